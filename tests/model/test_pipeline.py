"""The pipeline replay on real tensors (issue 14, CPU part): a small DSv4 stack, a seeded serving
trace of chunked prefill and decode steps, every kernel in call order under the Triton interpreter,
judged after each step against the same pipeline run with the references.

Sizes are tiny (B = 16, at most 24 tokens a step, max_model_len 300) so the file stays well under
a minute and a half on one core; adopted contexts (116, 240) put the C128 boundaries 127 and 255
within a few prefill chunks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_helpers import build

from dsv4kit.formats.ds_mla import DS_TOKEN_BYTES
from dsv4kit.model.judge import compare
from dsv4kit.model.pipeline import FLOW, Pipeline
from dsv4kit.model.presets import DSV4_FLASH
from dsv4kit.model.requests import Request, request_trace
from dsv4kit.model.stack import FAMILIES
from dsv4kit.model.trace import SeqChunk, Step, make_trace

#: Three layers (SWA, C4, C128) with DSv4-Flash's kernels, keys and state block sizes.
TINY3 = dataclasses.replace(
    DSV4_FLASH, name="tiny3", num_layers=3, compress_ratios=(0, 4, 128),
    compress_rope=dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096),
)
LIMITS = dict(block_size=16, max_num_batched_tokens=24, max_num_seqs=4, max_model_len=300)
#: A fresh prompt, and two requests adopted mid-serving whose chunks cross 127 and (decoding) 255.
REQUESTS = (Request(30, 4), Request(20, 4, context=116), Request(14, 4, context=240))


def _run(stack, trace, seed=3):
    kernels = Pipeline(stack, seed=seed)
    refs = Pipeline(stack, seed=seed, backend="reference")
    return kernels, refs, kernels.run(trace, compare_with=refs)


@pytest.fixture(scope="module")
def ds_run():
    stack, _ = build(TINY3, **LIMITS)
    trace = request_trace(stack, REQUESTS)
    kernels, refs, comparisons = _run(stack, trace)
    return stack, trace, kernels, refs, comparisons


def test_flow_table_names_every_family_of_the_stack() -> None:
    assert set(FLOW) == {f.name for f in FAMILIES}


def test_request_trace_is_chunked_prefill_then_padded_decode() -> None:
    stack, _ = build(TINY3, **LIMITS)
    trace = request_trace(stack, REQUESTS)
    assert [s.phase for s in trace] == ["prefill", "prefill", "mixed", "decode", "decode", "decode", "decode"]
    assert all(s.padded_tokens <= 24 for s in trace)
    graphs = [s for s in trace if s.cuda_graph]
    assert graphs and all(s.padded_tokens in stack.cuda_graph_sizes() for s in graphs)
    assert any(s.num_padding for s in graphs)
    seen: dict[int, int] = {}
    for s in trace:   # positions advance per request
        for c in s.seqs:
            assert c.context_len == seen.get(c.seq_id, REQUESTS[c.seq_id].context)
            seen[c.seq_id] = c.seq_len


def test_fp8_ds_mla_pipeline_matches_the_references(ds_run) -> None:
    stack, trace, kernels, refs, comparisons = ds_run
    for c in comparisons:
        c.assert_ok()
    # Every rule was exercised, and the kernels are mostly bit-identical even where they need not be.
    rules = {v.rule for c in comparisons for v in c.verdicts}
    assert {"bit-exact", "compressor", "fp32", "bit-exact outside compressed rows"} <= rules
    for c in comparisons:
        exact = [v for v in c.verdicts if v.rule == "bit-exact"]
        assert all(v.bit_identical == v.elements for v in exact)
        comp = [v for v in c.verdicts if v.rule == "compressor"]
        assert sum(v.elements for v in comp) > 0 and sum(v.bit_identical for v in comp) > 0
    # Zero compiles after warmup (a miss would have raised under JitMonitor("error")).
    assert kernels.report.warmup is not None and kernels.report.warmup.ok
    assert kernels.report.ok and not kernels.report.compile_events
    # The calls are the stack's: every family each step (K3 on prefill steps only), per layer kind.
    calls = kernels.report.calls()
    prefill = sum(bool(s.prefill_chunks) for s in trace)
    assert calls[("save_partial_states", "save_main_state")] == 2 * len(trace)
    assert calls[("save_partial_states", "save_indexer_state")] == len(trace)
    for fam in ("c4_compress_ds_mla", "indexer_compress", "c128_compress", "c128_norm_rope_store_ds_mla",
                "indexer_q"):
        assert sum(n for (f, _), n in calls.items() if f == fam) == len(trace)
    assert calls[("dequant_gather", "gather_window")] == 3 * prefill
    assert calls[("dequant_gather", "gather_compressed_c4")] == prefill
    assert calls[("dequant_gather", "gather_compressed_c128")] == prefill
    assert refs.report.calls() == calls
    # C128 boundaries 127 (prefill chunk) and 255 (decode) wrote entries, C4 every 4 tokens.
    written = kernels.report.written()
    assert written[(2, "main")] == 2
    boundaries = sum((p + 1) % 4 == 0 for r in REQUESTS
                     for p in range(r.context, r.context + r.prompt + r.decode))
    assert written[(1, "main")] == written[(1, "indexer")] == boundaries == 18
    assert kernels.report.steps[-1].occupancy[(0, "window")] == sum(r.context + r.prompt + r.decode
                                                                    for r in REQUESTS)
    assert kernels.report.rows()


@pytest.mark.parametrize("settings", [
    dict(cache_dtype="bf16", indexer_cache_dtype="mxfp4"),
    dict(cache_dtype="fp8", rope_cache_dtype="bfloat16", norm_weight_dtype="float32"),
], ids=["bf16-mxfp4", "fp8-bf16rope-fp32norm"])
def test_plain_row_caches_and_make_trace_steps(settings) -> None:
    """Plain-row caches (K6, K8b; no K3): bf16 rows with the MXFP4 indexer (K2, K9 MXFP4), and e4m3
    rows (E3) with a bf16 RoPE cache for K1 (trap 1) and fp32 norm weights (trap 9); over the
    request trace and then make_trace's mixed steps (decode sequences adopted with their history,
    evictions)."""
    stack, _ = build(TINY3, **settings, **LIMITS)
    kernels, refs, comparisons = _run(stack, request_trace(stack, REQUESTS[1:]))
    mixed = make_trace("mixed", stack, steps=3, seed=2)
    shifted = [dataclasses.replace(s, seqs=tuple(dataclasses.replace(c, seq_id=c.seq_id + 100)
                                                 for c in s.seqs)) for s in mixed]
    comparisons += kernels.run(shifted, compare_with=refs)
    for c in comparisons:
        c.assert_ok()
    names = {v.tensor for c in comparisons for v in c.verdicts}
    k2 = settings["cache_dtype"] == "bf16"
    assert ("indexer_q:indexer_q[1] int32" in names) == k2              # K2's q_scale
    assert ("indexer_q:indexer_q[0] float8_e4m3fn" in names) != k2      # K1's q_fp8
    assert not any("dequant_gather" in n for n in names)
    assert kernels.report.ok
    assert sum(s.history_tokens for s in kernels.report.steps) > 300
    assert any(s.evicted for s in kernels.report.steps)
    assert kernels.report.written()[(2, "main")] >= 1


def _flip(t: torch.Tensor, offset: int) -> None:
    """XOR one byte of ``t``'s memory at ``offset`` bytes from its first element with 0x40."""
    raw = t.view(torch.uint8).as_strided((offset + 1,), (1,), t.view(torch.uint8).storage_offset())
    raw[offset] ^= 0x40


