"""CuTeDSL kernels for indexer-Q RoPE + quant (spec K1 FP8, K2 MXFP4).

``index_q`` is seen as rows ``r = t * 64 + h`` of 128 bf16, read as 32 64-bit words: lane
``l`` holds dims ``4l .. 4l+3`` (one 8-byte load; a warp reads its 256-byte row in one
coalesced sweep). A warp (the key's "thread group") owns ``coarsen`` consecutive rows of one
token: it issues all their loads, fetches the token's position and cos/sin once, then
computes. Lanes 16..31 hold the rope half; each holds two complete GPT-J pairs, so RoPE needs
no shuffles. The 128-dim amax (FP8) is one warp reduction; the four 32-dim MXFP4 blocks are
8-lane groups. A CTA has 4 warps.

Every product/sum is an ``.rn`` instruction (no FMA contraction). Rope values are rounded to
bf16 by the hardware RNE ``cvt.rn.bf16x2.f32`` (spec §2.1 rule 3), e4m3 (K1) by the hardware
RNE conversion. MXFP4 (K2): a lane's 4 values stay two packed bf16x2 words through the amax,
the scaling and the E2M1 rounding (two elements per instruction: the recipes
:func:`~dsv4kit.kernels.cute_numerics.mx_scale_byte` and
:func:`~dsv4kit.kernels.cute_numerics.mxfp4_lane`, shared with the encoder E5). The
per-row scalars are stored once per thread, not once per row: lane ``c`` (``c < coarsen``)
writes the weight of row ``c``, and in K2 lane ``8b + c`` the scale byte of block ``b`` of row
``c``.
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int16, Int32, Int64, Uint8, Uint32, Uint64

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.errors import input_error
from dsv4kit.kernels.cute_numerics import (
    add_rn,
    bf16x2_op,
    bf16x2_rn,
    clog2,
    e4m3x4,
    mul_rn,
    mx_scale_byte,
    mxfp4_lane,
    pow2,
    prmt,
    select,
    sub_rn,
)
from dsv4kit.kernels.indexer_q.spec import IndexerQBase

__all__ = ["IndexerQFp8CuTeDSL", "IndexerQMxfp4CuTeDSL"]

WARPS_PER_CTA = 4
NUM_HEADS = 64
HEAD_SHIFT = 6
assert NUM_HEADS == 1 << HEAD_SHIFT


@cute.jit
def _unpack4(v: Uint64):
    """Four bf16 (little-endian in one 64-bit word) as exact fp32 values."""
    lo = Uint32(v & Uint64(0xFFFFFFFF))
    hi = Uint32(v >> Uint64(32))
    mask = Uint32(0xFFFF0000)
    return ((lo << Uint32(16)).bitcast(Float32), (lo & mask).bitcast(Float32),
            (hi << Uint32(16)).bitcast(Float32), (hi & mask).bitcast(Float32))


@cute.jit
def _cos_sin(mPos, mCS, first_row, lane):
    """cos/sin of the lane's two GPT-J pairs at the token of ``first_row`` (rope lanes only)."""
    c0, c1, s0, s1 = Float32(1.0), Float32(1.0), Float32(0.0), Float32(0.0)
    if lane >= 16:
        p = Int64(mPos[first_row >> HEAD_SHIFT])  # first_row >= 0: a shift, not a signed division
        i = (lane - 16) * 2                      # pair index of dims (4l, 4l+1); (4l+2, 4l+3) is i + 1
        c0 = mCS[p, i].to(Float32)
        c1 = mCS[p, i + 1].to(Float32)
        s0 = mCS[p, 32 + i].to(Float32)
        s1 = mCS[p, 32 + i + 1].to(Float32)
    return c0, c1, s0, s1


@cute.jit
def _unpack2(w: Uint32):
    """The two bf16 of a bf16x2 word (low half first) as exact fp32 values."""
    return (w << Uint32(16)).bitcast(Float32), (w & Uint32(0xFFFF0000)).bitcast(Float32)


