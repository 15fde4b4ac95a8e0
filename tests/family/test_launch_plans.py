"""Kernel launch plans (dsv4kit.jit.launch_plans) change nothing a caller sees.

Every op's kernel, with its valid call planned: a planned call writes and returns the same bytes
as the full path; every bad call of the bad-input matrix ends as the full path ends it (the same
exception type and message, or the same outputs); a signature change never reuses a plan; a
cleared executor cache drops the plan, so the monitor still sees the miss; value checks on take
no plan. Triton under the CPU interpreter here; the direct GPU launcher has its own GPU check
(``benchmarks/launch_plans_gpu_check.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_bad_input_matrix import CASES, SCALAR_CASES
from test_call_plans import _outcome

from dsv4kit.errors import UnwarmedKeyError
from dsv4kit.family import FamilySpec
from dsv4kit.jit import JitMonitor, launch_plans
from dsv4kit.jit.launch_plans import LaunchPlan, launch_signature, plans_of
from dsv4kit.kernels import families
from dsv4kit.testing.valid_calls import twin, valid_call

SPECS = {spec.name: spec for spec in families()}
OFF = {"debug_checks": False, "backend": "triton"}


pytestmark = pytest.mark.usefixtures("plan_on_sight")  # these tests are about the plans themselves


def _kernels(spec: FamilySpec) -> list[Any]:
    return list(spec._kernels.values())


def _plans(spec: FamilySpec) -> int:
    return sum(len(plans_of(k)) for k in _kernels(spec))


def _clear(spec: FamilySpec) -> None:
    """Drop the kernels' launch plans, and the op launches that hold them (else an op launch of an
    earlier test serves the call and the kernel makes no plan)."""
    spec._launches.clear()
    for k in _kernels(spec):
        plans_of(k).clear()


@pytest.fixture
def hits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the kernels whose plan ran, in call order."""
    seen: list[str] = []
    run = LaunchPlan.__call__

    def counted(self: LaunchPlan, tensors: list[torch.Tensor]) -> Any:
        seen.append(self.kernel_name)
        return run(self, tensors)

    monkeypatch.setattr(LaunchPlan, "__call__", counted)
    return seen


@pytest.fixture(scope="module")
def planned() -> dict[str, FamilySpec]:
    """Every op's kernel with the plan of its valid call (value checks off) in place."""
    for spec in SPECS.values():
        _clear(spec)
        spec.op(**valid_call(spec, with_defaults=True), **OFF)
        assert _plans(spec) == 1, spec.name
    return SPECS


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_planned_call_writes_and_returns_what_the_full_path_does(planned: dict, hits: list[str],
                                                                   name: str) -> None:
    spec = planned[name]
    call = {**valid_call(spec, with_defaults=True), **OFF}
    with launch_plans.disabled():
        full = _outcome(spec.op, call)
    assert not hits
    assert _outcome(spec.op, call) == full      # plans the twins' signature (their storages are apart)
    assert _outcome(spec.op, call) == full
    assert hits, "the second twin call (same signature, fresh memory) took the plan"
    assert full[0] == "returned"


ALL = [(s, a, k, b) for s, a, k, b in CASES + SCALAR_CASES]


@pytest.mark.parametrize("spec, arg, kind, bad", ALL, ids=[f"{s.name}-{a}-{k}" for s, a, k, _ in ALL])
def test_a_planned_kernel_ends_every_bad_call_as_the_full_path_does(planned: dict, spec: FamilySpec, arg: str,
                                                                    kind: str, bad: object) -> None:
    spec = planned[spec.name]
    call = {**valid_call(spec, with_defaults=True), arg: bad, **OFF}
    planned_outcome = _outcome(spec.op, call)
    with launch_plans.disabled():
        assert planned_outcome == _outcome(spec.op, call)
    if planned_outcome[0] == "raised":
        assert planned_outcome[1][0] == "KernelInputError", planned_outcome


def test_value_checks_on_take_no_plan(hits: list[str]) -> None:
    spec = SPECS["dequant_gather"]
    call = valid_call(spec)
    _clear(spec)
    spec.op(**call, backend="triton")                      # the CPU default: value checks on
    spec.op(**call, backend="triton", debug_checks=True)
    assert _plans(spec) == 0
    spec.op(**call, backend="triton", debug_checks=False)
    spec.op(**call, backend="triton", debug_checks=False)
    assert _plans(spec) == 1 and len(hits) == 1


