"""The reference pieces every compressor shares (§2.8, §2.9, §3): checks, selected tokens, pooling,
norm and RoPE. The compressors themselves: K5, K6, K9 in :mod:`dsv4kit.kernels.c4_compress`,
K7, K8a, K8b in :mod:`dsv4kit.kernels.c128_compress`.

Every compressor is "compute an fp32 row y" (pool -> rmsnorm -> rope at the compressed position)
followed by "encode y" with the store hooks' encoders. Pooling, softmax and norm run in fp32
(the compressor rule of D2 applies to kernels); the encode step is exactly E1..E5.
"""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.schema import Arg
from dsv4kit.formats.checks import (
    check_contiguous,
    check_dtype,
    check_ndim,
    check_per_token,
    check_positive_float,
    check_same_device,
    check_unique,
    check_values_in_range,
)
from dsv4kit.formats.ds_mla import check_ds_cache, enc_ds, write_ds_entries
from dsv4kit.formats.indexer_cache import check_indexer_cache, write_indexer_rows
from dsv4kit.formats.plain_row import check_fp8_scale, check_plain_cache, write_plain_rows
from dsv4kit.formats.rope import ROPE_DIM, compressed_position, rope_rotate
from dsv4kit.formats.state_cache import check_state_cache, pool_windows, rmsnorm, window_rows

__all__ = [
    "FP8_SCALE",
    "KV_CACHE",
    "KV_SLOT_MAPPING",
    "SLOT_MAPPING",
    "TOKEN_TO_REQ",
    "block_table_arg",
    "ds_cache_arg",
    "norm_rope_args",
    "positions_arg",
    "check_compressor_inputs",
    "check_norm_rope_inputs",
    "check_rope_rows",
    "check_store_inputs",
    "check_values",
    "check_window_rows",
    "compress_rows",
    "norm_rope_rows",
    "selected_tokens",
    "store_rows",
    "stored_reference",
]

# --------------------------------------------------------------------------- argument rows
# The rows the compressors' argument tables (K5..K9) share; a row's text names the op's ratio.

TOKEN_TO_REQ = Arg("token_to_req", "tensor", (torch.int32,), "[T]",
                   "request row of block_table; debug: in range")
SLOT_MAPPING = Arg("slot_mapping", "tensor", (torch.int64,), "[T]", "state slots; < 0 = padding (skipped)")
KV_SLOT_MAPPING = Arg("kv_slot_mapping", "tensor", (torch.int64,), "[T]",
                      "compressed-cache slots; < 0 = skip; debug: unique, < num_pages * kv_bs")
KV_CACHE = Arg("kv_cache", "tensor", (torch.bfloat16, torch.float8_e4m3fn), "[num_pages, kv_bs, 512]",
               "plain rows: strides (P, 512, 1), P % 16 == 0, data_ptr % 16 == 0")
FP8_SCALE = Arg("fp8_scale", "tensor", (torch.float32,), "[1]",
                "required iff kv_cache is e4m3 (E3); debug: finite and > 0", optional=True, default=None)
_DS_RULE = "fp8_ds_mla (§2.10): strides (P, 584, 1), P % 576 == 0, P >= 584 kv_bs, data_ptr % 32 == 0"


def positions_arg(ratio: int) -> Arg:
    return Arg("positions", "tensor", (torch.int64,), "[T]",
               f"defines T; boundary tokens: (p + 1) % {ratio} == 0")


def block_table_arg(window: str) -> Arg:
    """``window``: the block-table columns a window reads, as the debug checks name them."""
    return Arg("block_table", "tensor", (torch.int32,), "[num_reqs, max_state_blocks]",
               f"state block table, stride(1) == 1; debug: {window} and entries in range")


def norm_rope_args(head: int, ratio: int) -> tuple[Arg, Arg, Arg]:
    """``rms_norm_weight``, ``rms_norm_eps``, ``cos_sin_cache`` of an op normalizing ``head`` columns."""
    return (
        Arg("rms_norm_weight", "tensor", (torch.bfloat16, torch.float32), f"[{head}]",
            "contiguous; its dtype is a key field"),
        Arg("rms_norm_eps", "float", rule="> 0"),
        Arg("cos_sin_cache", "tensor", (torch.float32,), "[max_pos, 64]",
            "the layer's compress RoPE cache, fp32 only (trap 1: bf16 raises); debug: "
            f"(p // {ratio}) * {ratio} < max_pos"),
    )


def ds_cache_arg(more: str = "") -> Arg:
    """``k_cache`` of an fp8_ds_mla store; ``more``: what else its rule says."""
    return Arg("k_cache", "tensor", (torch.uint8,), "[num_pages, kv_bs, 584]", _DS_RULE + more)


# --------------------------------------------------------------------------- validation


