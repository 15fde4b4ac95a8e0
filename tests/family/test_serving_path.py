"""The serving path (issue 36): calls whose sizes change every step, on the CPU.

* Randomized: for random sequences of shapes (repeats included), the planned path's outputs and
  writes equal the full checked path's, byte for byte.
* A call of new sizes whose signature class (dtypes, devices, scalar types) the op planned is
  found by the class's guard: no call signature is computed; on a first sight of its sizes the
  kernel's record is built from the call's values in one pass (no keywords, no plan lookup), as a
  record whose table checks the plan proved.
* After a call that passes no hot guard, the next asks its size sight first (a cycle or new
  shapes do not pay every hot guard again); a repeat of the plan served before turns them back on.
* Nothing is generated per call: after warmup, calls of shapes never seen before generate no
  Python code (``JitMonitor("error")`` counts host code like a kernel compile); the monitor does see code
  generated under an op call (the check can fail). The launched serving replay is in
  ``tests/model/test_serving_replay.py``.
* The messages a user meets: an error raised below the op names the op; numpy integers are ints;
  ``backend="cutedsl"`` with CPU tensors names ``backend``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.jit import JitMonitor, class_plans, launch_plans
from dsv4kit.jit.monitor import HostCodegenError
from dsv4kit.kernels import families
from dsv4kit.testing.fast_path import as_bytes, op_bytes
from dsv4kit.testing.valid_calls import sized_call

SPECS = {s.name: s for s in families()}
#: One op per argument shape family: outputs allocated (rowquant, K1/K2), a gather into ``out``
#: (K3), cache writers (store hooks, K4), the compressor (K5).
RANDOMIZED = ("rowquant", "indexer_q", "dequant_gather", "store_rows_ds", "save_partial_states",
              "c4_compress_ds_mla")


@pytest.mark.parametrize("name", RANDOMIZED)
def test_planned_calls_equal_the_full_path_over_random_shapes(name: str) -> None:
    spec = SPECS[name]
    rng = random.Random(f"serving-{name}")
    sizes = [rng.choice((1, 2, 3, 5, 8)) for _ in range(7)]   # repeats: hot guards, lookups and new plans
    launches_before = len(spec._launches)
    for n in sizes:
        assert op_bytes(spec, n, plans=True) == op_bytes(spec, n, plans=False), n
    assert len(spec._launches) > launches_before   # the planned path was taken, not only the full one


@pytest.mark.parametrize("name", ("rowquant", "dequant_gather"))
def test_new_shapes_after_warmup_generate_no_host_code(name: str) -> None:
    spec = SPECS[name]
    for n in (1, 2):                                   # warm the keys and the fast path
        spec.op(**sized_call(spec, n), debug_checks=False)
    calls = [sized_call(spec, n) for n in (3, 4, 6, 7)]  # shapes not seen before, keys warm
    with JitMonitor("error") as mon:
        for call in calls:
            spec.op(**call, debug_checks=False)
            spec.op(**call, debug_checks=False)       # seen once: planned at both layers
    assert mon.events == []


def test_code_generated_under_an_op_call_is_a_host_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS["rowquant"]
    kernel = spec.kernel()
    real = type(kernel).launch_args

    def generating(self, *args):  # a launcher that builds code per call: what must never ship
        exec("pass", {})  # noqa: S102
        return real(self, *args)

    monkeypatch.setattr(type(kernel), "launch_args", generating)
    monkeypatch.setitem(class_plans._ON, "on", False)  # a class plan made earlier would skip launch_args
    call = sized_call(spec, 9)
    with JitMonitor("error") as mon, pytest.raises(HostCodegenError, match="host: Python code generated"):
        spec.op(**call, debug_checks=False)
    assert [e.kernel for e in mon.events] == ["host"]
    exec("pass", {})  # noqa: S102 - outside an op call: not reported
    with JitMonitor("warn") as quiet:
        exec("pass", {})  # noqa: S102
    assert quiet.events == []


def test_an_error_below_the_op_names_the_op() -> None:
    spec = SPECS["store_rows_ds"]
    call = sized_call(spec, 4)
    short = {**call, "kv_slot_mapping": call["kv_slot_mapping"][:2]}   # checked by the kernel, not the table
    for _ in range(2):                                   # cold, then with the op planned
        with pytest.raises(KernelInputError) as exc:
            spec.op(**short, debug_checks=False)
        assert str(exc.value).startswith("store_rows_ds: kv_slot_mapping: expected"), str(exc.value)
        assert exc.value.kernel == "StoreRowsDsTriton"
        spec.op(**call, debug_checks=False)


@pytest.mark.parametrize("name", ("dequant_gather", "save_partial_states"))
def test_numpy_integers_are_ints(name: str) -> None:
    spec = SPECS[name]
    ints = [k for k, v in sized_call(spec, 2).items() if type(v) is int]
    assert ints

    def written(fn, numpy: bool) -> list[bytes]:  # what the call returns and writes, from a fresh call
        call = {k: (np.int64(v) if numpy and k in ints else v) for k, v in sized_call(spec, 2).items()}
        return as_bytes(fn(**call, debug_checks=False)) + [b for v in call.values() for b in as_bytes(v)]

    want = written(spec.op, numpy=False)
    assert written(spec.op, numpy=True) == want
    assert written(spec.kernel(), numpy=True) == want


def test_cutedsl_with_cpu_tensors_names_backend() -> None:
    spec = SPECS["rowquant"]
    with pytest.raises(KernelInputError, match=r"^rowquant: backend: expected .*warmup --device cuda"):
        spec.op(**sized_call(spec, 2), backend="cutedsl")


def test_a_signature_is_planned_on_its_second_call() -> None:
    spec = SPECS["rowquant"]
    kernel = spec.kernel()
    call = sized_call(spec, 11)
    spec.op(**call, debug_checks=False)
    planned = len(launch_plans.plans_of(kernel))
    spec.op(**call, debug_checks=False)                     # the second call plans both layers
    assert len(launch_plans.plans_of(kernel)) == planned + 1
    hot = spec._launches.hot[0][1]
    assert hot((), {**call, "debug_checks": False}) is not None   # the third call takes the hot guard
    before = launch_plans.set_plan_after(1)
    try:
        spec.op(**sized_call(spec, 12), debug_checks=False)  # planned on sight
        assert len(launch_plans.plans_of(kernel)) == planned + 2
    finally:
        launch_plans.set_plan_after(before)
    with pytest.raises(ValueError, match="calls: expected an int >= 1"):
        launch_plans.set_plan_after(0)


def _no_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: object) -> object:
        raise AssertionError("a signature was computed")

    monkeypatch.setattr("dsv4kit.family.spec.launch_signature", refused)
    monkeypatch.setattr("dsv4kit.jit.launcher.launch_signature", refused)


@pytest.mark.parametrize("how", ("op", "kernel"))
def test_a_first_sight_computes_no_signature(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    spec = SPECS["rowquant"]
    fn = spec.op if how == "op" else spec.kernel()
    fn(torch.zeros(1, 512, dtype=torch.bfloat16), debug_checks=False)   # the key warm
    rows = 211 if how == "op" else 223                   # sizes no other test calls
    call = {"x": torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).bfloat16()}
    with monkeypatch.context() as m:
        _no_signature(m)
        got = as_bytes(fn(**call, debug_checks=False))
    with launch_plans.disabled():
        assert got == as_bytes(fn(**call, debug_checks=False))
    _no_signature(monkeypatch)
    with pytest.raises(AssertionError, match="signature was computed"):
        fn(**call, debug_checks=False)                   # its second call: signature computed, planned


@pytest.mark.parametrize("how", ("op", "kernel"))
def test_a_cycle_of_planned_sizes_longer_than_hot_computes_no_signature(
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    spec = SPECS["rowquant"]
    fn = spec.op if how == "op" else spec.kernel()
    sizes = range(20, 20 + 3 * launch_plans.HOT)        # more shapes than hot entries
    for n in (*sizes, *sizes):                          # seen twice: planned
        fn(**sized_call(spec, n), debug_checks=False)
    with launch_plans.disabled():
        want = [as_bytes(fn(**sized_call(spec, n), debug_checks=False)) for n in sizes]
    _no_signature(monkeypatch)
    for _ in range(2):
        assert [as_bytes(fn(**sized_call(spec, n), debug_checks=False)) for n in sizes] == want


@pytest.mark.parametrize("name", ("c4_compress_ds_mla", "dequant_gather"))
def test_new_sizes_of_a_planned_class_compute_no_call_signature(monkeypatch: pytest.MonkeyPatch,
                                                               name: str) -> None:
    spec = SPECS[name]
    spec.op(**sized_call(spec, 2), debug_checks=False)   # the class planned at the op layer
    with launch_plans.disabled():
        want = [op_bytes(spec, n, plans=False) for n in (9, 13)]

    def refused(*_: object) -> object:
        raise AssertionError("a call signature was computed")

    monkeypatch.setattr("dsv4kit.family.spec.call_signature", refused)
    assert [op_bytes(spec, n, plans=True) for n in (9, 13)] == want   # found by the hot class guard
    with pytest.raises(AssertionError, match="call signature was computed"):
        spec.op(**sized_call(spec, 9), debug_checks=True)  # another class: its signature is computed


@pytest.mark.parametrize("name", ("dequant_gather", "indexer_q"))
def test_a_first_sight_builds_the_kernel_record_without_keywords(monkeypatch: pytest.MonkeyPatch,
                                                                 name: str) -> None:
    spec = SPECS[name]
    call = sized_call(spec, 2)
    spec.op(**call, debug_checks=False)                  # the class planned at the op layer
    want = op_bytes(spec, 19, plans=False)
    defaults = {a.name: a.default for a in spec.args}
    variant = [call.get(spec.variant_arg, defaults[spec.variant_arg])] if spec.variant_arg else []
    record = type(spec.kernel(*variant)).__call__.record

    def refused(*_: object, **__: object) -> object:
        raise AssertionError("the record was bound by keyword")

    monkeypatch.setattr(record, "__new__", refused)
    assert op_bytes(spec, 19, plans=True) == want            # a first sight: the record in one pass
    with pytest.raises(AssertionError, match="bound by keyword"):
        op_bytes(spec, 19, plans=True)                        # its second call is planned through __call__


def test_a_proved_record_is_checked_again_once_changed() -> None:
    record = type(SPECS["rowquant"].kernel()).__call__.record
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    proved = tuple.__new__(record._proved, (x,))            # what a first sight builds
    assert proved.checked("rowquant") is proved              # the plan's guard proved the table
    changed = proved._replace(x=x.float())
    assert type(changed) is record                           # a plain record again
    with pytest.raises(KernelInputError, match="rowquant: x: expected dtype bfloat16, got float32"):
        changed.checked("rowquant")


def test_a_planned_size_sight_serves_only_its_own_signature() -> None:
    spec = SPECS["rowquant"]
    call = sized_call(spec, 6)
    x = call["x"]
    wide = torch.zeros(x.shape[0], x.shape[1] + 128, dtype=x.dtype)
    wide[:, : x.shape[1]] = x
    strided = wide[:, : x.shape[1]]                      # the same sizes, another row stride
    for _ in range(2):
        spec.op(x, debug_checks=False)                   # planned under these sizes
    with launch_plans.disabled():
        want = as_bytes(spec.op(strided, debug_checks=False))
    for _ in range(3):                                   # first sight of its signature, then planned
        assert as_bytes(spec.op(strided, debug_checks=False)) == want
    with pytest.raises(KernelInputError, match="rowquant: x: expected"):
        spec.op(x.float(), debug_checks=False)           # the same sizes, a bad dtype: still named


@pytest.mark.parametrize("how", ("op", "kernel"))
def test_after_a_hot_miss_the_next_call_asks_its_size_sight_first(how: str) -> None:
    spec = SPECS["rowquant"]
    fn = spec.op if how == "op" else spec.kernel()
    table = spec._launches if how == "op" else launch_plans.plans_of(fn)
    table.clear()
    for n in (21, 22, 21, 22, 21):                       # both sizes planned, each call a hot miss
        fn(**sized_call(spec, n), debug_checks=False)
    assert table.missed
    fn(**sized_call(spec, 21), debug_checks=False)       # the plan served before, again
    assert not table.missed and table.hot
    fn(**sized_call(spec, 23), debug_checks=False)       # new sizes: every hot guard fails
    assert table.missed

    def tried(*_: object) -> object:
        raise AssertionError("a hot guard was tried")

    table.hot = tuple((plan, tried) for plan, _ in table.hot)
    try:
        with launch_plans.disabled():
            want = as_bytes(fn(**sized_call(spec, 22), debug_checks=False))
        assert as_bytes(fn(**sized_call(spec, 22), debug_checks=False)) == want   # by its size sight
        assert table.missed                              # another plan than the one served before
        assert as_bytes(fn(**sized_call(spec, 22), debug_checks=False)) == want   # the same plan again:
        assert not table.missed                          # the hot guards go first again
        assert as_bytes(fn(**sized_call(spec, 22), debug_checks=False)) == want   # served by hot[0]
        with pytest.raises(AssertionError, match="hot guard was tried"):
            fn(**sized_call(spec, 24), debug_checks=False)   # a miss of hot[0] tries the others
    finally:
        table.clear()                                    # no refusing guard left for later tests
