"""PyTorch references of the C4 compressors K5, K6 and K9, their argument tables and checks.

At every boundary token (``p % 4 == 3``) of a C4 layer: pool the overlapping 8-row window of
the state K4 wrote (previous block's half A, current block's half B; the first boundary p = 3
has rows 4..7 only), RMSNorm, rotate the last 64 dims at row ``(p // 4) * 4`` of the fp32
cos/sin cache, and store the row with an encoder: K5 E1 (fp8_ds_mla, head 512), K6 E2 / E3
(plain rows, head 512), K9 E4 / E5 (indexer K cache, head 128). Pooling, softmax and norm run
in fp32 (kernels: the compressor rule of §2.12); the encode step is exactly the store hooks'.
"""

from __future__ import annotations

import torch

from dsv4kit.family.schema import Arg, check_args
from dsv4kit.formats.checks import check_per_token, check_same_device
from dsv4kit.formats.ds_mla import DS_HEAD_DIM, check_ds_cache, enc_ds, write_ds_entries
from dsv4kit.formats.indexer_cache import IDX_HEAD_DIM, check_indexer_cache, write_indexer_rows
from dsv4kit.formats.plain_row import check_fp8_scale, check_plain_cache, write_plain_rows
from dsv4kit.kernels.compressor.reference import (
    check_compressor_inputs,
    check_norm_rope_inputs,
    check_rope_rows,
    check_window_rows,
    compress_rows,
    norm_rope_rows,
    selected_tokens,
)

__all__ = [
    "ARGS",
    "CACHE_ARG",
    "HEAD_DIM",
    "RATIO",
    "c4_compress_ds_mla_reference",
    "c4_compress_plain_reference",
    "c4_rows",
    "check_c4_inputs",
    "check_c4_values",
    "indexer_compress_reference",
]

#: The compress ratio of every kernel here (and of their windows: 2 R = 8 rows).
RATIO = 4

_SLOTS = "state slots; < 0 = padding (skipped)"


def _state_args(head: int) -> tuple[Arg, ...]:
    return (
        Arg(
            "state_cache",
            "tensor",
            (torch.float32,),
            f"[nsb, sbs, {4 * head}]",
            "§2.8: strides (>= sbs*row, row, 1), data_ptr % 16 == 0; rows written by K4",
        ),
        Arg("token_to_req", "tensor", (torch.int32,), "[T]", "request row of block_table; debug: in range"),
        Arg("positions", "tensor", (torch.int64,), "[T]", "defines T; boundary tokens: (p + 1) % 4 == 0"),
        Arg("slot_mapping", "tensor", (torch.int64,), "[T]", _SLOTS),
        Arg(
            "block_table",
            "tensor",
            (torch.int32,),
            "[num_reqs, max_state_blocks]",
            "state block table, stride(1) == 1; debug: window columns and entries in range",
        ),
        Arg("state_block_size", "int", rule="== state_cache.shape[1] (4 in production)"),
        Arg(
            "rms_norm_weight",
            "tensor",
            (torch.bfloat16, torch.float32),
            f"[{head}]",
            "contiguous; its dtype is a key field",
        ),
        Arg("rms_norm_eps", "float", rule="> 0"),
        Arg(
            "cos_sin_cache",
            "tensor",
            (torch.float32,),
            "[max_pos, 64]",
            "the layer's compress RoPE cache, fp32 only (trap 1: bf16 raises); debug: (p // 4) * 4 < max_pos",
        ),
    )


_KV_SLOTS = Arg(
    "kv_slot_mapping",
    "tensor",
    (torch.int64,),
    "[T]",
    "compressed-cache slots; < 0 = skip; debug: unique, < num_pages * kv_bs",
)

