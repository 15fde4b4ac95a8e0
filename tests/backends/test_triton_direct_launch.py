"""The GPU's two direct launches of a warmed Triton binary (``TritonJitKernel._key_launch``: a
shape never seen; ``_direct_launcher``: a launch plan), run on the CPU against a stand-in compiled
kernel and driver: each must hand the C launcher the grid, the current stream and the kernel's full
argument list in parameter order, and refuse (launch nothing) what only ``JITFunction.run`` may
serve: another specialization, another current device, a registered launch hook."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import triton
from triton import knobs

from dsv4kit.backends.triton import TritonJitKernel
from dsv4kit.jit import launch_plans
from dsv4kit.kernels import families
from dsv4kit.testing.valid_calls import sized_call

STREAM, DEVICE = 0x5EED, 0


class _Run:
    """A ``CudaLauncher`` stand-in: its C ``launch`` and its ``__call__`` record their arguments."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []
        self.calls: list[tuple[Any, ...]] = []

    def launch(self, *args: Any) -> None:
        self.launches.append(args)

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


def _compiled() -> SimpleNamespace:
    return SimpleNamespace(run=_Run(), function="FUNCTION", packed_metadata="PACKED",
                           _init_handles=lambda: None, launch_metadata=lambda grid, stream, *a: "META")


def _call_of(spec, name: str) -> tuple[TritonJitKernel, Any, tuple[Any, ...]] | None:
    """The Triton kernel of ``spec``'s variant ``name``, the key and launch arguments of a sized call."""
    kernel = spec.kernel(name, "cpu", "triton")
    seen: list = []
    kernel.launch = lambda launch_spec, inputs: seen.append(launch_spec)  # type: ignore[method-assign]
    try:
        with launch_plans.disabled():
            call = sized_call(spec, 7)
            if spec.variant_arg and call.pop(spec.variant_arg, spec._rows[spec.variant_arg].default) != name:
                return None
            kernel(**call, debug_checks=False)
    finally:
        del kernel.launch
    return kernel, seen[0].key, tuple(seen[0].args)


CALLS = [(f"{spec.name}-{name}", c) for spec in families() for name in spec.variants
         if (c := _call_of(spec, name)) is not None]


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A stand-in driver whose current device can be switched."""
    drv = SimpleNamespace(current=DEVICE)
    drv.get_current_device = lambda: drv.current
    drv.get_current_stream = lambda d: STREAM if d == DEVICE else -1
    monkeypatch.setattr(triton.runtime.driver, "_active", drv)
    return drv


def _warm(monkeypatch: pytest.MonkeyPatch, kernel: TritonJitKernel, key: Any, args: tuple[Any, ...]):
    """``kernel`` with a stand-in binary of ``key``, warmed for the specialization of ``args``."""
    ck = _compiled()
    monkeypatch.setattr(kernel, "artifact", lambda k: SimpleNamespace(executable=ck) if k == key else None)
    variants = type(kernel)._variants.setdefault(kernel.target, {})
    monkeypatch.setitem(variants, key, kernel.variant(key, kernel._full_args(key, args)))
    return ck


def _grid(kernel: TritonJitKernel, key: Any, args: tuple[Any, ...]) -> tuple[int, int, int]:
    return (*kernel.grid(key, kernel._named(args)), 1, 1)[:3]


def _expected(kernel: TritonJitKernel, key: Any, args: tuple[Any, ...],
              grid: tuple[int, ...]) -> tuple[Any, ...]:
    return (*grid, STREAM, "FUNCTION", False, True, None, None, "PACKED", None, None, None,
            *kernel._full_args(key, args))


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[n for n, _ in CALLS])
def test_key_launch_hands_the_c_launcher_the_full_launch(name, call, device, monkeypatch) -> None:
    kernel, key, args = call
    ck = _warm(monkeypatch, kernel, key, args)
    launch = kernel._key_launch(key)
    assert launch is not None and launch(args)
    assert ck.run.launches == [_expected(kernel, key, args, _grid(kernel, key, args))] and not ck.run.calls
    # what only JITFunction.run may serve: launched nothing, False
    ptr = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    other = torch.float64 if args[ptr].dtype is not torch.float64 else torch.float32
    wrong = (*args[:ptr], torch.empty(args[ptr].shape, dtype=other), *args[ptr + 1:])
    device.current = DEVICE + 1
    assert not launch(args)
    device.current = DEVICE
    assert not launch(wrong)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert not launch(args)
    assert len(ck.run.launches) == 1


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[n for n, _ in CALLS])
def test_direct_launcher_takes_addresses_in_the_call_slots(name, call, device, monkeypatch) -> None:
    kernel, key, args = call
    ck = _warm(monkeypatch, kernel, key, args)
    served: list[tuple[Any, ...]] = []
    launch, pointers = kernel._direct_launcher(key, lambda *a: served.append(a), args)
    assert pointers == {i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    # a plan passes addresses as ints where the call had tensors
    plain = [a.data_ptr() if i in pointers else a for i, a in enumerate(args)]
    launch(plain)
    grid = _grid(kernel, key, args)  # the plan's grid: computed once, from the planned call
    assert ck.run.launches == [_expected(kernel, key, tuple(plain), grid)]
    # a launch hook: through CompiledKernel.run, with its launch metadata and the hooks
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook := (lambda *a: None))
    launch(plain)
    leave = knobs.runtime.launch_exit_hook
    assert ck.run.calls == [(*grid, STREAM, "FUNCTION", "PACKED", "META", hook, leave,
                             *kernel._full_args(key, tuple(plain)))]
    # another current device: the executor (JITFunction.run) with addresses of the call's dtypes
    device.current = DEVICE + 1
    launch(plain)
    assert len(served) == 1 and [a.data_ptr() for i, a in enumerate(served[0]) if i in pointers] == \
        [plain[i] for i in sorted(pointers)]
    assert [served[0][i].dtype for i in sorted(pointers)] == [args[i].dtype for i in sorted(pointers)]
