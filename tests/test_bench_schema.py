"""dsv4kit.bench_schema: every recorded benchmark file converts to the one schema, value for value;
the sweep plans' bytes models (each family folder's ``bench.py``) reproduce the recorded ``bytes``
columns."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from dsv4kit import bench, bench_schema
from dsv4kit.bench_schema import (
    BANDWIDTH_FIELDS,
    CONVERTERS,
    SCHEMA,
    BenchRow,
    host_rows,
    make_row,
    read_results,
    recorded_run,
    recorded_runs,
    results_json,
    rows_from_dicts,
    write_rows_csv,
)
from dsv4kit.kernels.dequant_gather.bench import dequant_gather_bytes
from dsv4kit.kernels.indexer_q.bench import indexer_q_bytes
from dsv4kit.kernels.rowquant.bench import rowquant_bytes
from dsv4kit.kernels.save_partial_states.bench import save_partial_states_bytes
from dsv4kit.results import results_dir

ROOT = results_dir()
pytestmark = pytest.mark.skipif(ROOT is None, reason="no recorded results in this install")


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=0)


def _num(s: str) -> float | None:
    if s == "":
        return None
    v = float(s)
    return None if math.isnan(v) else v


def test_schema_columns():
    assert BANDWIDTH_FIELDS == ("family", "kernel", "backend", "variant", "size", "bytes", "median_us",
                                "GBps", "copy_GBps", "fraction_of_copy")
    assert [f for f in BenchRow.__dataclass_fields__][:10] == list(BANDWIDTH_FIELDS)


def test_every_recorded_csv_is_converted():
    """Every CSV under the results directory is the source of one converted run (none forgotten)."""
    sources = {p.resolve() for run in recorded_runs(ROOT) for p in run.sources if p.suffix == ".csv"}
    on_disk = {p.resolve() for p in ROOT.rglob("*.csv")}
    assert on_disk == sources
    assert {n for n, _ in CONVERTERS} == {r.name for r in recorded_runs(ROOT)}


@pytest.mark.parametrize("name", ["indexer_q_h200.json", "indexer_q_h200_v1.json", "indexer_q_h200_v2.json"])
def test_indexer_q_exact(name):
    run = recorded_run(name, ROOT)
    src = _csv((ROOT / name).with_suffix(".csv"))
    data = json.loads((ROOT / name).read_text())
    assert run.copy_GBps == data["copy_GBps"]
    assert len(run.rows) == len(src) == len(data["timings"])
    for row, s in zip(run.rows, src, strict=True):
        assert row.family == "indexer_q" and row.kernel == f"indexer_q/{s['format']}"
        assert row.size == int(s["T"]) and row.bytes == int(s["bytes"])
        assert _same(row.median_us, 1e3 * float(s["ms"]))
        assert _same(row.GBps, float(s["GB/s"]))
        assert _same(row.fraction_of_copy, float(s["pct_of_copy"]) / 100)  # a percent there
        assert row.backend == {"triton": "triton", "cutedsl": "cutedsl", "torch": "torch"}[
            s["impl"].split(" ")[0].split(".")[0]]
    # The percent really was a percent: GBps / copy is the fraction.
    for row in run.rows:
        assert row.fraction_of_copy == pytest.approx(row.GBps / run.copy_GBps, rel=1e-9)


def test_indexer_q_headline():
    """The issue's numbers: K1 FP8 Triton 85 % / CuTeDSL 75 % of the copy at T = 65536 (v3)."""
    run = recorded_run("indexer_q_h200.json", ROOT)
    best = {(r.kernel, r.backend): r.fraction_of_copy for r in run.rows
            if r.size == 65536 and r.variant == "kernel (graph replay)"}
    assert best[("indexer_q/fp8", "triton")] == pytest.approx(0.8466, abs=1e-4)
    assert best[("indexer_q/fp8", "cutedsl")] == pytest.approx(0.7516, abs=1e-4)


@pytest.mark.parametrize("name", ["dequant_gather", "dequant_gather/full_sweep_run2",
                                  "dequant_gather/quick_4a499f7"])
