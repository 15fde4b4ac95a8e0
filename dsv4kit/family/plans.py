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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.family.schema import Arg, normalize_scalar
from dsv4kit.jit.launch_plans import _STATE, LaunchPlan, SignatureGuard, launch_signature, plans_of
from dsv4kit.platform import current_platform

__all__ = ["MAX_PLANS", "CallPlan", "OpLaunch", "call_signature", "op_launch_for", "plan_for"]

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
             variant_arg: str | None, debug_checks: bool | None) -> CallPlan:
    """The plan of a call that the full path just checked: ``checked`` its normalized values."""
    given = {a.name for a in args[: len(positional)]} | set(keywords)
    defaults = {name: value for name, value in checked.items() if name not in given}
    drop = tuple(options) + ((variant_arg,) if variant_arg else ())
    return CallPlan(kernel, platform, tuple(a.name for a in args[: len(positional)]),
                    defaults, drop, debug_checks, tuple((a.name, a.kind) for a in args if a.kind != "tensor"))


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
