"""Class plans (issue 36, deliverable 1): one launch recipe per signature class, its sizes symbols.

* Every op's full path can be traced into a class plan (no family falls back).
* Randomized: after the fast path has warmed, calls of sizes never seen before are served by a
  class plan, and what they return and write equals the full checked path's, byte for byte.
* A class plan's guards are the checks: a call that breaks a relation (a per-token array one short)
  or leaves the region the plan was traced in (``dispatch`` picking another key) is not served,
  and takes the full path (its error, or the other key).
* Nothing is generated under a monitor: a class first seen while a ``JitMonitor`` is armed keeps
  the full path; a plan made before serves under ``error`` without generating code.
"""

from __future__ import annotations

import random

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.family import plans as call_plans
from dsv4kit.jit import JitMonitor, class_plans, launch_plans
from dsv4kit.kernels import families
from dsv4kit.testing.fast_path import class_tables, op_bytes, warm_class_plans
from dsv4kit.testing.valid_calls import sized_call

SPECS = {s.name: s for s in families()}


class _Served:
    """Counts the op calls a class plan served (``serve`` wrapped where the op layer calls it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hits = self.misses = 0
        real = call_plans.serve

        def counted(table, args, kwargs):
            r = real(table, args, kwargs)
            if r is class_plans.MISS:
                self.misses += 1
            else:
                self.hits += 1
            return r

        monkeypatch.setattr(call_plans, "serve", counted)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_op_is_planned_by_class(name: str) -> None:
    spec = SPECS[name]
    warm_class_plans(spec)
    tables = class_tables(spec)
    assert any(t.hot for t in tables), f"{name}: no class plan"
    assert not any(t.failed for t in tables), f"{name}: a class not traced"
    plan = next(t.hot[0] for t in tables if t.hot)
    assert plan.guards and "launch(" in plan.source


@pytest.mark.parametrize("name", sorted(SPECS))
def test_new_sizes_served_by_class_plans_equal_the_full_path(name: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS[name]
    warm_class_plans(spec)
    served = _Served(monkeypatch)
    rng = random.Random(f"class-{name}")
    sizes = rng.sample(range(50, 70), 5)  # sizes other tests do not call: first sights
    for n in sizes:
        assert op_bytes(spec, n, plans=True) == op_bytes(spec, n, plans=False), n
    # served, but for a call in a region not traced yet (then traced) or sizes seen before
    assert served.hits >= 3 and served.misses <= 1, (served.hits, served.misses)


def test_a_broken_relation_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS["store_rows_ds"]
    warm_class_plans(spec)
    served = _Served(monkeypatch)
    call = sized_call(spec, 17)
    short = {**call, "kv_slot_mapping": call["kv_slot_mapping"][:5]}  # T of rows, 5 slots
    with pytest.raises(KernelInputError, match=r"^store_rows_ds: kv_slot_mapping: expected"):
        spec.op(**short, debug_checks=False)
    assert served.misses == 1 and served.hits == 0
    spec.op(**call, debug_checks=False)
    assert served.hits == 1


def test_storages_apart_in_the_trace_must_be_apart() -> None:
    spec = SPECS["store_rows_ds"]
    warm_class_plans(spec)
    plan = next(t.hot[0] for t in class_tables(spec) if t.hot)
    call = {**sized_call(spec, 6), "debug_checks": False}
    assert plan.fn((), call) is not class_plans.MISS
    t = call["rows"].shape[0]
    aliased = {**call, "kv_slot_mapping": call["rows"].view(torch.int64).flatten()[:t]}  # in rows' storage
    storage = call["rows"].untyped_storage().data_ptr()
    assert aliased["kv_slot_mapping"].untyped_storage().data_ptr() == storage
    assert plan.fn((), aliased) is class_plans.MISS


def test_a_call_in_another_region_takes_its_own_key() -> None:
    spec = SPECS["rowquant"]
    kernel = spec.kernel()
    warm_class_plans(spec)
    plan = next(t.hot[0] for t in class_tables(spec) if t.hot)
    assert plan.key.rows_per_program == 1
    assert any("< 512" in g for g in plan.guards), plan.guards  # dispatch's bucket, recorded as a guard
    x = torch.randn(600, 256).to(torch.bfloat16)
    q, s = spec.op(x, debug_checks=False)
    with launch_plans.disabled():
        q0, s0 = kernel(x, debug_checks=False)
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, s0)


def test_no_class_plan_is_made_under_a_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS["dequant_gather"]
    spec.op(**sized_call(spec, 1), debug_checks=False)       # the op's signature class, planned
    for t in class_tables(spec):
        t.clear()
    with JitMonitor("error") as mon:
        for n in (20, 21, 22):  # sizes never seen (dequant_gather's grow from n = 10 on)
            spec.op(**sized_call(spec, n), debug_checks=False)
    assert mon.events == []
    assert not any(t.hot for t in class_tables(spec))
    for n in (23, 24):  # outside, sizes never seen: made on the class's second first sight
        spec.op(**sized_call(spec, n), debug_checks=False)
    assert any(t.hot for t in class_tables(spec))
    served = _Served(monkeypatch)
    with JitMonitor("error") as mon:
        spec.op(**sized_call(spec, 25), debug_checks=False)
    assert mon.events == [] and served.hits == 1


def test_class_plans_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS["rowquant"]
    warm_class_plans(spec)
    served = _Served(monkeypatch)
    before = class_plans.set_enabled(False)
    try:
        spec.op(**sized_call(spec, 31), debug_checks=False)
    finally:
        class_plans.set_enabled(before)
    assert served.hits == 0
    spec.op(**sized_call(spec, 33), debug_checks=False)
    assert served.hits == 1


def test_a_cleared_executor_drops_its_plans() -> None:
    spec = SPECS["store_rows_plain"]
    warm_class_plans(spec)
    call_plan = next(p for p in spec._plans.values() if p.first is not None and p.first.classes.hot)
    table = call_plan.first.classes
    old = table.hot[0]
    assert old.valid()
    type(call_plan.kernel).clear_cache()           # its executor gone: the plan serves nothing
    assert not old.valid()
    for n in (61, 62, 63):                         # new sizes: the full path (compiles again), a new plan
        spec.op(**sized_call(spec, n), debug_checks=False)
    assert table.hot and old not in table.hot and all(p.valid() for p in table.hot)
