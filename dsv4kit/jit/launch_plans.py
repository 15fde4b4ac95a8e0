"""Launch plans: a kernel call's host work, done once per argument signature.

A kernel's ``__call__`` checks its arguments, allocates its outputs, dispatches to a CompileKey and
builds the executor's arguments. With metadata checks only (``debug_checks`` off), every one of
those steps reads nothing but the call's *signature*:

* a tensor: its type, dtype, device, sizes, strides, storage offset and address modulo 32 (every
  alignment rule of the spec, and Triton's 16-byte specialization, is a divisor of 32);
* which tensors share a storage (the index of the first earlier tensor with the same storage
  base, ``data_ptr - storage_offset * itemsize``): views derived from shared storage resolve alike;
* anything else: its type and value (ints, floats, bools, strings, dtypes, None, tuples of those).

So a call whose signature was seen before, and passed, passes again and builds the same launch up
to addresses. The first such call runs the full path and records a :class:`LaunchPlan`: how to
allocate each fresh output (``torch.empty_strided``; kernels allocate outputs uninitialized), and
where each executor argument comes from (a call tensor or output, a view of one's storage, an
address inside one, or a constant). Later calls rebuild the arguments from the new tensors and call
the executor (or a backend's direct launcher, :meth:`JitKernel.plan_launcher`) at once.

What never takes a plan: a call with value checks on (``debug_checks`` true, or its default
where that is on: the CPU interpreter), an argument the signature cannot describe, a launch whose
arguments cannot all be traced to the call (a tensor made inside ``__call__`` that is not an
output or a view of one, an output that is part of a larger fresh allocation), a finalizer that
closes over values, a kernel class whose ``launch`` is not marked plan-safe. A plan is dropped
when its executor is no longer the one cached for its key (``clear_cache``), so a miss still
reaches the monitor. Errors never come from a plan: a bad call has a signature of its own, which
takes the full path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.jit import coverage

__all__ = ["MAX_PLANS", "Address", "LaunchPlan", "build_plan", "disabled", "enabled", "launch_signature",
           "plan_safe", "plans_of", "set_enabled"]

#: Plans kept per kernel object; the table is cleared when full.
MAX_PLANS = 256

_STATE = {"enabled": True}


def enabled() -> bool:
    """Whether kernels make and use launch plans (on unless inside :func:`disabled`)."""
    return _STATE["enabled"]


def set_enabled(on: bool) -> bool:
    """Turn launch plans on or off for the process; returns the previous setting."""
    before, _STATE["enabled"] = _STATE["enabled"], bool(on)
    return before


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Every kernel call inside takes the full path (to compare with, or to rule the plans out)."""
    before = set_enabled(False)
    try:
        yield
    finally:
        set_enabled(before)

_SCALARS = (int, float, bool, str, torch.dtype, type(None))


class Address:
    """A bare device address a Triton launch can take (its launcher reads ``data_ptr()`` only).

    Cheaper than a view (no tensor is built); the caller's tensors keep the memory alive.
    """

    __slots__ = ("_ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self._ptr = ptr
        self.dtype = dtype

    def data_ptr(self) -> int:
        return self._ptr

    def __repr__(self) -> str:
        return f"Address({self._ptr:#x}, {self.dtype})"


def plans_of(kernel: Any) -> dict[tuple[Any, ...], LaunchPlan]:
    """The launch plans a kernel object keeps, by signature (made empty on first use)."""
    return kernel.__dict__.setdefault("_launch_plans", {})


def plan_safe(launch: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``launch`` method whose only effect is running the executor (plans may bypass it)."""
    launch.plan_safe = True  # type: ignore[attr-defined]
    return launch


def _base(t: torch.Tensor) -> int:
    return t.data_ptr() - t.storage_offset() * t.itemsize


def _scalar_sig(v: Any) -> Any:
    tp = type(v)
    if tp in _SCALARS:
        return (tp, v)
    if tp is tuple:
        parts = tuple(_scalar_sig(x) for x in v)
        return None if None in parts else (tuple, parts)
    return None


def launch_signature(args: tuple[Any, ...], kwargs: Mapping[str, Any]
                     ) -> tuple[tuple[Any, ...], list[torch.Tensor]] | None:
    """``(signature, tensors)`` of a call (module docstring), or None when it cannot be described.
    ``tensors``: the call's tensors in signature order (positional, then keyword)."""
    sig: list[Any] = [len(args)]
    tensors: list[torch.Tensor] = []
    bases: dict[int, int] = {}
    for items in (enumerate(args), kwargs.items()):
        for name, v in items:
            if isinstance(v, torch.Tensor):
                try:
                    off, ptr = v.storage_offset(), v.data_ptr()
                    # the storage base says which tensors share a storage
                    share = bases.setdefault(ptr - off * v.itemsize, len(tensors))
                    sig.append((name, type(v), v.dtype, v.device, v.shape, v.stride(), off, ptr & 31, share))
                except Exception:  # sparse, nested or otherwise unusual: the full path says what is wrong
                    return None
                tensors.append(v)
            else:
                d = _scalar_sig(v)
                if d is None:
                    return None
                sig.append((name, d))
    return tuple(sig), tensors


# --------------------------------------------------------------------------- recording

# Recipe steps. A source index points into the call's tensors followed by the fresh outputs.
_SRC, _VIEW, _ADDR, _PTR, _CONST = range(5)


class _Unplannable(Exception):
    """The launch cannot be rebuilt from the signature alone; the call keeps the full path."""


def _span_bytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))) * t.itemsize


