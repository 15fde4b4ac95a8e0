"""PyTorch references of the C128 compressors K7, K8a and K8b, their argument tables and checks.

C128 layers compress in two steps. K7: at every boundary token (``p % 128 == 127``) pool the 128
state rows ``p - 127 .. p`` (16 state blocks of 8 rows, no overlap) into one fp32 row of 512.
K8: RMSNorm that row, rotate its last 64 dims at row ``(p // 128) * 128`` of the fp32 cos/sin
cache, and store it with an encoder: K8a E1 (fp8_ds_mla), K8b E2 / E3 (plain rows). K7 follows
the FP32 rule; K8 (and K7 -> K8 end to end) the compressor rule of §2.12; the encode step is
exactly the store hooks'.
"""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.operands import operands, with_operands
from dsv4kit.family.schema import Arg
from dsv4kit.formats.checks import check_per_token, check_same_device
from dsv4kit.formats.ds_mla import DS_HEAD_DIM
from dsv4kit.kernels.compressor import reference as common
from dsv4kit.kernels.compressor.contract import CompressorOperands
from dsv4kit.kernels.compressor.reference import compress_rows

__all__ = ["ARGS", "CACHE_ARG", "OPERANDS", "RATIO", "STATE_BLOCK_SIZE", "STORE_OPS",
           "c128_compress_reference", "c128_norm_rope_store_ds_mla_reference",
           "c128_norm_rope_store_plain_reference", "c128_rows",
           "check_c128_values", "check_k7", "check_k8"]

#: The compress ratio (window rows) of every kernel here.
RATIO = 128
#: K7 reads the window as 16 whole blocks of 8 rows: any other state block size raises (trap 5).
STATE_BLOCK_SIZE = 8
#: The two store ops (K8a, K8b) and their cache argument.
STORE_OPS = ("c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain")
CACHE_ARG = {"c128_norm_rope_store_ds_mla": "k_cache", "c128_norm_rope_store_plain": "kv_cache"}

_POSITIONS = common.positions_arg(RATIO)


def _store_args(cache: Arg, *extra: Arg) -> tuple[Arg, ...]:
    return (
        Arg("compressed_kv", "tensor", (torch.float32,), "[T, 512]",
            "K7's rows, strides (512, 1); only boundary rows are read"),
        _POSITIONS,
        common.SLOT_MAPPING,
        common.KV_SLOT_MAPPING,
        *common.norm_rope_args(DS_HEAD_DIM, RATIO),
        cache,
        *extra,
    )


#: The ops' argument tables (spec K7, K8).
ARGS: dict[str, tuple[Arg, ...]] = {
    "c128_compress": (
        Arg("state_cache", "tensor", (torch.float32,), "[nsb, 8, 1024]",
            "§2.8: strides (>= 8*1024, 1024, 1), data_ptr % 16 == 0; state block size 8 only (trap 5)"),
        common.TOKEN_TO_REQ,
        _POSITIONS,
        common.SLOT_MAPPING,
        common.block_table_arg("the window's 16 columns"),
        Arg("out", "tensor", (torch.float32,), "[>= T, 512]",
            "strides (512, 1); rows of non-boundary tokens are left untouched; allocated if None",
            optional=True, default=None),
    ),
    "c128_norm_rope_store_ds_mla": _store_args(common.ds_cache_arg("; kv_bs and P are key fields (trap 4)")),
    "c128_norm_rope_store_plain": _store_args(common.KV_CACHE, common.FP8_SCALE),
}

#: Each op's operand record (:mod:`dsv4kit.family.operands`): what a call binds once.
OPERANDS: dict[str, type] = {
    op: operands(op, table, CompressorOperands, aliases={"cache": CACHE_ARG[op]} if op in CACHE_ARG else None)
    for op, table in ARGS.items()
}


# --------------------------------------------------------------------------- K7


def check_k7(kernel: str, ops: Any) -> tuple[int, float]:
    """The metadata checks of a K7 call (its record ``ops``; host only: every call, before any
    launch); returns (T, 0.0): K7 has no eps, and every compressor's checks return (T, eps)."""
    ops = ops.checked(kernel)
    state_cache, out = ops.state_cache, ops.out
    if state_cache.dim() == 3 and state_cache.shape[1] != STATE_BLOCK_SIZE:  # trap 5
        raise input_error(
            kernel,
            "state_cache",
            f"shape[1] (state block size) == {STATE_BLOCK_SIZE}",
            f"shape {tuple(state_cache.shape)}",
        )
    t = common.check_compressor_inputs(kernel, ops, None, DS_HEAD_DIM)
    if out is not None:
        if out.dim() != 2 or out.shape[0] < t or out.shape[1] != DS_HEAD_DIM:
            raise input_error(kernel, "out", f"shape [>= {t}, {DS_HEAD_DIM}]", f"shape {tuple(out.shape)}")
        if out.shape[0] > 0 and out.stride() != (DS_HEAD_DIM, 1):
            raise input_error(kernel, "out", f"strides ({DS_HEAD_DIM}, 1)", f"strides {tuple(out.stride())}")
    check_same_device(kernel, ops.tensors())
    return t, 0.0