def test_dequant_gather_exact(name):
    run = recorded_run(name, ROOT)
    src = _csv(ROOT / name / "bandwidth.csv")
    assert len(run.rows) == len(src)
    for row, s in zip(run.rows, src, strict=True):
        assert row.size == int(s["rows"]) and row.bytes == int(s["bytes"])
        assert _same(row.median_us, float(s["median_us"]))
        assert _same(row.GBps, _num(s["GBps"]))
        assert _same(row.fraction_of_copy, _num(s["fraction_of_copy"]))  # already a fraction
        assert f"block_size={s['block_size']}" in row.config and f"nreq={s['nreq']}" in row.config
        assert row.error == s["error"]
    summary = ROOT / name / "summary.json"
    if summary.is_file():
        assert run.copy_GBps == json.loads(summary.read_text())["copy_GBps"]
    else:  # the quick record: its log says 3570 GB/s
        assert "device-to-device copy: 3570 GB/s" in (ROOT / name / "log.txt").read_text()
        assert round(run.copy_GBps) == 3570


def test_save_partial_states_exact():
    run = recorded_run("save_partial_states_h200", ROOT)
    src = _csv(ROOT / "save_partial_states_h200" / "save_partial_states.csv")
    rec = json.loads((ROOT / "save_partial_states_h200/save_partial_states.json").read_text())
    assert run.copy_GBps == rec["copy_GBps"]
    assert len(run.rows) == len(src)
    for row, s in zip(run.rows, src, strict=True):
        assert row.size == int(s["T"]) and row.bytes == int(s["bytes"])
        assert _same(row.median_us, float(s["median_us"])) and _same(row.GBps, _num(s["GBps"]))
        assert _same(row.fraction_of_copy, float(s["pct_of_copy"]) / 100)
        assert f"layout={s['layout']}" in row.config and row.timing == s["timing"]


def test_c4_compress_exact():
    run = recorded_run("c4_compress_h200", ROOT)
    src = _csv(ROOT / "c4_compress_h200" / "c4_compress.csv")
    assert len(run.rows) == len(src)
    for row, s in zip(run.rows, src, strict=True):
        assert row.family == "c4_compress" and row.kernel == s["op"]
        assert (row.kernel + " " + row.config).strip() == s["format"]
        assert row.size == int(s["T"]) and row.bytes == int(s["bytes"])
        assert _same(row.median_us, float(s["median_us"])) and _same(row.GBps, _num(s["GBps"]))
        assert _same(row.fraction_of_copy, float(s["pct_of_copy"]) / 100)


def test_c128_compress_exact_and_decode():
    run = recorded_run("c128_compress_h200", ROOT)
    src = _csv(ROOT / "c128_compress_h200" / "c128_compress.csv")
    assert len(run.rows) == len(src)
    for row, s in zip(run.rows, src, strict=True):
        for k in ("family", "kernel", "backend", "variant", "timing", "error"):
            assert getattr(row, k) == s[k]
        assert row.size == int(s["size"]) and row.bytes == int(s["bytes"])
        for k in ("median_us", "GBps", "copy_GBps", "fraction_of_copy"):
            assert _same(getattr(row, k), _num(s[k]))
    check = json.loads((ROOT / "c128_compress_h200" / "check.json").read_text())
    assert len(run.decode) == len(check["decode"]) == 24
    for d, s in zip(run.decode, check["decode"], strict=True):
        assert (d.size, d.backend, d.kernel_us, d.empty_kernel_us, d.over_empty_us) == (
            s["T"], s["backend"], s["kernel_us"], s["empty_kernel_us"], s["over_empty_us"])
        assert d.kernel.startswith(s["op"])


def test_rowquant_and_encoders():
    rq = recorded_run("backends_h200.json", ROOT)
    src = json.loads((ROOT / "backends_h200.json").read_text())["timing_8192x4096"]
    assert {r.backend: (r.median_us, r.GBps) for r in rq.rows} == {
        b: (pytest.approx(1e3 * t["median_ms"]), t["GB_per_s"]) for b, t in src.items()}
    assert all(r.copy_GBps is None and r.fraction_of_copy is None for r in rq.rows)  # none was measured
    # The bytes model agrees with the recorded GB/s within half a unit of the median's last
    # recorded digit (0.0372 ms: 1.3e-3 relative).
    for r in rq.rows:
        gbps = rowquant_bytes(8192, 4096) / (r.median_us * 1e-6) / 1e9
        assert gbps == pytest.approx(r.GBps, rel=0.05 / r.median_us)
    enc = recorded_run("encoders_h200/encoders_gpu_check.json", ROOT)
    assert enc.rows == () and "no timings" in enc.note


