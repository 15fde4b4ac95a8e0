"""One small valid call of every public op, by argument name, from the family's seeded cases.

The bad-input matrix mutates these argument by argument; the host-overhead benchmark times them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsv4kit.family import FamilySpec
from dsv4kit.family.schema import REQUIRED
from dsv4kit.kernels.c4_compress.cases import make_case as c4_case
from dsv4kit.kernels.c128_compress.cases import make_k7_case, make_k8_case
from dsv4kit.kernels.dequant_gather.cases import make_case as k3_case
from dsv4kit.kernels.encoders.cases import make_case as store_case
from dsv4kit.kernels.indexer_q.cases import make_case as iq_case
from dsv4kit.kernels.rowquant.cases import regime
from dsv4kit.kernels.save_partial_states.cases import make_case as k4_case

__all__ = ["SIZED", "VALID", "bound", "sized_call", "twin", "valid_call"]


def bound(spec: FamilySpec, args: tuple) -> dict[str, Any]:
    """Positional case arguments by the op's argument names (the table's leading rows)."""
    return dict(zip((a.name for a in spec.args), args, strict=False))


#: A valid call of each op (by family name), by argument name; fresh tensors on every call.
VALID: dict[str, Callable[[FamilySpec], dict[str, Any]]] = {
    "save_partial_states": lambda spec: k4_case((256, 4, 4), 5, seed=1).kwargs(),
    "indexer_q": lambda spec: bound(spec, iq_case(3, seed=1).args()),
    "dequant_gather": lambda spec: bound(spec, k3_case([9, 3], [4, 3], block_size=16, seed=1).args()),
    "rowquant": lambda spec: {"x": regime("normal", 3, 256)},
    "c4_compress_ds_mla": lambda spec: c4_case(spec.name, lens=(9,), seed=1).fresh().args,
    "c4_compress_plain": lambda spec: c4_case(spec.name, lens=(9,), fp8_scale=0.5, seed=1).fresh().args,
    "indexer_compress": lambda spec: c4_case(spec.name, lens=(9,), seed=1).fresh().args,
    "c128_compress": lambda spec: make_k7_case(lens=(3,), starts=(126,), seed=1).fresh().args,
    "c128_norm_rope_store_ds_mla": lambda spec: make_k8_case(spec.name, t=5, boundaries=2,
                                                             seed=1).fresh().args,
    "c128_norm_rope_store_plain": lambda spec: make_k8_case(spec.name, t=5, boundaries=2, fp8_scale=0.5,
                                                            seed=1).fresh().args,
    "store_rows_ds": lambda spec: store_case(spec.name, 5, seed=1).fresh().args,
    "store_rows_plain": lambda spec: store_case(spec.name, 5, fp8_scale=0.5, seed=1).fresh().args,
    "store_rows_indexer": lambda spec: store_case(spec.name, 5, seed=1).fresh().args,
}


#: A valid call of each op whose token count (or request length) grows with ``n >= 1``: the serving
#: regimes of the host-overhead benchmark and the randomized plan test draw shapes from these.
SIZED: dict[str, Callable[[FamilySpec, int], dict[str, Any]]] = {
    "save_partial_states": lambda spec, n: k4_case((256, 4, 4), n, seed=n).kwargs(),
    "indexer_q": lambda spec, n: bound(spec, iq_case(n, seed=n).args()),
    "dequant_gather": lambda spec, n: bound(spec, k3_case([8 + n, 3], [4 + n, 3], block_size=16,
                                                          seed=n).args()),
    "rowquant": lambda spec, n: {"x": regime("normal", n, 256, seed=n)},
    "c4_compress_ds_mla": lambda spec, n: c4_case(spec.name, lens=(n,), seed=n).fresh().args,
    "c4_compress_plain": lambda spec, n: c4_case(spec.name, lens=(n,), fp8_scale=0.5, seed=n).fresh().args,
    "indexer_compress": lambda spec, n: c4_case(spec.name, lens=(n,), seed=n).fresh().args,
    "c128_compress": lambda spec, n: make_k7_case(lens=(n,), starts=(126,), seed=n).fresh().args,
    "c128_norm_rope_store_ds_mla": lambda spec, n: make_k8_case(spec.name, t=n + 1, boundaries=1,
                                                                seed=n).fresh().args,
    "c128_norm_rope_store_plain": lambda spec, n: make_k8_case(spec.name, t=n + 1, boundaries=1,
                                                               fp8_scale=0.5, seed=n).fresh().args,
    "store_rows_ds": lambda spec, n: store_case(spec.name, n, seed=n).fresh().args,
    "store_rows_plain": lambda spec, n: store_case(spec.name, n, fp8_scale=0.5, seed=n).fresh().args,
    "store_rows_indexer": lambda spec, n: store_case(spec.name, n, seed=n).fresh().args,
}


def sized_call(spec: FamilySpec, n: int) -> dict[str, Any]:
    """A valid call of ``spec`` at size ``n`` (see :data:`SIZED`): fresh tensors on every call."""
    return SIZED[spec.name](spec, n)


def valid_call(spec: FamilySpec, *, with_defaults: bool = False) -> dict[str, Any]:
    """The valid call of ``spec``; ``with_defaults``: every argument given, defaults too."""
    call = VALID[spec.name](spec)
    if not with_defaults:
        return call
    return {**{a.name: a.default for a in spec.args if a.default is not REQUIRED}, **call}


def twin(t: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """A copy of ``t`` (on ``device``, default its own) with the same storage size, storage offset,
    sizes and strides: the same call signature, fresh memory (``clone`` would compact a view)."""
    if t.device.type == "meta":
        return t
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())  # every byte
    storage = (raw.clone() if device is None else raw.to(device)).untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=storage.device).set_(storage, t.storage_offset(), t.size(),
                                                                     t.stride())
