"""Launch plans: a kernel call's host work, done once per argument signature.

A kernel's ``__call__`` checks its arguments, allocates its outputs, dispatches to a CompileKey and
builds the executor's arguments. With metadata checks only (``debug_checks`` off), every one of
those steps reads nothing but the call's *signature*:

* a tensor: its type, dtype, device, sizes, strides, storage offset and address modulo 32 (every
  alignment rule of the spec, and Triton's 16-byte specialization, is a divisor of 32);
* which tensors share a storage (the index of the first earlier tensor with the same storage
  base, ``data_ptr - storage_offset * itemsize``): views derived from shared storage resolve alike;
* anything else: its type and value (ints, floats, bools, strings, dtypes, None, tuples of those;
  a zero float also its sign: -0.0 == 0.0, but a plan bakes the value in).

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

Hot guards. Computing the signature is most of a planned call's cost (a dozen attribute reads per
tensor, a tuple of tuples, its hash). So the last few plans a kernel (or an op, :class:`OpLaunch
<dsv4kit.family.plans.OpLaunch>`) used sit in ``PlanTable.hot``, each with a :class:`SignatureGuard`
check built from its signature (a closure: no code is generated per signature): the positional
count and keyword names in order, each scalar's exact type and value, and per tensor
``TensorGuards`` (exact type, dtype, device, sizes, strides, in C++) plus the storage offset, the
address mod 32 and which tensors share a storage base, read from ``data_ptr``. A call passing it
has exactly the plan's signature (so the plan is what the table would return); any other call
gets None and takes the signature lookup, and from there the full checked path. ``TensorGuards``
also compares ``requires_grad`` and the dispatch key set under the thread's dispatch state
(inference mode): stricter than the signature, so such a call falls back and, the table finding
the plan, gets a hot entry guarded for its own state.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._dynamo.guards import TensorGuards

from dsv4kit.jit import coverage

__all__ = ["FIRST", "HOT", "MAX_PLANS", "PLAN", "Address", "LaunchPlan", "PlanTable", "SignatureGuard",
           "build_plan", "by_identity", "class_check", "disabled", "enabled", "launch_signature", "plan_safe",
           "plans_of", "set_enabled", "set_plan_after", "size_sight", "take_sight"]

#: Plans kept per kernel object; the table is cleared when full.
MAX_PLANS = 256

#: Signatures remembered as called once per table (:meth:`PlanTable.seen_before`).
MAX_ONCE = 4096

#: Hot entries (a plan and its bound guard) kept per table, most recent first. Each failing guard
#: costs ~0.1-1 µs before the fallback, so few: a steady loop reuses one signature per kernel.
HOT = 4

#: ``sight``: what an op layer already knows of the kernel call it is about to make, read and
#: cleared by that call (:func:`take_sight`): None (nothing), ``FIRST`` (its launch signature was
#: never seen: no hot entry and no plan can serve it, so the kernel skips computing its own), or
#: ``PLAN`` (seen before: the kernel plans it now, as the op launch needs the kernel's plan).
_STATE: dict[str, Any] = {"enabled": True, "plan_after": 2, "sight": None}
FIRST, PLAN = "first", "plan"


def take_sight() -> str | None:
    """The op layer's hint for this kernel call (``_STATE["sight"]``), cleared: it is for one call."""
    sight = _STATE["sight"]
    if sight is not None:
        _STATE["sight"] = None
    return sight


def enabled() -> bool:
    """Whether kernels make and use launch plans (on unless inside :func:`disabled`)."""
    return _STATE["enabled"]


def set_enabled(on: bool) -> bool:
    """Turn launch plans on or off for the process; returns the previous setting."""
    before, _STATE["enabled"] = _STATE["enabled"], bool(on)
    return before


def set_plan_after(calls: int) -> int:
    """Plan a signature on its ``calls``-th call (1: on sight, a fixed-shape loop's best; default
    2: a size seen once costs no plan); returns the previous setting."""
    if type(calls) is not int or calls < 1:
        raise ValueError(f"set_plan_after: calls: expected an int >= 1, got {calls!r}")
    before, _STATE["plan_after"] = _STATE["plan_after"], calls
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


