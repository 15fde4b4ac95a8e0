"""The kernel families: one folder each, registered here by name (one line per family).

Everything that loops over families (the model stack, the CLI, the notebooks, the GPU scripts)
reads :func:`families`; nothing else names a family. Order is the call order within a layer
(spec §1 data flow); families without model hooks (the rowquant example) come last.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsv4kit.family import FamilySpec

__all__ = ["FAMILY_NAMES", "families", "family"]

FAMILY_NAMES: tuple[str, ...] = (
    "save_partial_states",
    "indexer_q",
    "dequant_gather",
    "rowquant",
)


def family(name: str) -> FamilySpec:
    """The spec of family ``name`` (its folder's ``spec.SPEC``)."""
    if name not in FAMILY_NAMES:
        from dsv4kit.errors import input_error

        raise input_error("dsv4kit.kernels", "family", f"one of {', '.join(FAMILY_NAMES)}", repr(name))
    return importlib.import_module(f"dsv4kit.kernels.{name}.spec").SPEC


def families(*, model: bool = False) -> tuple[FamilySpec, ...]:
    """Every registered family spec; ``model=True``: only those with model hooks (a DSv4 layer's)."""
    specs = tuple(family(n) for n in FAMILY_NAMES)
    return tuple(s for s in specs if s.model is not None) if model else specs
