"""Helpers for tests of the serving fast path: an op's class plans (:mod:`dsv4kit.jit.class_plans`)."""

from __future__ import annotations

import torch

from dsv4kit.family import FamilySpec
from dsv4kit.jit import launch_plans
from dsv4kit.jit.class_plans import ClassTable
from dsv4kit.testing.valid_calls import sized_call

__all__ = ["as_bytes", "class_tables", "op_bytes", "warm_class_plans"]


def as_bytes(value: object) -> list[bytes]:
    """Every tensor in ``value`` (a tensor or a tuple of them, on any device) as raw bytes."""
    items = value if isinstance(value, tuple) else (value,)
    return [t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
            for t in items if isinstance(t, torch.Tensor)]


def op_bytes(spec: FamilySpec, n: int, plans: bool) -> list[bytes]:
    """``spec``'s op at size ``n`` (a fresh, seeded call; value checks off): what it returns and every
    tensor it was given, after the call (the caches it writes in place). ``plans`` false: launch plans
    and class plans off, so the kernel's full checked path runs."""
    call = sized_call(spec, n)
    before = launch_plans.set_enabled(plans)
    try:
        out = spec.op(**call, debug_checks=False)
    finally:
        launch_plans.set_enabled(before)
    return as_bytes(out) + [b for v in call.values() for b in as_bytes(v)]


def class_tables(spec: FamilySpec) -> list[ClassTable]:
    """The class plan tables of ``spec``'s op (one per call plan: a signature class of the op)."""
    return [p.first.classes for p in spec._plans.values() if p.first is not None]


def warm_class_plans(spec: FamilySpec) -> None:
    """Call ``spec``'s op (value checks off) until it keeps a hot class plan: one is made on a
    class's second first sight of new sizes, and earlier calls in the process may have used the
    small sizes already."""
    for n in (1, 1, *range(43, 49)):
        if any(t.hot for t in class_tables(spec)):
            return
        spec.op(**sized_call(spec, n), debug_checks=False)
    assert any(t.hot for t in class_tables(spec)), f"{spec.op_name}: no class plan"
