"""Indexer K cache (head 128, §2.7) and encoders E4/E5 (§2.9).

View ``uint8 [num_pages, bs, 132]``, page stride ``P = stride(0)`` (>= 132*bs, multiple of 4)::

    FP8:    [t*128, +128) 128 e4m3 bytes      [bs*128 + t*4, +4) fp32 scale value 2**e (LE)
    MXFP4:  [t*64, +64)   64 packed E2M1      [bs*64 + t*4, +4)  4 ue8m0 bytes; bytes >= bs*68 unused
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.bits import bf16_round, bytes_to_f32, e4m3_decode, f32_to_bytes, pow2
from dsv4kit.formats.checks import (
    check_dtype,
    check_paged_byte_cache,
    check_read_slots,
    check_store_rows,
    check_store_slots,
)
from dsv4kit.formats.fp8 import q8_quantize
from dsv4kit.formats.mxfp4 import pack_nibbles, q4_dequantize, q4_quantize, unpack_nibbles

__all__ = [
    "IDX_HEAD_DIM",
    "IDX_ENTRY_BYTES",
    "enc_idx_fp8",
    "enc_idx_mxfp4",
    "allocate_indexer_cache",
    "check_indexer_cache",
    "indexer_page_regions",
    "store_rows_indexer",
    "write_indexer_rows",
    "read_indexer_entries",
    "decode_indexer_rows",
]

IDX_HEAD_DIM = 128
IDX_ENTRY_BYTES = 132


def _check_rows(name: str, y: torch.Tensor) -> None:
    check_dtype(name, "y", y, torch.float32)
    if y.dim() == 0 or y.shape[-1] != IDX_HEAD_DIM:
        raise input_error(name, "y", f"last dim {IDX_HEAD_DIM}", f"shape {tuple(y.shape)}")


def enc_idx_fp8(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder E4: ``z = bf16(y)`` (all 128 dims), one Q8 block.

    Returns ``(codes uint8 [..., 128], scale fp32 [...])``.

    The scale is the fp32 value ``2**e`` (not a byte). K1 produces the same codes and exponent.
    """
    _check_rows("enc_idx_fp8", y)
    codes, e = q8_quantize(bf16_round(y.contiguous()), IDX_HEAD_DIM)
    return codes, pow2(e[..., 0])


def enc_idx_mxfp4(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder E5: ``z = bf16(y)``, Q4 -> ``(packed uint8 [..., 64], scale_bytes uint8 [..., 4])``."""
    _check_rows("enc_idx_mxfp4", y)
    codes, scale_bytes = q4_quantize(bf16_round(y.contiguous()))
    return pack_nibbles(codes), scale_bytes


def allocate_indexer_cache(
    num_pages: int,
    bs: int,
    *,
    page_stride: int | None = None,
    fill: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``uint8 [num_pages, bs, 132]`` with ``stride(0) == page_stride`` (default ``132*bs``)."""
    name = "allocate_indexer_cache"
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
        raise input_error(name, "num_pages", "an int > 0", num_pages)
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        raise input_error(name, "bs", "an int > 0", bs)
    stride = IDX_ENTRY_BYTES * bs if page_stride is None else page_stride
    if not isinstance(stride, int) or stride < IDX_ENTRY_BYTES * bs or stride % 4:
        raise input_error(name, "page_stride", f"a multiple of 4 and >= {IDX_ENTRY_BYTES * bs}", page_stride)
    buf = torch.full((num_pages * stride,), fill, dtype=torch.uint8, device=device)
    return buf.as_strided((num_pages, bs, IDX_ENTRY_BYTES), (stride, IDX_ENTRY_BYTES, 1))


def check_indexer_cache(kernel: str, arg: str, k_cache: torch.Tensor) -> None:
    """§2.7/K9 metadata checks: uint8 ``[*, *, 132]``, strides ``(P, 132, 1)``, P >= 132*bs, P % 4 == 0."""
    check_paged_byte_cache(kernel, arg, k_cache, IDX_ENTRY_BYTES, 4, align=16)


def indexer_page_regions(k_cache: torch.Tensor, use_fp4: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``(data [np, bs, 128 | 64], scales [np, bs, 4])`` into the cache memory (§2.7)."""
    check_indexer_cache("indexer_page_regions", "k_cache", k_cache)
    num_pages, bs, _ = k_cache.shape
    width = IDX_HEAD_DIM // 2 if use_fp4 else IDX_HEAD_DIM
    pages = k_cache.as_strided((num_pages, bs * (width + 4)), (k_cache.stride(0), 1))
    data = pages[:, : bs * width].unflatten(1, (bs, width))
    scales = pages[:, bs * width :].unflatten(1, (bs, 4))
    return data, scales


def write_indexer_rows(k_cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, use_fp4: bool) -> None:
    """Encode fp32 ``rows [n, 128]`` (E4 or E5) and write them at valid, unique ``slots``."""
    data, scales = indexer_page_regions(k_cache, use_fp4)
    bs = k_cache.shape[1]
    page, off = slots // bs, slots % bs
    if use_fp4:
        packed, sb = enc_idx_mxfp4(rows)
        data[page, off] = packed
        scales[page, off] = sb
    else:
        codes, scale = enc_idx_fp8(rows)
        data[page, off] = codes
        scales[page, off] = f32_to_bytes(scale[:, None])


def store_rows_indexer(
    rows: torch.Tensor, k_cache: torch.Tensor, kv_slot_mapping: torch.Tensor, use_fp4: bool
) -> None:
    """Reference store hook (§2.9): write E4 (``use_fp4=False``) or E5 of ``rows [T, 128]``.

    Slots < 0 are skipped; other bytes of the cache are untouched.
    """
    name = "store_rows_indexer"
    check_store_rows(name, rows, IDX_HEAD_DIM)
    check_indexer_cache(name, "k_cache", k_cache)
    if not isinstance(use_fp4, bool):
        raise input_error(name, "use_fp4", "a bool", type(use_fp4).__name__)
    keep = check_store_slots(name, rows, "k_cache", k_cache, kv_slot_mapping)
    valid = kv_slot_mapping[keep]
    if valid.numel():
        write_indexer_rows(k_cache, valid, rows[keep], use_fp4)


def read_indexer_entries(
    k_cache: torch.Tensor, slots: torch.Tensor, use_fp4: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw ``(data [n, 128 | 64], scale_bytes [n, 4])`` of the entries at ``slots`` (all >= 0)."""
    name = "read_indexer_entries"
    check_indexer_cache(name, "k_cache", k_cache)
    check_read_slots(name, slots, k_cache)
    data, scales = indexer_page_regions(k_cache, use_fp4)
    bs = k_cache.shape[1]
    return data[slots // bs, slots % bs], scales[slots // bs, slots % bs]


def decode_indexer_rows(k_cache: torch.Tensor, slots: torch.Tensor, use_fp4: bool) -> torch.Tensor:
    """Decode entries at ``slots`` to fp32 ``[n, 128]``: e4m3 x fp32 scale, or E2M1 x 2**(byte-127)."""
    data, sbytes = read_indexer_entries(k_cache, slots, use_fp4)
    if use_fp4:
        return q4_dequantize(unpack_nibbles(data), sbytes)
    return e4m3_decode(data) * bytes_to_f32(sbytes)
