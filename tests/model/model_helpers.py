"""Helpers for the model-level tests: a small preset, build, warm, warm-then-replay."""

from __future__ import annotations

import dataclasses

from dsv4kit.model.drills import build, warm  # noqa: F401 - the tests import them from here
from dsv4kit.model.presets import DSV4_FLASH
from dsv4kit.model.trace import coverage_report, make_trace, replay

#: Four layers (SWA, C4, C128, C4) and a 4096-row RoPE cache: small enough to launch under the
#: Triton interpreter, same kernels and keys as DSv4-Flash.
TINY = dataclasses.replace(
    DSV4_FLASH, name="tiny", num_layers=4, compress_ratios=(0, 4, 128, 4),
    compress_rope=dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096),
)


def warm_and_replay(stack, registry, kind="all", steps=12, seed=0, runtime=None):
    """Warm ``registry``, replay a trace of ``runtime`` (default: ``stack``); the coverage report."""
    ledger = warm(stack, registry)
    rt = runtime or stack
    result = replay(rt, make_trace(kind, rt, steps=steps, seed=seed), ledger=ledger)
    warmed = {r.kernel.name: r.kernel for r in registry.registrations.values()}
    return coverage_report(rt, ledger, result, warmed)
