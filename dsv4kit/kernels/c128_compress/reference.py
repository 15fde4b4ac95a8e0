"""PyTorch references of the C128 compressors K7, K8a and K8b, their argument tables and checks.

C128 layers compress in two steps. K7: at every boundary token (``p % 128 == 127``) pool the 128
state rows ``p - 127 .. p`` (16 state blocks of 8 rows, no overlap) into one fp32 row of 512.
K8: RMSNorm that row, rotate its last 64 dims at row ``(p // 128) * 128`` of the fp32 cos/sin
cache, and store it with an encoder: K8a E1 (fp8_ds_mla), K8b E2 / E3 (plain rows). K7 follows
the FP32 rule; K8 (and K7 -> K8 end to end) the compressor rule of §2.12; the encode step is
exactly the store hooks'.
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.schema import Arg, check_args
from dsv4kit.formats.checks import check_per_token, check_same_device
from dsv4kit.formats.ds_mla import DS_HEAD_DIM, check_ds_cache, enc_ds, write_ds_entries
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
    "RATIO",
    "STATE_BLOCK_SIZE",
    "STORE_OPS",
    "c128_compress_reference",
    "c128_norm_rope_store_ds_mla_reference",
    "c128_norm_rope_store_plain_reference",
    "c128_rows",
    "check_c128_compress_inputs",
    "check_c128_compress_values",
    "check_c128_store_inputs",
    "check_c128_store_values",
]

#: The compress ratio (window rows) of every kernel here.
RATIO = 128
#: K7 reads the window as 16 whole blocks of 8 rows: any other state block size raises (trap 5).
STATE_BLOCK_SIZE = 8
#: The two store ops (K8a, K8b) and their cache argument.
STORE_OPS = ("c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain")
CACHE_ARG = {"c128_norm_rope_store_ds_mla": "k_cache", "c128_norm_rope_store_plain": "kv_cache"}

_SLOTS = "state slots; < 0 = padding (skipped)"
_POSITIONS = Arg(
    "positions", "tensor", (torch.int64,), "[T]", "defines T; boundary tokens: (p + 1) % 128 == 0"
)
_KV_SLOTS = Arg(
    "kv_slot_mapping",
    "tensor",
    (torch.int64,),
    "[T]",
    "compressed-cache slots; < 0 = skip; debug: unique, < num_pages * kv_bs",
)


def _store_args(cache: Arg, *extra: Arg) -> tuple[Arg, ...]:
    return (
        Arg(
            "compressed_kv",
            "tensor",
            (torch.float32,),
            "[T, 512]",
            "K7's rows, strides (512, 1); only boundary rows are read",
        ),
        _POSITIONS,
        Arg("slot_mapping", "tensor", (torch.int64,), "[T]", _SLOTS),
        _KV_SLOTS,
        Arg(
            "rms_norm_weight",
            "tensor",
            (torch.bfloat16, torch.float32),
            "[512]",
            "contiguous; its dtype is a key field",
        ),
        Arg("rms_norm_eps", "float", rule="> 0"),
        Arg(
            "cos_sin_cache",
            "tensor",
            (torch.float32,),
            "[max_pos, 64]",
            "the layer's compress RoPE cache, fp32 only (trap 1: bf16 raises); debug: (p // 128) * 128 < "
            "max_pos",
        ),
        cache,
        *extra,
    )


#: The ops' argument tables (spec K7, K8).
ARGS: dict[str, tuple[Arg, ...]] = {
    "c128_compress": (
        Arg(
            "state_cache",
            "tensor",
            (torch.float32,),
            "[nsb, 8, 1024]",
            "§2.8: strides (>= 8*1024, 1024, 1), data_ptr % 16 == 0; state block size 8 only (trap 5)",
        ),
        Arg("token_to_req", "tensor", (torch.int32,), "[T]", "request row of block_table; debug: in range"),
        _POSITIONS,
        Arg("slot_mapping", "tensor", (torch.int64,), "[T]", _SLOTS),
        Arg(
            "block_table",
            "tensor",
            (torch.int32,),
            "[num_reqs, max_state_blocks]",
            "state block table, stride(1) == 1; debug: the window's 16 columns and entries in range",
        ),
        Arg(
            "out",
            "tensor",
            (torch.float32,),
            "[>= T, 512]",
            "strides (512, 1); rows of non-boundary tokens are left untouched; allocated if None",
            optional=True,
            default=None,
        ),
    ),
    "c128_norm_rope_store_ds_mla": _store_args(
        Arg(
            "k_cache",
            "tensor",
            (torch.uint8,),
            "[num_pages, kv_bs, 584]",
            "fp8_ds_mla (§2.10): strides (P, 584, 1), P % 576 == 0, P >= 584 kv_bs, data_ptr % 32 == 0; "
            "kv_bs and P are key fields (trap 4)",
        )
    ),
    "c128_norm_rope_store_plain": _store_args(
        Arg(
            "kv_cache",
            "tensor",
            (torch.bfloat16, torch.float8_e4m3fn),
            "[num_pages, kv_bs, 512]",
            "plain rows: strides (P, 512, 1), P % 16 == 0, data_ptr % 16 == 0",
        ),
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
}


# --------------------------------------------------------------------------- K7


def check_c128_compress_inputs(
    kernel: str,
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor | None,
) -> int:
    """The metadata checks of K7 (host only: every call, before any launch); returns T."""
    names = ("state_cache", "token_to_req", "positions", "slot_mapping", "block_table", "out")
    values = (state_cache, token_to_req, positions, slot_mapping, block_table, out)
    check_args(kernel, ARGS["c128_compress"], dict(zip(names, values, strict=True)))
    if state_cache.dim() == 3 and state_cache.shape[1] != STATE_BLOCK_SIZE:  # trap 5
        raise input_error(
            kernel,
            "state_cache",
            f"shape[1] (state block size) == {STATE_BLOCK_SIZE}",
            f"shape {tuple(state_cache.shape)}",
        )
    t = check_compressor_inputs(
        kernel, state_cache, token_to_req, positions, slot_mapping, block_table, None, DS_HEAD_DIM
    )
    if out is not None:
        if out.dim() != 2 or out.shape[0] < t or out.shape[1] != DS_HEAD_DIM:
            raise input_error(kernel, "out", f"shape [>= {t}, {DS_HEAD_DIM}]", f"shape {tuple(out.shape)}")
        if out.shape[0] > 0 and out.stride() != (DS_HEAD_DIM, 1):
            raise input_error(kernel, "out", f"strides ({DS_HEAD_DIM}, 1)", f"strides {tuple(out.stride())}")
    check_same_device(kernel, {n: v for n, v in zip(names, values, strict=True) if v is not None})
    return t


def check_c128_compress_values(
    kernel: str,
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
) -> torch.Tensor:
    """The checks that read device memory (debug, and always in the reference): live positions
    >= 0, request rows, the window's block-table columns and entries. Returns the boundary tokens."""
    idx = selected_tokens(kernel, positions, slot_mapping, None, RATIO, None)
    if idx.numel():
        check_window_rows(
            kernel, state_cache, block_table, token_to_req[idx], positions[idx], RATIO, False, DS_HEAD_DIM
        )
    return idx


