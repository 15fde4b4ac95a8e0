"""PyTorch references of the C4 compressors K5, K6 and K9, their argument tables and checks.

At every boundary token (``p % 4 == 3``) of a C4 layer: pool the overlapping 8-row window of
the state K4 wrote (previous block's half A, current block's half B; the first boundary p = 3
has rows 4..7 only), RMSNorm, rotate the last 64 dims at row ``(p // 4) * 4`` of the fp32
cos/sin cache, and store the row with an encoder: K5 E1 (fp8_ds_mla, head 512), K6 E2 / E3
(plain rows, head 512), K9 E4 / E5 (indexer K cache, head 128). Pooling, softmax and norm run
in fp32 (kernels: the compressor rule of §2.12); the encode step is exactly the store hooks'.
"""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.family.operands import operands, with_operands
from dsv4kit.family.schema import Arg
from dsv4kit.formats.ds_mla import DS_HEAD_DIM
from dsv4kit.formats.indexer_cache import IDX_HEAD_DIM
from dsv4kit.kernels.compressor import reference as common
from dsv4kit.kernels.compressor.contract import CompressorOperands

__all__ = ["ARGS", "CACHE_ARG", "HEAD_DIM", "OPERANDS", "RATIO", "c4_compress_ds_mla_reference",
           "c4_compress_plain_reference", "c4_rows", "check_c4", "check_c4_values",
           "indexer_compress_reference"]

#: The compress ratio of every kernel here (and of their windows: 2 R = 8 rows).
RATIO = 4



def _state_args(head: int) -> tuple[Arg, ...]:
    return (
        Arg("state_cache", "tensor", (torch.float32,), f"[nsb, sbs, {4 * head}]",
            "§2.8: strides (>= sbs*row, row, 1), data_ptr % 16 == 0; rows written by K4"),
        common.TOKEN_TO_REQ,
        common.positions_arg(RATIO),
        common.SLOT_MAPPING,
        common.block_table_arg("window columns"),
        Arg("state_block_size", "int", rule="== state_cache.shape[1] (4 in production)"),
        *common.norm_rope_args(head, RATIO),
    )


#: The ops' argument tables (spec K5, K6, K9).
ARGS: dict[str, tuple[Arg, ...]] = {
    "c4_compress_ds_mla": (*_state_args(DS_HEAD_DIM), common.ds_cache_arg(), common.KV_SLOT_MAPPING),
    "c4_compress_plain": (
        *_state_args(DS_HEAD_DIM), common.KV_CACHE, common.KV_SLOT_MAPPING, common.FP8_SCALE
    ),
    "indexer_compress": (
        *_state_args(IDX_HEAD_DIM),
        Arg("k_cache", "tensor", (torch.uint8,), "[num_pages, kv_bs, 132]",
            "indexer K cache (§2.7): strides (P, 132, 1), P % 4 == 0, P >= 132 kv_bs, data_ptr % 16 == 0"),
        common.KV_SLOT_MAPPING,
        Arg("use_fp4_cache", "bool", rule="False: FP8 pages (E4); True: MXFP4 pages (E5)"),
    ),
}

#: The cache argument of each op, and the head it stores.
CACHE_ARG = {"c4_compress_ds_mla": "k_cache", "c4_compress_plain": "kv_cache", "indexer_compress": "k_cache"}
HEAD_DIM = {
    "c4_compress_ds_mla": DS_HEAD_DIM,
    "c4_compress_plain": DS_HEAD_DIM,
    "indexer_compress": IDX_HEAD_DIM,
}

#: Each op's operand record (:mod:`dsv4kit.family.operands`): what a call binds once.
OPERANDS: dict[str, type] = {op: operands(op, table, CompressorOperands, aliases={"cache": CACHE_ARG[op]})
                             for op, table in ARGS.items()}


def check_c4(kernel: str, ops: Any) -> tuple[int, float]:
    """The metadata checks of a call (its record ``ops``; host only: every call, before any launch);
    returns (T, eps)."""
    ops = ops.checked(kernel)
    head = HEAD_DIM[ops.op]
    t = common.check_compressor_inputs(kernel, ops, ops.state_block_size, 2 * head)
    eps = common.check_norm_rope_inputs(kernel, ops, head)
    common.check_store_inputs(kernel, ops, t)
    return t, eps


def c4_rows(kernel: str, ops: Any, eps: float, idx: torch.Tensor) -> torch.Tensor:
    """The fp32 rows ``y [n, head]`` of the tokens ``idx``: pool -> rmsnorm -> rope at (p // 4) * 4."""
    p = ops.positions[idx]
    c = common.compress_rows(kernel, ops.state_cache, ops.block_table, ops.token_to_req[idx], p, RATIO, True,
                      HEAD_DIM[ops.op])
    return common.norm_rope_rows(kernel, c, p, RATIO, ops.rms_norm_weight, eps, ops.cos_sin_cache)


def _reference(ops: Any) -> None:
    common.stored_reference(ops, check_c4, c4_rows, RATIO, True, HEAD_DIM[ops.op])


c4_compress_ds_mla_reference = with_operands(OPERANDS["c4_compress_ds_mla"], _reference,
    "K5: C4 pool (D 512) -> RMSNorm -> RoPE -> E1 -> fp8_ds_mla store.")
c4_compress_plain_reference = with_operands(OPERANDS["c4_compress_plain"], _reference,
    "K6: as K5 up to y, then E2 (bf16 cache) or E3 (e4m3 cache with ``fp8_scale[0]``) plain-row store.")
indexer_compress_reference = with_operands(OPERANDS["indexer_compress"], _reference,
    "K9: C4 pool (D 128) -> RMSNorm -> RoPE on dims [64, 128) -> E4 (FP8) or E5 (MXFP4) store (§2.7).")


def check_c4_values(kernel: str, ops: Any) -> torch.Tensor:
    """:func:`~dsv4kit.kernels.compressor.reference.check_values` of a C4 op's record (the form
    :mod:`dsv4kit.viz.compressor` and the pipeline judge call); returns the indices of the tokens
    that write an entry."""
    return common.check_values(kernel, ops, RATIO, True, HEAD_DIM[ops.op])
