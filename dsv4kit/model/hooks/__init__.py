"""The model's table of the kernel families of a DSv4 attention layer: family name ->
:class:`ModelHooks`, in call order within a layer (spec §1 data flow).

The model knows the kernels, the kernels do not know the model: every hook lives here, one small
module per kernel folder, and nothing under ``dsv4kit/kernels`` or ``dsv4kit/family`` imports
this package. A family without an entry (the encoder store hooks, the rowquant example) is not
called by a DSv4 layer.
"""

from __future__ import annotations

from dsv4kit.family import FamilySpec
from dsv4kit.kernels import family
from dsv4kit.model.hooks import c4_compress, c128_compress, dequant_gather, indexer_q, save_partial_states
from dsv4kit.model.hooks.base import ModelHooks, Site, check_dispatch_by_name

__all__ = ["HOOKS", "ModelHooks", "Site", "check_dispatch_by_name", "model_families"]

#: family name -> its hooks, in call order within a layer.
HOOKS: dict[str, ModelHooks] = {
    **save_partial_states.HOOKS,
    **c4_compress.HOOKS,
    **c128_compress.HOOKS,
    **indexer_q.HOOKS,
    **dequant_gather.HOOKS,
}


def model_families() -> tuple[FamilySpec, ...]:
    """The specs of the families a DSv4 layer calls (those of :data:`HOOKS`), in call order."""
    return tuple(check_dispatch_by_name(family(name)) for name in HOOKS)
