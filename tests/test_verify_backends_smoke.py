"""benchmarks/verify_backends.py (rowquant's byte check on the GPU) loads where CuTeDSL is absent.

``--triton-only`` is for a GPU machine without the CuTeDSL bundle: the script must import there
and import CuTeDSL only when it runs the CuTeDSL backend. The battery itself runs on the GPU
(``--smoke`` runs it on the Triton interpreter, ~30 s: not part of the suite).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "verify_backends.py"

_PROBE = f"""
import importlib.util, sys
sys.modules["cutlass"] = None                      # any import of cutlass raises ImportError
spec = importlib.util.spec_from_file_location("verify_backends", {str(SCRIPT)!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
assert "dsv4kit.kernels.rowquant.cutedsl" not in sys.modules
print("imported")
"""


def test_the_script_imports_without_cutedsl() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "imported", out.stderr[-2000:]


def test_the_probe_can_fail() -> None:  # the same probe on a module that imports CuTeDSL at once
    cute_module = SCRIPT.parents[1] / "dsv4kit" / "kernels" / "rowquant" / "cutedsl.py"
    probe = _PROBE.replace(repr(str(SCRIPT)), repr(str(cute_module)))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "import of cutlass halted" in out.stderr, out.stderr[-2000:]