def c128_compress_reference(
    state_cache: torch.Tensor,
    token_to_req: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """K7: fp32 pooled rows ``compressed_kv [T, 512]`` (a view of ``out``) at C128 boundary tokens.

    Rows of other tokens are left untouched. Without ``out`` the reference allocates zeros (the
    spec allows uninitialized memory, and the kernels allocate so: callers must not read those rows).
    """
    kernel = "c128_compress"
    t = check_c128_compress_inputs(
        kernel, state_cache, token_to_req, positions, slot_mapping, block_table, out
    )
    if out is None:
        out = torch.zeros((t, DS_HEAD_DIM), dtype=torch.float32, device=state_cache.device)
    compressed_kv = out[:t]
    if t == 0:
        return compressed_kv
    idx = check_c128_compress_values(kernel, state_cache, token_to_req, positions, slot_mapping, block_table)
    if idx.numel():
        compressed_kv[idx] = compress_rows(
            kernel, state_cache, block_table, token_to_req[idx], positions[idx], RATIO, False, DS_HEAD_DIM
        )
    return compressed_kv


# --------------------------------------------------------------------------- K8a / K8b


def check_c128_store_inputs(
    kernel: str,
    op: str,
    compressed_kv: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    cache: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
) -> tuple[int, float]:
    """The metadata checks of K8a / K8b (host only: every call, before any launch); returns (T, eps)."""
    values = dict(
        compressed_kv=compressed_kv,
        positions=positions,
        slot_mapping=slot_mapping,
        kv_slot_mapping=kv_slot_mapping,
        rms_norm_weight=rms_norm_weight,
        rms_norm_eps=rms_norm_eps,
        cos_sin_cache=cos_sin_cache,
    )
    values[CACHE_ARG[op]] = cache
    if op == "c128_norm_rope_store_plain":
        values["fp8_scale"] = fp8_scale
    check_args(kernel, ARGS[op], values)
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
    check_per_token(kernel, "slot_mapping", slot_mapping, torch.int64, t)
    check_per_token(kernel, "kv_slot_mapping", kv_slot_mapping, torch.int64, t)
    eps = check_norm_rope_inputs(kernel, rms_norm_weight, rms_norm_eps, cos_sin_cache, DS_HEAD_DIM)
    if op == "c128_norm_rope_store_ds_mla":
        check_ds_cache(kernel, "k_cache", cache)
    else:
        check_plain_cache(kernel, "kv_cache", cache)
    check_same_device(kernel, {k: v for k, v in values.items() if isinstance(v, torch.Tensor)})
    if op == "c128_norm_rope_store_plain":
        check_fp8_scale(kernel, cache, fp8_scale, check_value=False)
    return t, eps


def check_c128_store_values(
    kernel: str,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    cache: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The checks that read device memory (debug, and always in the reference): kv slots unique and
    in range, rope rows, ``fp8_scale`` > 0. Returns the indices of the tokens that write an entry."""
    idx = selected_tokens(
        kernel, positions, slot_mapping, kv_slot_mapping, RATIO, cache.shape[0] * cache.shape[1]
    )
    if fp8_scale is not None:
        check_fp8_scale(kernel, cache, fp8_scale)
    if idx.numel():
        check_rope_rows(kernel, positions[idx], RATIO, cos_sin_cache)
    return idx


def c128_rows(
    kernel: str,
    compressed_kv: torch.Tensor,
    positions: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    eps: float,
    cos_sin_cache: torch.Tensor,
    idx: torch.Tensor,
) -> torch.Tensor:
    """The fp32 rows ``y [n, 512]`` of the tokens ``idx``: rmsnorm -> rope at (p // 128) * 128."""
    return norm_rope_rows(
        kernel, compressed_kv[idx], positions[idx], RATIO, rms_norm_weight, eps, cos_sin_cache
    )


def _rows_to_store(
    op: str,
    compressed_kv: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    cache: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(kv slots, rows y) of the entries ``op`` writes, after every check; None if none."""
    t, eps = check_c128_store_inputs(
        op,
        op,
        compressed_kv,
        positions,
        slot_mapping,
        kv_slot_mapping,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
        cache,
        fp8_scale,
    )
    if t == 0:
        return None
    idx = check_c128_store_values(
        op, positions, slot_mapping, kv_slot_mapping, cos_sin_cache, cache, fp8_scale
    )
    if idx.numel() == 0:
        return None
    y = c128_rows(op, compressed_kv, positions, rms_norm_weight, eps, cos_sin_cache, idx)
    return kv_slot_mapping[idx], y


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
    out = _rows_to_store(
        "c128_norm_rope_store_ds_mla",
        compressed_kv,
        positions,
        slot_mapping,
        kv_slot_mapping,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
        k_cache,
    )
    if out is not None:
        write_ds_entries(k_cache, out[0], enc_ds(out[1]))


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
    """K8b: as K8a but E2 (bf16 cache) or E3 (e4m3 cache with ``fp8_scale[0]``) plain-row store (§2.6)."""
    out = _rows_to_store(
        "c128_norm_rope_store_plain",
        compressed_kv,
        positions,
        slot_mapping,
        kv_slot_mapping,
        rms_norm_weight,
        rms_norm_eps,
        cos_sin_cache,
        kv_cache,
        fp8_scale,
    )
    if out is not None:
        write_plain_rows(kv_cache, out[0], out[1], fp8_scale)
