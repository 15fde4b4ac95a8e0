"""CuTeDSL encode routines E1..E5 (spec §2.9) and the store-hook kernel that runs them.

:func:`encode_store` is *the* encode step of the CuTeDSL backend: the store hooks launch it on
given rows and the C4 compressors (K5 / K6 / K9) call it on the row they computed in
registers. It writes the same bytes as :func:`dsv4kit.kernels.encoders.triton.encode_store`.

Row ownership (the calling convention, for every caller): **one warp holds one row**. A row of
``D = 64 * NB`` fp32 (``NB`` = 8 for head 512, 2 for the indexer's 128) is split into
``EPT = D / 32 = 2 * NB`` consecutive elements per lane: lane ``l`` holds dims
``[l * EPT, (l + 1) * EPT)`` in a register tensor of ``EPT`` Float32.

* head 512 (E1 / E2 / E3), ``EPT = 16``: the 64-block ``b`` is lanes ``4b .. 4b + 3``; lanes
  0..27 hold the 448 nope dims, lanes 28..31 the 64 rope dims (block 7).
* head 128 (E4 / E5), ``EPT = 4``: E4's one 128-block is the whole warp; E5's 32-blocks are
  lanes ``8b .. 8b + 7``.

Block maxima are butterfly shuffles (``shfl.sync.bfly``) inside those aligned lane groups: no
shared memory, no barrier. The scale bytes are gathered into lane 0 with ``shfl.sync.idx``.

Stores (bytes from the cache's first page, entry ``slot % kv_bs`` of page ``slot // kv_bs`` at
``page * page_stride``; layouts as in the Triton kernel):

* E1: nope lanes one 16-byte store of 16 e4m3 at ``entry * 576 + 16 l``; rope lanes two 16-byte
  stores of 16 bf16 at ``entry * 576 + 448 + 32 (l - 28)``; lane 0 one 8-byte store of the 7
  ue8m0 bytes and the 0 pad at ``kv_bs * 576 + entry * 8``.
* E2: two 16-byte stores of 16 bf16 at ``entry * 1024 + 32 l``.
* E3: one 16-byte store of 16 e4m3 at ``entry * 512 + 16 l``.
* E4: one 4-byte store of 4 e4m3 at ``entry * 128 + 4 l``; lane 0 the fp32 ``2^e`` at
  ``kv_bs * 128 + entry * 4``.
* E5: one 2-byte store of 4 packed E2M1 codes (even dim in the low nibble) at
  ``entry * 64 + 2 l``; lane 0 the 4 ue8m0 bytes (block 0 lowest) at ``kv_bs * 64 + entry * 4``.

Store-hook mapping: CTAs of :data:`WARPS` warps; warp ``w`` of CTA ``b`` owns the ``R =``
:func:`rows_per_warp` rows ``t = (b * WARPS + w) * R + r`` (``t < T``; R = 1 for head 512, 4 for
the indexer). All its lanes read ``kv_slot_mapping[t]`` of each; a row whose slot is < 0 is
neither loaded nor stored. Lane ``l`` first loads its ``EPT`` fp32 of every stored row (16-byte
loads, all R in flight), then the warp calls :func:`encode_store` row after row. The branches are
warp-uniform.

Numerics (spec §2.1): bf16 by the integer RNE of :func:`~dsv4kit.kernels.cute_numerics.
round_bf16` (E1..E4), e4m3 by the hardware RNE conversion (``cvt.rn.satfinite.e4m3x2.f32``),
exponents by ``clog2`` of the bits, and every fp32 product an ``.rn`` instruction (no FMA
contraction). ``fl(1 / fp8_scale)`` (E3) is ``div.rn.f32``, the IEEE division (not the
approximate ``div.full``). E5 is K2's MXFP4 path: the lane's 4 values rounded to two bf16x2
words by the hardware RNE ``cvt.rn.bf16x2.f32``, then the packed recipes of
:mod:`~dsv4kit.kernels.cute_numerics` (block amax by ``max.bf16x2`` and the butterfly,
:func:`~dsv4kit.kernels.cute_numerics.mx_scale_byte`,
:func:`~dsv4kit.kernels.cute_numerics.mxfp4_lane`: two values an instruction; its one
``fma.rn.bf16x2`` rounds the exact ``|v| + 64 B`` once). The per-element fp32 recipes it
replaced (integer bf16 RNE, fp32 amax, three magic adds per code) made the E5 store hook
issue-bound: static SASS per thread 755 -> 519, instruction time / DRAM time 1.02 -> 0.59
(benchmarks/sass_mix.py, sm_90a, compiled on CPU).
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64, Uint8, Uint16, Uint32, Uint64

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.kernels.cute_numerics import (
    abs_f32,
    bf16x2_op,
    bf16x2_rn,
    clog2,
    div_rn,
    e4m3x4,
    mul_rn,
    mx_scale_byte,
    mxfp4_lane,
    pow2,
    round_bf16,
)
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

__all__ = ["StoreRowsDsCuTeDSL", "StoreRowsIndexerCuTeDSL", "StoreRowsPlainCuTeDSL", "WARPS", "cache_align",
           "elems_per_lane", "encode_store", "rows_per_warp", "store_rows_host"]

#: Warps (rows) per CTA of the store hook.
WARPS = 4

# Layout constants of §2.5-2.7 (bytes).
_DS_TOKEN = 576
_DS_SCALES = 8
_DS_NOPE_LANES = 28          # 448 nope dims / 16 per lane
_IDX_FP8_TOKEN = 128
_IDX_FP4_TOKEN = 64

# fp32 constants by their bits (the values the Triton kernel's Python floats become).
_AMAX_FLOOR_BITS = 0x38D1B717      # fl(1e-4)  (D1 floor)
_INV448_BITS = 0x3B124925          # fl(1/448)
_FP8_MAX = 448.0


def elems_per_lane(nb: int) -> int:
    """Consecutive row elements each lane holds for a row of ``64 * nb`` (one row per warp)."""
    return 2 * nb


def cache_align(enc: int) -> int:
    """The byte alignment the kernel assumes of the cache base (host-checked by the hooks)."""
    return 32 if enc == E1 else 16


def _check_encoder(enc: int, nb: int) -> int:
    """Trace-time check of the compile-time pair (encoder, row blocks); returns the lane's element count."""
    want = {E1: 8, E2: 8, E3: 8, E4: 2, E5: 2}
    if enc not in want or nb != want[enc]:
        raise ValueError(f"encode_store: encoder {enc} with nb = {nb}: expected E1/E2/E3 with nb = 8 or "
                         "E4/E5 with nb = 2")
    return elems_per_lane(nb)


