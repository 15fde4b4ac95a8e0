"""Exact arithmetic for CuTeDSL kernels (spec §2.1).

* ``mul_rn`` / ``add_rn`` / ``sub_rn`` emit ``.rn`` PTX, which ptxas never contracts into an
  FMA (rule 1: every product and sum rounded separately).
* bf16 and E2M1 rounding use the same recipes as the Triton kernels
  (:mod:`dsv4kit.kernels.triton_numerics`); e4m3 uses the hardware RNE conversion, which the
  spec allows CuTeDSL (and which the GPU tests compare with the reference bit for bit).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _rn(op: str, a: Float32, b: Float32, loc=None, ip=None) -> Float32:
    return Float32(
        llvm.inline_asm(
            T.f32(),
            [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
            f"{op}.rn.f32 $0, $1, $2;",
            "=f,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
            loc=loc,
            ip=ip,
        )
    )


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fl(a * b)``; never fused."""
    return _rn("mul", a, b, loc, ip)


@dsl_user_op
def add_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fl(a + b)``; never fused."""
    return _rn("add", a, b, loc, ip)


@dsl_user_op
def sub_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fl(a - b)``; never fused."""
    return _rn("sub", a, b, loc, ip)


def select(cond: Boolean, a, b, dtype):
    """``a if cond else b`` without a branch, typed as ``dtype``."""
    return dtype(cutlass.select_(cond, dtype(a), dtype(b)))


@cute.jit
def abs_f32(x: Float32) -> Float32:
    return (x.bitcast(Uint32) & Uint32(0x7FFFFFFF)).bitcast(Float32)


@cute.jit
def round_bf16(x: Float32) -> Float32:
    """RNE of ``x`` to a bf16 value, returned as fp32."""
    u = x.bitcast(Uint32)
    u = u + Uint32(0x7FFF) + ((u >> Uint32(16)) & Uint32(1))
    return (u & Uint32(0xFFFF0000)).bitcast(Float32)


@cute.jit
def clog2(v: Float32) -> Int32:
    """Smallest e with 2**e >= v (v positive normal)."""
    return Int32((v.bitcast(Uint32) + Uint32(0x7FFFFF)) >> Uint32(23)) - Int32(127)


@cute.jit
def pow2(e: Int32) -> Float32:
    """2**e for e in [-126, 127]."""
    return Uint32((e + Int32(127)) << Int32(23)).bitcast(Float32)


@dsl_user_op
def e4m3x4(y0: Float32, y1: Float32, y2: Float32, y3: Float32, *, loc=None, ip=None) -> Uint32:
    """Four e4m3fn bytes (``y0`` in the low byte) by the hardware RNE conversion (spec §2.1 rule 3).

    ``cvt.rn.satfinite.e4m3x2.f32`` rounds to nearest even, keeps the sign of zero, and
    saturates at 448 (inputs are at most 448 here anyway). sm_89 and newer.
    """
    vals = [Float32(v).ir_value(loc=loc, ip=ip) for v in (y0, y1, y2, y3)]
    return Uint32(
        llvm.inline_asm(
            T.i32(),
            vals,
            "{ .reg .b16 lo, hi;\n"
            "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
            "mov.b32 $0, {lo, hi}; }",
            "=r,f,f,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
            loc=loc,
            ip=ip,
        )
    )


@cute.jit
def e2m1_code(v: Float32) -> Uint32:
    """E2M1 code of ``v`` (sign in bit 3), RNE ties to even (§2.4): the Triton kernels' recipe.

    ``C = binade(|v|, >= 1) * 2**22`` makes the fp32 add round |v| onto the E2M1 grid; then
    ``bits(r) >> 22 = 2E + M`` is the code plus 252 for r >= 1, 252 for 0.5 and 0 for 0.
    """
    u = v.bitcast(Uint32)
    a = (u & Uint32(0x7FFFFFFF)).bitcast(Float32)
    c = (cutlass.max(u & Uint32(0x7F800000), Uint32(0x3F800000)) + Uint32(22 << 23)).bitcast(Float32)
    t = sub_rn(add_rn(a, c), c).bitcast(Uint32) >> Uint32(22)
    mag = cutlass.max(t, Uint32(251)) - select(t >= Uint32(254), Uint32(252), Uint32(251), Uint32)
    return mag | ((u >> Uint32(28)) & Uint32(8))
