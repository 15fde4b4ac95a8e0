"""rowquant in Triton: one program quantizes ROWS rows x COLB 128-wide blocks.

Thread mapping (Triton's layouts): the program's tile is ``[ROWS * COLB, 128]``, tile row ``j``
being row ``ROWS * pid0 + j // COLB``, block ``COLB * pid1 + j % COLB``. At the coarse key
(ROWS = 4, COLB = :func:`~dsv4kit.kernels.rowquant.spec.blocks_per_program`: 8 at 4096 columns,
4 at 512) it runs 4 warps; a half-warp holds one tile row, each lane 8 consecutive bf16 (one
16-byte load) whose 8 e4m3 bytes it writes with one 8-byte store, and a lane's COLB / 2 loads
are all issued before the first amax (4 butterfly shuffles within the half-warp) needs one; the
scales go out through shared memory (the 1-D scale store has its own layout). Why several
blocks: with one (a 1 KB program) the SMs' CTA launch rate, not the memory, bounded both
backends at 60 % of the copy on the H200 (achieved occupancy 36-39 % of 100 %). With ROWS = 1
(fewer than ``COARSEN_AT`` rows: decode sizes) COLB is 1 and the row block is spread over 4
warps, one element per lane, amax across warps through shared memory.

Numerics (spec §2.1), bit-exact on GPU and under the CPU interpreter: the float operations are
the exact bf16 -> fp32 upcast, one rounded multiply ``fl(a * fl(1/448))`` (same ``clog2`` as the
division for bf16-valued amax) and the exact scaling ``y = x * 2**-e`` (|y| <= 448); the amax
(|x| orders like its bit pattern) and the exponent are integer operations on fp32 bits. The
e4m3 rounding of y depends on ``HW_CVT``:

* GPU compiles (``HW_CVT`` true): ``y.to(tl.float8e4nv)``, which Triton 3.6 lowers to the
  hardware ``cvt.rn.satfinite.e4m3x2.f32`` (two values per instruction): RNE, sign of zero
  kept (-0 and negatives that round to zero give 0x80), saturation never reached (|y| <= 448).
* the CPU interpreter (``HW_CVT`` false, set by the backend): the integer recipe
  :func:`_e4m3_code`, because the interpreter's fp32 -> fp8 cast drops the rounding carry
  (D3). The two give the same byte for every |y| <= 448, so the interpreter tests the GPU's
  bytes but not the GPU's instruction; ``tests/backends/test_rowquant_hw_cvt.py`` checks the PTX
  and ``benchmarks/verify_backends.py`` the bytes on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const, FromKey, IntClass, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.rowquant.reference import BLOCK
from dsv4kit.kernels.rowquant.spec import RowQuantBase, blocks_per_program

__all__ = ["RowQuantTriton"]

AMAX_FLOOR_BITS = tl.constexpr(0x38D1B717)  # fl(1e-4)
INV448_BITS = tl.constexpr(0x3B124925)  # fl(1/448)


@triton.jit
def _e4m3_code(u):
    """e4m3fn byte of the fp32 value with bits ``u`` (|value| <= 448): RNE, integer ops only."""
    m = u & 0x7FFFFFFF
    sign = (u >> 24) & 0x80  # bit 31 -> bit 7 (arithmetic shift; higher bits masked off)
    exp = m >> 23
    # |v| >= 2**-6: keep 3 mantissa bits; the add rounds to nearest even and carries into
    # the exponent (15.9 -> 16); then rebias 127 -> 7: ((exp - 120) << 3) | mant3.
    normal = ((m + 0x7FFFF + ((m >> 20) & 1)) >> 20) - 960
    # |v| < 2**-6: k = RNE(|v| * 512) from the 24-bit significand; k == 8 is 2**-6 (code 8).
    sig = (m & 0x7FFFFF) | tl.where(exp > 0, 0x800000, 0)
    shift = tl.minimum(tl.maximum(141 - exp, 21), 25)  # >= 25: below half of the smallest step
    k = sig >> shift
    rem = sig - (k << shift)
    half = (rem * 0 + 1) << (shift - 1)
    k += ((rem > half) | ((rem == half) & ((k & 1) == 1))).to(tl.int32)
    return tl.where(exp >= 121, normal, k) | sign


@triton.jit(do_not_specialize=["n_rows"])
def _rowquant_kernel(x_ptr, q_ptr, s_ptr, n_rows: tl.int32, x_row_stride, n_cols,
                     ROWS: tl.constexpr, COLB: tl.constexpr, BLOCK: tl.constexpr,
                     HW_CVT: tl.constexpr = True):
    j = tl.arange(0, ROWS * COLB)
    rows = tl.program_id(0) * ROWS + j // COLB
    blk = tl.program_id(1) * COLB + j % COLB
    cols = blk[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    live = (rows < n_rows)[:, None]
    r = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r * x_row_stride + cols, mask=live, other=0.0).to(tl.float32)
    u = x.to(tl.int32, bitcast=True)
    # |x| orders like its bit pattern, so the amax is an integer max (redux.sync on the GPU).
    amax = tl.max(u & 0x7FFFFFFF, axis=1)
    a = tl.maximum(amax, AMAX_FLOOR_BITS).to(tl.float32, bitcast=True)
    d = a * tl.full(a.shape, INV448_BITS, tl.int32).to(tl.float32, bitcast=True)
    e = ((d.to(tl.int32, bitcast=True) + 0x7FFFFF) >> 23) - 127  # clog2(d), d a positive normal
    y = x * ((127 - e) << 23).to(tl.float32, bitcast=True)[:, None]  # exact: times 2**-e
    if HW_CVT:  # cvt.rn.satfinite.e4m3x2.f32
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        code = _e4m3_code(y.to(tl.int32, bitcast=True)).to(tl.uint8)
    tl.store(q_ptr + r * n_cols + cols, code, mask=live)
    scale = ((e + 127) << 23).to(tl.float32, bitcast=True)  # 2**e
    tl.static_assert(BLOCK == 128)
    nblk = n_cols >> 7  # n_cols // BLOCK without the signed-division fixup (n_cols > 0)
    tl.store(s_ptr + rows.to(tl.int64) * nblk + blk, scale, mask=rows < n_rows)


class RowQuantTriton(RowQuantBase, TritonJitKernel["RowQuantBase.CompileKey"]):
    """rowquant, Triton backend (GPU, or the interpreter on CPU)."""

    kernel_fn = _rowquant_kernel
    params = {
        "x_ptr": Ptr(torch.bfloat16),
        "q_ptr": Ptr(torch.uint8),
        "s_ptr": Ptr(torch.float32),
        "n_rows": Runtime(),
        "x_row_stride": IntClass("x_stride_class"),
        "n_cols": FromKey("n_cols"),
        "ROWS": FromKey("rows_per_program"),
        "COLB": FromKey(lambda key: blocks_per_program(key.n_cols, key.rows_per_program)),
        "BLOCK": Const(BLOCK),
        "HW_CVT": Const(True),
    }

    def grid(self, key: RowQuantBase.CompileKey, args: Mapping[str, Any]) -> tuple[int, ...]:
        colb = blocks_per_program(key.n_cols, key.rows_per_program)
        return (triton.cdiv(args["n_rows"], key.rows_per_program), key.n_cols // BLOCK // colb)


    def launch_args(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
        return (x, q, scale, x.shape[0], x.stride(0))
