"""``fp8_ds_mla`` paged cache (head 512, §2.5): page geometry, encoder E1 (§2.9), store and decode.

Page of ``bs`` tokens, base ``page * P`` with ``P = k_cache.stride(0)`` bytes::

    [t*576, t*576+448)        token t: 448 e4m3 nope bytes (7 blocks of 64)
    [t*576+448, t*576+576)    token t: 64 bf16 rotated rope dims, little-endian
    [bs*576 + t*8, +7)        token t: 7 ue8m0 scale bytes
    bs*576 + t*8 + 7          pad byte, always 0
    [bs*584, P)               unused

The tensor view is ``uint8 [num_pages, bs, 584]``; only ``stride(0)`` is meaningful, so all
addressing here goes through an explicit per-page byte view.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.bits import bf16_round, bf16_to_bytes, bytes_to_bf16, e4m3_decode, ue8m0_decode
from dsv4kit.formats.checks import (
    check_dtype,
    check_paged_byte_cache,
    check_read_slots,
    check_store_rows,
    check_store_slots,
)
from dsv4kit.formats.fp8 import exponent_to_ue8m0, q8_quantize

__all__ = [
    "DS_HEAD_DIM",
    "DS_NOPE_DIM",
    "DS_ROPE_DIM",
    "DS_QUANT_BLOCK",
    "DS_TOKEN_BYTES",
    "DS_SCALE_BYTES",
    "DS_ENTRY_BYTES",
    "DsEntry",
    "ds_min_page_stride",
    "allocate_ds_cache",
    "check_ds_cache",
    "ds_page_regions",
    "enc_ds",
    "ds_entry_bytes",
    "store_rows_ds",
    "write_ds_entries",
    "read_ds_entries",
    "decode_ds_entries",
    "decode_ds_rows",
]

DS_HEAD_DIM = 512
DS_NOPE_DIM = 448
DS_ROPE_DIM = 64
DS_QUANT_BLOCK = 64
DS_TOKEN_BYTES = 576  # 448 e4m3 + 64 * 2 bf16
DS_SCALE_BYTES = 8  # 7 ue8m0 + 1 pad
DS_ENTRY_BYTES = DS_TOKEN_BYTES + DS_SCALE_BYTES  # 584
_NBLK = DS_NOPE_DIM // DS_QUANT_BLOCK  # 7


class DsEntry(NamedTuple):
    """One or more encoded fp8_ds_mla entries (leading dims shared)."""

    nope: torch.Tensor  # uint8 [..., 448] e4m3 codes
    scales: torch.Tensor  # uint8 [..., 7] ue8m0 bytes
    rope: torch.Tensor  # bfloat16 [..., 64]


def ds_min_page_stride(bs: int) -> int:
    """Minimal page stride ``round_up(bs*584, 576)`` (bs 1 -> 1152, 2 -> 1728, 64 -> 37440)."""
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        raise input_error("ds_min_page_stride", "bs", "an int > 0", bs)
    need = bs * DS_ENTRY_BYTES
    return -(-need // DS_TOKEN_BYTES) * DS_TOKEN_BYTES


def allocate_ds_cache(
    num_pages: int,
    bs: int,
    *,
    page_stride: int | None = None,
    fill: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A ``uint8 [num_pages, bs, 584]`` view with ``stride(0) == page_stride`` (default: minimal).

    The backing buffer holds ``num_pages * page_stride`` bytes, all set to ``fill`` (use 0xA5 as a
    sentinel to check untouched bytes, §2.12).
    """
    name = "allocate_ds_cache"
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
        raise input_error(name, "num_pages", "an int > 0", num_pages)
    stride = ds_min_page_stride(bs) if page_stride is None else page_stride
    if not isinstance(stride, int) or stride % DS_TOKEN_BYTES or stride < bs * DS_ENTRY_BYTES:
        raise input_error(name, "page_stride", f"a multiple of 576 and >= {bs * DS_ENTRY_BYTES}", page_stride)
    buf = torch.full((num_pages * stride,), fill, dtype=torch.uint8, device=device)
    return buf.as_strided((num_pages, bs, DS_ENTRY_BYTES), (stride, DS_ENTRY_BYTES, 1))


def check_ds_cache(kernel: str, arg: str, k_cache: torch.Tensor) -> None:
    """§2.10 metadata checks of an fp8_ds_mla cache."""
    check_paged_byte_cache(kernel, arg, k_cache, DS_ENTRY_BYTES, DS_TOKEN_BYTES, align=32)


