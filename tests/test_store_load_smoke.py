"""benchmarks/store_load_check.py on CPU: a store built by one process, shipped as a tar and loaded by
another with an empty Triton cache, warms DSv4-Flash and replays without generating any code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import BENCHMARKS

REPO = BENCHMARKS.parent


def _run(*cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600)


def test_a_shipped_store_loads_with_no_code_generation(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "builder-triton")}
    built = _run("-m", "dsv4kit", "warmup", "--no-progress", "--device", "cpu", "--arch", "sm_90a",
                 "--cache-dir", str(tmp_path / "built"), env=env)
    assert built.returncode == 0 and "store: 0 hit(s), 14 compiled" in built.stdout, built.stderr[-2000:]
    tar = tmp_path / "store.tar.gz"
    exported = _run("-m", "dsv4kit", "cache", "export", str(tar), "--cache-dir", str(tmp_path / "built"),
                    env=env)
    assert exported.returncode == 0, exported.stderr[-2000:]
    out = tmp_path / "out"
    check = _run(str(BENCHMARKS / "store_load_check.py"), "--import", str(tar), "--cache-dir",
                 str(tmp_path / "loaded"), "--out", str(out), "--device", "cpu", "--steps", "2", env=env)
    result = json.loads((out / "result.json").read_text())
    assert check.returncode == 0, (check.stdout[-2000:], check.stderr[-2000:])
    assert result["imported"] == {"added": 14, "problems": []}
    assert result["store_hits"] == 14 and result["store_compiled"] == 0
    assert result["triton_codegen"] == [] and result["coverage_rc"] == 0 and result["pass"] is True
