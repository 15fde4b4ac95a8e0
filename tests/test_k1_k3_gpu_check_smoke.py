"""benchmarks/indexer_q_gpu_check.py and dequant_gather_gpu_check.py: their whole flow on CPU
(``--cpu-smoke``, Triton interpreter), so a typo in a script costs no device time; and the GPU
session scripts name only scripts that exist (the per-family bandwidth scripts became
``dsv4kit bench``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from benchmark_scripts import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def indexer_q():
    return load_benchmark("indexer_q_gpu_check")


@pytest.fixture(scope="module")
def dequant_gather():
    return load_benchmark("dequant_gather_gpu_check")


def test_indexer_q_cpu_smoke_passes(indexer_q, tmp_path: Path) -> None:
    assert indexer_q.main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "indexer_q_gpu_check.json").read_text())
    assert result["pass"] is True and "ALL CHECKS PASS" in result["log"]
    judged = {(r["backend"], r["format"]) for r in result["numerics"]}
    assert judged == {("triton", "fp8"), ("triton", "mxfp4")}
    assert all(r["bit_exact"] == r["cases"] > 0 for r in result["numerics"])
    replay = result["replay"]
    assert replay["calls"] > 0 and replay["triton_compiles"] == 0 and not replay["missed"]
    prov = result["provenance"]
    assert prov["cpu_smoke"] and prov["family"] == ["indexer_q"] and prov["kernel_source_hash"]["indexer_q"]


def test_dequant_gather_cpu_smoke_passes(dequant_gather, tmp_path: Path) -> None:
    assert dequant_gather.main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["numerics_exact"] and summary["zero_compiles_after_warmup"]
    assert summary["backends"] == ["triton"]
    num = json.loads((tmp_path / "numerics.json").read_text())
    assert num["triton"]["exact"] == num["triton"]["cases"] >= 2 and not num["triton"]["failures"]
    cov = json.loads((tmp_path / "coverage.json").read_text())["triton"]
    assert cov["trace_calls"] > 0 and cov["compiles_after_warmup"] == 0 and not cov["missed"]
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["cpu_smoke"] and prov["kernel_source_hash"]["dequant_gather"]


@pytest.mark.parametrize("name", ["indexer_q_gpu_check", "dequant_gather_gpu_check"])
def test_without_a_gpu_the_script_says_so(name: str, tmp_path: Path, monkeypatch, capsys) -> None:
    script = load_benchmark(name)
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_gpu_session_scripts_name_existing_scripts() -> None:
    named = set()
    for sh in BENCHMARKS.glob("*.sh"):
        named |= set(re.findall(r"benchmarks/([\w-]+\.py)", sh.read_text()))
    assert named, "expected the session scripts to run benchmarks/*.py"
    missing = sorted(n for n in named if not (BENCHMARKS / n).is_file())
    assert missing == [], f"benchmarks/*.sh run scripts that do not exist: {missing}"
    for gone in ("indexer_q.py", "dequant_gather.py", "c4_compress.py"):   # folded into dsv4kit bench
        assert not (BENCHMARKS / gone).exists()
