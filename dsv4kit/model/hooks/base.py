"""What the model knows of a kernel family: :class:`ModelHooks`, the family's place in a DSv4 layer.

The kernels know nothing of the model; the model adapts to them. Each family of a DSv4 layer has
one small module here (``dsv4kit/model/hooks/<folder>.py``) whose hooks read the stack's runtime
settings and describe, by the op's own argument names, the calls a serving step makes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4kit.errors import ContractError
from dsv4kit.family import DEFAULT_VARIANT, FamilySpec

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = ["ModelHooks", "Site", "check_dispatch_by_name"]


@dataclass(frozen=True)
class Site:
    """One op call a layer makes in a serving step: a call-site name and the op's arguments by
    name (:class:`~dsv4kit.family.calls.TensorSpec` stand-ins, or plain values)."""

    name: str
    args: Mapping[str, Any]


def _no_reason(*_: Any) -> str | None:
    return None


def _default_variant(_: Any) -> str:
    return DEFAULT_VARIANT


@dataclass(frozen=True)
class ModelHooks:
    """A family's place in a DSv4 attention layer (what the stack and the trace replay read).

    ``config(stack, layer)``: the warmup config of the calls the layer makes, or None where the
    runtime never calls the family on that layer (the registration gate). ``call_sites(stack,
    layer, step)``: the op calls of a serving step, as :class:`Site` rows. ``variant(stack)``:
    which variant this runtime calls; ``variant_reason(stack)`` completes "<variant> variant not
    selected: ..." for the others. ``unused(stack)``: why the runtime never calls the family at
    all (None when it does). ``explain_dead(stack, key, stats)``: why a warmed key was never
    requested by a trace, or None for no family-specific reason.
    """

    config: Callable[[DSv4AttentionStack, AttentionLayer], Any]
    call_sites: Callable[[DSv4AttentionStack, AttentionLayer, Step], list[Site]]
    variant: Callable[[DSv4AttentionStack], str] = _default_variant
    variant_reason: Callable[[DSv4AttentionStack], str | None] = _no_reason
    unused: Callable[[DSv4AttentionStack], str | None] = _no_reason
    explain_dead: Callable[[DSv4AttentionStack, Any, ReplayStats], str | None] = _no_reason


def check_dispatch_by_name(spec: FamilySpec) -> FamilySpec:
    """``spec``, once its ``dispatch`` reads op arguments only: the model replays a call by binding
    its arguments to ``dispatch`` by name, with no adapter per family (ContractError otherwise)."""
    names = [a.name for a in spec.args]
    missing = [p for p in spec.contract._dispatch_program.params if p not in names]  # type: ignore[attr-defined]
    if missing:
        raise ContractError(f"FamilySpec({spec.name}): dispatch parameters {missing} of "
                            f"{spec.contract.__name__} are not op arguments {names}; dispatch must read "
                            "the op's arguments by name")
    return spec