def _check_block_table(kernel: str, block_table: torch.Tensor) -> None:
    check_dtype(kernel, "block_table", block_table, torch.int32)
    check_ndim(kernel, "block_table", block_table, 2)
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise input_error(kernel, "block_table", "stride(1) == 1", f"strides {tuple(block_table.stride())}")


def _check_norm_weight(kernel: str, w: torch.Tensor, dim: int) -> None:
    check_dtype(kernel, "rms_norm_weight", w, torch.bfloat16, torch.float32)
    if tuple(w.shape) != (dim,):
        raise input_error(kernel, "rms_norm_weight", f"shape ({dim},)", f"shape {tuple(w.shape)}")
    check_contiguous(kernel, "rms_norm_weight", w)


def _check_cos_sin_fp32(kernel: str, cs: torch.Tensor) -> None:
    # Trap 1: compressors accept an fp32 cache only; a bf16 cache raises loudly.
    check_dtype(kernel, "cos_sin_cache", cs, torch.float32)
    check_ndim(kernel, "cos_sin_cache", cs, 2)
    if cs.shape[1] != ROPE_DIM:
        raise input_error(kernel, "cos_sin_cache", f"shape[1] == {ROPE_DIM}", f"shape {tuple(cs.shape)}")
    check_contiguous(kernel, "cos_sin_cache", cs)


def check_compressor_inputs(kernel: str, ops: Any, state_block_size: int | None, state_width: int) -> int:
    """Checks shared by K5, K6, K7 and K9 (the state cache and per-token arrays of the record
    ``ops``); returns T. ``state_block_size=None`` (K7) skips the block-size argument check."""
    positions, state_cache = ops.positions, ops.state_cache
    check_per_token(kernel, "positions", positions, torch.int64, None)
    t = positions.shape[0]
    check_state_cache(kernel, "state_cache", state_cache, state_width)
    if state_cache.shape[0] < 1 or state_cache.shape[1] < 1:  # windows index blocks and rows in them
        raise input_error(kernel, "state_cache", "at least one block of at least one row",
                          f"shape {tuple(state_cache.shape)}")
    if state_block_size is not None and state_block_size != state_cache.shape[1]:
        raise input_error(
            kernel, "state_block_size", f"state_cache.shape[1] ({state_cache.shape[1]})", state_block_size
        )
    check_per_token(kernel, "token_to_req", ops.token_to_req, torch.int32, t)
    check_per_token(kernel, "slot_mapping", ops.slot_mapping, torch.int64, t)
    _check_block_table(kernel, ops.block_table)
    return t


def check_norm_rope_inputs(kernel: str, ops: Any, dim: int) -> float:
    """Checks of the record's norm weight / eps / fp32 cos_sin cache; returns eps as a float."""
    _check_norm_weight(kernel, ops.rms_norm_weight, dim)
    eps = check_positive_float(kernel, "rms_norm_eps", ops.rms_norm_eps)
    _check_cos_sin_fp32(kernel, ops.cos_sin_cache)
    return eps


def check_store_inputs(kernel: str, ops: Any, t: int, kv_slots: bool = True) -> None:
    """Checks of the record's compressed cache (fp8_ds_mla, plain rows or indexer K, by its
    argument's name and the op), its kv slots (unless ``kv_slots`` is false: the caller checked
    them), ``fp8_scale`` (metadata) and every tensor's device."""
    plain = ops.kv_cache
    if plain is not None:
        check_plain_cache(kernel, "kv_cache", plain)
    elif ops.use_fp4_cache is not None:
        check_indexer_cache(kernel, "k_cache", ops.k_cache)
    else:
        check_ds_cache(kernel, "k_cache", ops.k_cache)
    if kv_slots:
        check_per_token(kernel, "kv_slot_mapping", ops.kv_slot_mapping, torch.int64, t)
    check_same_device(kernel, ops.tensors())
    if plain is not None:
        check_fp8_scale(kernel, plain, ops.fp8_scale, check_value=False)


def selected_tokens(
    kernel: str,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_slot_mapping: torch.Tensor | None,
    ratio: int,
    kv_capacity: int | None,
) -> torch.Tensor:
    """Indices of tokens that produce an entry: slot >= 0, boundary, kv slot >= 0 (if any).

    Checks (device reads) live positions >= 0 and the kv slots of those tokens: unique, in range.
    """
    live = slot_mapping >= 0
    check_values_in_range(kernel, "positions", positions[live], 0, 2**63 - 1)
    sel = live & ((positions + 1) % ratio == 0)
    if kv_slot_mapping is not None:
        sel &= kv_slot_mapping >= 0
        kv = kv_slot_mapping[sel]
        assert kv_capacity is not None
        check_values_in_range(kernel, "kv_slot_mapping", kv, 0, kv_capacity)
        check_unique(kernel, "kv_slot_mapping", kv)
    return torch.nonzero(sel).flatten()


