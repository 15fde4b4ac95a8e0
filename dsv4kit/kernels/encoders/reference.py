"""The row encoders E1..E5 as store hooks (spec §2.9): references, argument tables and checks.

A compressor is "compute an fp32 row y" (compressor rule) followed by "encode y" (bit-exact).
These hooks run only the second half on given fp32 rows: ``rows[t]`` is encoded and written at
``kv_slot_mapping[t]`` (slot < 0: skipped) with the addressing of §2.5-2.7. They are the test
hooks of the encode step; inside each backend the compressors call the very routine the hook
launches. The references are the formats' store functions, each on its hook's operand record.
"""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.operands import operands, with_operands
from dsv4kit.family.schema import Arg
from dsv4kit.formats.checks import (
    check_contiguous,
    check_per_token,
    check_shape,
    check_slot_values,
)
from dsv4kit.formats.ds_mla import DS_HEAD_DIM, check_ds_cache, store_rows_ds
from dsv4kit.formats.indexer_cache import IDX_HEAD_DIM, check_indexer_cache, store_rows_indexer
from dsv4kit.formats.plain_row import PLAIN_HEAD_DIM, check_fp8_scale, check_plain_cache, store_rows_plain

__all__ = [
    "ARGS",
    "CACHE_ARG",
    "check_aligned",
    "HEAD_DIM",
    "OPERANDS",
    "StoreRowsOperands",
    "check_store_inputs",
    "check_store_values",
    "store_rows_ds_reference",
    "store_rows_indexer_reference",
    "store_rows_plain_reference",
]

_ROWS = "fp32 rows y, contiguous, data_ptr % 16 == 0"
_SLOTS = "slot per row; < 0 = skip; debug: unique, < num_pages * kv_bs"

#: The op's argument table, per hook (spec §2.9).
ARGS: dict[str, tuple[Arg, ...]] = {
    "store_rows_ds": (
        Arg("rows", "tensor", (torch.float32,), f"[T, {DS_HEAD_DIM}]", _ROWS),
        Arg("k_cache", "tensor", (torch.uint8,), "[num_pages, kv_bs, 584]",
            "fp8_ds_mla (§2.5, §2.10): strides (P, 584, 1), P % 576 == 0, P >= 584 kv_bs, "
            "data_ptr % 32 == 0"),
        Arg("kv_slot_mapping", "tensor", (torch.int64,), "[T]", _SLOTS),
    ),
    "store_rows_plain": (
        Arg("rows", "tensor", (torch.float32,), f"[T, {PLAIN_HEAD_DIM}]", _ROWS),
        Arg("cache", "tensor", (torch.bfloat16, torch.float8_e4m3fn), "[num_pages, kv_bs, 512]",
            "plain rows (§2.6): strides (P, 512, 1), P % 16 == 0, data_ptr % 16 == 0"),
        Arg("kv_slot_mapping", "tensor", (torch.int64,), "[T]", _SLOTS),
        Arg("fp8_scale", "tensor", (torch.float32,), "[1]",
            "required iff the cache is e4m3 (E3 divides by it); debug: finite and > 0", optional=True,
            default=None),
    ),
    "store_rows_indexer": (
        Arg("rows", "tensor", (torch.float32,), f"[T, {IDX_HEAD_DIM}]", _ROWS),
        Arg("k_cache", "tensor", (torch.uint8,), "[num_pages, kv_bs, 132]",
            "indexer K cache (§2.7): strides (P, 132, 1), P % 4 == 0, P >= 132 kv_bs, data_ptr % 16 == 0"),
        Arg("kv_slot_mapping", "tensor", (torch.int64,), "[T]", _SLOTS),
        Arg("use_fp4", "bool", rule="False: E4 (FP8, fp32 scale value); True: E5 (MXFP4, 4 ue8m0 bytes)"),
    ),
}

