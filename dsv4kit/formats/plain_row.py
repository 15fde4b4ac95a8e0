"""Plain-row caches (§2.6) and encoders E2/E3 (§2.9).

Cache ``[num_pages, bs, 512]`` of bf16, or of float8_e4m3fn with one per-tensor fp32 scale
``fp8_scale[0]``; element order ``[448 nope | 64 rotated rope]``; entry address
``page*stride(0) + off*stride(1)`` elements.
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.bits import E4M3_MAX, bf16_round, e4m3_decode, e4m3_encode
from dsv4kit.formats.checks import (
    check_dtype,
    check_ndim,
    check_per_token,
    check_read_slots,
    check_same_device,
    check_shape,
    check_slot_values,
    check_store_rows,
    dtype_name,
)

__all__ = [
    "PLAIN_HEAD_DIM",
    "enc_row_bf16",
    "enc_row_fp8",
    "allocate_plain_cache",
    "check_plain_cache",
    "check_fp8_scale",
    "store_rows_plain",
    "write_plain_rows",
    "read_plain_rows",
]

PLAIN_HEAD_DIM = 512


def _check_rows(name: str, y: torch.Tensor) -> None:
    check_dtype(name, "y", y, torch.float32)
    if y.dim() == 0 or y.shape[-1] != PLAIN_HEAD_DIM:
        raise input_error(name, "y", f"last dim {PLAIN_HEAD_DIM}", f"shape {tuple(y.shape)}")


def enc_row_bf16(y: torch.Tensor) -> torch.Tensor:
    """Encoder E2: ``bf16(y)`` of fp32 rows ``[..., 512]``, as a bf16 tensor (RNE)."""
    _check_rows("enc_row_bf16", y)
    return bf16_round(y.contiguous()).to(torch.bfloat16)


def enc_row_fp8(y: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Encoder E3: ``e4m3(clamp(fl(bf16(y_i) * fl(1/s)), -448, 448))`` as uint8 codes ``[..., 512]``.

    ``scale`` is ``fp8_scale[0]`` (fp32, > 0, finite): a 1-element fp32 tensor or a Python float
    (rounded to fp32 first). One reciprocal, then one multiply per element (§2.9, K6 numerics).
    """
    name = "enc_row_fp8"
    _check_rows(name, y)
    if isinstance(scale, torch.Tensor):
        check_dtype(name, "scale", scale, torch.float32)
        if scale.numel() != 1:
            raise input_error(name, "scale", "one element", f"shape {tuple(scale.shape)}")
        s = scale.reshape(()).to(y.device)
    else:
        s = torch.tensor(float(scale), dtype=torch.float32, device=y.device)
    if not (float(s) > 0.0 and float(s) != float("inf")):
        raise input_error(name, "scale", "a finite value > 0", float(s))
    inv = torch.ones((), dtype=torch.float32, device=y.device) / s  # fl(1/s)
    z = bf16_round(y.contiguous())
    return e4m3_encode(torch.clamp(z * inv, -E4M3_MAX, E4M3_MAX))