def ds_page_regions(k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``(data [num_pages, bs, 576], scales [num_pages, bs, 8])`` into the cache's memory.

    ``data[pg, t]`` covers page bytes ``[t*576, t*576+576)``; ``scales[pg, t]`` covers
    ``[bs*576 + t*8, +8)`` (§2.5). Writing through them writes the cache.
    """
    check_ds_cache("ds_page_regions", "k_cache", k_cache)
    num_pages, bs, _ = k_cache.shape
    pages = k_cache.as_strided((num_pages, bs * DS_ENTRY_BYTES), (k_cache.stride(0), 1))
    data = pages[:, : bs * DS_TOKEN_BYTES].unflatten(1, (bs, DS_TOKEN_BYTES))
    scales = pages[:, bs * DS_TOKEN_BYTES :].unflatten(1, (bs, DS_SCALE_BYTES))
    return data, scales


def enc_ds(y: torch.Tensor) -> DsEntry:
    """Encoder E1 (§2.9): fp32 rows ``[..., 512]`` -> :class:`DsEntry`.

    ``z = bf16(y[:448])`` quantized by Q8 in 7 blocks of 64 (D1 floor); the rope part is
    ``bf16(y[448:])`` stored as is. A bf16 ``y`` (sliding-window insert) is accepted and upcast.
    """
    name = "enc_ds"
    check_dtype(name, "y", y, torch.float32, torch.bfloat16)
    if y.dim() == 0 or y.shape[-1] != DS_HEAD_DIM:
        raise input_error(name, "y", f"last dim {DS_HEAD_DIM}", f"shape {tuple(y.shape)}")
    z = bf16_round(y[..., :DS_NOPE_DIM].contiguous())
    codes, e = q8_quantize(z, DS_QUANT_BLOCK)
    rope = bf16_round(y[..., DS_NOPE_DIM:].contiguous()).to(torch.bfloat16)
    return DsEntry(codes, exponent_to_ue8m0(e), rope)


def ds_entry_bytes(entry: DsEntry) -> torch.Tensor:
    """Token-local byte image ``[..., 584]``: 448 nope | 128 rope (LE bf16) | 7 scales | pad 0.

    The first 576 bytes go to the page's data region, the last 8 to its scale region.
    """
    pad = torch.zeros((*entry.scales.shape[:-1], 1), dtype=torch.uint8, device=entry.scales.device)
    return torch.cat((entry.nope, bf16_to_bytes(entry.rope), entry.scales, pad), dim=-1)


def store_rows_ds(rows: torch.Tensor, k_cache: torch.Tensor, kv_slot_mapping: torch.Tensor) -> None:
    """Reference store hook (§2.9): write ``enc_ds(rows[t])`` at slot ``kv_slot_mapping[t]``.

    ``rows`` fp32 ``[T, 512]`` contiguous; slots < 0 are skipped; slot s -> page ``s // bs``,
    entry ``s % bs``. Only the 584 bytes of each written entry change.
    """
    name = "store_rows_ds"
    check_store_rows(name, rows, DS_HEAD_DIM)
    check_ds_cache(name, "k_cache", k_cache)
    keep = check_store_slots(name, rows, "k_cache", k_cache, kv_slot_mapping)
    if rows.shape[0] == 0 or not bool(keep.any()):
        return
    write_ds_entries(k_cache, kv_slot_mapping[keep], enc_ds(rows[keep]))


def write_ds_entries(k_cache: torch.Tensor, slots: torch.Tensor, entry: DsEntry) -> None:
    """Write already-encoded entries at (valid, unique) ``slots``; used by store hooks and K5/K8a."""
    data, scales = ds_page_regions(k_cache)
    bs = k_cache.shape[1]
    img = ds_entry_bytes(entry)
    page, off = slots // bs, slots % bs
    data[page, off] = img[:, :DS_TOKEN_BYTES]
    scales[page, off] = img[:, DS_TOKEN_BYTES:]


def read_ds_entries(k_cache: torch.Tensor, slots: torch.Tensor) -> tuple[DsEntry, torch.Tensor]:
    """Read entries at ``slots [n]`` (all >= 0): ``(DsEntry, pad_bytes uint8 [n])``."""
    name = "read_ds_entries"
    check_ds_cache(name, "k_cache", k_cache)
    check_read_slots(name, slots, k_cache)
    data, scales = ds_page_regions(k_cache)
    bs = k_cache.shape[1]
    d = data[slots // bs, slots % bs]
    s = scales[slots // bs, slots % bs]
    entry = DsEntry(d[:, :DS_NOPE_DIM], s[:, :_NBLK], bytes_to_bf16(d[:, DS_NOPE_DIM:]))
    return entry, s[:, _NBLK]


def decode_ds_entries(entry: DsEntry) -> torch.Tensor:
    """Exact fp32 values ``[..., 512]``: nope ``e4m3_val * 2**(byte-127)``, rope bf16 upcast."""
    vals = e4m3_decode(entry.nope).unflatten(-1, (_NBLK, DS_QUANT_BLOCK))
    nope = (vals * ue8m0_decode(entry.scales)[..., None]).flatten(-2)
    return torch.cat((nope, entry.rope.to(torch.float32)), dim=-1)


def decode_ds_rows(k_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Decode the entries at ``slots`` to fp32 ``[n, 512]`` (see :func:`decode_ds_entries`)."""
    entry, _ = read_ds_entries(k_cache, slots)
    return decode_ds_entries(entry)