def _f32(bits: int) -> Float32:
    return Uint32(bits).bitcast(Float32)


@cute.jit
def _q8_exponent(amax: Float32) -> Int32:
    """UE8M0 exponent of a Q8 block (§2.3, D1): clog2(fl(max(amax, fl(1e-4)) * fl(1/448)))."""
    return clog2(mul_rn(cute.arch.fmax(amax, _f32(_AMAX_FLOOR_BITS)), _f32(_INV448_BITS)))


@cute.jit
def _bf16_pair(lo: Float32, hi: Float32) -> Uint32:
    """Two bf16-valued fp32 as one little-endian word of bf16 bits (``lo`` in the low half)."""
    return (hi.bitcast(Uint32) & Uint32(0xFFFF0000)) | (lo.bitcast(Uint32) >> Uint32(16))


@cute.jit
def _at(mCache: cute.Tensor, off: Int64, dtype: Any, n: cutlass.Constexpr, align: cutlass.Constexpr):
    """``n`` elements of ``dtype`` at byte ``off`` of the cache (``off % align == 0``: the addressing
    of §2.5-2.7 on host-checked page strides)."""
    ptr = mCache.iterator + cute.assume(off, divby=align)
    return cute.make_tensor(cute.recast_ptr(ptr, dtype=dtype), cute.make_layout(n))


