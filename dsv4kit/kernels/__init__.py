"""The kernel families: one folder each, registered here by name (one line per family).

Everything that loops over families (the model stack, the CLI, the notebooks, the GPU scripts)
reads :func:`families`; nothing else names a family. Order is the call order within a layer
(spec §1 data flow); families a DSv4 layer does not call (the encoder store hooks, the rowquant
example) come last. Which families a layer calls, and where, is the model's table
(:mod:`dsv4kit.model.hooks`): the kernels know nothing of the model. A folder whose ops share
one kernel core (the three C4 compressors share the pooling core; K8a and K8b the norm-RoPE
core; the three store hooks share the encoders) holds one spec per op, in ``SPECS``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsv4kit.family import FamilySpec

__all__ = ["FAMILY_FOLDERS", "FAMILY_NAMES", "families", "family"]

#: family name -> its folder under ``dsv4kit/kernels``.
FAMILY_FOLDERS: dict[str, str] = {
    "save_partial_states": "save_partial_states",
    "c4_compress_ds_mla": "c4_compress",
    "c4_compress_plain": "c4_compress",
    "indexer_compress": "c4_compress",
    "c128_compress": "c128_compress",
    "c128_norm_rope_store_ds_mla": "c128_compress",
    "c128_norm_rope_store_plain": "c128_compress",
    "indexer_q": "indexer_q",
    "dequant_gather": "dequant_gather",
    "store_rows_ds": "encoders",
    "store_rows_plain": "encoders",
    "store_rows_indexer": "encoders",
    "rowquant": "rowquant",
}
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILY_FOLDERS)


def family(name: str) -> FamilySpec:
    """The spec of family ``name`` (its folder's ``spec.SPEC``, or ``spec.SPECS[name]``)."""
    if name not in FAMILY_FOLDERS:
        from dsv4kit.errors import input_error

        raise input_error("dsv4kit.kernels", "family", f"one of {', '.join(FAMILY_NAMES)}", repr(name))
    mod = importlib.import_module(f"dsv4kit.kernels.{FAMILY_FOLDERS[name]}.spec")
    specs = getattr(mod, "SPECS", None)
    return specs[name] if specs is not None else mod.SPEC


def families() -> tuple[FamilySpec, ...]:
    """Every registered family spec (those of a DSv4 layer: :func:`dsv4kit.model.hooks.model_families`)."""
    return tuple(family(n) for n in FAMILY_NAMES)
