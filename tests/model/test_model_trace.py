"""Serving traces and their replay: invariants, the op's own dispatch, the monitor in error mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_helpers import TINY, build, warm

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.jit import KeyLedger
from dsv4kit.kernels.c4_compress.spec import C4CompressPlainBase, IndexerCompressBase
from dsv4kit.kernels.c128_compress.spec import C128StoreDsMlaBase
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.indexer_q import COARSEN_AT
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.save_partial_states.spec import SavePartialStatesBase
from dsv4kit.model.stack import DSv4AttentionStack
from dsv4kit.model.trace import (
    SeqChunk,
    ServingTrace,
    Step,
    TraceLimits,
    coverage_report,
    edge_counts,
    make_trace,
    replay,
)

IQ = IndexerQBase.CompileKey
K3 = DequantGatherBase.CompileKey
LIMITS = TraceLimits(8192, 256, 2**20, DSv4AttentionStack("flash", "sm_90a").cuda_graph_sizes())


# --------------------------------------------------------------------------- generation


def test_edge_counts() -> None:
    assert edge_counts(1) == [1]
    assert edge_counts(8) == [1, 8, 2, 3, 4, 5, 7]
    e = edge_counts(8192)
    assert e[:2] == [1, 8192] and {511, 512, 513, 8191} <= set(e) and max(e) == 8192
    assert edge_counts(600)[:2] == [1, 600] and 513 in edge_counts(600) and max(edge_counts(600)) == 600


@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed", "all"])
def test_trace_invariants(kind) -> None:
    trace = make_trace(kind, LIMITS, steps=40, seed=3)
    trace.check(LIMITS)   # every step is one a scheduler with these limits could emit
    phases = trace.phases()
    assert set(phases) == {"decode": {"capture", "decode"}, "prefill": {"prefill"}, "mixed": {"mixed"},
                           "all": {"capture", "decode", "prefill", "mixed"}}[kind]
    for s in trace:
        assert s.num_tokens <= s.padded_tokens <= LIMITS.max_num_batched_tokens
        assert len(s.seqs) <= LIMITS.max_num_seqs
        assert all(c.seq_len <= LIMITS.max_model_len for c in s.seqs)
        pos = s.positions()
        assert pos.shape == (s.padded_tokens,) and pos.dtype == torch.int64
        slots = s.slot_mapping()
        assert int((slots == -1).sum()) == s.num_padding          # padding entries carry slot -1
        if s.phase in ("decode", "capture"):
            assert not s.prefill_chunks and all(c.num_tokens == 1 for c in s.seqs)
        if s.phase == "prefill":
            assert all(c.prefill for c in s.seqs)
        if s.phase == "mixed":
            assert s.prefill_chunks and any(not c.prefill for c in s.seqs) and not s.cuda_graph
    if kind in ("decode", "all"):
        capture = [s.padded_tokens for s in trace if s.phase == "capture"]
        assert capture == list(LIMITS.cuda_graph_sizes)
        decode = [s for s in trace if s.phase == "decode"]
        assert {1, 256} <= {s.num_tokens for s in decode}
        padded = [s for s in decode if s.num_padding > 0]
        assert padded and all(s.cuda_graph and s.padded_tokens in LIMITS.cuda_graph_sizes for s in padded)
        assert max(c.seq_len for s in decode for c in s.seqs) == LIMITS.max_model_len   # long contexts
    if kind in ("prefill", "all"):
        prefill = [s.num_tokens for s in trace if s.phase == "prefill"]
        assert {1, COARSEN_AT - 1, COARSEN_AT, COARSEN_AT + 1, 8192} <= set(prefill)
        chunks = [c for s in trace if s.phase == "prefill" for c in s.seqs]
        assert any(c.context_len > 0 and c.num_tokens > 1 for c in chunks)       # chunked prefill
        assert any(c.seq_len == LIMITS.max_model_len for c in chunks)            # ends at the max length


def test_trace_is_seeded() -> None:
    a, b = make_trace("all", LIMITS, steps=10, seed=7), make_trace("all", LIMITS, steps=10, seed=7)
    assert a.to_json() == b.to_json()
    assert make_trace("all", LIMITS, steps=10, seed=8).to_json() != a.to_json()
    back = ServingTrace.from_json(a.to_json())
    assert back.steps == a.steps and back.limits == a.limits


def test_no_cuda_graphs_means_no_padding() -> None:
    lim = TraceLimits(8192, 256, 2**20, ())
    trace = make_trace("decode", lim, steps=20)
    assert "capture" not in trace.phases()
    assert all(s.num_padding == 0 and not s.cuda_graph for s in trace)


@pytest.mark.parametrize("kwargs,arg", [
    (dict(kind="burst"), "kind"),
    (dict(steps=0), "steps"),
    (dict(max_context=2**20 + 1), "max_context"),
    (dict(max_context=1), "max_context"),
])
def test_bad_trace_arguments(kwargs, arg) -> None:
    kind = kwargs.pop("kind", "all")
    with pytest.raises(KernelInputError, match=f"make_trace: {arg}: expected"):
        make_trace(kind, LIMITS, **kwargs)


def test_mixed_needs_two_sequences() -> None:
    with pytest.raises(KernelInputError, match="mixed batches need max_num_seqs >= 2"):
        make_trace("mixed", TraceLimits(16, 1, 100, (1,)))
    assert "mixed" not in make_trace("all", TraceLimits(16, 1, 100, (1,)), steps=3).phases()


def test_check_rejects_what_a_scheduler_cannot_emit() -> None:
    small = TraceLimits(16, 4, 100, (1, 2, 4))
    bad = [
        Step(0, "prefill", (SeqChunk(0, 95, 10, True),), 10),           # past max_model_len
        Step(0, "prefill", (SeqChunk(0, 0, 17, True),), 17),            # over the token budget
        Step(0, "decode", tuple(SeqChunk(i, 1, 1, False) for i in range(5)), 5),  # too many sequences
        Step(0, "decode", (SeqChunk(0, 1, 2, False),), 2),              # decode of 2 tokens
        Step(0, "decode", (SeqChunk(0, 1, 1, False),), 3, cuda_graph=True),        # no graph of size 3
    ]
    for step in bad:
        with pytest.raises(KernelInputError):
            ServingTrace([step], "custom", 0, small, 100).check(small)


def test_replay_rejects_a_trace_longer_than_the_model() -> None:
    stack = DSv4AttentionStack("flash", "sm_90a", max_model_len=4096)
    trace = make_trace("decode", LIMITS, steps=4)     # contexts up to 2**20
    with pytest.raises(KernelInputError, match="max_model_len"):
        replay(stack, trace)


# --------------------------------------------------------------------------- replay = the op's keys


def test_dispatch_on_stand_ins_equals_dispatch_on_real_tensors() -> None:
    """Every call site's Like stand-ins and the real tensors built from the same spec give one key."""
    stack, _ = build(TINY, block_size=16, max_num_batched_tokens=600, max_num_seqs=4, max_model_len=4096)
    trace = make_trace("all", stack, steps=6, seed=5)
    pools: dict = {}
    seen = set()
    for step in trace:
        for layer in stack.layers:
            for call in stack.calls(layer, step):
                real = call.real_args(torch.device("cpu"), pools)
                assert call.key() == call.family.dispatch(call.kernel, real)
                seen.add((call.site, call.key()))
    assert {site for site, _ in seen} == {"indexer_q", "gather_window", "gather_compressed_c4",
                                          "gather_compressed_c128", "save_main_state", "save_indexer_state",
                                          "compress_main", "compress_indexer", "store_main"}