def _k7_reference(ops: Any) -> torch.Tensor:
    kernel = "c128_compress"
    t, _ = check_k7(kernel, ops)
    out = ops.out
    if out is None:
        out = torch.zeros((t, DS_HEAD_DIM), dtype=torch.float32, device=ops.state_cache.device)
    compressed_kv = out[:t]
    if t == 0:
        return compressed_kv
    idx = common.check_values(kernel, ops, RATIO, False, DS_HEAD_DIM)
    if idx.numel():
        compressed_kv[idx] = compress_rows(
            kernel, ops.state_cache, ops.block_table, ops.token_to_req[idx], ops.positions[idx], RATIO, False,
            DS_HEAD_DIM
        )
    return compressed_kv


c128_compress_reference = with_operands(OPERANDS["c128_compress"], _k7_reference,
    """K7: fp32 pooled rows ``compressed_kv [T, 512]`` (a view of ``out``) at C128 boundary tokens.

    Rows of other tokens are left untouched. Without ``out`` the reference allocates zeros (the
    spec allows uninitialized memory, and the kernels allocate so: callers must not read those rows).
    """, returns="torch.Tensor")


# --------------------------------------------------------------------------- K8a / K8b


def check_k8(kernel: str, ops: Any) -> tuple[int, float]:
    """The metadata checks of a K8a / K8b call (its record ``ops``; host only: every call, before
    any launch); returns (T, eps)."""
    ops = ops.checked(kernel)
    positions, compressed_kv = ops.positions, ops.compressed_kv
    check_per_token(kernel, "positions", positions, torch.int64, None)
    t = positions.shape[0]
    if compressed_kv.dim() != 2 or tuple(compressed_kv.shape) != (t, DS_HEAD_DIM):
        raise input_error(
            kernel, "compressed_kv", f"shape [{t}, {DS_HEAD_DIM}]", f"shape {tuple(compressed_kv.shape)}"
        )
    if t > 0 and compressed_kv.stride() != (DS_HEAD_DIM, 1):
        raise input_error(
            kernel, "compressed_kv", f"strides ({DS_HEAD_DIM}, 1)", f"strides {tuple(compressed_kv.stride())}"
        )
    check_per_token(kernel, "slot_mapping", ops.slot_mapping, torch.int64, t)
    check_per_token(kernel, "kv_slot_mapping", ops.kv_slot_mapping, torch.int64, t)
    eps = common.check_norm_rope_inputs(kernel, ops, DS_HEAD_DIM)
    common.check_store_inputs(kernel, ops, t, kv_slots=False)
    return t, eps


def c128_rows(kernel: str, ops: Any, eps: float, idx: torch.Tensor) -> torch.Tensor:
    """The fp32 rows ``y [n, 512]`` of the tokens ``idx``: rmsnorm -> rope at (p // 128) * 128."""
    return common.norm_rope_rows(
        kernel, ops.compressed_kv[idx], ops.positions[idx], RATIO, ops.rms_norm_weight, eps, ops.cos_sin_cache
    )


def _k8_reference(ops: Any) -> None:
    common.stored_reference(ops, check_k8, c128_rows, RATIO, False, DS_HEAD_DIM)


c128_norm_rope_store_ds_mla_reference = with_operands(
    OPERANDS["c128_norm_rope_store_ds_mla"], _k8_reference,
    "K8a: RMSNorm -> RoPE at ``(p // 128) * 128`` -> E1 -> fp8_ds_mla store, boundary rows only.")
c128_norm_rope_store_plain_reference = with_operands(
    OPERANDS["c128_norm_rope_store_plain"], _k8_reference,
    "K8b: as K8a but E2 (bf16 cache) or E3 (e4m3 cache with ``fp8_scale[0]``) plain-row store (§2.6).")


def check_c128_values(kernel: str, ops: Any) -> torch.Tensor:
    """The value checks of a C128 op's record (K7: request rows, block-table columns and entries;
    K8a / K8b: kv slots unique and in range, rope rows, ``fp8_scale`` > 0), the form the viz and the
    pipeline judge call; returns the indices of the tokens that write an entry."""
    return common.check_values(kernel, ops, RATIO, False, DS_HEAD_DIM)