def _rows_amax(words, lanes: int):
    """Per row of ``words`` (one or two rows' (w0, w1) bf16x2 pairs): the fp32 absmax over the
    row's 4 values in each of ``lanes`` consecutive lanes (a butterfly over lanes 8 or 32).

    bf16 maxima are exact, so the reduction runs on packed words; two rows share one word
    (row 0 in the low half, row 1 in the high half), halving the shuffles. Plain Python,
    traced inline into the kernel."""
    ms = [bf16x2_op("max", w0 & Uint32(0x7FFF7FFF), w1 & Uint32(0x7FFF7FFF)) for w0, w1 in words]
    if len(ms) == 2:
        m = bf16x2_op("max", prmt(ms[0], ms[1], 0x5410), prmt(ms[0], ms[1], 0x7632))
    else:
        m = ms[0]
    offset = lanes // 2
    while offset >= 1:
        m = bf16x2_op("max", m, cute.arch.shuffle_sync_bfly(m, offset=offset))
        offset //= 2
    lo, hi = (m << Uint32(16)).bitcast(Float32), (m & Uint32(0xFFFF0000)).bitcast(Float32)
    return [lo, hi] if len(ms) == 2 else [cute.arch.fmax(lo, hi)]


@cute.kernel
def _fp8_kernel(mPos, mQ, mCS, mW, mQout, mWout, num_rows: Int32, ss: Float32, hs: Float32,
                coarsen: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % 32
    first = (bidx * WARPS_PER_CTA + tidx // 32) * coarsen
    # num_rows is a multiple of 64 and coarsen divides 64: a group is all in range, one token.
    if first < num_rows:
        words = [mQ[first + c, lane] for c in range(coarsen)]   # all loads in flight first
        cs = _cos_sin(mPos, mCS, first, lane)
        e_mine = Int32(0)                                 # lane c (< coarsen): row c's exponent
        for c0 in cutlass.range_constexpr(0, coarsen, 2):   # rows in pairs (see _rows_amax)
            ws = [_bf16_words(words[c], cs, lane) for c in range(c0, min(c0 + 2, coarsen))]
            amaxes = _rows_amax(ws, 32)
            for j in cutlass.range_constexpr(len(ws)):
                c = c0 + j
                y0, y1 = _unpack2(ws[j][0])
                y2, y3 = _unpack2(ws[j][1])
                # D1: floor before dividing; multiply by fl(1/448) (§2.1: same clog2 as / 448).
                e = clog2(mul_rn(cute.arch.fmax(amaxes[j], Float32(1e-4)), Float32(1.0 / 448.0)))
                inv = pow2(-e)
                packed = e4m3x4(mul_rn(y0, inv), mul_rn(y1, inv), mul_rn(y2, inv), mul_rn(y3, inv))
                mQout[first + c, lane] = packed.bitcast(Int32)
                e_mine = e if c == 0 else select(lane == c, e, e_mine, Int32)
        if lane < coarsen:                                # one weight store per thread, not per row
            w = mW[first + lane].to(Float32)
            mWout[first + lane] = mul_rn(mul_rn(mul_rn(w, pow2(e_mine)), ss), hs)


@cute.jit
def _bf16_words(v: Uint64, cs, lane):
    """The lane's 4 values as two bf16x2 words (dims 4l, 4l+1 | 4l+2, 4l+3, low half first):
    nope lanes as loaded, rope lanes rotated (no FMA) and rounded by the hardware RNE cvt.

    Every lane computes the rotation and a select keeps it on the rope lanes: a warp issues
    the rope arithmetic once either way, and a select is cheaper than a divergent branch."""
    w0 = Uint32(v & Uint64(0xFFFFFFFF))
    w1 = Uint32(v >> Uint64(32))
    x0, x1, x2, x3 = _unpack4(v)
    c0, c1, s0, s1 = cs
    r0 = bf16x2_rn(add_rn(mul_rn(x1, c0), mul_rn(x0, s0)), sub_rn(mul_rn(x0, c0), mul_rn(x1, s0)))
    r1 = bf16x2_rn(add_rn(mul_rn(x3, c1), mul_rn(x2, s1)), sub_rn(mul_rn(x2, c1), mul_rn(x3, s1)))
    rope = lane >= 16
    return select(rope, r0, w0, Uint32), select(rope, r1, w1, Uint32)


@cute.kernel
def _mxfp4_kernel(mPos, mQ, mCS, mW, mQout, mScale, mWout, num_rows: Int32, ss: Float32, hs: Float32,
                  coarsen: cutlass.Constexpr):
    """Per row, a lane's 4 dims stay two packed bf16x2 words: amax, scaling and the E2M1 rounding
    run two elements per instruction (bf16 holds every value exactly: y is bf16 and 2^-e scales
    exactly, or underflows to a code-0 value). Lanes 8b..8b+7 hold block b (dims 32b..32b+31).
    Lane 8b + c (c < coarsen) stores the scale byte of block b of row c, lane c (< coarsen) the
    weight of row c: one store instruction per thread each, not one per row."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % 32
    first = (bidx * WARPS_PER_CTA + tidx // 32) * coarsen
    if first < num_rows:
        words = [mQ[first + c, lane] for c in range(coarsen)]
        cs = _cos_sin(mPos, mCS, first, lane)
        sel = lane % 8                           # the row whose scale byte this lane stores
        byte = Uint32(0)
        for c0 in cutlass.range_constexpr(0, coarsen, 2):   # rows in pairs (see _rows_amax)
            ws = [_bf16_words(words[c], cs, lane) for c in range(c0, min(c0 + 2, coarsen))]
            amaxes = _rows_amax(ws, 8)                       # lanes 8b..8b+7: block b
            for j in cutlass.range_constexpr(len(ws)):
                c = c0 + j
                b = mx_scale_byte(amaxes[j])                          # ue8m0 byte, 1..254
                packed = mxfp4_lane(ws[j][0], ws[j][1], b)          # nibbles 4l | 4l+1 | 4l+2 | 4l+3
                mQout[first + c, lane] = cutlass.Uint16(packed & Uint32(0xFFFF)).bitcast(Int16)
                byte = b if c == 0 else select(sel == c, b, byte, Uint32)
        if sel < coarsen:                                   # q_scale as bytes: row * 4 + block
            mScale[first + sel, lane // 8] = cutlass.Uint8(byte)
        if lane < coarsen:
            w = mW[first + lane].to(Float32)
            mWout[first + lane] = mul_rn(mul_rn(w, ss), hs)


def _grid(num_rows: Int32, coarsen: int) -> list:
    per_cta = WARPS_PER_CTA * coarsen
    return [(num_rows + per_cta - 1) // per_cta, 1, 1]


@cute.jit
def launch_fp8(mPos: cute.Tensor, mQ: cute.Tensor, mCS: cute.Tensor, mW: cute.Tensor, mQout: cute.Tensor,
               mWout: cute.Tensor, num_rows: Int32, ss: Float32, hs: Float32, stream: cuda.CUstream,
               coarsen: cutlass.Constexpr):
    """K1. ``mQ`` int64 [R, 32] (4 bf16 each); ``mQout`` int32 [R, 32] (4 e4m3 bytes); weights [R]."""
    _fp8_kernel(mPos, mQ, mCS, mW, mQout, mWout, num_rows, ss, hs, coarsen).launch(
        grid=_grid(num_rows, coarsen), block=[32 * WARPS_PER_CTA, 1, 1], stream=stream)


@cute.jit
def launch_mxfp4(mPos: cute.Tensor, mQ: cute.Tensor, mCS: cute.Tensor, mW: cute.Tensor, mQout: cute.Tensor,
                 mScale: cute.Tensor, mWout: cute.Tensor, num_rows: Int32, ss: Float32, hs: Float32,
                 stream: cuda.CUstream, coarsen: cutlass.Constexpr):
    """K2. ``mQout`` int16 [R, 32] (2 packed bytes each); ``mScale`` uint8 [R, 4] (the int32 words)."""
    _mxfp4_kernel(mPos, mQ, mCS, mW, mQout, mScale, mWout, num_rows, ss, hs, coarsen).launch(
        grid=_grid(num_rows, coarsen), block=[32 * WARPS_PER_CTA, 1, 1], stream=stream)


_CS_DTYPES = {"float32": Float32, "bfloat16": BFloat16}


class _CuteLaunch:
    """Fake inputs shared by the two CuTeDSL variants (a mixin)."""

    name: str
    tvm_ffi: bool

    def _shared_fakes(self, key: IndexerQBase.CompileKey) -> tuple[tuple[Any, ...], Any]:
        t, r, p = sym(symbol="T"), sym(symbol="R"), sym(symbol="max_pos")
        if key.cos_sin_dtype not in _CS_DTYPES:
            raise input_error(self.name, "cos_sin_dtype", f"one of {list(_CS_DTYPES)}", key.cos_sin_dtype)
        return (
            fake_tensor(Int64, (t,), align=8),                              # positions
            fake_tensor(Int64, (r, key.head_dim // 4)),                     # index_q as [R, 32] words
            fake_tensor(_CS_DTYPES[key.cos_sin_dtype], (p, key.rope_dim), align=4),
            fake_tensor(BFloat16, (r,), align=2),                           # index_weights [R]
        ), r


class IndexerQFp8CuTeDSL(_CuteLaunch, IndexerQBase, CuTeDSLJitKernel["IndexerQBase.CompileKey"]):
    """K1 on CuTeDSL: ``q_out`` written as int32 words of 4 e4m3 bytes."""

    cache_format = "fp8"
    jit_fn = launch_fp8

    def warmup_inputs(self, key: IndexerQBase.CompileKey) -> tuple[Any, ...]:
        shared, r = self._shared_fakes(key)
        q_out = fake_tensor(Int32, (r, key.head_dim // 4))
        w_out = fake_tensor(Float32, (r,), align=4)
        return (*shared, q_out, w_out, Int32(0), Float32(0.0), Float32(0.0), fake_stream(self.tvm_ffi),
                key.coarsen)

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_fp8, w_out = outs
        rows = q_fp8.shape[0] * q_fp8.shape[1]
        return (positions, index_q.view(torch.int64).view(rows, -1), cos_sin_cache, index_weights.view(rows),
                q_fp8.view(torch.int32).view(rows, -1), w_out.view(rows), rows, ss, hs)


class IndexerQMxfp4CuTeDSL(_CuteLaunch, IndexerQBase, CuTeDSLJitKernel["IndexerQBase.CompileKey"]):
    """K2 on CuTeDSL: packed codes as int16 words (2 bytes per lane), int32 scale words."""

    cache_format = "mxfp4"
    jit_fn = launch_mxfp4

    def warmup_inputs(self, key: IndexerQBase.CompileKey) -> tuple[Any, ...]:
        shared, r = self._shared_fakes(key)
        q_out = fake_tensor(Int16, (r, key.head_dim // 4))
        scale = fake_tensor(Uint8, (r, key.head_dim // 32))
        w_out = fake_tensor(Float32, (r,), align=4)
        return (*shared, q_out, scale, w_out, Int32(0), Float32(0.0), Float32(0.0),
                fake_stream(self.tvm_ffi), key.coarsen)

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_packed, q_scale, w_out = outs
        rows = q_packed.shape[0] * q_packed.shape[1]
        return (positions, index_q.view(torch.int64).view(rows, -1), cos_sin_cache, index_weights.view(rows),
                q_packed.view(torch.int16).view(rows, -1), q_scale.view(torch.uint8).view(rows, -1),
                w_out.view(rows), rows, ss,
                hs)