def test_replay_matches_real_launches_under_the_interpreter() -> None:
    """Launching the public ops (Triton interpreter) requests exactly the keys the dispatch replay
    derives, call for call: the replay goes through the ops' own dispatch."""
    stack, registry = build(TINY, block_size=16, max_num_batched_tokens=24, max_num_seqs=4, max_model_len=96)
    by_dispatch, by_launch = KeyLedger(), KeyLedger()
    warm(stack, registry, by_dispatch)
    by_launch.warmed = {k: dict(v) for k, v in by_dispatch.warmed.items()}
    trace = make_trace("all", stack, steps=3, seed=2)
    a = replay(stack, trace, ledger=by_dispatch)
    b = replay(stack, trace, ledger=by_launch, launch=True)
    assert a.ok and b.ok and b.launch
    assert by_dispatch.requested == by_launch.requested
    assert sum(by_launch.requested["DequantGatherTriton"].values()) > 0


def test_coarsen_4_launch_matches_dispatch() -> None:
    """One 512-token step: the coarsen switch (trap 2) seen by a real launch and by the replay."""
    one_c4 = dataclasses.replace(TINY, num_layers=1, compress_ratios=(4,))
    stack, registry = build(one_c4, cache_dtype="bf16", max_num_batched_tokens=512, max_num_seqs=4,
                            max_model_len=1024)
    ledger = warm(stack, registry)
    step = Step(0, "prefill", (SeqChunk(0, 0, COARSEN_AT, True),), COARSEN_AT)
    trace = ServingTrace([step], "custom", 0, TraceLimits.of(stack), 1024)
    launched = KeyLedger()
    launched.warmed = ledger.warmed
    assert replay(stack, trace, ledger=ledger).ok and replay(stack, trace, ledger=launched, launch=True).ok
    k4 = SavePartialStatesBase.CompileKey
    assert ledger.requested == launched.requested == {
        "IndexerQFp8Triton": {IQ(cos_sin_dtype="float32", coarsen=4): 1},
        "SavePartialStatesTriton": {k4(1024, 4, 4): 1, k4(256, 4, 4): 1},   # main and indexer state
        "C4CompressPlainTriton": {C4CompressPlainBase.CompileKey(store_full_fp8=False,
                                                                 norm_weight_dtype="bfloat16"): 1},
        "IndexerCompressTriton": {IndexerCompressBase.CompileKey(
            use_fp4_cache=False, norm_weight_dtype="bfloat16", quant_block=128, token_stride=128): 1}}