def test_provenance_unchanged_and_round_trip(tmp_path):
    for run in recorded_runs(ROOT):
        src = run.record.path
        prov = json.loads((src / "provenance.json").read_text()) if src.is_dir() else None
        if prov is not None:
            assert dict(run.provenance) == prov
        obj = run.to_json()
        assert obj["schema"] == SCHEMA and obj["source"] == run.name
        path = tmp_path / (run.name.replace("/", "_") + ".json")
        path.write_text(json.dumps(obj))
        p, rows, decode, host = read_results(path)
        assert p == json.loads(json.dumps(dict(run.provenance)))
        assert len(rows) == len(run.rows) and len(decode) == len(run.decode)
        for a, b in zip(rows, run.rows, strict=True):
            assert a.series == b.series and a.size == b.size and _same(a.median_us, b.median_us)
            assert _same(a.fraction_of_copy, b.fraction_of_copy)
        assert len(host) == len(run.host())


def test_status_uses_the_recorded_hash():
    by_name = {r.name: r for r in recorded_runs(ROOT)}
    assert "kernel source hash not recorded" in by_name["indexer_q_h200.json"].status()
    k3 = by_name["dequant_gather"]
    assert k3.record.recorded_hash("dequant_gather") == k3.provenance["kernel_source_hash"]
    assert k3.current() == (", kernel source" not in k3.status())


def test_host_rows_and_csv(tmp_path):
    rows = [make_row("f", "k", "triton", "kernel (graph replay)", 1, 1000, 2.0, 4000.0),
            make_row("f", "k", "triton", "op", 1, 1000, 47.0, 4000.0),
            make_row("f", "k", "cutedsl", "op", 1, 1000, 12.0, 4000.0)]
    assert rows[0].GBps == pytest.approx(1000 / 2e-6 / 1e9)
    assert rows[0].fraction_of_copy == pytest.approx(0.5 / 4000)
    (h,) = host_rows(rows)  # the CuTeDSL op has no kernel row: no host row
    assert (h.backend, h.op_us, h.kernel_us, h.host_us) == ("triton", 47.0, 2.0, 45.0)
    write_rows_csv(tmp_path / "r.csv", rows)
    back = rows_from_dicts(_csv(tmp_path / "r.csv"))
    assert back == rows
    obj = results_json(rows, {"device": "x", "kernel_source_hash": {"f": "0" * 64}}, 4000.0, host=[h])
    assert obj["provenance"]["kernel_source_hash"] == {"f": "0" * 64} and len(obj["host"]) == 1


