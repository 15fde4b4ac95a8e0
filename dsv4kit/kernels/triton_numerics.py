"""Interpreter-safe rounding for Triton kernels (spec §2.1, decision D3).

The Triton CPU interpreter truncates fp32→bf16 casts and can drop the rounding carry
of fp32→fp8 casts, so the bit-exact kernels never let a cast round. bf16 rounds with
integer arithmetic on the fp32 bits; e4m3 and E2M1 round with one fp32 add of a
"magic" constant that leaves exactly the target format's mantissa bits (the hardware and
numpy both round that add to nearest even). Results are values the final cast represents
exactly (bf16, e4m3) or the 4-bit codes themselves (E2M1). The same code runs on the GPU.
:func:`bf16_value` and :func:`e4m3` take an ``HW`` constexpr instead: on the GPU (``HW`` true) the
cast itself rounds to nearest even in hardware (fewer instructions, the same bits); a kernel sets
``HW`` false under the interpreter (a ``HW_CVT`` parameter: the backend does it).

All helpers take and return blocks; ``x`` is fp32 unless said otherwise.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bits(x):
    """The fp32 bits of ``x`` as uint32."""
    return x.to(tl.uint32, bitcast=True)


@triton.jit
def from_bits(u):
    """The fp32 whose bits are ``u`` (uint32)."""
    return u.to(tl.float32, bitcast=True)


@triton.jit
def round_bf16(x):
    """RNE of fp32 ``x`` to the nearest bf16 value, returned as fp32 (exactly representable)."""
    u = bits(x)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return from_bits(u & 0xFFFF0000)


@triton.jit
def clog2(v):
    """Smallest e with 2**e >= v, for positive normal fp32 ``v``; int32."""
    return ((bits(v) + 0x7FFFFF) >> 23).to(tl.int32) - 127


@triton.jit
def pow2(e):
    """2.0**e as fp32, for int32 ``e`` in [-126, 127]."""
    return from_bits(((e + 127) << 23).to(tl.uint32))


@triton.jit
def round_e4m3(y):
    """RNE of ``y`` (|y| <= 448) onto the e4m3fn grid, as an fp32 the final cast keeps exactly.

    Adding ``C = 2**(E + 20)`` (E = the binade of |y|, at least -6) leaves exactly the three
    mantissa bits of e4m3 (or, below 2**-6, the 2**-9 subnormal step) in the sum, and the fp32
    add rounds them to nearest even; subtracting C is exact. A carry (15.9 -> 16) is simply the
    sum reaching the next binade. The sign is put back afterwards, so -0 survives.
    """
    u = bits(y)
    a = from_bits(u & 0x7FFFFFFF)
    binade = tl.maximum(u & 0x7F800000, 0x3C800000)      # 2**-6: the subnormal step below it
    c = from_bits(binade + (20 << 23))
    r = (a + c) - c
    return from_bits(bits(r) | (u & 0x80000000))


@triton.jit
def bf16_value(x, HW: tl.constexpr):
    """RNE of fp32 ``x`` to bf16, as fp32: the GPU's ``cvt.rn.bf16.f32`` (Triton's fp32 -> bf16
    cast rounds to nearest even) and an exact widening where ``HW``, else :func:`round_bf16`."""
    if HW:
        return x.to(tl.bfloat16).to(tl.float32)
    else:
        return round_bf16(x)


@triton.jit
def e4m3(y, HW: tl.constexpr):
    """``y`` (|y| <= 448) as float8e4nv, rounded to nearest even: the GPU's cast where ``HW`` (on
    sm_90 ``cvt.rn.satfinite.e4m3x2.f32``, two values per instruction; saturation never triggers
    in this range), else :func:`round_e4m3` and a cast that has nothing left to round."""
    if HW:
        return y.to(tl.float8e4nv)
    else:
        return round_e4m3(y).to(tl.float8e4nv)


@triton.jit
def e2m1_code(v):
    """E2M1 code (0..15, sign in bit 3) of ``v`` (|v| <= 6 up to rounding), RNE ties to even (§2.4).

    The grid spacing is half the binade of |v| (at least 0.5): adding ``C = binade * 2**22``
    rounds |v| onto it with the fp32 add (ties to an even multiple = an even code). The rounded
    r has exponent E and one mantissa bit M, and ``bits(r) >> 22 = 2E + M`` is the code plus
    252 for r >= 1; r = 0.5 gives 252 (code 1) and r = 0 gives 0 (code 0).
    """
    u = bits(v)
    a = from_bits(u & 0x7FFFFFFF)
    c = from_bits(tl.maximum(u & 0x7F800000, 0x3F800000) + (22 << 23))
    t = bits((a + c) - c) >> 22
    mag = tl.maximum(t, 251) - tl.where(t >= 254, 252, 251)
    return mag | ((u >> 28) & 8)
