"""Exact arithmetic for CuTeDSL kernels (spec §2.1).

* ``mul_rn`` / ``add_rn`` / ``sub_rn`` / ``div_rn`` / ``sqrt_rn`` emit ``.rn`` PTX, which ptxas
  never contracts into an FMA (rule 1: every product and sum rounded separately); ``exp_f32`` is
  Triton's ``tl.exp`` (the compressors' exp, §2.12). Each is one :func:`inline_ptx` block.
* bf16 rounding: the Triton kernels' integer recipe :func:`round_bf16` (fp32 in, fp32 out), or
  the hardware RNE ``cvt.rn.bf16x2.f32`` (:func:`bf16x2_rn`, two values packed); e4m3 uses the
  hardware RNE conversion. The spec allows CuTeDSL both (§2.1 rule 3), and the GPU tests compare
  them with the reference bit for bit.
* MXFP4 (§2.4): the block's scale byte and E2M1 codes on packed bf16x2 words
  (:func:`mx_scale_byte`, :func:`e2m1_pair`, :func:`mxfp4_lane`), shared by K2 and E5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def inline_ptx(ret: Any, args: Sequence[Any], body: str, cons: str, loc=None, ip=None) -> Any:
    """One side-effect-free inline PTX block: ``ret`` the MLIR result type (``T.f32()``, ``T.i32()``),
    ``args`` DSL scalars (``$1``, ``$2``, ... in ``body``; ``$0`` the result), ``cons`` the LLVM
    constraints (``"=f,f,f"``). Every hand-written instruction of the CuTeDSL kernels goes through it.
    """
    return llvm.inline_asm(ret, [a.ir_value(loc=loc, ip=ip) for a in args], body, cons,
                           has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                           loc=loc, ip=ip)


def _rn(op: str, a: Float32, b: Float32, loc=None, ip=None) -> Float32:
    return Float32(inline_ptx(T.f32(), [Float32(a), Float32(b)], f"{op}.rn.f32 $0, $1, $2;", "=f,f,f",
                              loc, ip))


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
    body = ("{ .reg .b16 lo, hi;\n"
            "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
            "mov.b32 $0, {lo, hi}; }")
    return Uint32(inline_ptx(T.i32(), [Float32(v) for v in (y0, y1, y2, y3)], body, "=r,f,f,f,f", loc, ip))


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fl(a / b)``: ``div.rn.f32``, the correctly rounded IEEE division."""
    return _rn("div", a, b, loc, ip)


