"""rowquant in Triton: one program quantizes ROWS rows x one 128-wide block.

Bit-exact on GPU and under the CPU interpreter: the only float operations are the exact
bf16 -> fp32 upcast, one rounded multiply ``fl(a * fl(1/448))`` (same ``clog2`` as the
division for bf16-valued amax, spec §2.1) and the exact scaling by ``2**-e``; the amax, the
exponent and the e4m3 rounding are integer operations on fp32 bit patterns (spec §2.1
recipes), so no float cast of the interpreter (D3) is ever asked to round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const, FromKey, IntClass, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.rowquant.reference import BLOCK
from dsv4kit.kernels.rowquant.spec import RowQuantBase

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
                     ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    live = (rows < n_rows)[:, None]
    r = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r * x_row_stride + cols[None, :], mask=live, other=0.0).to(tl.float32)
    u = x.to(tl.int32, bitcast=True)
    # |x| orders like its bit pattern, so the amax is an integer max (no float max semantics).
    amax = tl.max(u & 0x7FFFFFFF, axis=1)
    a = tl.maximum(amax, AMAX_FLOOR_BITS).to(tl.float32, bitcast=True)
    d = a * tl.full(a.shape, INV448_BITS, tl.int32).to(tl.float32, bitcast=True)
    e = ((d.to(tl.int32, bitcast=True) + 0x7FFFFF) >> 23) - 127  # clog2(d), d a positive normal
    y = x * ((127 - e) << 23).to(tl.float32, bitcast=True)[:, None]  # exact: times 2**-e
    code = _e4m3_code(y.to(tl.int32, bitcast=True))
    tl.store(q_ptr + r * n_cols + cols[None, :], code.to(tl.uint8), mask=live)
    scale = ((e + 127) << 23).to(tl.float32, bitcast=True)  # 2**e
    tl.store(s_ptr + rows.to(tl.int64) * (n_cols // BLOCK) + blk, scale, mask=rows < n_rows)


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
        "BLOCK": Const(BLOCK),
    }

    def launch_options(self, key: RowQuantBase.CompileKey) -> dict[str, Any]:
        return {"num_warps": 4}

    def grid(self, key: RowQuantBase.CompileKey, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(args["n_rows"], key.rows_per_program), key.n_cols // BLOCK)


    def launch_args(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
        return (x, q, scale, x.shape[0], x.stride(0))
