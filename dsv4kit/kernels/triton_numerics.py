"""Interpreter-safe rounding for Triton kernels (spec §2.1, decision D3).

The Triton CPU interpreter truncates fp32→bf16 casts and can drop the rounding carry
of fp32→fp8 casts, so the bit-exact kernels never let a cast round: every rounding here
is integer arithmetic on the fp32 bits, and results are produced either as values that
the final cast represents exactly (bf16) or directly as the encoded bytes (e4m3, E2M1).
The same code runs on the GPU, where it compiles to a handful of integer instructions.

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
def e4m3_byte(y):
    """The OCP e4m3fn byte of ``y`` (|y| <= 448), RNE, sign of zero kept; uint8.

    Normals round on the fp32 bits (a carry into the exponent is just the integer add);
    the subnormal range (|y| < 2**-6) rounds ``|y| * 512`` to an integer k, and k is the
    byte (k == 8 is the smallest normal, whose byte is also 8).
    """
    u = bits(y)
    sign = (u >> 24) & 0x80
    a = from_bits(u & 0x7FFFFFFF)
    m = u & 0x7FFFFFFF
    m = m + 0x7FFFF + ((m >> 20) & 1)
    normal = (((m >> 23) - 120) << 3) | ((m >> 20) & 7)
    t = a * 512.0
    i = tl.floor(t)
    f = t - i
    ii = i.to(tl.uint32)
    k = tl.where((f > 0.5) | ((f == 0.5) & ((ii & 1) == 1)), ii + 1, ii)
    mag = tl.where(a >= 0.015625, normal, k)
    return (sign | mag).to(tl.uint8)


@triton.jit
def e2m1_code(v):
    """E2M1 code (0..15, sign in bit 3) of ``v`` by comparisons, RNE ties to even (§2.4)."""
    a = tl.abs(v)
    mag = ((a > 0.25).to(tl.uint32) + (a >= 0.75).to(tl.uint32) + (a > 1.25).to(tl.uint32)
           + (a >= 1.75).to(tl.uint32) + (a > 2.5).to(tl.uint32) + (a >= 3.5).to(tl.uint32)
           + (a > 5.0).to(tl.uint32))
    sign = (bits(v) >> 28) & 8
    return mag | sign
