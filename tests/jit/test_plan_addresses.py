"""A launch plan's bare addresses (the GPU direct launcher's pointer slots, ``Address``) follow the
new call's tensors: deltas from the source's ``data_ptr`` (its storage offset is part of the
signature), checked here on the CPU with a stand-in kernel whose launcher takes pointers."""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.jit.launch_plans import Address, build_plan, launch_signature
from dsv4kit.jit.launcher import LaunchSpec


class _Kernel:
    """What ``build_plan`` reads of a kernel: its name, executor cache and plan launcher."""

    name = "stand-in"

    def __init__(self, pointer_slots: frozenset[int]) -> None:
        self.cache: dict[Any, Any] = {"key": lambda *args: None}
        self.pointer_slots = pointer_slots
        self.seen: list[list[Any]] = []

    def _executor_cache(self) -> dict[Any, Any]:
        return self.cache

    def plan_launcher(self, key: Any, exe: Any, args: tuple[Any, ...]) -> tuple[Any, frozenset[int]]:
        return self.seen.append, self.pointer_slots


def _launch_args(x: torch.Tensor) -> tuple[Any, ...]:
    """What a kernel's ``__call__`` might launch with: views and addresses around ``x``."""
    return (x[2:], Address(x.data_ptr() - 8, x.dtype), x[1:], Address(x.data_ptr() + 4, torch.uint8), x, 3)


def test_pointers_and_addresses_are_rebuilt_from_the_new_call() -> None:
    kernel = _Kernel(frozenset({0, 1}))
    buf = torch.zeros(32)
    x = buf[4:12]                                    # storage offset 4
    sig, tensors = launch_signature((x,), {})
    plan = build_plan(kernel, LaunchSpec("key", _launch_args(x)), tensors, sig)
    assert plan is not None and "storage_offset" not in plan.source
    other = torch.zeros(32)
    y = other[4:12]                                  # the same signature, other memory
    assert launch_signature((y,), {})[0] == sig
    plan([y])
    p0, p1, view, addr, same, const = kernel.seen[-1]
    assert p0 == y[2:].data_ptr() and p1 == y.data_ptr() - 8
    assert torch.equal(view, y[1:]) and view.data_ptr() == y[1:].data_ptr()
    assert isinstance(addr, Address) and addr.data_ptr() == y.data_ptr() + 4 and addr.dtype is torch.uint8
    assert same is y and const == 3
    assert plan.guard is not None and plan.guard.bind([y])((y,), {}) == [y]
