"""``dsv4kit coverage --json``: the machine-readable report (structure, every family, misses as dicts)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from cli_run import run_main

from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.model.stack import FAMILIES

ENTRY = {"key_class", "key"}
KERNEL_FIELDS = {"family", "spec_id", "backend", "target", "selected", "warmed", "requested", "missed",
                 "dead", "counts"}
COUNTS = ("warmed", "requested", "missed", "dead", "calls")
FLASH_KERNELS = {"SavePartialStatesTriton", "C4CompressDsMlaTriton", "IndexerCompressTriton",
                 "C128CompressTriton", "C128StoreDsMlaTriton", "IndexerQFp8Triton", "DequantGatherTriton"}


def coverage_json(capsys, tmp_path, *argv: str) -> tuple[int, dict]:
    path = tmp_path / "cov.json"
    rc, _, _ = run_main(capsys, "coverage", "--no-progress", "--steps", "2", *argv, "--json", str(path))
    return rc, json.loads(path.read_text())


def key_of(cls, entry: dict):
    """The CompileKey an entry describes (its class name checked)."""
    assert entry["key_class"] == cls.__qualname__
    return cls(**entry["key"])


def check_entry(entry: dict, extra: set[str] = frozenset()) -> None:
    assert set(entry) == ENTRY | set(extra), entry
    assert isinstance(entry["key_class"], str) and entry["key_class"].endswith(".CompileKey")
    assert isinstance(entry["key"], dict) and entry["key"]
    assert all(isinstance(v, bool | int | float | str) for v in entry["key"].values()), entry


def check_structure(report: dict) -> None:
    """Invariants every coverage report keeps: entries, counts, totals, families."""
    assert report["schema"] == "dsv4kit.coverage/1"
    kernels = report["kernels"]
    for name, k in kernels.items():
        assert set(k) == KERNEL_FIELDS, name
        for e in k["warmed"]:
            check_entry(e)
        for e in k["requested"]:
            check_entry(e, {"calls"})
            assert e["calls"] >= 1
        for e in k["missed"]:
            check_entry(e, {"calls", "nearest", "diff"})
            assert e["nearest"] is None or set(e["nearest"]) == ENTRY
            assert all(set(d) == {"warmed", "requested"} for d in e["diff"].values())
        for e in k["dead"]:
            check_entry(e, {"reason"})
            assert isinstance(e["reason"], str) and e["reason"]
        assert k["counts"] == {"warmed": len(k["warmed"]), "requested": len(k["requested"]),
                               "missed": len(k["missed"]), "dead": len(k["dead"]),
                               "calls": sum(e["calls"] for e in k["requested"])}
        warmed = [e["key"] for e in k["warmed"]]
        requested = [e["key"] for e in k["requested"]]
        assert [e["key"] for e in k["missed"]] == [r for r in requested if r not in warmed]
        assert [e["key"] for e in k["dead"]] == [w for w in warmed if w not in requested]
    totals = report["totals"]
    sums = {c: sum(k["counts"][c] for k in kernels.values()) for c in COUNTS}
    assert totals == {"kernels": len(kernels), **sums,
                      "compiles_after_warmup": sum(e["calls"] for e in report["compiles_after_warmup"])}
    assert report["ok"] == (totals["missed"] == 0 and totals["compiles_after_warmup"] == 0)
    assert len(report["missed"]) == totals["missed"] and len(report["dead"]) == totals["dead"]   # text lines
    fams = report["families"]
    assert [f["family"] for f in fams] == [f.name for f in FAMILIES]          # every model family
    assert [f["spec_id"] for f in fams] == [f.spec_id for f in FAMILIES]
    for f in fams:
        assert (f["unused"] is None) == bool(f["kernels"]), f
        assert f["calls"] == sum(f["sites"].values())
        assert all(kernels[n]["family"] == f["family"] for n in f["kernels"] if n in kernels)


def test_coverage_json_structure_flash(capsys, tmp_path) -> None:
    rc, report = coverage_json(capsys, tmp_path)
    assert rc == 0
    check_structure(report)
    assert report["ok"] is True and report["totals"]["missed"] == 0
    assert set(report["kernels"]) == FLASH_KERNELS
    assert all(k["selected"] and k["backend"] == "triton" and k["target"] == "sm_90a"
               for k in report["kernels"].values())
    s = report["settings"]
    assert (s["preset"], s["arch"], s["cache_dtype"], s["indexer_cache_dtype"], s["block_size"]) == (
        "DSv4-Flash", "sm_90a", "fp8_ds_mla", "fp8", 256)
    # The key dicts are the CompileKeys (asdict): K1's warmed keys are the spec's four.
    k1 = report["kernels"]["IndexerQFp8Triton"]
    assert [key_of(IndexerQBase.CompileKey, e) for e in k1["warmed"]] == [
        IndexerQBase.CompileKey(cos_sin_dtype=d, coarsen=c) for d in ("float32", "bfloat16") for c in (1, 4)]
    k3 = report["kernels"]["DequantGatherTriton"]
    assert [dataclasses.astuple(key_of(DequantGatherBase.CompileKey, e)) for e in k3["warmed"]] == [
        (256, True), (64, False), (2, False)]
    # The two dead keys are trap 1's, each with its reason.
    assert [(e["key"]["cos_sin_dtype"], e["reason"].endswith("trap 1)")) for e in k1["dead"]] == [
        ("bfloat16", True), ("bfloat16", True)]
    # Every family the runtime registers was called by the replay; K6 and K8b say why not.
    fams = {f["spec_id"]: f for f in report["families"]}
    assert all(f["calls"] > 0 for f in fams.values() if f["kernels"])
    assert {sid for sid, f in fams.items() if f["unused"]} == {"K6", "K8b"}
    assert fams["K6"]["unused"] == "K6 not used by this runtime: the KV cache is fp8_ds_mla (K5 stores it)"
    assert fams["K4"]["sites"].keys() == {"save_main_state", "save_indexer_state"}
    assert report["compiles_after_warmup"] == []


def test_coverage_json_plain_row_runtime_covers_k6_k8b(capsys, tmp_path) -> None:
    rc, report = coverage_json(capsys, tmp_path, "--cache-dtype", "bf16", "--trace", "prefill")
    assert rc == 0
    check_structure(report)
    fams = {f["spec_id"]: f for f in report["families"]}
    assert fams["K6"]["kernels"] == ["C4CompressPlainTriton"] and fams["K6"]["calls"] > 0
    assert fams["K8b"]["kernels"] == ["C128StorePlainTriton"] and fams["K8b"]["calls"] > 0
    assert {sid for sid, f in fams.items() if f["unused"]} == {"K3", "K5", "K8a"}
    k6 = report["kernels"]["C4CompressPlainTriton"]
    assert [(e["key"]["store_full_fp8"], e["key"]["norm_weight_dtype"]) for e in k6["warmed"]] == [
        (False, "bfloat16")]


@pytest.mark.parametrize("drill,kernel,field,warmed,requested,missing", [
    (["--warmup-cos-sin-dtypes", "bfloat16"], "IndexerQFp8Triton", "cos_sin_dtype", "bfloat16", "float32",
     {"IndexerQFp8Triton"}),
    (["--warmup-block-size", "64", "--trace", "prefill"], "DequantGatherTriton", "block_size", 64, 256,
     {"DequantGatherTriton", "C128StoreDsMlaTriton"}),         # K8a's page geometry follows B too
])
def test_a_forced_miss_is_a_dict(capsys, tmp_path, drill, kernel, field, warmed, requested, missing) -> None:
    rc, report = coverage_json(capsys, tmp_path, *drill)
    assert rc == 1
    check_structure(report)
    assert report["ok"] is False and report["totals"]["missed"] >= 1
    missed = report["kernels"][kernel]["missed"]
    hit = [m for m in missed if m["diff"].get(field) == {"warmed": warmed, "requested": requested}]
    assert hit, missed
    m = hit[0]
    assert m["key"][field] == requested and m["nearest"]["key"][field] == warmed
    assert m["key_class"] == m["nearest"]["key_class"] and m["calls"] >= 1
    assert {n for n, k in report["kernels"].items() if k["counts"]["missed"]} == missing
    # The monitor stopped exactly the missed keys' calls (the same dicts), before compiling them.
    stopped = [e for e in report["compiles_after_warmup"] if e["kernel"] == kernel]
    assert stopped and all(e["source"] == "jit" and e["key_class"] == m["key_class"] for e in stopped)
    assert {json.dumps(e["key"], sort_keys=True) for e in stopped} == {
        json.dumps(x["key"], sort_keys=True) for x in missed}
    assert {e["kernel"] for e in report["compiles_after_warmup"]} == missing


def test_json_dash_writes_json_alone_to_stdout(capsys) -> None:
    rc, out, err = run_main(capsys, "coverage", "--no-progress", "--steps", "2", "--trace", "prefill",
                            "--json", "-")
    assert rc == 0
    report = json.loads(out)                           # nothing else on stdout
    check_structure(report)
    assert report["ok"] is True
    assert "coverage OK" in err and "DSv4-Flash: 43 layers" in err    # the text report went to stderr
    rc, out, err = run_main(capsys, "warmup", "--no-progress", "--json", "-")
    assert rc == 0
    warm = json.loads(out)
    assert len(warm["warmup"]) == 14 and "0 failure(s)" in err
