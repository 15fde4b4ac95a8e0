"""dsv4kit.viz.pipeline and the per-step series of dsv4kit.model.pipeline.PipelineReport.

The pipeline runs here are reference pipelines only (no kernel, no interpreter): fast. The kernel
pipeline and its comparison are tests/model/test_pipeline.py's and notebook 05's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import matplotlib
import pytest

matplotlib.use("Agg")

from dsv4kit.jit import KeyLedger  # noqa: E402
from dsv4kit.model.drills import TRAPS, Caught, build  # noqa: E402
from dsv4kit.model.judge import StepComparison, TensorVerdict  # noqa: E402
from dsv4kit.model.pipeline import Pipeline, PipelineReport, StepRecord  # noqa: E402
from dsv4kit.model.presets import DSV4_FLASH  # noqa: E402
from dsv4kit.model.requests import Request, request_trace  # noqa: E402
from dsv4kit.model.stack import FAMILIES  # noqa: E402
from dsv4kit.viz import pipeline as vp  # noqa: E402

TINY3 = dataclasses.replace(
    DSV4_FLASH, name="tiny3", num_layers=3, compress_ratios=(0, 4, 128),
    compress_rope=dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096),
)
LIMITS = dict(block_size=16, max_num_batched_tokens=16, max_num_seqs=2, max_model_len=64)


@pytest.fixture(scope="module")
def ref_run():
    """A reference pipeline over three requests; the third evicts the first (max_num_seqs 2)."""
    stack, _ = build(TINY3, **LIMITS)
    trace = request_trace(stack, (Request(10, 2), Request(6, 2), Request(5, 1, arrival=3)))
    pipe = Pipeline(stack, seed=1, backend="reference")
    pipe.run(trace)
    return stack, trace, pipe


def test_occupancy_covers_the_state_caches_and_follows_the_live_sequences(ref_run) -> None:
    stack, trace, pipe = ref_run
    report = pipe.report
    assert set(report.capacity) == {(0, "window"), (1, "window"), (1, "main"), (1, "indexer"),
                                    (1, "state:main"), (1, "state:indexer"), (2, "window"), (2, "main"),
                                    (2, "state:main")}
    assert report.capacity[(1, "state:main")] == pipe.layers[1].states["main"].shape[0] * 4
    assert report.capacity[(2, "state:main")] == pipe.layers[2].states["main"].shape[0] * 8
    series = report.occupancy_series()
    assert set(series) == set(report.capacity) and all(len(v) == len(trace) for v in series.values())
    live: dict[int, int] = {}
    for step, rec in zip(trace, report.steps, strict=True):
        for seq in rec.evicted:
            live.pop(seq)
        for c in step.seqs:
            live[c.seq_id] = c.seq_len
        tokens = sum(live.values())
        assert rec.occupancy[(0, "window")] == rec.occupancy[(1, "state:main")] == tokens
        assert rec.occupancy[(1, "state:indexer")] == rec.occupancy[(2, "state:main")] == tokens
        assert rec.occupancy[(1, "main")] == sum(n // 4 for n in live.values())
    assert any(rec.evicted for rec in report.steps)
    assert series[(0, "window")][-1] < max(series[(0, "window")])        # the eviction freed entries


def test_family_call_series_sums_the_call_sites(ref_run) -> None:
    _, trace, pipe = ref_run
    fam = pipe.report.family_call_series()
    assert list(fam) == list(dict.fromkeys(f for s in pipe.report.steps for f, _ in s.calls))
    assert fam["save_partial_states"] == [3] * len(trace)             # 2 main (C4, C128) + 1 indexer
    assert fam["indexer_q"] == [1] * len(trace)
    prefill = [bool(s.prefill_chunks) for s in trace]
    assert fam["dequant_gather"] == [5 * p for p in prefill]          # 3 windows + C4 + C128, prefill only
    for rec in pipe.report.steps:
        assert sum(rec.family_calls().values()) == sum(rec.calls.values())


def test_plot_pipeline_merges_coinciding_series(ref_run) -> None:
    stack, _, pipe = ref_run
    kinds = {layer.index: layer.kind for layer in stack.layers}
    lines = vp._occupancy_lines(pipe.report, kinds)
    labels = [label for label, *_ in lines]
    assert len(lines) == 3                       # window + state rows; C4 main + indexer; C128 main
    assert any("window pages (L0 SWA, L1 C4, L2 C128)" in lb and "state rows (main)" in lb for lb in labels)
    fig = vp.plot_pipeline(pipe.report, kinds)
    ax1, ax2 = fig.axes
    assert len(ax1.get_lines()) == 3
    assert len(ax2.patches) == len(pipe.report.family_call_series()) * len(pipe.report.steps)
    matplotlib.pyplot.close(fig)


def _verdict(rule: str, ok: bool = True, n: int = 10, same: int = 10) -> TensorVerdict:
    return TensorVerdict(1, "t", rule, ok, n, same)


def test_comparison_rows_split_bit_exact_and_rule_verdicts() -> None:
    report = PipelineReport("kernels", None, {}, [StepRecord(0, "prefill", 7, 7, False),
                                                  StepRecord(1, "decode", 2, 4, True)])
    comps = [StepComparison(0, [_verdict("bit-exact"), _verdict("bit-exact outside compressed rows"),
                                _verdict("compressor", n=8, same=5), _verdict("fp32", n=4, same=0)]),
             StepComparison(1, [_verdict("bit-exact", ok=False, same=9), _verdict("compressor")])]
    rows = vp.comparison_rows(comps, report)
    assert rows[0] == {"step": 0, "phase": "prefill", "tokens": 7, "padded_tokens": 7, "ok": True,
                       "bit-exact_tensors": 2, "bit-exact_ok": 2, "bit-exact_elements": 20,
                       "bit-exact_bit_identical": 20, "rule_tensors": 2, "rule_ok": 2, "rule_elements": 12,
                       "rule_bit_identical": 5}
    assert rows[1]["ok"] is False and rows[1]["bit-exact_ok"] == 0
    md = vp.comparison_table_markdown(comps, report).splitlines()
    assert md[2] == "| 0 | prefill | 7 (7) | 2/2 | 20/20 | 2/2 | 5/12 | OK |"
    assert md[3] == "| 1 | decode | 2 (4) | 0/1 | 9/10 | 1/1 | 10/10 | **FAILED** |"


def test_family_coverage_has_a_row_for_every_family() -> None:
    ledger = KeyLedger()
    ledger.add_warmed("SavePartialStatesTriton", ["a", "b"])
    ledger.add_warmed("IndexerQFp8Triton", ["q"])
    ledger.add_warmed("IndexerQMxfp4Triton", ["m"])
    ledger.requested["SavePartialStatesTriton"] = Counter({"a": 3, "c": 1})
    ledger.requested["IndexerQMxfp4Triton"] = Counter({"m": 2})
    rows = vp.family_coverage_rows(ledger, FAMILIES)
    assert [r["family"] for r in rows] == [f.name for f in FAMILIES[:7]] + ["indexer_q", "indexer_q",
                                                                             "dequant_gather"]
    k4 = rows[0]
    assert (k4["kernel"], k4["warmed"], k4["requested"], k4["missed"], k4["dead"], k4["calls"]) == \
        ("SavePartialStatesTriton", 2, 2, 1, 1, 4)
    assert [r["kernel"] for r in rows if r["family"] == "indexer_q"] == ["IndexerQFp8Triton",
                                                                          "IndexerQMxfp4Triton"]
    assert rows[-1]["kernel"] is None and rows[-1]["warmed"] == 0
    assert vp.family_of_kernel("DequantGatherCuTeDSL", FAMILIES).name == "dequant_gather"
    assert vp.family_of_kernel("NoSuchKernel", FAMILIES) is None
    fig = vp.plot_family_coverage(ledger, FAMILIES)
    assert len(fig.axes[0].get_yticklabels()) == len(rows)
    matplotlib.pyplot.close(fig)


def test_drill_table_and_gpu_table() -> None:
    caught = [Caught(2, "monitor", "coarsen", "K: compile after warmup\n  other: warmed 1, requested 4"),
              Caught(1, "configuration check", "cos_sin_cache", "cos_sin_cache: expected float32 | x")]
    md = vp.drill_table_markdown(caught).splitlines()
    assert md[2].startswith(f"| 1 | {TRAPS[1]} | configuration check | `cos_sin_cache` | cos_sin_cache: ")
    assert "\\|" in md[2]
    assert md[3] == f"| 2 | {TRAPS[2]} | monitor | `coarsen` (NOT named) | K: compile after warmup " \
        "other: warmed 1, requested 4 |"
    assert Caught(2, "monitor", "coarsen", "x coarsen: warmed 1").names_field
    long = Caught(2, "monitor", "coarsen", "K: unwarmed key (" + "a=1, " * 40 + "); nearest (...) differs in "
                  "coarsen: warmed 1, requested 4")
    assert long.excerpt() == "...differs in coarsen: warmed 1, requested 4"
    gpu = vp.pipeline_gpu_table_markdown([
        {"config": "flash-default", "backend": "cutedsl", "ok": True, "steps_run": 6, "op_calls": 900,
         "steps_ok": 6, "steps_compared": 6, "triton_runtime_compiles": 0, "cute_runtime_compiles": 0,
         "monitor_events": [], "seconds": 12.34},
        {"config": "pro-default", "backend": "triton", "ok": False, "error": "boom"}]).splitlines()
    assert gpu[2] == "| flash-default | cutedsl | yes | 6 | 900 | 6/6 | 0, 0 | 0 | 12.3 |"
    assert gpu[3].startswith("| pro-default | triton | **NO** | 0 | 0 | 0/0 |") and gpu[3].endswith(" boom")


def test_key_labels_name_only_the_fields_that_differ() -> None:
    from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
    from dsv4kit.viz.coverage import key_labels

    K3 = DequantGatherBase.CompileKey
    assert key_labels([]) == []
    assert key_labels([K3(256, True), K3(64, True)]) == ["block_size=256", "block_size=64"]
    assert key_labels([K3(256, True), K3(64, False)]) == ["block_size=256\nhas_gather_lens=True",
                                                         "block_size=64\nhas_gather_lens=False"]
    assert key_labels([K3(2, False)]) == ["block_size=2\nhas_gather_lens=False"]   # one key: its last two
    assert key_labels(["not a key"]) == ["'not a key'"]                             # format_key: its repr