def test_a_cleared_cache_drops_the_plan_and_the_monitor_sees_the_miss(hits: list[str]) -> None:
    spec = SPECS["rowquant"]
    call = {**valid_call(spec), **OFF}
    _clear(spec)
    spec.op(**call)
    assert _plans(spec) == 1
    kernel = _kernels(spec)[0]
    key = next(iter(plans_of(kernel).values())).key
    type(kernel).clear_cache()
    try:
        with JitMonitor(mode="error"), pytest.raises(UnwarmedKeyError):
            spec.op(**call)
        assert not hits and _plans(spec) == 0
    finally:
        kernel.warmup(keys=[key])
    spec.op(**call)
    spec.op(**call)
    assert len(hits) == 1


def _sig(*args: Any, **kwargs: Any) -> Any:
    described = launch_signature(args, kwargs)
    return None if described is None else described[0]


def test_signatures_tell_apart_what_the_kernel_checks() -> None:
    buf = torch.zeros(64, 8)
    x, y = buf[:8], buf[8:16]
    base = _sig(x, y, 3, flag=True)
    other = twin(buf)                                   # CPU allocations are 64-byte aligned
    assert base == _sig(other[:8], other[8:16], 3, flag=True)
    assert base != _sig(x, twin(y), 3, flag=True), "sharing a storage or not"
    assert base != _sig(buf[1:9], y, 3, flag=True), "storage offset and address class"
    assert base != _sig(x.double(), y, 3, flag=True)
    assert base != _sig(x.t(), y, 3, flag=True)
    assert base != _sig(x, y, 4, flag=True), "scalars by value"
    assert base != _sig(x, y, 3.0, flag=True), "scalars by type"
    assert base != _sig(x, y, 3, flag=False)
    assert base != _sig(x, y, 3), "keywords"
    assert base != _sig(x, y, flag=True)
    assert _sig(x, y, [3]) is None and _sig(x, object()) is None, "what it cannot describe"
    assert _sig(x, (1, 2.0)) == _sig(x, (1, 2.0)) != _sig(x, (1, 2))


def test_a_view_of_a_shared_storage_is_rebuilt_from_the_new_call(hits: list[str]) -> None:
    # dequant_gather writes into ``out``; a second call with other memory must write there.
    spec = SPECS["dequant_gather"]
    call = {**valid_call(spec), **OFF}
    _clear(spec)
    spec.op(**call)                                   # plans this signature
    again = {k: (twin(v) if isinstance(v, torch.Tensor) else v) for k, v in call.items()}
    again["out"].fill_(7.0)
    expected = {k: (twin(v) if isinstance(v, torch.Tensor) else v) for k, v in again.items()}
    with launch_plans.disabled():
        want = spec.op(**expected)
    got = spec.op(**again)
    assert hits == [_kernels(spec)[0].name]
    assert got.data_ptr() == again["out"].data_ptr() != call["out"].data_ptr()
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_an_op_call_with_a_known_launch_signature_runs_the_kernel_plan_at_once(
        monkeypatch: pytest.MonkeyPatch, hits: list[str]) -> None:
    from dsv4kit.family.plans import OpLaunch

    spec = SPECS["indexer_q"]
    call = {**valid_call(spec, with_defaults=True), **OFF}
    _clear(spec)
    spec._launches.clear()
    for _ in range(3):     # full path, then the call plan (the kernel plans it), then the op launch
        spec.op(**call)
    fused = [v for v in spec._launches.values() if v]
    assert len(fused) == 1 and isinstance(fused[0], OpLaunch)

    def no_call_plan(*_: Any, **__: Any) -> Any:
        raise AssertionError("the call plan ran for a known launch signature")

    monkeypatch.setattr("dsv4kit.family.plans.CallPlan.__call__", no_call_plan)
    hits.clear()
    with launch_plans.disabled():
        with pytest.raises(AssertionError, match="call plan ran"):
            spec.op(**call)                                    # plans off: not the op launch
    out = spec.op(**call)
    assert hits == [_kernels(spec)[0].name] and len(out) == 2
    with pytest.raises(AssertionError, match="call plan ran"):
        spec.op(**{**call, "softmax_scale": 0.5})   # another value: the op's call plan (same types) runs