#: The ops' argument tables (spec K5, K6, K9).
ARGS: dict[str, tuple[Arg, ...]] = {
    "c4_compress_ds_mla": (
        *_state_args(DS_HEAD_DIM),
        Arg(
            "k_cache",
            "tensor",
            (torch.uint8,),
            "[num_pages, kv_bs, 584]",
            "fp8_ds_mla (§2.10): strides (P, 584, 1), P % 576 == 0, P >= 584 kv_bs, data_ptr % 32 == 0",
        ),
        _KV_SLOTS,
    ),
    "c4_compress_plain": (
        *_state_args(DS_HEAD_DIM),
        Arg(
            "kv_cache",
            "tensor",
            (torch.bfloat16, torch.float8_e4m3fn),
            "[num_pages, kv_bs, 512]",
            "plain rows: strides (P, 512, 1), P % 16 == 0, data_ptr % 16 == 0",
        ),
        _KV_SLOTS,
        Arg(
            "fp8_scale",
            "tensor",
            (torch.float32,),
            "[1]",
            "required iff kv_cache is e4m3 (E3); debug: finite and > 0",
            optional=True,
            default=None,
        ),
    ),
    "indexer_compress": (
        *_state_args(IDX_HEAD_DIM),
        Arg(
            "k_cache",
            "tensor",
            (torch.uint8,),
            "[num_pages, kv_bs, 132]",
            "indexer K cache (§2.7): strides (P, 132, 1), P % 4 == 0, P >= 132 kv_bs, data_ptr % 16 == 0",
        ),
        _KV_SLOTS,
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

_STATE_ARGS = (
    "state_cache",
    "token_to_req",
    "positions",
    "slot_mapping",
    "block_table",
    "state_block_size",
    "rms_norm_weight",
    "rms_norm_eps",
    "cos_sin_cache",
)


def check_c4_inputs(
    kernel: str,
    op: str,
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    state_block_size: int,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
    use_fp4_cache: bool | None = None,
) -> tuple[int, float]:
    """The metadata checks of ``op`` (host only: every call, before any launch); returns (T, eps)."""
    state = (
        state_cache,
        token_to_req,
        positions,
        slot_mapping,
        block_table,
        state_block_size,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
    )
    values = dict(zip(_STATE_ARGS, state, strict=True))
    values[CACHE_ARG[op]] = cache
    values["kv_slot_mapping"] = kv_slot_mapping
    if op == "c4_compress_plain":
        values["fp8_scale"] = fp8_scale
    if op == "indexer_compress":
        values["use_fp4_cache"] = use_fp4_cache
    check_args(kernel, ARGS[op], values)
    head = HEAD_DIM[op]
    t = check_compressor_inputs(
        kernel, state_cache, token_to_req, positions, slot_mapping, block_table, state_block_size, 2 * head
    )
    eps = check_norm_rope_inputs(kernel, rms_norm_weight, rms_norm_eps, cos_sin_cache, head)
    if op == "c4_compress_ds_mla":
        check_ds_cache(kernel, "k_cache", cache)
    elif op == "c4_compress_plain":
        check_plain_cache(kernel, "kv_cache", cache)
    else:
        check_indexer_cache(kernel, "k_cache", cache)
    check_per_token(kernel, "kv_slot_mapping", kv_slot_mapping, torch.int64, t)
    check_same_device(kernel, {**{k: v for k, v in values.items() if isinstance(v, torch.Tensor)}})
    if op == "c4_compress_plain":
        check_fp8_scale(kernel, cache, fp8_scale, check_value=False)
    return t, eps


def check_c4_values(
    kernel: str,
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    head: int,
    fp8_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The checks that read device memory (debug, and always in the reference): kv slots unique and
    in range, request rows, window block-table columns and entries, rope rows; ``fp8_scale`` > 0.
    Returns the indices of the tokens that write an entry."""
    idx = selected_tokens(
        kernel, positions, slot_mapping, kv_slot_mapping, RATIO, cache.shape[0] * cache.shape[1]
    )
    if fp8_scale is not None:
        check_fp8_scale(kernel, cache, fp8_scale)
    if idx.numel():
        p = positions[idx]
        check_window_rows(kernel, state_cache, block_table, token_to_req[idx], p, RATIO, True, head)
        check_rope_rows(kernel, p, RATIO, cos_sin_cache)
    return idx


def c4_rows(
    kernel: str,
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    eps: float,
    cos_sin_cache: torch.Tensor,
    idx: torch.Tensor,
    head: int,
) -> torch.Tensor:
    """The fp32 rows ``y [n, head]`` of the tokens ``idx``: pool -> rmsnorm -> rope at (p // 4) * 4."""
    p = positions[idx]
    c = compress_rows(kernel, state_cache, block_table, token_to_req[idx], p, RATIO, True, head)
    return norm_rope_rows(kernel, c, p, RATIO, rms_norm_weight, eps, cos_sin_cache)


def _rows_to_store(
    kernel: str,
    op: str,
    args: tuple,
    cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
    use_fp4_cache: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    t, eps = check_c4_inputs(kernel, op, *args, cache, kv_slot_mapping, fp8_scale, use_fp4_cache)
    state_cache, token_to_req, positions, slot_mapping, block_table, _, weight, _, cos_sin = args
    if t == 0:
        return None
    idx = check_c4_values(
        kernel,
        state_cache,
        token_to_req,
        positions,
        slot_mapping,
        block_table,
        cos_sin,
        cache,
        kv_slot_mapping,
        HEAD_DIM[op],
        fp8_scale,
    )
    if idx.numel() == 0:
        return None
    y = c4_rows(
        kernel, state_cache, token_to_req, positions, block_table, weight, eps, cos_sin, idx, HEAD_DIM[op]
    )
    return kv_slot_mapping[idx], y


def c4_compress_ds_mla_reference(
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    state_block_size: int,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
) -> None:
    """K5: C4 pool (D 512) -> RMSNorm -> RoPE -> E1 -> fp8_ds_mla store."""
    args = (
        state_cache,
        token_to_req,
        positions,
        slot_mapping,
        block_table,
        state_block_size,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
    )
    out = _rows_to_store("c4_compress_ds_mla", "c4_compress_ds_mla", args, k_cache, kv_slot_mapping)
    if out is not None:
        write_ds_entries(k_cache, out[0], enc_ds(out[1]))


def c4_compress_plain_reference(
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    state_block_size: int,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
) -> None:
    """K6: as K5 up to y, then E2 (bf16 cache) or E3 (e4m3 cache with ``fp8_scale[0]``) plain-row store."""
    args = (
        state_cache,
        token_to_req,
        positions,
        slot_mapping,
        block_table,
        state_block_size,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
    )
    out = _rows_to_store("c4_compress_plain", "c4_compress_plain", args, kv_cache, kv_slot_mapping, fp8_scale)
    if out is not None:
        write_plain_rows(kv_cache, out[0], out[1], fp8_scale)


def indexer_compress_reference(
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    state_block_size: int,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    use_fp4_cache: bool,
) -> None:
    """K9: C4 pool (D 128) -> RMSNorm -> RoPE on dims [64, 128) -> E4 (FP8) or E5 (MXFP4) store (§2.7)."""
    args = (
        state_cache,
        token_to_req,
        positions,
        slot_mapping,
        block_table,
        state_block_size,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
    )
    out = _rows_to_store(
        "indexer_compress", "indexer_compress", args, k_cache, kv_slot_mapping, use_fp4_cache=use_fp4_cache
    )
    if out is not None:
        write_indexer_rows(k_cache, out[0], out[1], use_fp4_cache)
