"""CuTeDSL kernels for indexer-Q RoPE + quant (spec K1 FP8, K2 MXFP4).

``index_q`` is seen as rows ``r = t * 64 + h`` of 128 bf16, read as 32 64-bit words: lane
``l`` holds dims ``4l .. 4l+3`` (one 8-byte load; a warp reads its 256-byte row in one
coalesced sweep). A warp (the key's "thread group") owns ``coarsen`` consecutive rows of one
token: it issues all their loads, fetches the token's position and cos/sin once, then
computes. Lanes 16..31 hold the rope half; each holds two complete GPT-J pairs, so RoPE needs
no shuffles. The 128-dim amax (FP8) is one warp reduction; the four 32-dim MXFP4 blocks are
8-lane groups. A CTA has 4 warps.

Rounding is in :mod:`dsv4kit.kernels.cute_numerics` (bf16 and E2M1 as in the Triton kernels,
e4m3 by the hardware RNE conversion), and every product/sum is an ``.rn`` instruction (no FMA
contraction).
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int16, Int32, Int64, Uint32, Uint64

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.errors import input_error
from dsv4kit.kernels.cute_numerics import (
    abs_f32,
    add_rn,
    clog2,
    e2m1_code,
    e4m3x4,
    mul_rn,
    pow2,
    round_bf16,
    sub_rn,
)
from dsv4kit.kernels.indexer_q.spec import IndexerQBase

__all__ = ["IndexerQFp8CuTeDSL", "IndexerQMxfp4CuTeDSL"]

WARPS_PER_CTA = 4
NUM_HEADS = 64


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
        p = Int64(mPos[first_row // NUM_HEADS])
        i = (lane - 16) * 2                      # pair index of dims (4l, 4l+1); (4l+2, 4l+3) is i + 1
        c0 = mCS[p, i].to(Float32)
        c1 = mCS[p, i + 1].to(Float32)
        s0 = mCS[p, 32 + i].to(Float32)
        s1 = mCS[p, 32 + i + 1].to(Float32)
    return c0, c1, s0, s1


@cute.jit
def _rotate(v: Uint64, cs, lane):
    """The lane's 4 values: nope lanes as loaded, rope lanes rotated (no FMA) and bf16-rounded."""
    x0, x1, x2, x3 = _unpack4(v)
    y0, y1, y2, y3 = x0, x1, x2, x3
    if lane >= 16:
        c0, c1, s0, s1 = cs
        y0 = round_bf16(sub_rn(mul_rn(x0, c0), mul_rn(x1, s0)))
        y1 = round_bf16(add_rn(mul_rn(x1, c0), mul_rn(x0, s0)))
        y2 = round_bf16(sub_rn(mul_rn(x2, c1), mul_rn(x3, s1)))
        y3 = round_bf16(add_rn(mul_rn(x3, c1), mul_rn(x2, s1)))
    return y0, y1, y2, y3


@cute.jit
def _amax4(y0, y1, y2, y3):
    return cute.arch.fmax(cute.arch.fmax(abs_f32(y0), abs_f32(y1)), cute.arch.fmax(abs_f32(y2), abs_f32(y3)))


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
        for c in cutlass.range_constexpr(coarsen):
            row = first + c
            y0, y1, y2, y3 = _rotate(words[c], cs, lane)
            amax = cute.arch.warp_reduction_max(_amax4(y0, y1, y2, y3))
            # D1: floor before dividing; multiply by fl(1/448) (§2.1: same clog2 as / 448).
            e = clog2(mul_rn(cute.arch.fmax(amax, Float32(1e-4)), Float32(1.0 / 448.0)))
            inv = pow2(-e)
            packed = e4m3x4(mul_rn(y0, inv), mul_rn(y1, inv), mul_rn(y2, inv), mul_rn(y3, inv))
            mQout[row, lane] = packed.bitcast(Int32)
            if lane == 0:
                w = mW[row].to(Float32)
                mWout[row] = mul_rn(mul_rn(mul_rn(w, pow2(e)), ss), hs)


@cute.jit
def _mx_exp(amax: Float32) -> Int32:
    """MXFP4 block exponent: clog2(fl(max(a, 6*2^-126) * fl(1/6))) clamped to [-127, 127]."""
    a = cute.arch.fmax(amax, Float32(6.0 * 2.0**-126))
    e = clog2(mul_rn(a, Float32(1.0 / 6.0)))
    return cutlass.min(cutlass.max(e, Int32(-127)), Int32(127))


@cute.kernel
def _mxfp4_kernel(mPos, mQ, mCS, mW, mQout, mScale, mWout, num_rows: Int32, ss: Float32, hs: Float32,
                  coarsen: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % 32
    first = (bidx * WARPS_PER_CTA + tidx // 32) * coarsen
    if first < num_rows:
        words = [mQ[first + c, lane] for c in range(coarsen)]
        cs = _cos_sin(mPos, mCS, first, lane)
        for c in cutlass.range_constexpr(coarsen):
            row = first + c
            y0, y1, y2, y3 = _rotate(words[c], cs, lane)
            # Lanes 8b..8b+7 hold block b (dims 32b..32b+31).
            e = _mx_exp(cute.arch.warp_reduction_max(_amax4(y0, y1, y2, y3), threads_in_group=8))
            inv = pow2(-e)
            lo = e2m1_code(mul_rn(y0, inv)) | (e2m1_code(mul_rn(y1, inv)) << Uint32(4))
            hi = e2m1_code(mul_rn(y2, inv)) | (e2m1_code(mul_rn(y3, inv)) << Uint32(4))
            mQout[row, lane] = cutlass.Uint16(lo | (hi << Uint32(8))).bitcast(cutlass.Int16)
            b = Uint32(e + Int32(127))
            b1 = cute.arch.shuffle_sync(b, 8)
            b2 = cute.arch.shuffle_sync(b, 16)
            b3 = cute.arch.shuffle_sync(b, 24)
            if lane == 0:
                mScale[row] = (b | (b1 << Uint32(8)) | (b2 << Uint32(16)) | (b3 << Uint32(24))).bitcast(Int32)
                w = mW[row].to(Float32)
                mWout[row] = mul_rn(mul_rn(w, ss), hs)


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
    """K2. ``mQout`` int16 [R, 32] (2 packed bytes each); ``mScale`` int32 [R]."""
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
        scale = fake_tensor(Int32, (r,), align=4)
        w_out = fake_tensor(Float32, (r,), align=4)
        return (*shared, q_out, scale, w_out, Int32(0), Float32(0.0), Float32(0.0),
                fake_stream(self.tvm_ffi), key.coarsen)

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_packed, q_scale, w_out = outs
        rows = q_packed.shape[0] * q_packed.shape[1]
        return (positions, index_q.view(torch.int64).view(rows, -1), cos_sin_cache, index_weights.view(rows),
                q_packed.view(torch.int16).view(rows, -1), q_scale.view(rows), w_out.view(rows), rows, ss,
                hs)
