"""benchmarks/c4_compress_gpu_check.py: its flow on CPU (``--cpu-smoke``, Triton interpreter).

The GPU run is one scarce device call; this runs the same code paths here (warmup of every config
key, random / odd-stride cases, one small production-layout case per op, the compressor-rule judge
against the CPU reference, the compile counters, the summary and the JSON), so a broken edit of
the script costs no device time. CuTeDSL and the CUDA reference need a GPU: the smoke run skips
them and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

from dsv4kit.kernels.c4_compress.cases import OPS

KEYS = {"provenance", "args", "cpu_smoke", "skipped", "warmup", "compiles_after_warmup", "cases",
        "summary", "pass", "log"}


@pytest.fixture(scope="module")
def script():
    return load_benchmark("c4_compress_gpu_check")


def _result(path: Path) -> dict:
    return json.loads((path / "c4_compress_gpu_check.json").read_text())


def test_the_cpu_smoke_run_passes_and_writes_the_json(script, tmp_path: Path) -> None:
    rc = script.main(["--cpu-smoke", "--out", str(tmp_path)])
    result = _result(tmp_path)
    why = [line for line in result["log"] if line.startswith(("NONCONFORMING", "warmup", "no kernel"))]
    assert rc == 0, why
    assert KEYS <= set(result) and result["pass"] is True and result["cpu_smoke"] is True
    records = result["cases"]
    assert records and all(r["ok"] and r["written"] > 0 and r["elements"] > 0 and r["other_bytes_equal"]
                           for r in records), [r for r in records if not r["ok"]]
    assert {r["backend"] for r in records} == {"triton"}                 # no CuTeDSL, no reference@cuda
    assert {r["reference"] for r in records} == {"cpu"}
    padded = f"padded to T={script.PAST_DECODE_T}"
    for op in OPS:                                    # 2 random (1 padded) + 1 odd stride + 1 large
        mine = [r for r in records if r["op"] == op]
        assert len(mine) == 5, mine
        labels = [r["case"] for r in mine]                  # case 0 is odd-strided, then padded too
        assert sum("block_stride=" in c and padded not in c for c in labels) == 1, labels
        assert sum(padded in c for c in labels) == 1, labels
        big = [r for r in mine if r["large"]]
        assert len(big) == 1 and big[0]["T"] == script.SMOKE_LARGE_T and "in order" in big[0]["case"]
    sets = {(r["op"], r["set"]) for r in result["summary"]}
    assert sets == {(op, s) for op in OPS for s in ("random", "large")}
    assert all(r["conforming"] == r["cases"] and not r["errors"] for r in result["summary"])
    assert {(w["backend"], w["op"]) for w in result["warmup"]} == {("triton", op) for op in OPS}
    assert not any("error" in w for w in result["warmup"]) and all(w["keys"] for w in result["warmup"])
    assert result["compiles_after_warmup"] == {"triton": 0, "cutedsl": None}
    skipped = " ".join(result["skipped"])
    assert "cutedsl backend" in skipped and "CUDA reference" in skipped
    assert result["provenance"]["cpu_smoke"] is True and result["provenance"]["arch"] == "sm_90a"
    assert any(line.startswith("CPU SMOKE: skipped") for line in result["log"])
    assert result["log"][-1] == "ALL CHECKS PASS"


def test_a_corrupted_kernel_result_fails_the_run(script, tmp_path: Path, monkeypatch) -> None:
    real = script.run_kernel

    def corrupt(case, backend, *args, **kwargs):  # every byte the Triton op wrote XOR 0x55
        got = real(case, backend, *args, **kwargs)
        raw = torch.empty(0, dtype=torch.uint8).set_(got.untyped_storage())
        raw ^= 0x55
        return got

    monkeypatch.setattr(script, "run_kernel", corrupt)
    assert script.main(["--cpu-smoke", "--out", str(tmp_path)]) == 1
    result = _result(tmp_path)
    assert result["pass"] is False and result["log"][-1] == "ALL CHECKS FAIL"
    kernel = [r for r in result["cases"] if r["backend"] == "triton"]
    assert kernel and not any(r["ok"] for r in kernel)
    assert any(line.startswith("NONCONFORMING triton") for line in result["log"])


def test_without_a_gpu_and_without_cpu_smoke_the_script_says_so(script, tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "c4_compress_gpu_check.json").exists()
