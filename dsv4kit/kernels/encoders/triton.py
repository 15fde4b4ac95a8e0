"""Triton encode routines E1..E5 (spec §2.9) and the store-hook kernel that runs them.

:func:`encode_store` is *the* encode step of the Triton backend: the store hooks launch it on
given rows and the C4 compressors (:mod:`dsv4kit.kernels.c4_compress.triton`) call it on the
rows they pool. A row arrives as ``y [NB, 64]`` fp32 (``NB = D / 64``: 8 for head 512, 2 for
the indexer's 128), block ``b`` holding dims ``[64 b, 64 b + 64)``, so the 64-blocks of E1 are
the tile's rows and E4's one block is the whole tile. ``ENC`` (a constexpr encoder id of
:mod:`dsv4kit.kernels.encoders.spec`) picks the branch at compile time.

Addresses are bytes from the cache's first page (:func:`~dsv4kit.kernels.encoders.spec.
cache_operands`): entry ``slot % kv_bs`` of page ``slot // kv_bs`` at ``page * page_stride``;
typed stores go through bit-cast pointers (bf16 rope dims at even offsets, fp32 indexer scales
at multiples of 4: the host checked the page strides). On the GPU bf16 and e4m3 round by the
hardware casts (``HW_CVT`` / ``HW``: 0.5-1 instruction per element against 4-8 for the recipes);
under the interpreter, which truncates those casts, by the integer recipes of
:mod:`dsv4kit.kernels.triton_numerics`, whose casts then receive values they represent exactly:
the CPU interpreter writes the GPU's bytes. The reciprocal of ``fp8_scale`` (E3) is ``div_rn``:
a plain ``/`` is not correctly rounded on the GPU.

Store-hook mapping (:func:`store_rows_kernel`, :func:`_store_tile`, the same bytes as
:func:`encode_store`): 4 warps, ``ROWS * SUB`` consecutive rows per program (:func:`tile_rows`: E1 / E2
two tiles of 2 rows, E3 one of 4: 8 KB of rows each; E4 one of 64, E5 one of 32: 32 / 16 KB),
grid ``cdiv(T, ROWS * SUB)``.
A tile is ``[G, ROWS, W]`` (E1-E3: the 8 64-blocks, E4: the row in 4 quarters), every block
maximum one reduction over the W lanes and registers of a group. Triton picks the thread layout
from the widest store (16 bytes): E3 / E4 (E4: pages a multiple of 16 bytes, else a 4-byte-store
branch) hold 16 consecutive fp32 of a row per thread (4 x 16-byte loads; E3 one row, E4 4 rows
of the tile), E1 / E2 8 of each of two rows. E5 reads a row as 64 int64 pairs of dims, its tile
``[4, 32, 16]`` (the 4 32-blocks of 32 rows): each of the 128 threads holds one whole block (8 x
16-byte loads), so its maximum needs no shuffle, and writes its 16 packed bytes (one 16-byte
store; pages a multiple of 4 bytes only: 4-byte stores of a layout 4 threads a block, reached
through shared memory) and its scale byte. Its slots are read in that same layout
(:func:`_load_pairs`): the only shared-memory use left on the 16-byte path is the row mask that
the 4-byte branch will need, one byte a thread staged before the loads. The E2M1 step is K2's
(:func:`~dsv4kit.kernels.triton_numerics.mxfp4_words` on bf16 pairs rounded by one
``cvt.rn.bf16x2.f32`` each). A row whose slot is < 0 (or beyond T) is not loaded and nothing of
it is stored; all tiles are loaded before the first store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const, FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.encoders.spec import (
    E1,
    E2,
    E3,
    E4,
    E5,
    StoreOperands,
    StoreRowsDsBase,
    StoreRowsIndexerBase,
    StoreRowsPlainBase,
    key_encoder,
)
from dsv4kit.kernels.triton_numerics import bf16_value, bf16x2_words, clog2, e4m3, mxfp4_words, pow2

__all__ = ["StoreRowsDsTriton", "StoreRowsIndexerTriton", "StoreRowsPlainTriton", "encode_store",
           "store_rows_kernel"]

# Encoder ids and the layout constants of §2.5-2.7 (bytes), as Triton constants.
_E1, _E2, _E3, _E4, _E5 = (tl.constexpr(e) for e in (E1, E2, E3, E4, E5))
_DS_TOKEN = tl.constexpr(576)
_DS_SCALES = tl.constexpr(8)
_IDX_FP8_TOKEN = tl.constexpr(128)
_IDX_FP4_TOKEN = tl.constexpr(64)


@triton.jit
def _q8_exponent(amax):
    """UE8M0 exponent of a Q8 block (§2.3, D1): clog2(fl(max(amax, 1e-4) / 448))."""
    return clog2(tl.maximum(amax, 1e-4) * (1.0 / 448.0))   # §2.1: * fl(1/448) == / 448 here


@triton.jit
def encode_store(y, cache_ptr, scale_ptr, slot, kv_bs, page_stride, ENC: tl.constexpr, NB: tl.constexpr,
                 HW: tl.constexpr):
    """Encode the fp32 row ``y [NB, 64]`` with encoder ``ENC`` and write it at ``slot`` (>= 0).
    ``HW``: the bf16 and e4m3 roundings by the GPU's casts (False: the integer recipes)."""
    blk = tl.arange(0, NB)[:, None]
    d = blk * 64 + tl.arange(0, 64)[None, :]
    # Page strides are multiples of 16 bytes (fp8_ds_mla: of 576; plain rows: of 16 elements) or,
    # for the indexer cache, of 4 (host-checked). Written so, the compiler sees it and vectorizes.
    if (ENC == _E4) or (ENC == _E5):
        page_base = (slot // kv_bs) * ((page_stride // 4) * 4)
    else:
        page_base = (slot // kv_bs) * ((page_stride // 16) * 16)
    entry = slot % kv_bs
    f8 = cache_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    b16 = cache_ptr.to(tl.pointer_type(tl.bfloat16), bitcast=True)
    if ENC == _E1:
        # 448 e4m3 | 64 bf16 rope | (scale region) 7 ue8m0 + pad 0. Block 7 is the rope block.
        z = bf16_value(y, HW)
        e = _q8_exponent(tl.max(tl.abs(z), axis=1))
        q = e4m3(z * pow2(-e)[:, None], HW)
        tok = page_base + entry * _DS_TOKEN
        tl.store(f8 + tok + d, q, mask=blk < 7)
        tl.store(b16 + (tok + 448) // 2 + (d - 448), z.to(tl.bfloat16), mask=blk == 7)
        i = tl.arange(0, NB)
        sb = tl.where(i < 7, e + 127, 0).to(tl.uint8)
        tl.store(cache_ptr + page_base + kv_bs * _DS_TOKEN + entry * _DS_SCALES + i, sb)
    elif ENC == _E2:
        tl.store(b16 + (page_base + entry * (2 * 64 * NB)) // 2 + d, bf16_value(y, HW).to(tl.bfloat16))
    elif ENC == _E3:
        inv = tl.div_rn(1.0, tl.load(scale_ptr))
        v = tl.minimum(tl.maximum(bf16_value(y, HW) * inv, -448.0), 448.0)
        tl.store(f8 + page_base + entry * (64 * NB) + d, e4m3(v, HW))
    elif ENC == _E4:
        # 128 e4m3 | (scale region) the fp32 value 2^e.
        z = bf16_value(y, HW)
        e = _q8_exponent(tl.max(tl.max(tl.abs(z), axis=1), axis=0))
        q = e4m3(z * pow2(-e), HW)
        tl.store(f8 + page_base + entry * _IDX_FP8_TOKEN + d, q)
        f32 = cache_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
        tl.store(f32 + (page_base + kv_bs * _IDX_FP8_TOKEN + entry * 4) // 4, pow2(e))
    else:
        tl.static_assert(ENC == _E5)
        # 64 packed E2M1 bytes (even dim in the low nibble) | (scale region) 4 ue8m0 bytes. Dims
        # (2k, 2k+1) as one word of two bf16: its halves are the nibbles of output byte k.
        lo, hi = tl.split(tl.reshape(y, (NB, 32, 2)))
        byte, e = mxfp4_words(tl.reshape(bf16x2_words(lo, hi, HW), (2 * NB, 16)))
        tl.store(cache_ptr + page_base + entry * _IDX_FP4_TOKEN + tl.arange(0, 64 * NB // 2),
                 tl.reshape(byte, (64 * NB // 2,)).to(tl.uint8))
        tl.store(cache_ptr + page_base + kv_bs * _IDX_FP4_TOKEN + entry * 4 + tl.arange(0, 2 * NB),
                 (e + 127).to(tl.uint8))


@triton.jit
def _store_tile(y, cache_ptr, inv, slot, live, col, kv_bs, page_stride, ENC: tl.constexpr,
                PS_ALIGN: tl.constexpr, HW: tl.constexpr):
    """Encode the fp32 tile ``y [G, ROWS, W]`` (``y[g, r]``: group ``g``, dims ``col[g]``, of row ``r``)
    and write the rows that are ``live`` at their ``slot`` (``slot``, ``live``: ``[G, ROWS]``, equal
    over g). The bytes of :func:`encode_store` on each row. A group is E1-E3's 64-block (W 64) or a
    quarter of E4's row (W 32), so a block maximum is one ``axis=2`` max (E4: then the in-thread
    ``axis=0`` one). E5 takes the tile as int64 pairs ``[G, ROWS, 16]`` (group = 32-block, ``col``
    in pairs: pair k of group g, dims 32 g + 2k and + 1, is output byte 16 g + k). ``HW``: the bf16
    and e4m3 roundings by the GPU's casts."""
    blk = tl.arange(0, y.shape[0])[:, None]
    page_base = (slot // kv_bs) * ((page_stride // PS_ALIGN) * PS_ALIGN)   # page_stride % PS_ALIGN == 0
    entry = slot % kv_bs
    f8 = cache_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    b16 = cache_ptr.to(tl.pointer_type(tl.bfloat16), bitcast=True)
    if ENC == _E1:
        z = bf16_value(y, HW)
        e = _q8_exponent(tl.max(tl.abs(z), axis=2))
        q = e4m3(z * pow2(-e)[:, :, None], HW)
        tok = page_base + entry * _DS_TOKEN
        tl.store(f8 + tok[:, :, None] + col, q, mask=(live & (blk < 7))[:, :, None])
        tl.store(b16 + ((tok + 448) // 2)[:, :, None] + (col - 448), z.to(tl.bfloat16),
                 mask=(live & (blk == 7))[:, :, None])
        sb = tl.where(blk < 7, e + 127, 0).to(tl.uint8)
        tl.store(cache_ptr + page_base + kv_bs * _DS_TOKEN + entry * _DS_SCALES + blk, sb, mask=live)
    elif ENC == _E2:
        tl.store(b16 + ((page_base + entry * (2 * 64 * y.shape[0])) // 2)[:, :, None] + col,
                 bf16_value(y, HW).to(tl.bfloat16), mask=live[:, :, None])
    elif ENC == _E3:
        v = tl.minimum(tl.maximum(bf16_value(y, HW) * inv, -448.0), 448.0)
        tl.store(f8 + (page_base + entry * (64 * y.shape[0]))[:, :, None] + col,
                 e4m3(v, HW), mask=live[:, :, None])
    elif ENC == _E4:
        z = bf16_value(y, HW)
        e = _q8_exponent(tl.max(tl.max(tl.abs(z), axis=2), axis=0))
        q = e4m3(z * pow2(-e)[None, :, None], HW)
        tl.store(f8 + (page_base + entry * _IDX_FP8_TOKEN)[:, :, None] + col, q,
                 mask=live[:, :, None])
        f32 = cache_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
        at = tl.max((page_base + kv_bs * _IDX_FP8_TOKEN + entry * 4) // 4, axis=0)   # equal over g
        tl.store(f32 + at, pow2(e), mask=tl.max(live.to(tl.int32), axis=0) != 0)
    else:
        tl.static_assert(ENC == _E5)
        # A pair's fp32 halves are its two dims: one bf16x2 word each, whose halves are the
        # nibbles of the pair's output byte (mxfp4_words). One 32-block per thread, all in-thread.
        lo = y.to(tl.int32).to(tl.float32, bitcast=True)
        hi = (y >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        byte, e = mxfp4_words(bf16x2_words(lo, hi, HW))
        tl.store(cache_ptr + (page_base + entry * _IDX_FP4_TOKEN)[:, :, None] + col, byte.to(tl.uint8),
                 mask=live[:, :, None])
        tl.store(cache_ptr + page_base + kv_bs * _IDX_FP4_TOKEN + entry * 4 + blk, (e + 127).to(tl.uint8),
                 mask=live)


@triton.jit
def _load_tile(rows_ptr, slot_ptr, t0, T, ROWS: tl.constexpr, G: tl.constexpr, W: tl.constexpr):
    """Rows ``t0 .. t0 + ROWS - 1`` as ``y [G, ROWS, W]`` (nothing read for a row with slot < 0 or
    beyond T), their slots and liveness ``[G, ROWS]`` and the dims ``col [G, 1, W]``."""
    t = t0 + tl.broadcast_to(tl.arange(0, ROWS)[None, :], (G, ROWS))
    slot = tl.load(slot_ptr + t, mask=t < T, other=-1)   # a row's G copies: one address
    live = slot >= 0
    col = tl.arange(0, G)[:, None, None] * W + tl.arange(0, W)[None, None, :]
    y = tl.load(rows_ptr + t[:, :, None] * (G * W) + col, mask=live[:, :, None])
    return y, slot, live, col


@triton.jit
def _load_pairs(rows_ptr, slot_ptr, t0, T, ROWS: tl.constexpr, G: tl.constexpr, W: tl.constexpr):
    """E5's :func:`_load_tile`: rows as int64 pairs of dims ``y [G, ROWS, W]`` (W = 16 pairs a
    32-block), slots and liveness ``[G, ROWS]``, ``col [G, 1, W]`` in pairs. The slots are read in
    the tile's layout (one block a thread), so that nothing derived from them is converted through
    shared memory (a plain ``[G, ROWS]`` load takes a layout of its own: 9 shared-memory accesses
    and 9 barriers a thread): as a ``[G, ROWS, W]`` load of ``slot_ptr + t + k`` of which only
    k = 0 is read (a constant mask: ptxas drops the other lanes' loads), summed over k. Declaring
    the rows non-contiguous (``max_contiguous`` 1) gives it the row loads' order, pairs first, so
    the coalescing pass gives it their layout."""
    k = tl.arange(0, W)[None, None, :]
    t = t0 + tl.broadcast_to(tl.arange(0, ROWS)[None, :, None], (G, ROWS, 1))
    ts = tl.max_contiguous(t, [1, 1, 1])
    s3 = tl.load(slot_ptr + ts + k, mask=(k == 0) & (t < T), other=tl.where(k == 0, -1, 0))
    slot = tl.sum(s3, axis=2)
    live = slot >= 0
    col = tl.arange(0, G)[:, None, None] * W + k
    y = tl.load(rows_ptr + t * (G * W) + col, mask=live[:, :, None])
    return y, slot, live, col


@triton.jit(do_not_specialize=["kv_bs", "page_stride", "T"],
            do_not_specialize_on_alignment=["slot_ptr", "scale_ptr"])
def store_rows_kernel(
    rows_ptr,            # fp32 [T, G W], contiguous
    cache_ptr,           # uint8: the cache from its first page (StoreOperands.cache)
    slot_ptr,            # int64 [T]
    scale_ptr,           # fp32 [1]: fp8_scale (E3), otherwise never read
    kv_bs: tl.int32,
    page_stride: tl.int64,
    T: tl.int64,
    ENC: tl.constexpr,
    ROWS: tl.constexpr,  # rows per tile
    SUB: tl.constexpr,   # tiles per program (1 or 2), all loaded before the first store
    G: tl.constexpr,     # groups per row
    W: tl.constexpr,     # dims per group
    HW_CVT: tl.constexpr = True,   # bf16 / e4m3 rounding by the GPU's casts (False: the interpreter)
):
    t0 = tl.program_id(0).to(tl.int64) * (ROWS * SUB)
    if ENC == _E5:
        # E5 reads a row as 64 int64 pairs of dims: its tile is [G, ROWS, W // 2] (_store_tile).
        pairs = rows_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
        y, slot, live, col = _load_pairs(pairs, slot_ptr, t0, T, ROWS, G, W // 2)
    else:
        y, slot, live, col = _load_tile(rows_ptr, slot_ptr, t0, T, ROWS, G, W)
    if SUB == 2:
        y1, slot1, live1, col1 = _load_tile(rows_ptr, slot_ptr, t0 + ROWS, T, ROWS, G, W)
    inv = 1.0
    if ENC == _E3:
        inv = tl.div_rn(1.0, tl.load(scale_ptr))   # fl(1 / fp8_scale), once per program
    if (ENC == _E4) or (ENC == _E5):
        # Indexer pages are multiples of 4 bytes (host-checked); of 16 (kv_bs % 4 == 0, production)
        # the entries are 16-byte aligned: wide stores, and a layout of one row per 8 lanes (E4) or
        # of one 32-block per lane (E5).
        if page_stride % 16 == 0:
            _store_tile(y, cache_ptr, inv, slot, live, col, kv_bs, page_stride, ENC, 16, HW_CVT)
        else:
            _store_tile(y, cache_ptr, inv, slot, live, col, kv_bs, page_stride, ENC, 4, HW_CVT)
    else:
        _store_tile(y, cache_ptr, inv, slot, live, col, kv_bs, page_stride, ENC, 16, HW_CVT)
        if SUB == 2:
            _store_tile(y1, cache_ptr, inv, slot1, live1, col1, kv_bs, page_stride, ENC, 16, HW_CVT)


def _groups(key: Any) -> tuple[int, int]:
    """(groups per row, dims per group) of the key's encoder: its scale blocks, one reduction axis."""
    enc = key_encoder(key)
    return (4, 32) if enc in (E4, E5) else (key.head_size // 64, 64)


def tile_rows(key: Any) -> tuple[int, int]:
    """(rows per tile, tiles per program). E1 / E2 write bf16, at most 8 per thread and store (16
    bytes), so their tiles are 2 rows and the loads take that layout too (a 4-row tile would go
    through shared memory); E3 / E4 / E5 keep 16 fp32 of one row per thread. E1-E3: 8 KB of rows per
    program of 4 warps. E4 / E5 rows are 512 bytes: with 16 per program (8 KB) they reached 68 / 44 %
    of the copy on the H200, with 64 / 32 (each thread's rows all loaded before the first amax)
    92 / 58 % (``benchmarks/results/shape_tuning_h200/``; E1 gained nothing from any shape). E5 since
    its thread-per-block rewrite: 16 rows per program (half its 128 threads hold a block) 89.8 %, 32
    rows 78.5 %, 64 rows 77.5 % at T = 524288 on an H100 (``shape_tuning_h100/``)."""
    enc = key_encoder(key)
    return (2, 2) if enc in (E1, E2) else (4, 1) if enc == E3 else (64, 1) if enc == E4 else (16, 1)


def rows_per_program(key: Any) -> int:
    rows, sub = tile_rows(key)
    return rows * sub


class _StoreRowsTriton:
    """The launch every hook shares (a mixin): :func:`rows_per_program` rows per program."""

    kernel_fn = store_rows_kernel
    params = {
        "rows_ptr": Ptr(torch.float32),          # data_ptr % 16 == 0: checked
        "cache_ptr": Ptr(torch.uint8),           # data_ptr % 16 (32 for fp8_ds_mla) == 0: checked
        "slot_ptr": Ptr(torch.int64, aligned=False),
        "scale_ptr": Ptr(torch.float32, aligned=False),
        "kv_bs": Runtime(),
        "page_stride": Runtime(),
        "T": Runtime(),
        "ENC": FromKey(key_encoder),
        "ROWS": FromKey(lambda key: tile_rows(key)[0]),
        "SUB": FromKey(lambda key: tile_rows(key)[1]),
        "G": FromKey(lambda key: _groups(key)[0]),
        "W": FromKey(lambda key: _groups(key)[1]),
        "HW_CVT": Const(True),
    }

    def launch_options(self, key: Any) -> dict[str, Any]:
        return {"num_warps": 4}

    def grid(self, key: Any, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(args["T"], rows_per_program(key)),)

    def launch_args(self, key: Any, rows: torch.Tensor, kv_slot_mapping: torch.Tensor, ops: StoreOperands,
                    t: int) -> tuple[Any, ...]:
        return (rows, ops.cache, kv_slot_mapping, ops.scale, ops.kv_bs, ops.page_stride, t)


class StoreRowsDsTriton(_StoreRowsTriton, StoreRowsDsBase, TritonJitKernel["StoreRowsDsBase.CompileKey"]):
    """E1 store hook on Triton (GPU, or the interpreter on CPU)."""


class StoreRowsPlainTriton(_StoreRowsTriton, StoreRowsPlainBase,
                           TritonJitKernel["StoreRowsPlainBase.CompileKey"]):
    """E2 / E3 store hook on Triton."""


class StoreRowsIndexerTriton(_StoreRowsTriton, StoreRowsIndexerBase,
                             TritonJitKernel["StoreRowsIndexerBase.CompileKey"]):
    """E4 / E5 store hook on Triton."""
