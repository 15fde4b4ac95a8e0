"""rowquant in CuTeDSL: a warp quantizes ``colb`` 128-wide blocks of one row.

A CTA covers ``rows_per_program`` rows (a warp each) of ``colb`` adjacent column blocks
(:func:`~dsv4kit.kernels.rowquant.spec.blocks_per_program`: 1 at one row per program, 8 at
4096 columns and 4 at 512 on the coarse key). A warp issues every block's load before the first
amax needs one: ``colb`` x 8 bytes per lane in flight. Why several blocks: with one block of 4
rows per CTA (1 KB) the SMs' CTA launch rate, not the memory, bounded both backends at 60 % of
the copy on the H200 (achieved occupancy 36-39 % of 100 %). Each lane holds 4 consecutive
elements of a row per block: one 8-byte load where the key's row stride is a multiple of 16
elements (``x_stride_class`` div16; the base is 16-byte aligned, checked at call), four 2-byte
loads otherwise. A row past
the end is loaded as the last row (clamped: the loads need no guard) and not stored. The amax
is an integer max over |x| bit patterns (|x| orders like its bits), reduced across the warp with
one ``redux.sync.max.s32`` per block; the exponent comes from the same integer recipe as the Triton
kernel (spec §2.1). The only float operations are the exact upcast, the rounded multiply
``fl(a * fl(1/448))`` and the exact scaling ``y = x * 2**-e``, both as ``mul.rn.f32`` (NVVM
would otherwise be free to contract a product into a later add: spec §2.1 rule 1). The e4m3
bytes come from the hardware RNE conversion (:func:`~dsv4kit.kernels.cute_numerics.e4m3x4`: two
``cvt.rn.satfinite.e4m3x2.f32``, which §2.1 rule 3 allows CuTeDSL; |y| <= 448, so saturation
never triggers, and the sign of zero is kept), packed with the lane's first column in the low byte and
written with one 4-byte store per block (little endian: column order). Both backends and the
reference agree bit for bit.
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Uint32

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.kernels.cute_numerics import e4m3x4, mul_rn
from dsv4kit.kernels.rowquant.reference import BLOCK
from dsv4kit.kernels.rowquant.spec import RowQuantBase, blocks_per_program

__all__ = ["RowQuantCuTeDSL"]

VEC = BLOCK // 32  # elements per lane
AMAX_FLOOR_BITS = 0x38D1B717  # fl(1e-4)
INV448_BITS = 0x3B124925  # fl(1/448)


def _x_vec(key: RowQuantBase.CompileKey) -> bool:
    """Whether x's rows start 8-byte aligned: the row stride is a multiple of 16 elements."""
    return key.x_stride_class.endswith("div16")


@cute.kernel
def _rowquant_kernel(x: cute.Tensor, q: cute.Tensor, s: cute.Tensor, rows_per_cta: cutlass.Constexpr,
                     colb: cutlass.Constexpr, x_vec: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    pid_m, pid_n, _ = cute.arch.block_idx()
    lane = tidx % 32
    row = pid_m * rows_per_cta + tidx // 32
    last_row = x.shape[0] - 1
    base = cutlass.min(row, last_row) * x.stride[0]  # a row past the end loads the last row
    xs = []
    for k in cutlass.range_constexpr(colb):  # every load first: colb * 8 bytes in flight
        # The lane's 4 bf16 of block k: one 8-byte load where the row stride is a multiple of
        # 16 elements (base 16-byte aligned, checked at call), else 4 2-byte loads.
        off = base + (pid_n * colb + k) * BLOCK + lane * VEC
        if cutlass.const_expr(x_vec):
            off = cute.assume(off, divby=VEC)
        xr = cute.make_rmem_tensor(VEC, cutlass.BFloat16)
        cute.autovec_copy(cute.make_tensor(x.iterator + off, cute.make_layout(VEC)), xr)
        xs.append(xr)
    for k in cutlass.range_constexpr(colb):
        xr = xs[k]
        blk = pid_n * colb + k
        amax = Int32(0)
        for j in cutlass.range_constexpr(VEC):
            amax = cutlass.max(amax, xr[j].to(Float32).bitcast(Int32) & 0x7FFFFFFF)
        amax = cute.arch.warp_redux_sync(amax, kind="max")  # one redux.sync.max.s32, values >= 0
        a = cutlass.max(amax, Int32(AMAX_FLOOR_BITS)).bitcast(Float32)
        d = mul_rn(a, Int32(INV448_BITS).bitcast(Float32))
        e = ((d.bitcast(Int32) + 0x7FFFFF) >> 23) - 127
        inv_scale = ((127 - e) << 23).bitcast(Float32)
        if row <= last_row:  # warp-uniform
            # Four e4m3 bytes, the lane's first in the low byte: a little-endian 4-byte store writes
            # them in column order (q rows are n_cols bytes, n_cols a multiple of 128: aligned).
            word = cute.make_rmem_tensor(1, Uint32)
            word[0] = e4m3x4(mul_rn(xr[0].to(Float32), inv_scale), mul_rn(xr[1].to(Float32), inv_scale),
                             mul_rn(xr[2].to(Float32), inv_scale), mul_rn(xr[3].to(Float32), inv_scale))
            qp = q.iterator + cute.assume(row * q.shape[1] + blk * BLOCK + lane * VEC, divby=VEC)
            cute.autovec_copy(word, cute.make_tensor(cute.recast_ptr(qp, dtype=Uint32), cute.make_layout(1)))
            if lane == 0:
                s[row, blk] = ((e + 127) << 23).bitcast(Float32)


@cute.jit
def _rowquant_host(x: cute.Tensor, q: cute.Tensor, s: cute.Tensor, stream: cuda.CUstream,
                   rows_per_cta: cutlass.Constexpr, colb: cutlass.Constexpr, x_vec: cutlass.Constexpr):
    grid_m = (x.shape[0] + rows_per_cta - 1) // rows_per_cta
    _rowquant_kernel(x, q, s, rows_per_cta, colb, x_vec).launch(
        grid=(grid_m, x.shape[1] // (BLOCK * colb), 1), block=(32 * rows_per_cta, 1, 1), stream=stream)


class RowQuantCuTeDSL(RowQuantBase, CuTeDSLJitKernel["RowQuantBase.CompileKey"]):
    """rowquant, CuTeDSL backend (compiles anywhere, runs on CUDA)."""

    jit_fn = _rowquant_host

    def warmup_inputs(self, key: RowQuantBase.CompileKey) -> tuple[Any, ...]:
        m = sym(symbol="M")  # one symbol shared by the three tensors: the same runtime M
        # The row stride's class from the key: divisible by 16 elements, or nothing assumed.
        stride = sym(divisibility=16 if _x_vec(key) else 1, symbol="ldx")
        n = key.n_cols
        x = fake_tensor(cutlass.BFloat16, (m, n), (stride, 1))
        q = fake_tensor(cutlass.Uint8, (m, n))
        s = fake_tensor(Float32, (m, n // BLOCK))
        colb = blocks_per_program(key.n_cols, key.rows_per_program)
        return x, q, s, fake_stream(self.tvm_ffi), key.rows_per_program, colb, _x_vec(key)


    def launch_args(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
        return (x, q, scale)