class _Sources:
    """The tensors a recipe may refer to: the call's, then the fresh outputs."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = list(tensors)
        self.bases = [_base(t) for t in tensors]

    def index_of(self, t: torch.Tensor) -> int | None:
        return next((i for i, s in enumerate(self.tensors) if s is t), None)

    def sharing(self, base: int) -> int | None:
        return next((i for i, b in enumerate(self.bases) if b == base), None)

    def add(self, t: torch.Tensor) -> int:
        self.tensors.append(t)
        self.bases.append(_base(t))
        return len(self.tensors) - 1


def _output_steps(output: Any, src: _Sources) -> tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``(shape, fresh allocations, leaf steps)`` of the op's output: ``"none"``, ``"one"`` (a
    tensor or constant) or ``"tuple"``."""
    if output is None:
        return "none", [], []
    shape, leaves = ("tuple", list(output)) if isinstance(output, tuple) else ("one", [output])
    fresh: list[tuple[Any, ...]] = []
    steps: list[tuple[Any, ...]] = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            if _scalar_sig(leaf) is None:
                raise _Unplannable(f"output {type(leaf).__name__}")
            steps.append((_CONST, leaf))
            continue
        i = src.index_of(leaf)
        if i is not None:
            steps.append((_SRC, i))
            continue
        shared = src.sharing(_base(leaf))
        if shared is not None:
            steps.append(_view_step(leaf, shared, src))
            continue
        # A fresh allocation: rebuilt with empty_strided, so it must be all of its storage.
        if leaf.storage_offset() != 0 or leaf.untyped_storage().nbytes() != _span_bytes(leaf):
            raise _Unplannable("an output that is part of a larger fresh allocation")
        fresh.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device))
        steps.append((_SRC, src.add(leaf)))
    return shape, fresh, steps


def _view_step(t: torch.Tensor, i: int, src: _Sources) -> tuple[Any, ...]:
    """``t`` as a view of source ``i``'s storage (its own dtype: ``q.view(torch.uint8)``, say)."""
    how = "same" if t.dtype is src.tensors[i].dtype else (
        "view" if t.itemsize == src.tensors[i].itemsize else "rebind")
    return (_VIEW, i, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, how)


def _arg_step(a: Any, src: _Sources, pointer: bool) -> tuple[Any, ...]:
    if isinstance(a, torch.Tensor):
        i = src.index_of(a)
        base = _base(a)
        if i is None:
            i = src.sharing(base)
            if i is None:
                raise _Unplannable("a launch tensor made inside the call")
        if pointer:  # the backend takes a bare address here
            return (_PTR, i, a.data_ptr() - src.bases[i], src.tensors[i].itemsize)
        if src.tensors[i] is a:
            return (_SRC, i)
        return _view_step(a, i, src)
    if isinstance(a, Address):
        ptr = a.data_ptr()
        for i, t in enumerate(src.tensors):
            lo = src.bases[i]
            if lo <= ptr < lo + t.untyped_storage().nbytes():
                size = t.itemsize
                return (_PTR, i, ptr - lo, size) if pointer else (_ADDR, i, ptr - lo, size, a.dtype)
        raise _Unplannable("an address outside every call tensor")
    if _scalar_sig(a) is None:
        raise _Unplannable(f"a launch argument of type {type(a).__name__}")
    return (_CONST, a)


@dataclass(frozen=True)
class LaunchPlan:
    """One signature's launch, rebuilt per call from the call's tensors (module docstring).

    ``source`` is the Python of a planned call, generated from the recipe (as Triton generates its
    argument binder): the fresh outputs, the executor's arguments, the launch, the result. E.g.::

        def planned_call(s0, s1, s2, s3):
            s4 = empty_strided(c0, c1, dtype=c2, device=c3)
            s5 = empty_strided(c4, c5, dtype=c6, device=c3)
            r = launch([s0, s1, s2, s3, s4, s5, c7, c8, c9])
            return (s4, s5)
    """

    kernel_name: str
    key: Any
    executor: Callable[..., Any]       # the cached executor this plan was made with
    cache: dict[Any, Any]              # the executor cache it was found in
    source: str
    run: Callable[..., Any]

    def valid(self, cache: dict[Any, Any] | None) -> bool:
        """Whether the executor it launches is still the one cached for its key."""
        return cache is self.cache and cache.get(self.key) is self.executor

    def __call__(self, tensors: list[torch.Tensor]) -> Any:
        if coverage._ACTIVE:
            coverage.record_request(self.kernel_name, self.key)
        return self.run(*tensors)


