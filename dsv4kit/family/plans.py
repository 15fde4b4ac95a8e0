"""Call plans: the op layer's checks, done once per argument signature.

An op call binds its arguments to the argument table, runs the table's checks, checks the
devices and picks the kernel object; with the same *signature* the outcome is always the same.
The signature holds exactly what those steps read:

* a tensor: its type, dtype and device (the table checks the dtype, §2.10 the device);
* ``None``: itself;
* a scalar of a row without ``choices``: its type (``operator.index`` / ``float`` / ``isinstance``
  accept or refuse by type alone, and normalizing is redone per call);
* a scalar of a row with ``choices``, and the ``backend`` / ``debug_checks`` options: type and value;
* the ``platform`` option: the object's identity (the plan holds it, so the id stays unique),
  or the process's current platform when it is None.

A call whose signature has a plan skips ``inspect.Signature.bind`` and the table checks and goes
straight to the kernel, which still runs every check of its own (shapes, strides, relations,
value checks): the fast path removes repeated work, never a check. Any argument the signature
cannot describe (an unknown keyword, an unhashable value, too many positionals) takes the full
path, which raises the error.

The signature holds no size, so it names a *signature class*: every call that differs from it in
sizes and addresses only. The plans used last sit in :attr:`CallPlans.hot` with a class guard
(:func:`class_guard`, no code generated) that proves a call's signature without computing it: a
call of new sizes of a hot class finds its plan for the price of the guard (2.3 µs for the dozen
arguments of a C4 compressor on the CPU machine, against 8.5 µs to compute and look up its
signature). Where the call's sizes were never seen (no launch plan can exist for it), the plan's
``first`` builds the kernel's operand record from the call's values in one pass and runs the
kernel's full path from it (:func:`first_sight`): no keyword dict, no binding, no plan lookup.
Every check of the kernel still runs, or, once the class has a class plan
(:mod:`dsv4kit.jit.class_plans`), the guards the trace of those checks recorded.

One step further, :class:`OpLaunch`: when the kernel keeps a launch plan for the call
(:mod:`dsv4kit.jit.launch_plans`: value checks off), the op call's own *launch* signature (every
tensor's full metadata, scalars by value, plus the process's current platform) fixes both layers'
outcomes, so a call with a known launch signature runs the kernel's launch plan at once: one
signature per call instead of two, no keyword dict. The op launches used last are hot
(:class:`~dsv4kit.jit.launch_plans.PlanTable`): their guard proves the op call's launch signature
without computing it, and hands the tensors over in the kernel plan's order (no reordering hop);
the platform is compared by identity, as the key's ``id`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.family.schema import Arg, normalize_scalar
from dsv4kit.jit.class_plans import MISS, ClassTable, learn, serve
from dsv4kit.jit.launch_plans import (
    _STATE,
    LaunchPlan,
    SignatureGuard,
    _tuple_getter,
    class_check,
    launch_signature,
    plans_of,
)
from dsv4kit.platform import current_platform

__all__ = ["HOT_CALLS", "MAX_PLANS", "CallPlan", "CallPlans", "OpLaunch", "call_signature", "class_guard",
           "first_sight", "op_launch_for", "plan_for"]

#: Plans kept per op; the table is cleared when full (a long tail of choice values is rare).
MAX_PLANS = 1024

# Scalars the table accepts or refuses by type alone, and normalizes without failing. Any other
# type (numpy scalars, 0-d arrays, ...) is described by value: ``operator.index`` of an array
# depends on its shape, not only its type.
_BY_TYPE = (int, float, bool, str)


def _describe(row: Arg, value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # the usual argument first
        return (type(value), value.dtype, value.device)
    if value is None:
        return None
    if row.kind == "tensor":
        return (type(value),)  # refused by the table; the full path raises
    tp = type(value)
    return tp if tp in _BY_TYPE and not row.choices else (tp, value)


def call_signature(args: Sequence[Arg], options: tuple[str, ...], positional: tuple[Any, ...],
                   keywords: Mapping[str, Any], rows: Mapping[str, Arg]) -> tuple[Any, ...] | None:
    """The signature of a call (see the module docstring), or None when it cannot be described."""
    if len(positional) > len(args):
        return None
    sig: list[Any] = [len(positional)]
    sig += [_describe(args[i], v) for i, v in enumerate(positional)]
    platform = None
    for name, value in keywords.items():
        row = rows.get(name)
        if row is not None:
            sig.append((name, _describe(row, value)))
        elif name == "platform":
            platform = value
        elif name in options:
            sig.append((name, type(value), value))
        else:
            return None
    if platform is None:
        platform = current_platform()
    sig.append(id(platform))
    out = tuple(sig)
    try:
        hash(out)
    except TypeError:
        return None
    return out


_PLATFORM = object()  # the platform keyword's entry (the signature holds it last, by id)


def class_guard(signature: tuple[Any, ...], positional: tuple[Any, ...],
                keywords: Mapping[str, Any]) -> Callable[[tuple[Any, ...], Mapping[str, Any]], bool] | None:
    """``guard(args, kwargs)``: whether a call has ``signature``, the :func:`call_signature` of the
    call ``(positional, keywords)`` (or stricter), without computing one; None when no guard can
    be built (an unusual tensor, a value the signature holds in a form the guard cannot compare).

    A signature class holds no size, so this guard serves every call of new sizes of its class:
    positional count and keyword names in order, each scalar's exact type (and value where the
    signature holds one), each tensor's type, dtype and device (``TensorGuards`` in C++, every
    dimension dynamic: it also compares the number of dimensions, ``requires_grad`` and the
    dispatch keys, stricter than the signature), the platform by identity. No code is generated.
    """
    nargs, values = len(positional), (*positional, *keywords.values())
    keys = tuple(keywords)
    entries = [*signature[1:1 + nargs], *(None for _ in keys)]
    at = 1 + nargs
    for i, name in enumerate(keys):  # a keyword's entry: (name, desc), (name, type, value) or absent
        if name == "platform":
            entries[nargs + i] = _PLATFORM
            continue
        entries[nargs + i] = signature[at][1] if len(signature[at]) == 2 else signature[at][1:]
        at += 1
    platform_id = signature[-1]
    tensors, typed, valued = [], [], []
    for j, e in enumerate(entries):
        v = values[j]
        if e is _PLATFORM:
            continue
        if isinstance(v, torch.Tensor):
            if not (isinstance(e, tuple) and len(e) == 3 and e[0] is type(v)):
                return None
            tensors.append(j)
        elif e is None:
            typed.append((j, type(None)))
        elif isinstance(e, type):
            typed.append((j, e))
        elif isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], type):
            typed.append((j, e[0]))
            valued.append((j, e[1]))
        else:
            return None
    try:
        ts = [values[j] for j in tensors]
        check = class_check(ts)
        if not check(*ts):
            return None
    except Exception:  # an unusual tensor: the signature lookup still serves it
        return None
    pick_t = _tuple_getter(tensors) if tensors else None
    pick_typed = _tuple_getter([j for j, _ in typed]) if typed else None
    pick_valued = _tuple_getter([j for j, _ in valued]) if valued else None
    types, wanted = tuple(tp for _, tp in typed), tuple(want for _, want in valued)
    has_platform = "platform" in keys
    p_at = nargs + keys.index("platform") if has_platform else -1

    def guard(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        if len(args) != nargs or tuple(kwargs) != keys:
            return False
        vals = (*args, *kwargs.values()) if kwargs else args
        if pick_typed is not None and tuple(map(type, pick_typed(vals))) != types:
            return False
        if pick_valued is not None and pick_valued(vals) != wanted:
            return False
        platform = vals[p_at] if has_platform else None
        if id(platform if platform is not None else current_platform()) != platform_id:
            return False
        return check(*pick_t(vals)) if pick_t is not None else check()

    return guard


@dataclass(frozen=True)
class CallPlan:
    """What a checked call of one signature resolved to: how to name the arguments, the
    (normalized) defaults of those left out, and the kernel object with its options."""

    kernel: Any
    platform: Any                      # held so that the id in the signature stays this object's
    names: tuple[str, ...]             # op argument names of the positional slots
    defaults: Mapping[str, Any]        # arguments the call left out, already normalized
    drop: tuple[str, ...]              # option names and the variant argument: not kernel arguments
    debug_checks: bool | None
    scalars: tuple[tuple[str, str], ...]  # (name, table kind) of the scalar rows: normalized per call
    guard: Callable[[tuple[Any, ...], Mapping[str, Any]], bool] | None = None  # its class guard
    # the kernel's full path from the call's values (no keywords, no plan lookup): a first sight's
    first: Callable[[tuple[Any, ...], Mapping[str, Any]], Any] | None = None

    def kernel_args(self, positional: tuple[Any, ...], keywords: Mapping[str, Any]) -> dict[str, Any]:
        """The kernel's keyword arguments for a call of this plan's signature."""
        values = dict(self.defaults)
        values.update(zip(self.names, positional, strict=False))
        values.update(keywords)
        for name in self.drop:
            values.pop(name, None)
        for name, kind in self.scalars:  # the scalar rows only: a tensor is passed as it came
            value = values.get(name)
            if value is not None:
                values[name] = normalize_scalar(kind, value)
        return values

    def __call__(self, positional: tuple[Any, ...], keywords: Mapping[str, Any]) -> Any:
        return self.kernel(**self.kernel_args(positional, keywords), debug_checks=self.debug_checks)


def plan_for(kernel: Any, platform: Any, args: Sequence[Arg], options: tuple[str, ...],
             positional: tuple[Any, ...], keywords: Mapping[str, Any], checked: Mapping[str, Any],
             variant_arg: str | None, debug_checks: bool | None, signature: tuple[Any, ...]) -> CallPlan:
    """The plan of a call of ``signature`` that the full path just checked: ``checked`` its
    normalized values."""
    given = {a.name for a in args[: len(positional)]} | set(keywords)
    defaults = {name: value for name, value in checked.items() if name not in given}
    drop = tuple(options) + ((variant_arg,) if variant_arg else ())
    return CallPlan(kernel, platform, tuple(a.name for a in args[: len(positional)]),
                    defaults, drop, debug_checks, tuple((a.name, a.kind) for a in args if a.kind != "tensor"),
                    class_guard(signature, positional, keywords),
                    first_sight(kernel, args, len(positional), tuple(keywords), defaults, debug_checks))


def first_sight(kernel: Any, args: Sequence[Arg], nargs: int, keys: tuple[str, ...],
                defaults: Mapping[str, Any], debug_checks: bool | None
                ) -> Callable[[tuple[Any, ...], Mapping[str, Any]], Any] | None:
    """``first(positional, keywords)``: the kernel's full path for a call of ``nargs`` positionals
    and the keywords ``keys`` in that order (a plan's signature fixes both), its record built from
    the call's values in one pass (scalars normalized, defaults filled in) and handed to
    :func:`~dsv4kit.family.operands.launch_record`: no keyword dict, no binding, no plan lookup. For
    sizes the op never saw, where no launch plan can exist; a class plan of the signature class
    (:mod:`dsv4kit.jit.class_plans`, ``first.classes``: made on the class's second first sight when
    value checks are off) serves such a call before it, its sizes as symbols. None: the kernel's
    ``__call__`` is not a :func:`~dsv4kit.family.operands.kernel_call`, or its record has a field
    the call cannot fill."""
    call = type(kernel).__call__
    record, launch = getattr(call, "record", None), getattr(call, "launch_record", None)
    if record is None or launch is None:
        return None
    record = record._proved  # the plan's signature proves the table's checks (OperandRecord._proved)
    kinds = {a.name: a.kind for a in args}
    slot = {a.name: i for i, a in enumerate(args[:nargs])} | {k: nargs + j for j, k in enumerate(keys)}
    fields: list[Any] = []            # per record field: a call slot, or the default itself
    normalize: list[tuple[int, str]] = []
    for i, name in enumerate(record._fields):
        if name in slot:
            fields.append(slot[name])
            if kinds.get(name, "tensor") != "tensor":
                normalize.append((i, kinds[name]))
        elif name in defaults:
            fields.append(_Default(defaults[name]))
        else:
            return None
    make = tuple.__new__

    def bound(positional: tuple[Any, ...], keywords: Mapping[str, Any]) -> Any:
        vals = (*positional, *keywords.values()) if keywords else positional
        out = [f.value if type(f) is _Default else vals[f] for f in fields]
        for i, kind in normalize:
            if out[i] is not None:
                out[i] = normalize_scalar(kind, out[i])
        return make(record, out)

    def describe(positional: tuple[Any, ...], keywords: Mapping[str, Any]) -> Any:
        return kernel.launch_operands(bound(positional, keywords), debug_checks)

    # a class plan only where a launch plan could be made (launch_plans: value checks off, plan-safe)
    platform = getattr(kernel, "platform", None)
    checks_off = debug_checks is False or (debug_checks is None and platform is not None and platform.is_cuda)
    plannable = checks_off and getattr(type(kernel).launch, "plan_safe", False)
    classes = ClassTable()

    def first(positional: tuple[Any, ...], keywords: Mapping[str, Any]) -> Any:
        if classes.hot and _STATE["enabled"]:  # sizes as symbols: a class plan of this signature class
            r = serve(classes, positional, keywords)
            if r is not MISS:
                return r
        result = launch(kernel, bound(positional, keywords), debug_checks)
        if plannable and _STATE["enabled"]:
            learn(classes, kernel, describe, positional, keywords)
        return result

    first.classes = classes  # type: ignore[attr-defined]
    return first


class _Default:
    """A record field the call left out: its (normalized) default."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


#: Call plans tried by their class guard before a call signature is computed, most recent first.
HOT_CALLS = 4


class CallPlans(dict):  # type: ignore[type-arg]
    """An op's :class:`CallPlan` s by call signature, and ``hot``: those used last with their class
    guards (:func:`class_guard`), most recent first. A call of a hot plan's signature class, of
    whatever sizes, finds its plan by the guard: no call signature computed, nothing hashed."""

    __slots__ = ("hot",)

    def __init__(self) -> None:
        super().__init__()
        self.hot: tuple[CallPlan, ...] = ()

    def match(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> CallPlan | None:
        """The hot plan whose guard the call passes, or None."""
        for plan in self.hot:
            if plan.guard(args, kwargs):  # type: ignore[misc]
                return plan
        return None

    def promote(self, plan: CallPlan) -> None:
        """Put ``plan`` first in ``hot`` (nothing when it has no guard)."""
        if plan.guard is not None:
            self.hot = (plan, *(p for p in self.hot if p is not plan))[:HOT_CALLS]

    def clear(self) -> None:
        self.hot = ()
        super().clear()


@dataclass(frozen=True)
class OpLaunch:
    """An op call signature's kernel launch plan, and where its tensors sit among the op call's."""

    kernel: Any
    platform: Any                      # held so that the id in the key stays this object's
    plan: LaunchPlan
    order: tuple[int, ...]             # kernel-call tensor i is op-call tensor order[i]
    guard: SignatureGuard | None = None  # the op call signature's hot guard, picking ``order``

    def __call__(self, tensors: list[torch.Tensor]) -> Any:
        return self.plan([tensors[i] for i in self.order])

    def valid(self) -> bool:
        """Plans on, and the launch plan's executor still the one cached for its key."""
        k = self.kernel
        return _STATE["enabled"] and self.plan.valid(type(k)._executors.get(k.target))


def op_launch_for(plan: CallPlan, positional: tuple[Any, ...], keywords: Mapping[str, Any],
                  tensors: list[torch.Tensor], signature: tuple[Any, ...] | None = None) -> OpLaunch | None:
    """The :class:`OpLaunch` of a call that just ran through ``plan`` (``tensors``: the op call's,
    from :func:`~dsv4kit.jit.launch_plans.launch_signature`, ``signature`` its signature: the
    launch's guard), or None when the kernel keeps no launch plan for it."""
    kwargs = {**plan.kernel_args(positional, keywords), "debug_checks": plan.debug_checks}
    described = launch_signature((), kwargs)
    if described is None:
        return None
    launch = plans_of(plan.kernel).get(described[0])
    if launch is None:
        return None
    order = []
    for t in described[1]:
        i = next((j for j, u in enumerate(tensors) if u is t), None)
        if i is None:
            return None  # a tensor the op call did not pass
        order.append(i)
    guard = SignatureGuard(signature, tuple(order)) if signature is not None else None
    return OpLaunch(plan.kernel, plan.platform, launch, tuple(order), guard)