def test_recorded_files_untouched():
    before = {p: p.stat().st_mtime_ns for p in ROOT.rglob("*") if p.is_file()}
    for run in recorded_runs(ROOT):
        run.to_json()
    assert before == {p: p.stat().st_mtime_ns for p in ROOT.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- bytes models


def test_bytes_models_reproduce_recorded_bytes():
    q = recorded_run("indexer_q_h200.json", ROOT)
    for r in q.rows:
        assert indexer_q_bytes(r.kernel.split("/")[1], r.size) == r.bytes
    for s in _csv(ROOT / "dequant_gather" / "bandwidth.csv"):
        assert dequant_gather_bytes(int(s["nreq"]), int(s["rows_per_request"]), int(s["block_size"]),
                                    s["has_gather_lens"] == "True") == int(s["bytes"])
    for s in _csv(ROOT / "save_partial_states_h200" / "save_partial_states.csv"):
        assert save_partial_states_bytes(int(s["state_width"]), int(s["compress_ratio"]),
                                         int(s["T"])) == int(s["bytes"])


def test_plans_reproduce_recorded_bytes():
    """The sweep's points at the recorded sizes carry the recorded bytes (same bytes model)."""
    c4 = recorded_run("c4_compress_h200", ROOT)
    recorded = {(r.kernel, r.config, r.size): r.bytes for r in c4.rows}
    for t in (4096, 16384, 65536):
        for pt in bench.PLANS["c4_compress"].points(t):
            assert recorded[(pt.kernel, pt.config, t)] == pt.nbytes
    c128 = recorded_run("c128_compress_h200", ROOT)
    k7 = {r.size: r.bytes for r in c128.rows if r.kernel == "c128_compress" and r.variant == "op"}
    (pt,) = bench.PLANS["c128_compress"].points(65536)
    assert pt.nbytes == k7[65536]
    (pt,) = bench.PLANS["c128_compress"].points(1)  # one boundary: the recorded decode point's bytes
    assert pt.nbytes == next(r.bytes for r in c128.rows if r.kernel == "c128_compress" and r.size == 1)
    k8 = {(r.kernel, r.size): r.bytes for r in c128.rows if r.kernel.startswith("c128_norm_rope_store")}
    names = {"": "c128_norm_rope_store_ds_mla", "bf16": "c128_norm_rope_store_plain/bf16"}
    points = [pt for pt in bench.PLANS["c128_store"].points(1) if pt.config in names]
    assert len(points) == 2          # one written entry: the recorded decode points' bytes (no e4m3 there)
    for pt in points:
        assert pt.nbytes == k8[(names[pt.config], 1)], pt.config
    k4 = recorded_run("save_partial_states_h200", ROOT)
    rec = {(r.config, r.size): r.bytes for r in k4.rows}
    for pt in bench.PLANS["save_partial_states"].points(65536):
        assert rec[(pt.config, 65536)] == pt.nbytes


@pytest.mark.parametrize("name", bench_schema.BENCH_RUNS)
def test_bench_runs_read_back_value_for_value(name):
    """A ``dsv4kit bench`` record is already in the schema: the run holds its rows, decode rows and
    copy unchanged, and every fraction is GBps over that copy."""
    run = recorded_run(name, ROOT)
    data = json.loads((ROOT / name).read_text())
    family = bench.PLANS[name.split("/")[1].removesuffix(".json")].hash_family  # store_rows: encoders
    assert data["schema"] == SCHEMA and run.family == family
    assert run.copy_GBps == data["copy_GBps"] > 4000
    assert len(run.rows) == len(data["rows"]) and len(run.decode) == len(data["decode"])
    for row, d in zip(run.rows, data["rows"], strict=True):
        assert row.kernel == d["kernel"] and row.size == d["size"] and _same(row.median_us, d["median_us"])
        if row.bytes and row.median_us == row.median_us:
            assert row.GBps == pytest.approx(row.bytes / row.median_us / 1e3, rel=1e-9)
            assert row.fraction_of_copy == pytest.approx(row.GBps / run.copy_GBps, rel=1e-9)
    assert not any(r.error for r in run.rows)
    assert run.provenance["device"] == "NVIDIA H200" and family in run.provenance["kernel_source_hash"]


def test_host_overhead_launch_plan_and_sass_records_read_back():
    """The three records of issue 16's host side and analysis load with their own numbers."""
    ho = bench_schema.recorded_host_overhead(ROOT)
    raw = json.loads((ROOT / "host_overhead_h200/host_overhead.json").read_text())
    assert [r["op"] for r in ho.rows] == [r["op"] for r in raw["rows"]] and ho.empty_launch_us == raw[
        "empty_launch_us"]
    lp = bench_schema.recorded_launch_plans(ROOT)
    lp_rows = json.loads((ROOT / "launch_plans_h200/launch_plans.json").read_text())["rows"]
    assert lp.ok() == sum(r["ok"] for r in lp_rows) == len(lp_rows)
    rec, mix = bench_schema.recorded_sass_mix(ROOT)
    kernels = json.loads((ROOT / "sass_mix_sm90a/sass_mix.json").read_text())["kernels"]
    assert len(mix) == len(kernels) and rec.provenance["arch"] == "sm_90a"
    for m, k in zip(mix, kernels, strict=True):
        assert m.backend == k["backend"] and m.instr_over_dram == k["sass"]["headline"]["pipe_model"][
            "instr_over_dram"]
        assert m.kernel.startswith(k["family"])


def test_ncu_record_reads_back_kernel_for_kernel():
    """``ncu_h200/``: every profiled kernel with its label, counters and stalls as recorded; its
    DRAM bytes agree with the plan's bytes model (the models count every byte once)."""
    rec, copy, ks = bench_schema.recorded_ncu(ROOT)
    raw = json.loads((ROOT / "ncu_h200/ncu_profile.json").read_text())
    assert rec.device == "NVIDIA H200" and copy == raw["copy_GBps"] > 4000
    assert [(k.kernel, k.backend) for k in ks] == [(r["kernel"], r["backend"]) for r in raw["kernels"]]
    for k, r in zip(ks, raw["kernels"], strict=True):
        assert k.duration_us == r["duration_us"] and k.registers == r["registers"]
        assert k.top_stalls(1)[0][1] == max(v for v in r["stalls_pct"].values() if v is not None)
        assert 0.95 < k.dram_over_model < 1.1, k
        assert 0 < k.achieved_occupancy_pct <= k.theoretical_occupancy_pct + 1
