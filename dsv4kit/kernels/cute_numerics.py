"""Exact arithmetic for CuTeDSL kernels (spec §2.1).

* ``mul_rn`` / ``add_rn`` / ``sub_rn`` emit ``.rn`` PTX, which ptxas never contracts into an
  FMA (rule 1: every product and sum rounded separately).
* The rounding helpers are the same integer recipes as the Triton kernels
  (:mod:`dsv4kit.kernels.triton_numerics`): one algorithm, two backends, identical bytes.
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


@cute.jit
def e4m3_byte(y: Float32) -> Uint32:
    """OCP e4m3fn byte of ``y`` (|y| <= 448), RNE, sign of zero kept (value in the low 8 bits)."""
    u = y.bitcast(Uint32)
    sign = (u >> Uint32(24)) & Uint32(0x80)
    m = u & Uint32(0x7FFFFFFF)
    a = m.bitcast(Float32)
    mr = m + Uint32(0x7FFFF) + ((m >> Uint32(20)) & Uint32(1))
    normal = (((mr >> Uint32(23)) - Uint32(120)) << Uint32(3)) | ((mr >> Uint32(20)) & Uint32(7))
    # Subnormal range: |y| * 512 < 8 is exact; truncation is floor for a non-negative value.
    t = mul_rn(a, Float32(512.0))
    i = Uint32(t)
    f = sub_rn(t, Float32(i))
    up = (f > Float32(0.5)) | ((f == Float32(0.5)) & ((i & Uint32(1)) == Uint32(1)))
    k = select(up, i + Uint32(1), i, Uint32)
    mag = select(a >= Float32(0.015625), normal, k, Uint32)
    return sign | mag


@cute.jit
def e2m1_code(v: Float32) -> Uint32:
    """E2M1 code of ``v`` by comparisons (§2.4), sign in bit 3."""
    a = abs_f32(v)
    mag = (
        Uint32(a > Float32(0.25)) + Uint32(a >= Float32(0.75)) + Uint32(a > Float32(1.25))
        + Uint32(a >= Float32(1.75)) + Uint32(a > Float32(2.5)) + Uint32(a >= Float32(3.5))
        + Uint32(a > Float32(5.0))
    )
    return mag | ((v.bitcast(Uint32) >> Uint32(28)) & Uint32(8))
