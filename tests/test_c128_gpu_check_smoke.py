"""benchmarks/c128_compress_gpu_check.py: its whole flow on CPU (``--cpu-smoke``, Triton interpreter).

The GPU run is one scarce device call; this runs the same code paths here (warmup of every key the
cases dispatch to, random / odd-stride / packed-pool cases, a chain per store op, the kernel-alone
launch built as the op builds it, the check-free core, the summary and the files), so a typo in the
script costs no device time.
"""

from __future__ import annotations

import csv
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
    header = (tmp_path / "c128_compress.csv").read_text().splitlines()[0]     # no timing here: the header
    assert header.startswith("family,kernel,backend,variant,size,bytes,median_us,GBps,copy_GBps,"
                             "fraction_of_copy")


def test_without_a_gpu_the_script_says_so(script, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_the_timing_row_has_the_csv_columns(script, tmp_path: Path) -> None:
    ctx = script.Ctx("cpu", None, ["triton"], False)
    timer = script.Timer(ctx, copy_gbs=4000.0, rep_ms=1)
    row = timer.row("c128_compress", "triton", "kernel (graph replay)", 16384, 4_000_000, 0.002, "", "x")
    assert list(row)[:10] == ["family", "kernel", "backend", "variant", "size", "bytes", "median_us", "GBps",
                              "copy_GBps", "fraction_of_copy"]
    assert tuple(row) == script.CSV_COLUMNS
    assert row["GBps"] == pytest.approx(2000.0) and row["fraction_of_copy"] == pytest.approx(0.5)
    from dsv4kit.bench import write_csv

    write_csv(tmp_path / "t.csv", [row])
    assert next(csv.reader(open(tmp_path / "t.csv")))[:10] == list(row)[:10]