# --------------------------------------------------------------------------- the monitor


def test_cos_sin_warmed_in_the_model_dtype_is_caught() -> None:
    """Trap 1 as a misconfiguration: warmup covers bf16 only, the runtime cache is fp32."""
    stack, registry = build(warmup_cos_sin_dtypes=("bfloat16",))
    warm(stack, registry)
    with pytest.raises(UnwarmedKeyError) as info:
        replay(stack, make_trace("decode", stack, steps=2), stop_on_miss=True)
    err = info.value
    assert err.kernel == "IndexerQFp8Triton"
    assert err.diff == {"cos_sin_dtype": ("bfloat16", "float32")}


def test_block_size_mismatch_is_caught_and_reported() -> None:
    """Traps 4 and 10: warmup with B = 64, runtime B = 256; every K3 key misses, and K8a's page
    geometry (1 entry of 1152 bytes vs 2 of 1728), fields named."""
    warm_stack, registry = build(block_size=64)
    runtime = DSv4AttentionStack("flash", "sm_90a")
    ledger = warm(warm_stack, registry)
    result = replay(runtime, make_trace("prefill", runtime, steps=4), ledger=ledger)
    assert not result.ok and result.misses
    assert {e.kernel for e in result.misses} == {"DequantGatherTriton", "C128StoreDsMlaTriton"}
    cov = coverage_report(runtime, ledger, result, warm_stack.kernels())
    missed = {m.key: m for m in cov.missed}
    k8a = C128StoreDsMlaBase.CompileKey(norm_weight_dtype="bfloat16", kv_cache_block_size=2,
                                        kv_block_stride=1728)
    assert set(missed) == {K3(256, True), K3(64, False), K3(2, False), k8a}
    assert missed[K3(256, True)].diff == {"block_size": (64, 256)}
    assert missed[k8a].diff == {"kv_cache_block_size": (1, 2), "kv_block_stride": (1152, 1728)}
    assert "not a warmup key of this runtime configuration" in cov.dead_reasons()[("DequantGatherTriton",
                                                                                  K3(64, True))]
    assert "coverage FAILED: 4 missed key(s)" in cov.summary()


def test_warn_mode_counts_without_raising() -> None:
    stack, registry = build(warmup_cos_sin_dtypes=("bfloat16",))
    warm(stack, registry)
    result = replay(stack, make_trace("decode", stack, steps=2), mode="warn")
    assert not result.misses and result.compile_events     # logged, compiled, not raised
    assert not result.ok


def test_gpu_replay_script_cpu_smoke(tmp_path) -> None:
    """benchmarks/replay_gpu.py runs end to end (4-layer model, Triton interpreter) and reports."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(repo / "benchmarks" / "replay_gpu.py"), "--out", str(tmp_path),
                          "--cpu-smoke", "--quick"], capture_output=True, text=True, cwd=repo)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    (r,) = report["results"]
    assert r["ok"] and r["dispatch_replay_matches_launch"] and r["missed"] == [] and r["monitor_events"] == []
    assert r["triton_runtime_compiles"] == 0 and sum(r["calls"].values()) > 0
    assert "| flash-default | yes |" in (tmp_path / "report.md").read_text()