def test_a_corrupted_byte_is_reported_by_the_next_compare(ds_run) -> None:
    """Between steps, flip one byte in four of the kernel pipeline's tensors that no later call
    reads or writes; after the next step exactly those four verdicts fail."""
    stack, trace, kernels, refs, _ = ds_run
    c4, c128 = kernels.layers[1], kernels.layers[2]
    slot = min(kernels.entries[(1, "main")])              # a C4 entry a kernel wrote in step 0
    bs = c4.caches["main"].tensor.shape[1]
    page = c4.caches["main"].tensor.stride(0)
    _flip(c4.caches["main"].tensor, (slot // bs) * page + (slot % bs) * DS_TOKEN_BYTES)
    # Request 0 has finished: its state row of position 0 and its first window page are never read again.
    block = kernels.seq_blocks(0)[c4.state_pools["main"]][0]
    _flip(c4.states["main"], block * c4.states["main"].stride(0) * 4 + 4 * 5)
    window = kernels.layers[0].caches["window"]
    _flip(window.tensor, kernels.seq_blocks(0)[window.pool][0] * window.tensor.stride(0) + 17)
    _flip(c128.caches["main"].tensor, c128.caches["main"].tensor.stride(0) - 1)   # a page tail byte
    last = {c.seq_id: c.seq_len for s in trace for c in s.seqs}
    step = Step(len(trace), "decode", (SeqChunk(1, last[1], 1, False),), 1, True)
    kernels.step(step)
    refs.step(step)
    result = compare(kernels, refs)
    failed = {(v.layer, v.tensor) for v in result.failures()}
    assert failed == {(1, "cache:main"), (1, "state:main"), (0, "cache:window"), (2, "cache:main")}, \
        result.summary()