@cute.jit
def encode_store(y: cute.Tensor, mCache: cute.Tensor, mScale: cute.Tensor, slot: Int64, kv_bs: Int32,
                 page_stride: Int64, enc: cutlass.Constexpr, nb: cutlass.Constexpr):
    """Encode one row with encoder ``enc`` (E1..E5, compile time) and write it at ``slot``.

    Call it from **one whole warp** (32 lanes converged, no lane exited or masked off), with the
    same ``slot`` (>= 0), ``kv_bs`` and ``page_stride`` in every lane: the caller skips slot < 0
    (and any other "no entry" case) with a warp-uniform branch around the call.

    ``y``: a register tensor of ``2 * nb`` Float32; lane ``l`` holds row dims
    ``[l * 2nb, (l + 1) * 2nb)`` of the fp32 row (``nb = 8``: 512 dims, 16 per lane, E1/E2/E3;
    ``nb = 2``: 128 dims, 4 per lane, E4/E5). The 64-blocks of E1 are lanes ``4b .. 4b + 3``
    (lanes 28..31: the rope dims, stored as bf16), E4's 128-block the whole warp, E5's 32-blocks
    lanes ``8b .. 8b + 7``. Block maxima: butterfly shuffles within those groups (no shared
    memory, no barrier); the scale bytes are shuffled to lane 0, which stores them.

    ``mCache``: the 1-D uint8 cache from its first page, base aligned to :func:`cache_align`
    bytes (32 for E1, else 16), page strides as host-checked for the format. ``mScale``: fp32,
    element 0 = ``fp8_scale`` (read by E3 only, by every lane; any fp32 tensor otherwise).
    ``slot``: Int64; ``kv_bs``: Int32; ``page_stride``: Int64 bytes. ``y`` is the final row (nope
    normalized, rope rotated, fp32, not yet bf16-rounded) and is not modified. The lane is the
    hardware ``%laneid``: the warp must be a hardware warp (CTA x-size a multiple of 32).
    """
    ept = _check_encoder(enc, nb)
    lane = cute.arch.lane_idx()
    # slot >= 0 and kv_bs > 0: an unsigned division (a signed one adds Python's floor fix-ups), which
    # the compiler runs in 32 bits whenever both fit; the remainder from the quotient.
    page = Uint64(slot) // Uint64(kv_bs)
    page_base = Int64(page) * page_stride
    entry = Int64(Uint64(slot) - page * Uint64(kv_bs))
    z = cute.make_rmem_tensor(ept, Float32)     # E1..E4: bf16(y) as fp32 (E5 rounds packed; unused there)
    for i in cutlass.range_constexpr(ept):
        z[i] = round_bf16(y[i])

    if cutlass.const_expr(enc == E1):
        amax = abs_f32(z[0])
        for i in cutlass.range_constexpr(1, ept):
            amax = cute.arch.fmax(amax, abs_f32(z[i]))
        e = _q8_exponent(cute.arch.warp_reduction_max(amax, threads_in_group=4))
        tok = page_base + entry * Int64(_DS_TOKEN)
        if lane < _DS_NOPE_LANES:
            inv = pow2(-e)
            words = cute.make_rmem_tensor(4, Uint32)
            for k in cutlass.range_constexpr(4):
                words[k] = e4m3x4(mul_rn(z[4 * k], inv), mul_rn(z[4 * k + 1], inv),
                                  mul_rn(z[4 * k + 2], inv), mul_rn(z[4 * k + 3], inv))
            cute.autovec_copy(words, _at(mCache, tok + Int64(lane * 16), Uint32, 4, 16))
        else:
            words = cute.make_rmem_tensor(8, Uint32)
            for k in cutlass.range_constexpr(8):
                words[k] = _bf16_pair(z[2 * k], z[2 * k + 1])
            cute.autovec_copy(words, _at(mCache, tok + Int64(448 + (lane - _DS_NOPE_LANES) * 32), Uint32,
                                         8, 16))
        # 7 ue8m0 bytes (blocks 0..6 from lanes 0, 4, .., 24) and the pad byte 0.
        b = Uint32(e + Int32(127)) & Uint32(0xFF)
        g = [b] + [cute.arch.shuffle_sync(b, 4 * k) for k in range(1, 7)]
        if lane == 0:
            sw = cute.make_rmem_tensor(2, Uint32)
            sw[0] = g[0] | (g[1] << Uint32(8)) | (g[2] << Uint32(16)) | (g[3] << Uint32(24))
            sw[1] = g[4] | (g[5] << Uint32(8)) | (g[6] << Uint32(16))
            at = page_base + Int64(kv_bs) * Int64(_DS_TOKEN) + entry * Int64(_DS_SCALES)
            cute.autovec_copy(sw, _at(mCache, at, Uint32, 2, 8))
    elif cutlass.const_expr(enc == E2):
        words = cute.make_rmem_tensor(8, Uint32)
        for k in cutlass.range_constexpr(8):
            words[k] = _bf16_pair(z[2 * k], z[2 * k + 1])
        at = page_base + entry * Int64(2 * 64 * nb) + Int64(lane * 32)
        cute.autovec_copy(words, _at(mCache, at, Uint32, 8, 16))
    elif cutlass.const_expr(enc == E3):
        inv = div_rn(Float32(1.0), mScale[0])
        v = cute.make_rmem_tensor(ept, Float32)
        for i in cutlass.range_constexpr(ept):
            v[i] = cute.arch.fmin(cute.arch.fmax(mul_rn(z[i], inv), Float32(-_FP8_MAX)), Float32(_FP8_MAX))
        words = cute.make_rmem_tensor(4, Uint32)
        for k in cutlass.range_constexpr(4):
            words[k] = e4m3x4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3])
        at = page_base + entry * Int64(64 * nb) + Int64(lane * 16)
        cute.autovec_copy(words, _at(mCache, at, Uint32, 4, 16))
    elif cutlass.const_expr(enc == E4):
        amax = cute.arch.fmax(cute.arch.fmax(abs_f32(z[0]), abs_f32(z[1])),
                              cute.arch.fmax(abs_f32(z[2]), abs_f32(z[3])))
        e = _q8_exponent(cute.arch.warp_reduction_max(amax))
        inv = pow2(-e)
        words = cute.make_rmem_tensor(1, Uint32)
        words[0] = e4m3x4(mul_rn(z[0], inv), mul_rn(z[1], inv), mul_rn(z[2], inv), mul_rn(z[3], inv))
        cute.autovec_copy(words, _at(mCache, page_base + entry * Int64(_IDX_FP8_TOKEN) + Int64(lane * 4),
                                     Uint32, 1, 4))
        if lane == 0:
            sc = cute.make_rmem_tensor(1, Float32)
            sc[0] = pow2(e)
            at = page_base + Int64(kv_bs) * Int64(_IDX_FP8_TOKEN) + entry * Int64(4)
            cute.autovec_copy(sc, _at(mCache, at, Float32, 1, 4))
    else:
        # E5: lanes 8b .. 8b + 7 hold the 32-block b. z as two bf16x2 words (hardware RNE), then the
        # packed MXFP4 recipes of cute_numerics, as in K2: amax, scaling and codes two values an instruction.
        w0 = bf16x2_rn(y[1], y[0])
        w1 = bf16x2_rn(y[3], y[2])
        m = bf16x2_op("max", w0 & Uint32(0x7FFF7FFF), w1 & Uint32(0x7FFF7FFF))   # exact: bf16 maxima
        m = bf16x2_op("max", m, cute.arch.shuffle_sync_bfly(m, offset=4))
        m = bf16x2_op("max", m, cute.arch.shuffle_sync_bfly(m, offset=2))
        m = bf16x2_op("max", m, cute.arch.shuffle_sync_bfly(m, offset=1))
        b = mx_scale_byte(cute.arch.fmax((m << Uint32(16)).bitcast(Float32),
                                         (m & Uint32(0xFFFF0000)).bitcast(Float32)))
        packed = cute.make_rmem_tensor(1, Uint16)
        packed[0] = Uint16(mxfp4_lane(w0, w1, b) & Uint32(0xFFFF))
        cute.autovec_copy(packed, _at(mCache, page_base + entry * Int64(_IDX_FP4_TOKEN) + Int64(lane * 2),
                                      Uint16, 1, 2))
        b1 = cute.arch.shuffle_sync(b, 8)
        b2 = cute.arch.shuffle_sync(b, 16)
        b3 = cute.arch.shuffle_sync(b, 24)
        if lane == 0:
            sw = cute.make_rmem_tensor(1, Uint32)
            sw[0] = b | (b1 << Uint32(8)) | (b2 << Uint32(16)) | (b3 << Uint32(24))
            at = page_base + Int64(kv_bs) * Int64(_IDX_FP4_TOKEN) + entry * Int64(4)
            cute.autovec_copy(sw, _at(mCache, at, Uint32, 1, 4))


