"""Helpers for tests of the serving fast path: an op's class plans (:mod:`dsv4kit.jit.class_plans`)."""

from __future__ import annotations

from dsv4kit.family import FamilySpec
from dsv4kit.jit.class_plans import ClassTable
from dsv4kit.testing.valid_calls import sized_call

__all__ = ["class_tables", "warm_class_plans"]


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