def _rebind(t: torch.Tensor, dtype: torch.dtype, offset: int, size: tuple[int, ...],
            stride: tuple[int, ...]) -> torch.Tensor:
    """A view of ``t``'s storage in a dtype of another width (offsets count its own elements)."""
    return torch.empty(0, dtype=dtype, device=t.device).set_(t.untyped_storage(), offset, size, stride)


class _Source:
    """The generated function's text and the constants it names."""

    def __init__(self) -> None:
        self.names: dict[str, Any] = {"empty_strided": torch.empty_strided, "Address": Address,
                                      "_rebind": _rebind}
        self.count = 0

    def const(self, value: Any) -> str:
        name = f"c{self.count}"
        self.count += 1
        self.names[name] = value
        return name

    def expr(self, step: tuple[Any, ...]) -> str:
        kind, rest = step[0], step[1:]
        if kind == _SRC:
            return f"s{rest[0]}"
        if kind in (_PTR, _ADDR):
            i, delta, itemsize = rest[:3]
            ptr = f"s{i}.data_ptr() - s{i}.storage_offset() * {itemsize} + {delta}"
            return f"({ptr})" if kind == _PTR else f"Address({ptr}, {self.const(rest[3])})"
        if kind == _VIEW:
            i, size, stride, offset, dtype, how = rest
            size, stride = self.const(size), self.const(stride)
            if how == "rebind":
                return f"_rebind(s{i}, {self.const(dtype)}, {offset}, {size}, {stride})"
            cast = f".view({self.const(dtype)})" if how == "view" else ""
            return f"s{i}{cast}.as_strided({size}, {stride}, {offset})"
        return self.const(rest[0])


def _generate(ntensors: int, fresh: list[tuple[Any, ...]], arg_steps: list[tuple[Any, ...]], out_shape: str,
              out_steps: list[tuple[Any, ...]], launch: Callable[..., Any],
              finalizer: Callable[[Any], Any] | None) -> tuple[str, Callable[..., Any]]:
    src = _Source()
    src.names.update(launch=launch, finalizer=finalizer)
    lines = [f"def planned_call({', '.join(f's{i}' for i in range(ntensors))}):"]
    for j, (shape, stride, dtype, device) in enumerate(fresh):
        lines.append(f"    s{ntensors + j} = empty_strided({src.const(shape)}, {src.const(stride)}, "
                     f"dtype={src.const(dtype)}, device={src.const(device)})")
    lines.append(f"    r = launch([{', '.join(src.expr(st) for st in arg_steps)}])")
    if out_shape == "tuple":
        lines.append(f"    r = ({''.join(src.expr(st) + ', ' for st in out_steps)})")
    elif out_shape == "one":
        lines.append(f"    r = {src.expr(out_steps[0])}")
    lines.append("    return r" if finalizer is None else "    return finalizer(r)")
    text = "\n".join(lines) + "\n"
    namespace = dict(src.names)
    exec(compile(text, "<dsv4kit launch plan>", "exec"), namespace)  # noqa: S102 - our own recipe
    return text, namespace["planned_call"]


def build_plan(kernel: Any, spec: Any, tensors: list[torch.Tensor]) -> LaunchPlan | None:
    """The plan of a launch that the full path just made (``spec``: its LaunchSpec), or None when
    the launch cannot be rebuilt from the signature alone."""
    if spec.finalizer is not None and getattr(spec.finalizer, "__closure__", True) is not None:
        return None  # a bound method or a closure may hold this call's values
    cache = kernel._executor_cache()
    exe = cache.get(spec.key)
    if exe is None:
        return None
    launch, pointer_slots = kernel.plan_launcher(spec.key, exe, spec.args)
    src = _Sources(tensors)
    try:
        out_shape, fresh, out_steps = _output_steps(spec.output, src)
        arg_steps = [_arg_step(a, src, i in pointer_slots) for i, a in enumerate(spec.args)]
    except _Unplannable:
        return None
    text, run = _generate(len(tensors), fresh, arg_steps, out_shape, out_steps, launch, spec.finalizer)
    return LaunchPlan(kernel.name, spec.key, exe, cache, text, run)
