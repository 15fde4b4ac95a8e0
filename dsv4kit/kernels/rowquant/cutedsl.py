"""rowquant in CuTeDSL: one warp quantizes one 128-wide block of one row.

A CTA of ``rows_per_program`` warps covers that many rows of one column block; each lane
holds 4 consecutive elements. The amax is an integer max over |x| bit patterns, reduced
across the warp with butterfly shuffles; the exponent and the e4m3 byte come from the same
integer recipes as the Triton kernel (spec §2.1), so both backends and the reference agree
bit for bit. The only float operations are the exact upcast, the rounded multiply
``fl(a * fl(1/448))`` and the exact scaling by ``2**-e``, both as ``mul.rn.f32`` (NVVM would
otherwise be free to contract a product into a later add: spec §2.1 rule 1).
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.kernels.cute_numerics import mul_rn
from dsv4kit.kernels.rowquant.reference import BLOCK
from dsv4kit.kernels.rowquant.spec import RowQuantBase

__all__ = ["RowQuantCuTeDSL"]

VEC = BLOCK // 32  # elements per lane
AMAX_FLOOR_BITS = 0x38D1B717  # fl(1e-4)
INV448_BITS = 0x3B124925  # fl(1/448)


@cute.jit
def _e4m3_code(u: Int32) -> Int32:
    """e4m3fn byte of the fp32 value with bits ``u`` (|value| <= 448): RNE, integer ops only."""
    m = u & 0x7FFFFFFF
    sign = (u >> 24) & 0x80
    exp = m >> 23
    normal = ((m + 0x7FFFF + ((m >> 20) & 1)) >> 20) - 960
    sig = m & 0x7FFFFF
    if exp > 0:
        sig = sig | 0x800000
    shift = cutlass.min(cutlass.max(141 - exp, Int32(21)), Int32(25))
    k = sig >> shift
    rem = sig - (k << shift)
    half = Int32(1) << (shift - 1)
    if rem > half or (rem == half and (k & 1) == 1):
        k = k + 1
    code = k
    if exp >= 121:
        code = normal
    return code | sign


@cute.kernel
def _rowquant_kernel(x: cute.Tensor, q: cute.Tensor, s: cute.Tensor, rows_per_cta: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    pid_m, blk, _ = cute.arch.block_idx()
    lane = tidx % 32
    row = pid_m * rows_per_cta + tidx // 32
    if row < x.shape[0]:
        col0 = blk * BLOCK + lane * VEC
        amax = Int32(0)
        for j in cutlass.range_constexpr(VEC):
            u = x[row, col0 + j].to(Float32).bitcast(Int32)
            amax = cutlass.max(amax, u & 0x7FFFFFFF)
        amax = cute.arch.warp_reduction_max(amax)
        a = cutlass.max(amax, Int32(AMAX_FLOOR_BITS)).bitcast(Float32)
        d = mul_rn(a, Int32(INV448_BITS).bitcast(Float32))
        e = ((d.bitcast(Int32) + 0x7FFFFF) >> 23) - 127
        inv_scale = ((127 - e) << 23).bitcast(Float32)
        for j in cutlass.range_constexpr(VEC):
            y = mul_rn(x[row, col0 + j].to(Float32), inv_scale)
            q[row, col0 + j] = _e4m3_code(y.bitcast(Int32)).to(cutlass.Uint8)
        if lane == 0:
            s[row, blk] = ((e + 127) << 23).bitcast(Float32)


@cute.jit
def _rowquant_host(x: cute.Tensor, q: cute.Tensor, s: cute.Tensor, stream: cuda.CUstream,
                   rows_per_cta: cutlass.Constexpr):
    grid_m = (x.shape[0] + rows_per_cta - 1) // rows_per_cta
    _rowquant_kernel(x, q, s, rows_per_cta).launch(
        grid=(grid_m, x.shape[1] // BLOCK, 1), block=(32 * rows_per_cta, 1, 1), stream=stream)


class RowQuantCuTeDSL(RowQuantBase, CuTeDSLJitKernel["RowQuantBase.CompileKey"]):
    """rowquant, CuTeDSL backend (compiles anywhere, runs on CUDA)."""

    jit_fn = _rowquant_host

    def warmup_inputs(self, key: RowQuantBase.CompileKey) -> tuple[Any, ...]:
        m = sym(symbol="M")  # one symbol shared by the three tensors: the same runtime M
        # The row stride's class from the key: divisible by 16 elements, or nothing assumed.
        stride = sym(divisibility=16 if key.x_stride_class.endswith("div16") else 1, symbol="ldx")
        n = key.n_cols
        x = fake_tensor(cutlass.BFloat16, (m, n), (stride, 1))
        q = fake_tensor(cutlass.Uint8, (m, n))
        s = fake_tensor(Float32, (m, n // BLOCK))
        return x, q, s, fake_stream(self.tvm_ffi), key.rows_per_program


    def launch_args(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
        return (x, q, scale)
