"""Dynamic shapes (issue 37): a 50-step serving trace of varying T through one compiled op.

rowquant stands for any op (cheap under the interpreter): T is marked dynamic, each step's T comes
from a seeded serving trace (prefill chunks and padded decode sizes), the monitor is in ``error``
mode after warmup. Dynamo compiles once for T = 1 (specialized) and once for every other T; no
kernel compiles after warmup (a miss would raise).
"""

from __future__ import annotations

import dataclasses

import torch

import dsv4kit.ops
from dsv4kit.jit import JitMonitor, WarmupRegistry
from dsv4kit.kernels import family
from dsv4kit.kernels.rowquant.spec import RowQuantConfig
from dsv4kit.model.drills import build
from dsv4kit.model.presets import DSV4_FLASH
from dsv4kit.model.trace import make_trace

WIDTH, MAX_T, STEPS = 128, 16, 50


def _trace_sizes() -> list[int]:
    preset = dataclasses.replace(DSV4_FLASH, name="tiny1", num_layers=1, compress_ratios=(4,))
    stack, _ = build(preset, max_num_batched_tokens=MAX_T, max_num_seqs=8)
    sizes = [s.padded_tokens for s in make_trace("all", stack, steps=STEPS, seed=5)]
    return sizes[:: max(1, len(sizes) // STEPS)][:STEPS]  # every phase (decode, prefill, mixed)


def test_a_serving_trace_recompiles_only_for_the_first_shapes() -> None:
    sizes = _trace_sizes()
    assert len(sizes) >= STEPS and len(set(sizes)) >= 8 and 1 in sizes
    registry = WarmupRegistry()
    with registry.activate():
        family("rowquant").register(RowQuantConfig(widths=(WIDTH,), max_tokens=MAX_T))
    assert registry.warmup(progress=False).ok
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(lambda x: dsv4kit.ops.rowquant(x), fullgraph=True, backend="aot_eager")
    graphs_after = []
    g = torch.Generator().manual_seed(0)
    with JitMonitor("error") as monitor:
        for t in sizes:
            x = torch.randn((t, WIDTH), generator=g).to(torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            got = compiled(x)
            want = dsv4kit.ops.rowquant(x)
            assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype.itemsize == 1
                       else torch.equal(a, b) for a, b in zip(got, want, strict=True))
            graphs_after.append(counters["stats"]["unique_graphs"])
    assert monitor.events == []
    # One graph for T = 1 (torch specializes size 1) and one for every other T: after both met, none.
    assert graphs_after[-1] == 2
    settled = max(sizes.index(1), next(i for i, t in enumerate(sizes) if t != 1))
    assert graphs_after[settled:] == [2] * (len(sizes) - settled)