class PlanTable(dict):  # type: ignore[type-arg]
    """Plans by signature, and ``hot``: ``(plan, guard)`` pairs of the plans used last, most recent
    first (module docstring). Removing a plan removes its hot entries, so a cleared table is cold.

    ``once``: signatures called, not yet planned, with their call counts. A plan is built on a
    signature's ``plan_after``-th call (:func:`set_plan_after`, default 2): building one costs
    several full calls, and in serving most sizes come once (measured on the CPU with the no-op
    executor: a new shape 18-52 µs unplanned, 96-335 µs planned on sight).

    ``sizes``: the :func:`size_sight` of every call counted, each with the plans made for calls of
    it (their hot-guard entries, at most ``HOT``). A call whose size sight is not there has a
    signature never counted (the size sight is a function of the signature), so no plan or count
    can exist for it: :meth:`sighted` says so without computing the signature (its cost grows with
    the tensors: 1.2 µs for one, 8.6 µs for ten on the CPU machine, the size sight a fifth of
    that). A call of a size sight seen before tries that sight's plans by their guards, and computes
    its signature only when none passes: a cycle of seen shapes longer than ``HOT`` costs a size
    sight and a guard, not a signature.

    ``missed``: the last call passed no hot guard, so the next one asks its size sight first (a
    cycle of seen shapes, or new shapes, would fail every hot guard again: 2-3 µs for a C4
    compressor's four on the CPU machine); a call whose size sight finds the plan that served the
    call before it (:meth:`lift`) turns the hot guards back on, so a fixed-shape run pays the size
    sight once."""

    __slots__ = ("bound", "hot", "missed", "once", "sizes")

    def __init__(self) -> None:
        super().__init__()
        self.hot: tuple[tuple[Any, Callable[..., Any]], ...] = ()
        self.missed = False
        self.once: dict[Any, int] = {}
        # id(plan) -> its bound guard (None: it cannot be bound): a plan's guard is built once, not
        # at every promotion (a cycle of more signatures than ``HOT`` promotes at every call)
        self.bound: dict[int, Callable[..., Any] | None] = {}
        self.sizes: dict[tuple[Any, ...], tuple[tuple[Any, Callable[..., Any]], ...]] = {}

    def sighted(self, sizes: tuple[Any, ...]) -> tuple[tuple[Any, Callable[..., Any]], ...] | None:
        """The ``(plan, guard)`` entries made for calls of size sight ``sizes`` (:func:`size_sight`),
        or None for the first call of it this table counts (recorded now: its signature need not be
        computed, nothing is kept for it). Never None with plans on sight (``plan_after`` 1)."""
        entries = self.sizes.get(sizes)
        if entries is not None:
            return entries
        if len(self.sizes) >= MAX_ONCE:
            self.sizes.clear()  # a call of a forgotten size sight takes its first sight again
        self.sizes[sizes] = ()
        return () if _STATE["plan_after"] <= 1 else None

    def file(self, sizes: tuple[Any, ...], plan: Any) -> None:
        """File ``plan`` (just promoted: its guard is bound) under the size sight of its call."""
        guard = self.bound.get(id(plan))
        if guard is not None:
            kept = self.sizes.get(sizes, ())
            self.sizes[sizes] = ((plan, guard), *(h for h in kept if h[0] is not plan))[:HOT]

    def lift(self, entry: tuple[Any, Callable[..., Any]]) -> None:
        """Put ``entry`` (a ``(plan, guard)`` of :meth:`sighted` whose guard a call just passed) first
        in ``hot``, its guard as bound (it may hand tensors over in another order than the call's).
        The plan that served the call before this one again: the hot guards go first again."""
        plan = entry[0]
        if self.hot and self.hot[0][0] is plan:
            self.missed = False
        self.hot = (entry, *(h for h in self.hot[: HOT] if h[0] is not plan))[:HOT]

    def seen_before(self, signature: Any) -> bool:
        """Whether this call of ``signature`` is worth a plan (its ``plan_after``-th call or later);
        counts the call if not. The call after the first sight of its size sight (:meth:`sighted`):
        that first sight counts as the signature's first call (a signature sharing its size sight with another
        may be planned one call early; never late)."""
        after = _STATE["plan_after"]
        if after <= 1:
            return True
        seen = self.once.get(signature, 1) + 1
        if seen >= after:
            self.once.pop(signature, None)
            return True
        if len(self.once) >= MAX_ONCE:
            self.once.clear()
        self.once[signature] = seen
        return False

    def promote(self, plan: Any, tensors: list[torch.Tensor]) -> None:
        """Put ``plan`` first in ``hot``, its guard bound to ``tensors`` (a call of its signature);
        nothing when the plan has no guard or the guard cannot be bound to them."""
        pid = id(plan)
        guard = self.bound.get(pid)
        # bound for another dispatch state (inference mode, requires_grad) than these tensors': rebind
        if guard is None or not guard.tensors_pass(*tensors):
            guard = self.bound[pid] = plan.guard.bind(tensors) if plan.guard is not None else None
        if guard is not None:
            self.hot = ((plan, guard), *(h for h in self.hot[: HOT] if h[0] is not plan))[:HOT]

    def _cool(self, plan: Any) -> None:
        self.hot = tuple(h for h in self.hot if h[0] is not plan)
        self.bound.pop(id(plan), None)
        for sizes, kept in self.sizes.items():  # rare (a cleared executor): a scan is fine
            if any(h[0] is plan for h in kept):
                self.sizes[sizes] = tuple(h for h in kept if h[0] is not plan)

    def clear(self) -> None:
        self.hot, self.missed = (), False
        self.once.clear()
        self.sizes.clear()
        self.bound.clear()
        super().clear()

    def __delitem__(self, key: Any) -> None:
        self._cool(self[key])
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        plan = super().pop(key, *default)
        self._cool(plan)
        return plan

    def popitem(self) -> tuple[Any, Any]:
        key, plan = super().popitem()
        self._cool(plan)
        return key, plan


