"""benchmarks/c128_compress_gpu_check.py: its whole flow on CPU (``--cpu-smoke``, Triton interpreter).

The GPU run is one scarce device call; this runs the same code paths here (warmup of every key the
cases dispatch to, random / odd-stride / packed-pool cases, a chain per store op, the kernel-alone
launch built as the op builds it, the check-free core, the summary and the files), so a typo in the
script costs no device time. The script is numerics only: bandwidth is ``dsv4kit bench --family
c128_compress`` / ``c128_store``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from dsv4kit.kernels.c128_compress.cases import OPS


@pytest.fixture(scope="module")
def script():
    return load_benchmark("c128_compress_gpu_check")


def test_the_cpu_smoke_run_passes_and_writes_every_file(script, tmp_path: Path) -> None:
    rc = script.main(["--cpu-smoke", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "check.json").read_text())
    why = [line for line in result["log"] if line.startswith(("NONCONFORMING", "FAILURE", "BACKEND"))]
    assert rc == 0, why[:12]
    assert result["pass"] is True and result["failures"] == []
    records = result["cases"]
    kernel_ops = {r["op"] for r in records if r["backend"] == "triton"}
    assert set(OPS) <= kernel_ops                                          # all three ops judged
    assert {f"{OPS[0]} -> {op}" for op in OPS[1:]} <= kernel_ops         # and a chain per store op
    assert {r["set"] for r in records} >= {"random", "odd_stride", "packed", "chain"}
    assert all(r["ok"] and r["elements"] > 0 for r in records if r.get("written")), records
    assert all(r["ok"] for r in result["launch_checks"]) and len(result["launch_checks"]) == 3
    assert all(r["ok"] for r in result["core_checks"]) and len(result["core_checks"]) == 3
    assert result["numerics_compiles"]["triton_compiles"] == 0
    assert not result["numerics_compiles"]["monitor_events"]
    warmed = {w["op"]: [k["key"] for k in w["keys"]] for w in result["warmup"]}
    assert any("kv_block_stride=39168" in k for k in warmed[OPS[1]])     # the packed pool's key
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["family"] == "c128_compress" and prov["kernel_source_hash"] and prov["cpu_smoke"]
    md = (tmp_path / "c128_compress.md").read_text()
    assert "PASS" in md and "| c128_compress | triton |" in md
    assert "ALL CHECKS PASS" in (tmp_path / "c128_compress.log").read_text()
    assert not (tmp_path / "c128_compress.csv").exists()                     # numerics only: no timing
    assert not {"timing", "timing_compiles", "copy_GBps", "decode"} & set(result)
    assert "## Bandwidth" not in md and "dsv4kit bench --family c128_compress" in md


def test_without_a_gpu_the_script_says_so(script, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_a_nonconforming_kernel_fails_the_run(script, tmp_path: Path, monkeypatch) -> None:
    real = script.run_kernel

    def corrupt(item, backend, ctx):  # every kernel result with its first element changed
        got = real(item, backend, ctx)
        flat = got.view(-1) if got.is_contiguous() else got.as_strided((1,), (1,))
        flat[0] = flat[0] + 1 if got.is_floating_point() else flat[0] ^ 0x55
        return got

    monkeypatch.setattr(script, "run_kernel", corrupt)
    assert script.main(["--cpu-smoke", "--out", str(tmp_path)]) == 1
    result = json.loads((tmp_path / "check.json").read_text())
    assert result["pass"] is False and any("do not conform" in f for f in result["failures"])


@pytest.mark.parametrize("option", [["--no-timing"], ["--rep-ms", "100"], ["--compile-budget", "60"]])
def test_the_timing_options_are_gone(script, tmp_path: Path, option: list[str]) -> None:
    with pytest.raises(SystemExit):
        script.parse_args(["--out", str(tmp_path), *option])
