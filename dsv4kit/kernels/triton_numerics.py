"""Interpreter-safe rounding for Triton kernels (spec §2.1, decision D3).

The Triton CPU interpreter truncates fp32→bf16 casts and can drop the rounding carry
of fp32→fp8 casts, so the bit-exact kernels never let a cast round. bf16 rounds with
integer arithmetic on the fp32 bits; e4m3 and E2M1 round with one fp32 add of a
"magic" constant that leaves exactly the target format's mantissa bits (the hardware and
numpy both round that add to nearest even). Results are values the final cast represents
exactly (bf16, e4m3) or the E2M1 code itself (in the low byte). The same code runs on the GPU.
:func:`bf16_value`, :func:`bf16x2_words` and :func:`e4m3` take an ``HW`` constexpr instead: on the
GPU (``HW`` true) the cast itself rounds to nearest even in hardware (fewer instructions, the same
bits); a kernel sets ``HW`` false under the interpreter (a ``HW_CVT`` parameter: the backend does it).

MXFP4 (§2.4) on bf16 values is one routine, :func:`mxfp4_words` (with :func:`mx_block_exp` and
:func:`e2m1_magnitude`), shared by K2 (indexer Q) and E5 (the indexer K cache: its store hook and
the C4 indexer compressor K9): both hold a block as 16 int32 words of two bf16, whose halves are
the nibbles of the output bytes.

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
def bf16x2_words(lo, hi, HW: tl.constexpr):
    """int32 words of the RNE bf16 of fp32 ``lo`` (low half) and ``hi`` (high half): a two-lane
    :func:`bf16_value`. Where ``HW``, one ``cvt.rn.bf16x2.f32`` per word (the hardware RNE, two
    values an instruction; Triton's cast emits one per value and then a widening each), else
    :func:`round_bf16`."""
    if HW:
        return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        w = (bits(round_bf16(lo)) >> 16) | (bits(round_bf16(hi)) & 0xFFFF0000)
        return w.to(tl.int32, bitcast=True)


@triton.jit
def mx_block_exp(amax):
    """MXFP4 block exponent (§2.4) of the block maximum ``amax`` of |z|: clog2(fl(max(amax,
    6 * 2^-126) * fl(1/6))), clamped to [-127, 127]; int32. (In the domain e is in [-126, 126].)"""
    a = tl.maximum(amax, 6.0 * 1.1754943508222875e-38)
    return tl.minimum(tl.maximum(clog2(a * 0.16666666666666666), -127), 127)


@triton.jit
def e2m1_magnitude(v):
    """E2M1 magnitude code of ``v`` plus 0x55000000 (uint32: the low byte is the code 0..7), RNE,
    ties to the even code (§2.4). ``v``: 0 <= v <= 6, a bf16 value times a power of two, rounded
    like an fp32 product below 2^-126 (what :func:`mxfp4_words` computes; not any fp32).

    ``v' = fl(v * 2^-126)`` puts E2M1's subnormal edge (v = 1) on fp32's, so its bits are
    ``b = 2^22 g(v)``, ``g = min(2v, v + 2, v/2 + 4)`` (below 2: 2^23 v; above: exponent field
    and mantissa), and E2M1's grid 0, .5, .., 6 is g = 0..7 with its thresholds at the
    half-integers: the code is RNE(b / 2^22). v' is exact for v >= 2^-16, b % 4 == 0 for v >=
    2^-14, and smaller v are code 0 either way. ``f = 2^23 + b/4`` (b < 2^25: one LEA.HI) and
    one RNE add of ``2^43 - 2^23`` give ``2^43 + 2^20 RNE(b / 2^22)``. 4 instructions, where the
    3 magic adds of one grid each, their min and the scaling took 7. Needs fp32 subnormal
    products (no flush to zero: the default of Triton and of numpy).
    """
    b = bits(v * 1.1754943508222875e-38)
    f = from_bits((b >> 2) + 0x4B000000)
    return bits(f + 8796084633600.0)


@triton.jit
def mxfp4_words(w):
    """MXFP4 (§2.4) of blocks held as bf16 words: ``w`` int32 ``[..., 16]``, the last axis one
    32-dim block, word k = its dims (2k, 2k+1) (even dim in the low half). Returns (uint32
    ``[..., 16]`` whose low byte is output byte k = code(2k) | code(2k+1) << 4 (the bits above it
    are not zero: truncate to uint8), int32 block exponents ``e [...]``).

    |z| orders like its bits (non-negative, no NaN), so the block amax is an integer max of the
    halves' magnitude bits (a 3-way VIMNMX3 in SASS; sm_90 has no 3-way float max). The codes are
    :func:`e2m1_magnitude` of ``|z| * 2^-e`` (exact, or an underflow to code 0), the sign bits (15,
    31 of a word) go to bits 3, 7 (-0 and underflows keep theirs) by one IMAD.HI: for ``t = w &
    0x80008000``, ``hi32(t * (2^20 + 2^8)) = t >> 12 + t >> 24`` (bit 19 too, above the byte), and
    the low bytes of the three terms are disjoint: no carries.
    """
    aw = w & 0x7FFF7FFF
    a_e = aw << 16                                       # |even| fp32 bit patterns, >= 0 as int32
    a_o = aw & -65536                                    # |odd|
    amax = tl.max(tl.maximum(a_e, a_o), axis=-1).to(tl.float32, bitcast=True)
    e = mx_block_exp(amax)
    inv = tl.expand_dims(pow2(-e), -1)                   # exact (or underflow to code 0)
    c_e = e2m1_magnitude(a_e.to(tl.float32, bitcast=True) * inv)
    c_o = e2m1_magnitude(a_o.to(tl.float32, bitcast=True) * inv)
    sgn = tl.umulhi((w & -2147450880).to(tl.uint32, bitcast=True), 0x100100)
    return c_e + (c_o << 4) + sgn, e
