"""``kernel_launcher``: ``__call__`` describes a launch; the backend performs it.

Keeping the description declarative means one ``__call__`` serves every backend:
it validates, dispatches and returns ``(key, args[, output[, finalizer]])``; the
kernel's ``launch`` fetches the executor warmed for ``key`` and runs it. A call with value checks
off whose argument signature was seen before skips ``__call__`` and runs the signature's
:class:`~dsv4kit.jit.launch_plans.LaunchPlan` (same checks' outcome, same launch); the plans
used last are tried first through their hot guard, which proves the signature without computing it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

from dsv4kit.jit.launch_plans import (
    _STATE,
    FIRST,
    MAX_PLANS,
    PLAN,
    build_plan,
    launch_signature,
    plans_of,
    size_sight,
    take_sight,
)
from dsv4kit.jit.monitor import runtime_entry

__all__ = ["Immediate", "LaunchSpec", "as_launch_spec", "kernel_launcher", "launch_spec"]


class LaunchSpec(NamedTuple):
    """What to launch: ``executor(*args)`` for ``key``.

    ``output``: what the call returns (default: whatever the executor returns).
    ``finalizer``: applied to the result before returning it (e.g. a view or a dtype cast).
    A named tuple, not a frozen dataclass: every full-path call makes one, and a frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field) costs five times as much.
    """

    key: Any
    args: tuple[Any, ...]
    output: Any = None
    finalizer: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Immediate:
    """Nothing to launch (e.g. ``T == 0``): return ``value`` without dispatch or guard."""

    value: Any = None


def as_launch_spec(spec: Any, where: str) -> LaunchSpec | Immediate:
    """Normalize what ``__call__`` returned into a :class:`LaunchSpec` or :class:`Immediate`."""
    tp = type(spec)
    if tp is tuple and 2 <= len(spec) <= 4 and type(spec[1]) is tuple:  # the usual return, first
        return LaunchSpec(*spec)
    if tp is LaunchSpec or tp is Immediate or isinstance(spec, LaunchSpec | Immediate):
        return spec
    if isinstance(spec, tuple) and 2 <= len(spec) <= 4:
        key, args, *rest = spec
        if not isinstance(args, tuple | list):
            raise TypeError(f"{where}: launch args: expected a tuple, got {type(args).__name__}")
        return LaunchSpec(key, tuple(args), *rest)
    raise TypeError(
        f"{where}: __call__ must return (key, args), (key, args, output), "
        f"(key, args, output, finalizer), LaunchSpec or Immediate; got {type(spec).__name__}"
    )


def launch_spec(kernel: Any, spec: LaunchSpec, inputs: dict[str, Any] | None = None) -> Any:
    """The end of every full-path call: the key checked, then ``kernel.launch``."""
    kernel.check_key(spec.key)
    return kernel.launch(spec, inputs)


@overload
def kernel_launcher(fn: Callable[..., Any]) -> Callable[..., Any]: ...
@overload
def kernel_launcher(
    *, bind_launch_inputs: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def kernel_launcher(fn: Callable[..., Any] | None = None, *, bind_launch_inputs: bool = False) -> Any:
    """Decorate a kernel's ``__call__`` so that its returned spec is launched by ``self.launch``.

    With ``bind_launch_inputs=True`` the call's arguments, bound to ``__call__``'s signature
    (defaults applied), are passed to ``launch(spec, inputs)``; otherwise ``inputs`` is None.
    """

    def decorate(call: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(call)
        names = list(sig.parameters)[1:]
        debug_at = names.index("debug_checks") if "debug_checks" in names else None

        def plannable(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
            """Value checks off (explicitly, or by the platform's default) and a plan-safe launch."""
            if (bind_launch_inputs or debug_at is None or not _STATE["enabled"]
                    or not getattr(type(self).launch, "plan_safe", False)):
                return False
            debug = kwargs.get("debug_checks") if len(args) <= debug_at else args[debug_at]
            if debug is None:
                platform = getattr(self, "platform", None)
                return platform is not None and platform.is_cuda
            return debug is False

        @functools.wraps(call)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            plans = plans_of(self)
            sight = take_sight()  # the op's hint: FIRST skips the plan lookups, PLAN plans this call
            if sight is FIRST:
                return full_path(self, args, kwargs, None)
            if plans.hot and not plans.missed and _STATE["enabled"]:
                # a hot entry exists only for a plannable call, and plannable's other inputs are
                # fixed per kernel object or checked by the guard (debug_checks' value)
                cache = type(self)._executors.get(self.target)
                for plan, guard in plans.hot:  # the guard first: a miss never hashes the key
                    tensors = guard(args, kwargs)
                    if tensors is not None and plan.valid(cache):
                        return plan(tensors)
                plans.missed = True  # the next call asks its size sight first (PlanTable.missed)
            if not plannable(self, args, kwargs):
                return full_path(self, args, kwargs, None)
            sizes = size_sight(args, kwargs)
            entries = plans.sighted(sizes)
            # sizes never counted: a signature never seen, not computed (the op's PLAN: seen by the op)
            if entries is None and sight is not PLAN:
                return full_path(self, args, kwargs, None)
            if entries:
                cache = type(self)._executors.get(self.target)
                for entry in entries:
                    tensors = entry[1](args, kwargs)
                    if tensors is not None and entry[0].valid(cache):
                        plans.lift(entry)
                        return entry[0](tensors)
            described = launch_signature(args, kwargs)
            if described is not None:
                plan = plans.get(described[0])
                if plan is not None:
                    if plan.valid(type(self)._executors.get(self.target)):
                        plans.promote(plan, described[1])
                        plans.file(sizes, plan)
                        return plan(described[1])
                    del plans[described[0]]  # its executor was cleared: the full path reports a miss
            # planned on its second call (the op's PLAN: the op saw it before)
            plan_it = described is not None and (sight is PLAN or plans.seen_before(described[0]))
            return full_path(self, args, kwargs, described if plan_it else None, sizes)

        def full_path(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      described: tuple[tuple[Any, ...], list[Any]] | None, sizes: Any = None) -> Any:
            """The full path: ``__call__``'s checks and spec, the launch; with ``described`` (the
            call's signature and tensors), the launch is planned (filed under ``sizes``, its size
            sight)."""
            spec = as_launch_spec(call(self, *args, **kwargs), type(self).__name__)
            if isinstance(spec, Immediate):
                return spec.value
            inputs = None
            if bind_launch_inputs:
                bound = sig.bind(self, *args, **kwargs)
                bound.apply_defaults()
                inputs = dict(bound.arguments)
                inputs.pop(next(iter(sig.parameters)))
            result = launch_spec(self, spec, inputs)
            if described is not None:
                plan = build_plan(self, spec, described[1], described[0])
                if plan is not None:
                    plans = plans_of(self)
                    if len(plans) >= MAX_PLANS:
                        plans.clear()
                    plans[described[0]] = plan
                    plans.promote(plan, described[1])
                    plans.file(sizes, plan)
            return result

        wrapper.__kernel_launcher__ = True  # type: ignore[attr-defined]
        runtime_entry(wrapper)  # host code generated below a kernel call is reported after warmup
        return wrapper

    return decorate(fn) if fn is not None else decorate