#: The cache argument of each hook, and the row width it stores.
CACHE_ARG = {"store_rows_ds": "k_cache", "store_rows_plain": "cache", "store_rows_indexer": "k_cache"}
HEAD_DIM = {"store_rows_ds": DS_HEAD_DIM, "store_rows_plain": PLAIN_HEAD_DIM,
            "store_rows_indexer": IDX_HEAD_DIM}


class StoreRowsOperands:
    """The store hooks' record mixin: an argument a hook does not take reads as None (the record's
    fields come first in its MRO), and ``cache`` is the hook's cache (E2 / E3's own field, an alias
    of ``k_cache`` for E1 and E4 / E5)."""

    __slots__ = ()

    cache: torch.Tensor
    fp8_scale: torch.Tensor | None = None
    use_fp4: bool | None = None


#: Each hook's operand record (:mod:`dsv4kit.family.operands`): the checks, the reference and the
#: kernel's call take one, bound once per call.
OPERANDS: dict[str, type] = {
    op: operands(op, table, StoreRowsOperands,
                 aliases=None if CACHE_ARG[op] == "cache" else {"cache": CACHE_ARG[op]})
    for op, table in ARGS.items()
}


def check_store_inputs(kernel: str, ops: Any) -> int:
    """The metadata checks of a call's record ``ops`` (host only, every call); returns T. Errors
    name ``kernel``."""
    hook = ops.op
    rows, cache, kv_slot_mapping = ops.checked(kernel)[:3]  # the table's checks; every hook's first three
    check_shape(kernel, "rows", rows, (None, HEAD_DIM[hook]))
    check_contiguous(kernel, "rows", rows)
    t = rows.shape[0]
    if hook == "store_rows_ds":
        check_ds_cache(kernel, "k_cache", cache)
    elif hook == "store_rows_plain":
        check_plain_cache(kernel, "cache", cache)
        check_fp8_scale(kernel, cache, ops.fp8_scale, check_value=False)
    else:
        check_indexer_cache(kernel, "k_cache", cache)
    check_per_token(kernel, "kv_slot_mapping", kv_slot_mapping, torch.int64, t)
    if t:
        check_aligned(kernel, "rows", rows, 16)
    if hook == "store_rows_plain":
        check_aligned(kernel, "cache", cache, 16)
    return t


def check_aligned(kernel: str, arg: str, x: torch.Tensor, align: int) -> None:
    """``x.data_ptr() % align == 0``: the kernels declare these operands aligned (vector access)."""
    off = x.data_ptr() % align
    if off:
        raise input_error(kernel, arg, f"data_ptr % {align} == 0", f"data_ptr % {align} == {off}")


def check_store_values(kernel: str, ops: Any) -> None:
    """The checks that read device memory (debug) of a call's record ``ops``: slots unique and in
    range, ``fp8_scale`` > 0."""
    cache, fp8_scale = ops.cache, ops.fp8_scale
    check_slot_values(kernel, "kv_slot_mapping", ops.kv_slot_mapping, cache)
    if fp8_scale is not None:
        check_fp8_scale(kernel, cache, fp8_scale)


#: The formats' store function of each hook: the normative encode and write, its own checks first.
_STORE = {"store_rows_ds": store_rows_ds, "store_rows_plain": store_rows_plain,
          "store_rows_indexer": store_rows_indexer}


def _reference(ops: Any) -> None:
    """A hook's reference on a bound call: the formats' store function of ``ops.op``."""
    _STORE[ops.op](*ops)


# Each reference has the op's signature (its table) and the formats function's docs.
store_rows_ds_reference = with_operands(OPERANDS["store_rows_ds"], _reference, store_rows_ds.__doc__ or "")
store_rows_plain_reference = with_operands(OPERANDS["store_rows_plain"], _reference,
                                           store_rows_plain.__doc__ or "")
store_rows_indexer_reference = with_operands(OPERANDS["store_rows_indexer"], _reference,
                                             store_rows_indexer.__doc__ or "")