def plans_of(kernel: Any) -> PlanTable:
    """The launch plans a kernel object keeps, by signature (made empty on first use)."""
    table = kernel.__dict__.get("_launch_plans")  # not setdefault: that builds a table per call
    if table is None:
        table = kernel.__dict__["_launch_plans"] = PlanTable()
    return table


def plan_safe(launch: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``launch`` method whose only effect is running the executor (plans may bypass it)."""
    launch.plan_safe = True  # type: ignore[attr-defined]
    return launch


def _base(t: torch.Tensor) -> int:
    return t.data_ptr() - t.storage_offset() * t.itemsize


#: Types whose objects a signature describes by identity (:func:`by_identity`).
_BY_IDENTITY: set[type] = set()


def by_identity(cls: type) -> type:
    """Let call signatures describe objects of ``cls`` by identity (a platform passed to an op,
    say): whoever keeps the plan keeps the object alive, so its ``id`` stays its own."""
    _BY_IDENTITY.add(cls)
    return cls


def _scalar_sig(v: Any) -> Any:
    tp = type(v)
    if tp in _SCALARS:
        # -0.0 == 0.0, but a plan bakes the value in: the sign of a zero is part of it
        return (tp, v, math.copysign(1.0, v)) if tp is float and v == 0.0 else (tp, v)
    if tp in _BY_IDENTITY:
        return (tp, id(v), id)
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


def size_sight(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The sizes of a call's plain tensors (exact type ``torch.Tensor``), in call order: a function
    of its :func:`launch_signature` that costs a fifth of it or less (:meth:`PlanTable.sighted`).
    Two signatures may share one (other strides, another scalar); one signature never has two."""
    tensor = torch.Tensor
    return (*[v.shape for v in args if type(v) is tensor],
            *[v.shape for v in kwargs.values() if type(v) is tensor])


# --------------------------------------------------------------------------- hot guards

def _is_tensor_entry(entry: tuple[Any, ...]) -> bool:
    return len(entry) == 9 and isinstance(entry[1], type) and issubclass(entry[1], torch.Tensor)


class SignatureGuard:
    """A check, built from one signature, that a call has exactly that signature (module
    docstring). :meth:`bind` makes the callable ``guard(args, kwargs)``: the call's tensors (all of
    them in signature order, or those of ``order``) when it has the signature, else None.

    No code is generated: the guard is a closure over the signature's constants (the positional
    count, the keyword names, each scalar's exact type and value, each tensor's storage offset,
    address mod 32 and storage-sharing pattern), with the per-tensor metadata checked in C++ by
    ``TensorGuards``. A call of new sizes therefore builds its guard without ``compile()``: the
    cost of a signature not seen before does not include generating host code (and nothing is
    generated after warmup for the monitor to report).
    """

    def __init__(self, signature: tuple[Any, ...], order: tuple[int, ...] | None = None) -> None:
        self.signature, self.order = signature, order
        nargs, entries = signature[0], signature[1:]
        tensors = [j for j, e in enumerate(entries) if _is_tensor_entry(e)]
        self.sizes = [list(entries[j][4]) for j in tensors]
        self.strides = [list(entries[j][5]) for j in tensors]
        self._nargs = nargs
        self._keys = [e[0] for e in entries[nargs:]]
        self._tensors = tuple(tensors)
        # scalars: (position, exact type, value, sign of a zero float or None)
        self._scalars = tuple((j, e[1][0], e[1] if e[1][0] is tuple else e[1][1],
                               e[1][2] if len(e[1]) == 3 else None)
                              for j, e in enumerate(entries) if not _is_tensor_entry(e))
        self._offsets = tuple(entries[j][6] for j in tensors)
        self._align = tuple(entries[j][7] for j in tensors)
        self._base_delta = tuple(entries[j][6] * entries[j][2].itemsize for j in tensors)
        self._share = tuple(entries[j][8] for j in tensors)
        self._apart = all(s == i for i, s in enumerate(self._share))

    def bind(self, tensors: list[torch.Tensor]) -> Callable[[tuple[Any, ...], Mapping[str, Any]], Any] | None:
        """The guard, its ``TensorGuards`` made from ``tensors`` (a call of the signature, in
        signature order) under the current dispatch state; None when they fail it."""
        try:
            tg = TensorGuards(*tensors, dynamic_dims_sizes=self.sizes, dynamic_dims_strides=self.strides)
            if not tg.check(*tensors):
                return None
        except Exception:  # an unusual tensor: no hot entry, the table's lookup still serves it
            return None
        guard = _make_guard(self, tg.check)
        guard.tensors_pass = tg.check  # type: ignore[attr-defined]
        return guard


def class_check(tensors: list[torch.Tensor]) -> Callable[..., bool]:
    """``check(*tensors)`` of ``TensorGuards`` with every size and stride dynamic: exact type, dtype,
    device, number of dimensions, ``requires_grad`` and dispatch keys, no size (a signature class's)."""
    return TensorGuards(*tensors, dynamic_dims_sizes=[[None] * t.dim() for t in tensors],
                        dynamic_dims_strides=[[None] * t.dim() for t in tensors]).check


def _scalar_ok(tp: type, want: Any, sign: Any, v: Any) -> bool:
    """Whether scalar ``v`` is exactly what the signature recorded (what ``_scalar_sig`` tells apart)."""
    if tp is tuple:
        return _scalar_sig(v) == want
    if sign is id:  # an object described by identity
        return type(v) is tp and id(v) == want
    if tp is type(None) or tp is bool or tp is torch.dtype:  # singletons
        return v is want
    # int, float, str: the exact type, then == (a nan never passes: the table's lookup decides)
    return type(v) is tp and v == want and (sign is None or math.copysign(1.0, v) == sign)


def _share_pattern(bases: tuple[int, ...]) -> tuple[int, ...]:
    """For each tensor, the index of the first tensor with its storage base."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(b, i) for i, b in enumerate(bases))


#: Scalar types whose recorded value a call matches by exact type and ``==`` (tuple comparison in
#: C); a float only where the recorded value is not a zero (whose sign ``==`` cannot tell).
_PLAIN = (int, str, bool, type(None), torch.dtype, float)


def _tuple_getter(positions: tuple[int, ...] | list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """``itemgetter`` that returns a tuple for one position too."""
    if len(positions) == 1:
        j = positions[0]
        return lambda vals: (vals[j],)
    return operator.itemgetter(*positions)


def _make_guard(sig: SignatureGuard, check: Callable[..., bool]) -> Callable[..., Any]:
    """The closure :meth:`SignatureGuard.bind` returns (see the class docstring)."""
    nargs, keys = sig._nargs, tuple(sig._keys)
    pick = _tuple_getter(sig._tensors) if sig._tensors else None
    plain = [(j, tp, want) for j, tp, want, sign in sig._scalars if tp in _PLAIN and sign is None]
    others = tuple(x for x in sig._scalars if not (x[1] in _PLAIN and x[3] is None))
    pick_plain = _tuple_getter([j for j, _, _ in plain]) if plain else None
    plain_types = tuple(tp for _, tp, _ in plain)
    plain_values = tuple(want for _, _, want in plain)
    offsets, align, delta, share, apart = sig._offsets, sig._align, sig._base_delta, sig._share, sig._apart
    n = len(offsets)
    order = sig.order
    offset_of, ptr_of, sub = torch.Tensor.storage_offset, torch.Tensor.data_ptr, operator.sub
    mod32 = (31).__rand__

    def guard(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[torch.Tensor] | None:
        if len(args) != nargs or (tuple(kwargs) != keys if keys else kwargs):
            return None
        vals = args + tuple(kwargs.values()) if keys else args
        try:
            # the tensors first: a call of other sizes (the usual miss) fails there, in C++
            ts = () if pick is None else pick(vals)
            if ts and not check(*ts):
                return None
            if pick_plain is not None:
                got = pick_plain(vals)
                # types first: a tensor where an int was would compare elementwise
                if tuple(map(type, got)) != plain_types or got != plain_values:
                    return None
            for j, tp, want, sign in others:
                if not _scalar_ok(tp, want, sign, vals[j]):
                    return None
            if not ts:
                return []
            if tuple(map(offset_of, ts)) != offsets:
                return None
            ptrs = tuple(map(ptr_of, ts))
            if tuple(map(mod32, ptrs)) != align:  # each address mod 32 as recorded
                return None
            bases = map(sub, ptrs, delta)  # the offsets are checked: each tensor's storage base
            if (len(set(bases)) != n) if apart else (_share_pattern(tuple(bases)) != share):
                return None
        except Exception:
            return None
        return list(ts) if order is None else [ts[i] for i in order]

    return guard


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
            steps.append(_view_step(leaf, shared, src, as_source=False))
            continue
        # A fresh allocation: rebuilt with empty_strided, so it must be all of its storage.
        if leaf.storage_offset() != 0 or leaf.untyped_storage().nbytes() != _span_bytes(leaf):
            raise _Unplannable("an output that is part of a larger fresh allocation")
        fresh.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device))
        steps.append((_SRC, src.add(leaf)))
    return shape, fresh, steps


def _geometry(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype


def _view_step(t: torch.Tensor, i: int, src: _Sources, as_source: bool = True) -> tuple[Any, ...]:
    """``t`` as a view of source ``i``'s storage (its own dtype: ``q.view(torch.uint8)``, say), by
    the cheapest of: the source itself (a launch argument of the source's geometry, where
    ``as_source``), ``.view(dtype)``, that (or the source) ``.as_strided``, or a rebind. The
    source's geometry is part of the signature, so the choice made here holds for every call of it."""
    s, want = src.tensors[i], _geometry(t)
    if as_source and _geometry(s) == want:
        return (_SRC, i)
    if t.dtype is s.dtype:
        return (_VIEW, i, *want[:3], t.dtype, "strided")
    try:
        cast = s.view(t.dtype)
    except RuntimeError:  # widths whose view the source's last dimension does not allow
        return (_VIEW, i, *want[:3], t.dtype, "rebind")
    how = "view" if _geometry(cast) == want else "view_strided"
    return (_VIEW, i, *want[:3], t.dtype, how)


def _arg_step(a: Any, src: _Sources, pointer: bool) -> tuple[Any, ...]:
    if isinstance(a, torch.Tensor):
        i = src.index_of(a)
        base = _base(a)
        if i is None:
            i = src.sharing(base)
            if i is None:
                raise _Unplannable("a launch tensor made inside the call")
        if pointer:  # the backend takes a bare address here (deltas from the source's data_ptr:
            # its storage offset is part of the signature, so the plan need not read it)
            return (_PTR, i, a.data_ptr() - src.tensors[i].data_ptr(), src.tensors[i].itemsize)
        if src.tensors[i] is a:
            return (_SRC, i)
        return _view_step(a, i, src)
    if isinstance(a, Address):
        ptr = a.data_ptr()
        for i, t in enumerate(src.tensors):
            lo = src.bases[i]
            if lo <= ptr < lo + t.untyped_storage().nbytes():
                size, delta = t.itemsize, ptr - t.data_ptr()
                return (_PTR, i, delta, size) if pointer else (_ADDR, i, delta, size, a.dtype)
        raise _Unplannable("an address outside every call tensor")
    if _scalar_sig(a) is None:
        raise _Unplannable(f"a launch argument of type {type(a).__name__}")
    return (_CONST, a)


@dataclass(frozen=True)
class LaunchPlan:
    """One signature's launch, rebuilt per call from the call's tensors (module docstring).

    ``run`` is a closure over the recipe (no code is generated: a signature not seen before costs
    no ``compile()``); ``source`` renders the same recipe as Python for a reader, e.g.::

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
    recipe: tuple[Any, ...]            # _render's arguments: ``source`` is built when read
    run: Callable[..., Any]
    guard: SignatureGuard | None = None  # its signature's hot guard (unbound)
    launch: Callable[[list[Any]], Any] | None = None  # what ``run`` launches with (introspection)
    fresh: tuple[tuple[Any, ...], ...] = ()           # (shape, stride, dtype, device) per fresh output

    @property
    def source(self) -> str:
        """The recipe as Python, for a reader (rendered on demand: a new shape does not pay it)."""
        return _render(*self.recipe)

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
    """The rendered recipe's text and the constants it names (for reading only)."""

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
            i, delta = rest[:2]
            ptr = f"s{i}.data_ptr() + {delta}" if delta else f"s{i}.data_ptr()"
            return f"({ptr})" if kind == _PTR else f"Address({ptr}, {self.const(rest[3])})"
        if kind == _VIEW:
            i, size, stride, offset, dtype, how = rest
            size, stride = self.const(size), self.const(stride)
            if how == "rebind":
                return f"_rebind(s{i}, {self.const(dtype)}, {offset}, {size}, {stride})"
            cast = f"s{i}" if how == "strided" else f"s{i}.view({self.const(dtype)})"
            return cast if how == "view" else f"{cast}.as_strided({size}, {stride}, {offset})"
        return self.const(rest[0])


def _render(ntensors: int, fresh: list[tuple[Any, ...]], arg_steps: list[tuple[Any, ...]], out_shape: str,
            out_steps: list[tuple[Any, ...]], finalizer: Callable[[Any], Any] | None) -> str:
    """The recipe as the Python a reader would write (documentation: nothing compiles it)."""
    src = _Source()
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
    return "\n".join(lines) + "\n"


def _step_fn(step: tuple[Any, ...]) -> Callable[[list[Any]], Any]:
    """A function of the sources list ``s`` (call tensors, then fresh outputs) giving one value."""
    kind, rest = step[0], step[1:]
    if kind == _SRC:
        return operator.itemgetter(rest[0])
    if kind == _CONST:
        value = rest[0]
        return lambda s: value
    if kind == _PTR:
        i, delta = rest[:2]
        return lambda s: s[i].data_ptr() + delta
    if kind == _ADDR:
        i, delta, _, dtype = rest
        return lambda s: Address(s[i].data_ptr() + delta, dtype)
    i, size, stride, offset, dtype, how = rest
    if how == "rebind":
        return lambda s: _rebind(s[i], dtype, offset, size, stride)
    if how == "strided":
        return lambda s: s[i].as_strided(size, stride, offset)
    if how == "view":
        return lambda s: s[i].view(dtype)
    return lambda s: s[i].view(dtype).as_strided(size, stride, offset)


def _runner(fresh: list[tuple[Any, ...]], arg_steps: list[tuple[Any, ...]], out_shape: str,
            out_steps: list[tuple[Any, ...]], launch: Callable[..., Any],
            finalizer: Callable[[Any], Any] | None) -> Callable[..., Any]:
    """The planned call as a closure: allocate the fresh outputs, fill the executor's arguments
    that vary per call into a template of the constant ones, launch, return the output."""
    template = [st[1] if st[0] == _CONST else None for st in arg_steps]
    fill = tuple((slot, _step_fn(st)) for slot, st in enumerate(arg_steps) if st[0] != _CONST)
    outs = tuple(_step_fn(st) for st in out_steps)
    empty_strided = torch.empty_strided

    def run(*tensors: torch.Tensor) -> Any:
        s = list(tensors)
        for shape, stride, dtype, device in fresh:
            s.append(empty_strided(shape, stride, dtype=dtype, device=device))
        args = template.copy()
        for slot, f in fill:
            args[slot] = f(s)
        r = launch(args)
        if out_shape == "tuple":
            r = tuple(f(s) for f in outs)
        elif out_shape == "one":
            r = outs[0](s)
        return r if finalizer is None else finalizer(r)

    return run


def build_plan(kernel: Any, spec: Any, tensors: list[torch.Tensor],
               signature: tuple[Any, ...] | None = None) -> LaunchPlan | None:
    """The plan of a launch that the full path just made (``spec``: its LaunchSpec), or None when
    the launch cannot be rebuilt from the signature alone; with ``signature`` (the call's), the
    plan carries its :class:`SignatureGuard`."""
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
    recipe = (len(tensors), fresh, arg_steps, out_shape, out_steps, spec.finalizer)
    run = _runner(fresh, arg_steps, out_shape, out_steps, launch, spec.finalizer)
    guard = SignatureGuard(signature) if signature is not None else None
    return LaunchPlan(kernel.name, spec.key, exe, cache, recipe, run, guard, launch, tuple(fresh))