@dsl_user_op
def sqrt_rn(a: Float32, *, loc=None, ip=None) -> Float32:
    """``fl(sqrt(a))``: ``sqrt.rn.f32``, the correctly rounded IEEE square root."""
    return Float32(inline_ptx(T.f32(), [Float32(a)], "sqrt.rn.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def exp_f32(x: Float32, *, loc=None, ip=None) -> Float32:
    """``exp(x)`` as Triton's ``tl.exp`` computes it on the GPU: ``ex2.approx.f32(fl(x * fl(log2 e)))``
    (the same two PTX instructions, so both backends weigh a row alike; the compressors and K7 use
    it, spec §2.12). ``x <= 0`` there (-inf: +0); ``ex2.approx`` is within 2 ulp and keeps subnormal
    results (no ``.ftz``)."""
    body = "{ .reg .f32 t;\nmul.rn.f32 t, $1, 0f3FB8AA3B;\nex2.approx.f32 $0, t; }"
    return Float32(inline_ptx(T.f32(), [Float32(x)], body, "=f,f", loc, ip))


@dsl_user_op
def bf16x2_rn(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """RNE of two fp32 to bf16, packed (``lo`` in the low half): one ``cvt.rn.bf16x2.f32``
    (spec §2.1 rule 3 allows CuTeDSL the hardware RNE conversion; overflow gives inf, as the
    integer recipe :func:`round_bf16` does)."""
    return Uint32(inline_ptx(T.i32(), [Float32(hi), Float32(lo)], "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f",
                             loc, ip))


@dsl_user_op
def bf16x2_op(op: str, a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    """``op`` (``max`` or ``mul.rn``) per half of two packed bf16x2 words (sm_90: bf16 arithmetic
    has no ``.ftz`` form; a subnormal product is rounded, not flushed)."""
    return Uint32(inline_ptx(T.i32(), [Uint32(a), Uint32(b)], f"{op}.bf16x2 $0, $1, $2;", "=r,r,r", loc, ip))


@dsl_user_op
def bf16x2_fma(a: Uint32, b: Uint32, c: Uint32, *, loc=None, ip=None) -> Uint32:
    """``fl(a * b + c)`` per bf16 half, one RNE rounding of the exact result."""
    return Uint32(inline_ptx(T.i32(), [Uint32(a), Uint32(b), Uint32(c)], "fma.rn.bf16x2 $0, $1, $2, $3;",
                       "=r,r,r,r", loc, ip))


@dsl_user_op
def prmt(a: Uint32, b: Uint32, sel: int, *, loc=None, ip=None) -> Uint32:
    """Byte permute of {b, a} (``prmt.b32``: bytes 0-3 are ``a``'s, 4-7 ``b``'s; a selector
    nibble of 8 or more replicates the chosen byte's sign bit into all 8 bits)."""
    return Uint32(inline_ptx(T.i32(), [Uint32(a), Uint32(b)], f"prmt.b32 $0, $1, $2, {sel:#x};", "=r,r,r",
                             loc, ip))


# --------------------------------------------------------------------------- MXFP4 (§2.4)
#
# The CuTeDSL MXFP4 path (indexer-Q K2 and encoder E5, hence the C4 indexer compressor K9 too)
# keeps a lane's 4 consecutive values as two bf16x2 words (element 2i in the low half of word i)
# and runs the block amax, the scaling and the E2M1 rounding two elements per instruction: every
# value it touches is a bf16 value (z is bf16; z * 2^-e is exact, or below 2^-126 where it is
# code 0 whatever its rounding). The Triton kernels cannot pack (no bf16x2 arithmetic there) and
# use fp32 recipes instead (``dsv4kit.kernels.triton_numerics.e2m1_magnitude``: an integer amax
# over the |x| bit patterns, a 4-instruction E2M1 magnitude, the signs by one umulhi). Per element
# that is 4 fp32 instructions plus an unpack; the packed form below is 3 (0.5 multiply, 2.5 code),
# and its block amax is a packed max too (bf16 maxima are exact, and non-negative bf16 order like
# their bits: the same integer-amax idea, two values per instruction). Proof of equality with the
# reference encoder on every input the kernels can give: tests/kernels/test_cute_mxfp4_recipe.py
# (a numpy emulation of these steps, line for line).

_MX_FLOOR_BITS = 0x01C00000        # 6 * 2^-126 = 1.5 * 2^-124 (exact)
_INV6_BITS = 0x3E2AAAAB            # fl(1/6)


@cute.jit
def mx_scale_byte(amax: Float32) -> Uint32:
    """The ue8m0 byte ``e + 127`` of an MXFP4 block (§2.4) with absmax ``amax`` (>= 0):
    ``e = clamp(clog2(fl(max(amax, 6 * 2^-126) * fl(1/6))), -127, 127)``.

    ``clog2(m) + 127`` is ``(bits(m) + 0x7FFFFF) >> 23`` (no -127 / +127). The lower clamp never
    binds: the floor makes ``m >= 2^-126`` (6 * fl(1/6) rounds to 1), so the byte is >= 1; the
    upper one is ``min(., 254)`` (only an infinite amax reaches it; a finite bf16 amax gives at
    most 253). Always ``amax * 2^-e <= 6`` for a bf16 ``amax`` (the test checks every one).
    """
    a = cute.arch.fmax(amax, Uint32(_MX_FLOOR_BITS).bitcast(Float32))
    m = mul_rn(a, Uint32(_INV6_BITS).bitcast(Float32))
    return cutlass.min((m.bitcast(Uint32) + Uint32(0x7FFFFF)) >> Uint32(23), Uint32(254))


@cute.jit
def e2m1_pair(av: Uint32) -> Uint32:
    """E2M1 magnitude codes plus 10 in byte 0 and byte 2 of the two bf16 |v| in ``av`` (each a
    bf16 value, 0 <= |v| <= 6; bytes 1 and 3 are not codes: never read them).

    With ``B = max(binade(|v|), 1)``, ``s = fl(|v| + 64 B)`` (one bf16 RNE: ties to the even
    code) has exponent 133 + L (B = 2^L) and 7-bit mantissa k = round(|v| / (B/2)) <= 4, and the
    code is k + 2L = (s & 0x7F) + (s >> 6) - 266, whose low byte is the code + 10 (the caller
    takes 10 off all four bytes at once). The 32-bit ``s >> 6`` drops the high half's k into
    bits 10-12 of the low half: byte 1, which is never read; each half's sum (<= 274) stays in
    its own 9 bits, so nothing carries into byte 2. |v| < 0.25 (0 and subnormals included) is
    ``s = 64``: code 0. 5 instructions per pair (LOP3, HMNMX2, HFMA2, LOP3, LEA.HI).
    """
    b = bf16x2_op("max", av & Uint32(0x7F807F80), Uint32(0x3F803F80))     # B, per half
    s = bf16x2_fma(b, Uint32(0x42804280), av)                                # fl(|v| + 64 B)
    return (s & Uint32(0x007F007F)) + (s >> Uint32(6))


@cute.jit
def mxfp4_lane(w0: Uint32, w1: Uint32, byte: Uint32) -> Uint32:
    """The 4 E2M1 codes (§2.4) of a lane's 4 consecutive bf16 values ``z`` (``w0`` = z0 | z1 << 16,
    ``w1`` = z2 | z3 << 16, bf16 bits) in a block with scale byte ``byte`` (:func:`mx_scale_byte`
    of the block's amax), packed as the output's 2 bytes: bits 0-15 = code0 | code1 << 4 |
    code2 << 8 | code3 << 12 (even element in the low nibble); bits 16-31 are not zero.

    ``2^-e`` is a bf16 in both halves (``(254 - byte) << 7``; byte 254 gives 0, like the spec's
    ``pow2(-127)``), so one ``mul.rn.bf16x2`` scales two values, exactly or, below 2^-126, to a
    code-0 value (:func:`e2m1_pair`). The signs come from ``z``'s own bits (so -0 and values
    that underflow keep theirs, as the spec's ``sign_bit(v)`` does): ``prmt`` replicates each
    value's sign over a byte, in the byte order [z0, z2, z1, z3] that the codes are permuted to,
    and one add of ``x >> 12`` moves bytes 2, 3 into nibbles 1, 3 (all nibbles disjoint: no carry).
    """
    inv2 = Uint32(0x7F007F00) - byte * Uint32(0x00800080)
    k0 = e2m1_pair(bf16x2_op("mul.rn", w0 & Uint32(0x7FFF7FFF), inv2))
    k1 = e2m1_pair(bf16x2_op("mul.rn", w1 & Uint32(0x7FFF7FFF), inv2))
    # bytes [code z0, z2, z1, z3] (each code + 10 >= 10: no borrow between bytes), each sign in bit 3
    signs = prmt(w0, w1, 0xFBD9) & Uint32(0x08080808)
    x = (prmt(k0, k1, 0x6240) - Uint32(0x0A0A0A0A)) | signs
    return x + (x >> Uint32(12))