def rows_per_warp(nb: int) -> int:
    """Rows each warp stores: 1 for head 512 (64 bytes per lane already); 4 for the indexer's 128-dim
    rows, so a lane has 4 x 16-byte loads in flight (its 4 rows' loads issue before the first encode)."""
    return 1 if nb > 2 else 4


@cute.kernel
def _store_rows_kernel(
    mRows: cute.Tensor,      # fp32 [T * 64 NB] (rows flat, contiguous, 16-byte aligned)
    mCache: cute.Tensor,     # uint8 [*]: the cache from its first page (StoreOperands.cache)
    mSlot: cute.Tensor,      # int64 [T]
    mScale: cute.Tensor,     # fp32 [1]: fp8_scale (E3), otherwise never read
    kv_bs: Int32,
    page_stride: Int64,
    enc: cutlass.Constexpr,
    nb: cutlass.Constexpr,
):
    ept = elems_per_lane(nb)
    rpw = rows_per_warp(nb)
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % 32
    t0 = (bidx * WARPS + tidx // 32) * rpw
    n = mSlot.shape[0]
    # Every row's slot and (when it is stored) fp32 values first, then the encodes: all loads in flight.
    # (Register tensors: values written inside a runtime branch stay valid after it.)
    slots = cute.make_rmem_tensor(rpw, Int64)
    ys = [cute.make_rmem_tensor(ept, Float32) for _ in range(rpw)]
    for r in cutlass.range_constexpr(rpw):
        slots[r] = Int64(-1)
        if t0 + r < n:
            slots[r] = mSlot[t0 + r]
    for r in cutlass.range_constexpr(rpw):
        if slots[r] >= Int64(0):
            off = Int64(t0 + r) * Int64(64 * nb) + Int64(lane * ept)
            src = cute.make_tensor(mRows.iterator + cute.assume(off, divby=4), cute.make_layout(ept))
            cute.autovec_copy(src, ys[r])
    for r in cutlass.range_constexpr(rpw):
        if slots[r] >= Int64(0):
            encode_store(ys[r], mCache, mScale, slots[r], kv_bs, page_stride, enc, nb)


@cute.jit
def store_rows_host(
    mRows: cute.Tensor,
    mCache: cute.Tensor,
    mSlot: cute.Tensor,
    mScale: cute.Tensor,
    kv_bs: Int32,
    page_stride: Int64,
    stream: Any,
    enc: cutlass.Constexpr,
    nb: cutlass.Constexpr,
):
    """Launch the store hook: ``ceil(T / (WARPS * rows_per_warp))`` CTAs of ``32 * WARPS`` threads."""
    n = mSlot.shape[0]
    per_cta = WARPS * rows_per_warp(nb)
    _store_rows_kernel(mRows, mCache, mSlot, mScale, kv_bs, page_stride, enc, nb).launch(
        grid=[(n + per_cta - 1) // per_cta, 1, 1], block=[32 * WARPS, 1, 1], stream=stream)


class _StoreRowsCuTeDSL:
    """What the three hooks share (a mixin): the fakes and the runtime arguments."""

    jit_fn = store_rows_host
    tvm_ffi: bool

    def warmup_inputs(self, key: Any) -> tuple[Any, ...]:
        # Every size is a symbol: T, the cache span (pages, kv_bs, stride) are runtime values.
        enc = key_encoder(key)
        return (
            fake_tensor(Float32, (sym(symbol="row_elems", width=64),)),              # data_ptr % 16: checked
            fake_tensor(Uint8, (sym(symbol="cache_bytes", width=64),), align=cache_align(enc)),
            fake_tensor(Int64, (sym(symbol="T"),), align=8),
            fake_tensor(Float32, (1,), align=4),
            Int32(0),
            Int64(0),
            fake_stream(self.tvm_ffi),
            enc,
            key.head_size // 64,
        )

    def launch_args(self, key: Any, rows: torch.Tensor, kv_slot_mapping: torch.Tensor, ops: StoreOperands,
                    t: int) -> tuple[Any, ...]:
        # 1-D, unit-stride views (a size-1 dim may carry any stride; the fakes' strides are static).
        slots = kv_slot_mapping if kv_slot_mapping.stride(0) == 1 else kv_slot_mapping.as_strided((t,), (1,))
        scale = ops.scale.as_strided((1,), (1,))   # fp8_scale [1], or the stand-in's first element
        return (rows.view(-1), ops.cache, slots, scale, ops.kv_bs, ops.page_stride)


class StoreRowsDsCuTeDSL(_StoreRowsCuTeDSL, StoreRowsDsBase, CuTeDSLJitKernel["StoreRowsDsBase.CompileKey"]):
    """E1 store hook on CuTeDSL (compiles anywhere, runs on CUDA)."""


class StoreRowsPlainCuTeDSL(_StoreRowsCuTeDSL, StoreRowsPlainBase,
                            CuTeDSLJitKernel["StoreRowsPlainBase.CompileKey"]):
    """E2 / E3 store hook on CuTeDSL."""


class StoreRowsIndexerCuTeDSL(_StoreRowsCuTeDSL, StoreRowsIndexerBase,
                              CuTeDSLJitKernel["StoreRowsIndexerBase.CompileKey"]):
    """E4 / E5 store hook on CuTeDSL."""
