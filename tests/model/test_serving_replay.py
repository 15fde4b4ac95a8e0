"""Issue 36, deliverable 5: a serving trace whose sizes change every step, launched through the
public ops (Triton interpreter) under ``JitMonitor("error")``, compiles nothing after warmup:
no kernel key and no host code (the monitor counts Python generated under an op call)."""

from __future__ import annotations

from model_helpers import TINY, build, warm

from dsv4kit.jit import KeyLedger
from dsv4kit.kernels import families
from dsv4kit.model.trace import make_trace, replay


def test_a_launched_serving_replay_with_varying_sizes_compiles_nothing() -> None:
    stack, registry = build(TINY, block_size=16, max_num_batched_tokens=24, max_num_seqs=4, max_model_len=96)
    ledger = warm(stack, registry)
    trace = make_trace("all", stack, steps=6, seed=5)
    assert len(set(trace.token_counts())) > 2           # the sizes change from step to step
    launched = KeyLedger()
    launched.warmed = ledger.warmed
    result = replay(stack, trace, ledger=launched, launch=True, mode="error")
    assert result.ok and result.compile_events == []
    planned = [spec.op_name for spec in families() if spec._launches.hot]
    assert len(planned) >= 5, planned   # the replay went through the fast path (op launches, hot)


