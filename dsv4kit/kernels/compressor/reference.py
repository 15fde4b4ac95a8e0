"""PyTorch references of the C128 compressors K7, K8a, K8b, and the pieces every compressor shares
(§2.8, §2.9, §3); the C4 compressors K5, K6, K9 are in :mod:`dsv4kit.kernels.c4_compress`.

Every compressor is "compute an fp32 row y" (pool -> rmsnorm -> rope at the compressed position)
followed by "encode y" with the store hooks' encoders. Pooling, softmax and norm run in fp32
(the compressor rule of D2 applies to kernels); the encode step is exactly E1..E5.
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
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
from dsv4kit.formats.ds_mla import DS_HEAD_DIM, check_ds_cache, enc_ds, write_ds_entries
from dsv4kit.formats.plain_row import check_fp8_scale, check_plain_cache, write_plain_rows
from dsv4kit.formats.rope import ROPE_DIM, compressed_position, rope_rotate
from dsv4kit.formats.state_cache import check_state_cache, pool_windows, rmsnorm, window_rows

__all__ = [
    "C128_STATE_BLOCK_SIZE",
    "check_compressor_inputs",
    "check_norm_rope_inputs",
    "check_rope_rows",
    "check_window_rows",
    "compress_rows",
    "norm_rope_rows",
    "selected_tokens",
    "c128_compress_reference",
    "c128_norm_rope_store_ds_mla_reference",
    "c128_norm_rope_store_plain_reference",
]

C128_STATE_BLOCK_SIZE = 8


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


def check_compressor_inputs(
    kernel: str,
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    state_block_size: int | None,
    state_width: int,
) -> int:
    """Checks shared by K5, K6, K7 and K9 (state cache and per-token arrays); returns T.

    ``state_block_size=None`` (K7) skips the block-size argument check.
    """
    check_per_token(kernel, "positions", positions, torch.int64, None)
    t = positions.shape[0]
    check_state_cache(kernel, "state_cache", state_cache, state_width)
    if state_block_size is not None and state_block_size != state_cache.shape[1]:
        raise input_error(
            kernel, "state_block_size", f"state_cache.shape[1] ({state_cache.shape[1]})", state_block_size
        )
    check_per_token(kernel, "token_to_req", token_to_req, torch.int32, t)
    check_per_token(kernel, "slot_mapping", slot_mapping, torch.int64, t)
    _check_block_table(kernel, block_table)
    return t


def check_norm_rope_inputs(
    kernel: str, rms_norm_weight: torch.Tensor, rms_norm_eps: float, cos_sin_cache: torch.Tensor, dim: int
) -> float:
    """Checks of the norm weight / eps / fp32 cos_sin cache; returns eps as a float."""
    _check_norm_weight(kernel, rms_norm_weight, dim)
    eps = check_positive_float(kernel, "rms_norm_eps", rms_norm_eps)
    _check_cos_sin_fp32(kernel, cos_sin_cache)
    return eps


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


# --------------------------------------------------------------------------- row computation


def compress_rows(
    kernel: str,
    state_cache: torch.Tensor,
    block_table: torch.Tensor,
    req: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    overlap: bool,
    head_dim: int,
) -> torch.Tensor:
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


# --------------------------------------------------------------------------- K7


def c128_compress_reference(
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """K7: fp32 pooled rows ``compressed_kv [T, 512]`` (a view of ``out``) at C128 boundary tokens.

    Non-boundary / padding rows are left untouched. Without ``out`` the reference allocates a
    zero-filled buffer (the spec allows uninitialized memory; zeros make the reference
    deterministic, callers must not rely on those rows).
    """
    kernel = "c128_compress"
    check_dtype(kernel, "state_cache", state_cache, torch.float32)
    check_ndim(kernel, "state_cache", state_cache, 3)
    if state_cache.shape[1] != C128_STATE_BLOCK_SIZE:  # trap 5
        raise input_error(
            kernel,
            "state_cache",
            f"shape[1] (state block size) == {C128_STATE_BLOCK_SIZE}",
            f"shape {tuple(state_cache.shape)}",
        )
    t = check_compressor_inputs(
        kernel, state_cache, token_to_req, positions, slot_mapping, block_table, None, DS_HEAD_DIM
    )
    if out is not None:
        check_dtype(kernel, "out", out, torch.float32)
        check_ndim(kernel, "out", out, 2)
        if out.shape[0] < t or out.shape[1] != DS_HEAD_DIM:
            raise input_error(kernel, "out", f"shape [>= {t}, {DS_HEAD_DIM}]", f"shape {tuple(out.shape)}")
        if out.shape[0] > 0 and out.stride() != (DS_HEAD_DIM, 1):
            raise input_error(kernel, "out", f"strides ({DS_HEAD_DIM}, 1)", f"strides {tuple(out.stride())}")
    check_same_device(
        kernel,
        {
            "state_cache": state_cache,
            "token_to_req": token_to_req,
            "positions": positions,
            "slot_mapping": slot_mapping,
            "block_table": block_table,
            "out": out,
        },
    )
    if out is None:
        out = torch.zeros((t, DS_HEAD_DIM), dtype=torch.float32, device=state_cache.device)
    compressed_kv = out[:t]
    if t == 0:
        return compressed_kv
    idx = selected_tokens(kernel, positions, slot_mapping, None, 128, None)
    if idx.numel():
        compressed_kv[idx] = compress_rows(
            kernel, state_cache, block_table, token_to_req[idx], positions[idx], 128, False, DS_HEAD_DIM
        )
    return compressed_kv


# --------------------------------------------------------------------------- K8a / K8b


def _check_k8_common(
    kernel: str,
    compressed_kv: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
) -> tuple[int, float]:
    check_per_token(kernel, "positions", positions, torch.int64, None)
    t = positions.shape[0]
    check_dtype(kernel, "compressed_kv", compressed_kv, torch.float32)
    check_ndim(kernel, "compressed_kv", compressed_kv, 2)
    if tuple(compressed_kv.shape) != (t, DS_HEAD_DIM):
        raise input_error(
            kernel, "compressed_kv", f"shape [{t}, {DS_HEAD_DIM}]", f"shape {tuple(compressed_kv.shape)}"
        )
    if t > 0 and compressed_kv.stride() != (DS_HEAD_DIM, 1):
        raise input_error(
            kernel, "compressed_kv", f"strides ({DS_HEAD_DIM}, 1)", f"strides {tuple(compressed_kv.stride())}"
        )
    check_per_token(kernel, "slot_mapping", slot_mapping, torch.int64, t)
    check_per_token(kernel, "kv_slot_mapping", kv_slot_mapping, torch.int64, t)
    eps = check_norm_rope_inputs(kernel, rms_norm_weight, rms_norm_eps, cos_sin_cache, DS_HEAD_DIM)
    return t, eps


def c128_norm_rope_store_ds_mla_reference(
    compressed_kv: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
) -> None:
    """K8a: RMSNorm -> RoPE at ``(p // 128) * 128`` -> E1 -> fp8_ds_mla store, boundary rows only."""
    kernel = "c128_norm_rope_store_ds_mla"
    t, eps = _check_k8_common(
        kernel,
        compressed_kv,
        positions,
        slot_mapping,
        kv_slot_mapping,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
    )
    check_ds_cache(kernel, "k_cache", k_cache)
    check_same_device(
        kernel,
        {
            "compressed_kv": compressed_kv,
            "positions": positions,
            "slot_mapping": slot_mapping,
            "kv_slot_mapping": kv_slot_mapping,
            "rms_norm_weight": rms_norm_weight,
            "cos_sin_cache": cos_sin_cache,
            "k_cache": k_cache,
        },
    )
    if t == 0:
        return
    idx = selected_tokens(
        kernel, positions, slot_mapping, kv_slot_mapping, 128, k_cache.shape[0] * k_cache.shape[1]
    )
    if idx.numel() == 0:
        return
    y = norm_rope_rows(kernel, compressed_kv[idx], positions[idx], 128, rms_norm_weight, eps, cos_sin_cache)
    write_ds_entries(k_cache, kv_slot_mapping[idx], enc_ds(y))


def c128_norm_rope_store_plain_reference(
    compressed_kv: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
) -> None:
    """K8b: as K8a but E2/E3 into a plain-row bf16 or e4m3 cache (§2.6)."""
    kernel = "c128_norm_rope_store_plain"
    t, eps = _check_k8_common(
        kernel,
        compressed_kv,
        positions,
        slot_mapping,
        kv_slot_mapping,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
    )
    check_plain_cache(kernel, "kv_cache", kv_cache)
    check_same_device(
        kernel,
        {
            "compressed_kv": compressed_kv,
            "positions": positions,
            "slot_mapping": slot_mapping,
            "kv_slot_mapping": kv_slot_mapping,
            "rms_norm_weight": rms_norm_weight,
            "cos_sin_cache": cos_sin_cache,
            "kv_cache": kv_cache,
            "fp8_scale": fp8_scale,
        },
    )
    check_fp8_scale(kernel, kv_cache, fp8_scale)
    if t == 0:
        return
    idx = selected_tokens(
        kernel, positions, slot_mapping, kv_slot_mapping, 128, kv_cache.shape[0] * kv_cache.shape[1]
    )
    if idx.numel() == 0:
        return
    y = norm_rope_rows(kernel, compressed_kv[idx], positions[idx], 128, rms_norm_weight, eps, cos_sin_cache)
    write_plain_rows(kv_cache, kv_slot_mapping[idx], y, fp8_scale)