def check_values(kernel: str, ops: Any, ratio: int, overlap: bool, head: int) -> torch.Tensor:
    """The checks that read device memory (debug, and always in the reference) of the record
    ``ops``: live positions >= 0; kv slots unique and in range; ``fp8_scale`` finite and > 0;
    for the tokens that write an entry, request rows, the window's block-table columns and
    entries (the ops that pool), rope rows (the ops that rotate). Returns those tokens' indices."""
    cache = ops.cache
    capacity = None if cache is None else cache.shape[0] * cache.shape[1]
    idx = selected_tokens(kernel, ops.positions, ops.slot_mapping, ops.kv_slot_mapping, ratio, capacity)
    if ops.fp8_scale is not None:
        check_fp8_scale(kernel, cache, ops.fp8_scale)
    if idx.numel():
        p = ops.positions[idx]
        if ops.state_cache is not None:
            check_window_rows(kernel, ops.state_cache, ops.block_table, ops.token_to_req[idx], p, ratio,
                              overlap, head)
        if ops.cos_sin_cache is not None:
            check_rope_rows(kernel, p, ratio, ops.cos_sin_cache)
    return idx


def stored_reference(ops: Any, check: Any, rows: Any, ratio: int, overlap: bool, head: int) -> None:
    """A storing compressor's reference (K5, K6, K8a, K8b, K9) of the record ``ops``: the metadata
    checks (``check(kernel, ops) -> (T, eps)``), the value checks, the fp32 rows of the tokens that
    write an entry (``rows(kernel, ops, eps, idx)``), encoded into the cache."""
    t, eps = check(ops.op, ops)
    if t:
        idx = check_values(ops.op, ops, ratio, overlap, head)
        if idx.numel():
            store_rows(ops, ops.kv_slot_mapping[idx], rows(ops.op, ops, eps, idx))


def store_rows(ops: Any, slots: torch.Tensor, y: torch.Tensor) -> None:
    """Encode the fp32 rows ``y`` into the record's cache at ``slots``: E1 (fp8_ds_mla), E2 / E3
    (plain rows, ``fp8_scale``) or E4 / E5 (indexer K, ``use_fp4_cache``)."""
    if ops.kv_cache is not None:
        write_plain_rows(ops.kv_cache, slots, y, ops.fp8_scale)
    elif ops.use_fp4_cache is not None:
        write_indexer_rows(ops.k_cache, slots, y, ops.use_fp4_cache)
    else:
        write_ds_entries(ops.k_cache, slots, enc_ds(y))


# --------------------------------------------------------------------------- row computation


def compress_rows(kernel: str, state_cache: torch.Tensor, block_table: torch.Tensor, req: torch.Tensor,
                  positions: torch.Tensor, ratio: int, overlap: bool, head_dim: int) -> torch.Tensor:
    """``pool(...)`` of §2.8 for each selected token: fp32 ``[n, head_dim]``.

    ``req``/``positions`` are the selected tokens' request rows and positions; request rows and
    the block-table entries read are range-checked.
    """
    check_values_in_range(kernel, "token_to_req", req, 0, block_table.shape[0])
    k, s, _ = window_rows(
        state_cache, block_table, req.to(torch.int64), positions, ratio, overlap, head_dim, kernel=kernel
    )
    return pool_windows(k, s)


def check_window_rows(kernel: str, state_cache: torch.Tensor, block_table: torch.Tensor, req: torch.Tensor,
                      positions: torch.Tensor, ratio: int, overlap: bool, head_dim: int) -> None:
    """The debug checks of :func:`compress_rows` without the pooling: request rows, the window's
    block-table columns and entries in range."""
    check_values_in_range(kernel, "token_to_req", req, 0, block_table.shape[0])
    window_rows(state_cache, block_table, req.to(torch.int64), positions, ratio, overlap, head_dim,
                kernel=kernel)


def check_rope_rows(kernel: str, positions: torch.Tensor, ratio: int, cos_sin_cache: torch.Tensor) -> None:
    """The rope rows ``(p // R) * R`` of the selected tokens are rows of the cache (debug check)."""
    rows = compressed_position(positions, ratio)
    check_values_in_range(kernel, "positions (rope row (p // R) * R)", rows, 0, cos_sin_cache.shape[0])


def norm_rope_rows(
    kernel: str,
    c: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    rms_norm_weight: torch.Tensor,
    eps: float,
    cos_sin_cache: torch.Tensor,
) -> torch.Tensor:
    """``y = [n[:-64], rope_fwd(n[-64:], row (p // R) * R)]`` with ``n = rmsnorm(c)`` (fp32, not bf16)."""
    n = rmsnorm(c, rms_norm_weight, eps)
    check_rope_rows(kernel, positions, ratio, cos_sin_cache)
    return rope_rotate(n, cos_sin_cache[compressed_position(positions, ratio)])