def allocate_plain_cache(
    num_pages: int,
    bs: int,
    dtype: torch.dtype,
    *,
    page_stride: int | None = None,
    fill_byte: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``[num_pages, bs, 512]`` bf16/e4m3 cache, ``stride(0) == page_stride`` elements (default bs*512).

    Every byte of the backing buffer is set to ``fill_byte`` (sentinel for untouched checks).
    """
    name = "allocate_plain_cache"
    if dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise input_error(name, "dtype", "bfloat16 or float8_e4m3fn", dtype)
    stride = bs * PLAIN_HEAD_DIM if page_stride is None else page_stride
    if stride < bs * PLAIN_HEAD_DIM or stride % 16:
        raise input_error(name, "page_stride", f">= {bs * PLAIN_HEAD_DIM} and a multiple of 16", page_stride)
    esize = torch.empty((), dtype=dtype).element_size()
    buf = torch.full((num_pages * stride * esize,), fill_byte, dtype=torch.uint8, device=device)
    return buf.view(dtype).as_strided((num_pages, bs, PLAIN_HEAD_DIM), (stride, PLAIN_HEAD_DIM, 1))


def check_plain_cache(kernel: str, arg: str, cache: torch.Tensor) -> None:
    """K6 metadata checks: bf16/e4m3fn ``[*, *, 512]``, strides ``(k*16, 512, 1)``."""
    check_dtype(kernel, arg, cache, torch.bfloat16, torch.float8_e4m3fn)
    check_ndim(kernel, arg, cache, 3)
    if cache.shape[2] != PLAIN_HEAD_DIM:
        raise input_error(kernel, arg, f"shape[2] == {PLAIN_HEAD_DIM}", f"shape {tuple(cache.shape)}")
    s0, s1, s2 = cache.stride()
    if s2 != 1 or s1 != PLAIN_HEAD_DIM or s0 % 16 != 0:
        raise input_error(kernel, arg, "strides (k*16, 512, 1)", f"strides {(s0, s1, s2)}")


def check_fp8_scale(
    kernel: str, cache: torch.Tensor, fp8_scale: torch.Tensor | None, *, check_value: bool = True
) -> None:
    """``fp8_scale`` required iff the cache is e4m3: fp32 ``[1]``, value > 0 and finite (K6).

    The value check reads device memory; pass ``check_value=False`` for metadata-only checks.
    """
    if cache.dtype == torch.float8_e4m3fn:
        if fp8_scale is None:
            raise input_error(kernel, "fp8_scale", "a [1] fp32 tensor for an e4m3 cache", None)
        check_dtype(kernel, "fp8_scale", fp8_scale, torch.float32)
        check_shape(kernel, "fp8_scale", fp8_scale, (1,))
        if check_value:
            v = float(fp8_scale[0])
            if not (v > 0.0 and v != float("inf")):
                raise input_error(kernel, "fp8_scale", "a finite value > 0", v)
    elif fp8_scale is not None:
        raise input_error(kernel, "fp8_scale", f"None for a {dtype_name(cache.dtype)} cache", "a tensor")


def write_plain_rows(
    cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, fp8_scale: torch.Tensor | None
) -> None:
    """Encode fp32 ``rows [n, 512]`` (E2 or E3 by cache dtype) and write them at valid ``slots``."""
    bs = cache.shape[1]
    page, off = slots // bs, slots % bs
    if cache.dtype == torch.bfloat16:
        cache[page, off] = enc_row_bf16(rows)
    else:
        assert fp8_scale is not None
        cache.view(torch.uint8)[page, off] = enc_row_fp8(rows, fp8_scale)


def store_rows_plain(
    rows: torch.Tensor,
    cache: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    fp8_scale: torch.Tensor | None = None,
) -> None:
    """Reference store hook (§2.9): write E2/E3 of ``rows [T, 512]`` (fp32, contiguous) at each slot >= 0."""
    name = "store_rows_plain"
    check_store_rows(name, rows, PLAIN_HEAD_DIM)
    check_plain_cache(name, "cache", cache)
    check_same_device(
        name, {"rows": rows, "cache": cache, "kv_slot_mapping": kv_slot_mapping, "fp8_scale": fp8_scale}
    )
    check_fp8_scale(name, cache, fp8_scale)
    n = rows.shape[0]
    check_per_token(name, "kv_slot_mapping", kv_slot_mapping, torch.int64, n)
    keep = check_slot_values(name, "kv_slot_mapping", kv_slot_mapping, cache)
    valid = kv_slot_mapping[keep]
    if valid.numel():
        write_plain_rows(cache, valid, rows[keep], fp8_scale)


def read_plain_rows(
    cache: torch.Tensor, slots: torch.Tensor, fp8_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Decode rows at ``slots`` to fp32 ``[n, 512]``: bf16 upcast, or ``e4m3_val * fp8_scale[0]``."""
    name = "read_plain_rows"
    check_plain_cache(name, "cache", cache)
    check_fp8_scale(name, cache, fp8_scale)
    check_read_slots(name, slots, cache)
    bs = cache.shape[1]
    if cache.dtype == torch.bfloat16:
        return cache[slots // bs, slots % bs].to(torch.float32)
    assert fp8_scale is not None
    return e4m3_decode(cache.view(torch.uint8)[slots // bs, slots % bs]) * fp8_scale[0]
