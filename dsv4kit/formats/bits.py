"""Bit-level numeric primitives of §2.1: fp32 bits, clog2, pow2, bf16 RNE, e4m3fn encode/decode.

Everything here is computed with integer operations on the fp32 bit pattern, following the
interpreter-safe recipes of §2.1, so that the reference never depends on a library's cast or
``log2``. Tests pin each primitive against hand-computed vectors and against torch's own
(RNE) CPU casts.
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.checks import check_dtype

__all__ = [
    "E4M3_MAX",
    "f32_bits",
    "bits_f32",
    "clog2",
    "pow2",
    "bf16_round",
    "e4m3_round",
    "e4m3_encode",
    "e4m3_decode",
    "e4m3_table",
    "ue8m0_decode",
    "bf16_to_bytes",
    "bytes_to_bf16",
    "f32_to_bytes",
    "bytes_to_f32",
]

E4M3_MAX = 448.0
_MASK32 = 0xFFFFFFFF


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 tensor -> its bit patterns as non-negative int64 (unsigned 32-bit values)."""
    check_dtype("f32_bits", "x", x, torch.float32)
    return x.contiguous().view(torch.int32).to(torch.int64) & _MASK32


def bits_f32(u: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit patterns (any integer dtype) -> fp32 tensor with those bits."""
    check_dtype("bits_f32", "u", u, torch.int64, torch.int32)
    u = u.to(torch.int64) & _MASK32
    # Wrap into int32 range explicitly instead of relying on an overflowing cast.
    signed = torch.where(u >= 2**31, u - 2**32, u).to(torch.int32)
    return signed.view(torch.float32)


def clog2(v: torch.Tensor) -> torch.Tensor:
    """Smallest integer e with 2**e >= v, for positive normal fp32 v (§2.1), as int32.

    ``e = ((bits(v) + 0x7FFFFF) >> 23) - 127``: any non-zero mantissa carries into the exponent.
    Never computed with ``log2``.
    """
    check_dtype("clog2", "v", v, torch.float32)
    return (((f32_bits(v) + 0x7FFFFF) >> 23) - 127).to(torch.int32)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**e`` built from bits ``(e + 127) << 23``; requires ``-126 <= e <= 127`` (§2.1)."""
    check_dtype("pow2", "e", e, torch.int32, torch.int64)
    if e.numel() and (int(e.min()) < -126 or int(e.max()) > 127):
        raise input_error("pow2", "e", "exponents in [-126, 127]", f"range [{int(e.min())}, {int(e.max())}]")
    return bits_f32((e.to(torch.int64) + 127) << 23)


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """``bf16(x)`` of the spec: RNE to bfloat16, returned as the exact fp32 value.

    §2.1 recipe: ``u += 0x7FFF + ((u >> 16) & 1); u &= 0xFFFF0000`` (finite x; overflow -> inf).
    Accepts fp32 or bf16 (a bf16 input is returned upcast, unchanged).
    """
    check_dtype("bf16_round", "x", x, torch.float32, torch.bfloat16)
    if x.dtype == torch.bfloat16:
        return x.to(torch.float32)
    u = f32_bits(x)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return bits_f32(u).reshape(x.shape)


def e4m3_round(y: torch.Tensor) -> torch.Tensor:
    """``e4m3(y)`` as an exact fp32 value: RNE to float8_e4m3fn, sign of zero kept (§2.1).

    Requires ``|y| <= 448`` (callers clamp); never produces NaN. Normal range (|y| >= 2**-6):
    round the fp32 mantissa to 3 bits with an integer add, so a carry (15.9 -> 16) moves into the
    exponent. Subnormal range: ``k = RNE(|y| * 512)``, magnitude ``k / 512`` (both steps exact).
    """
    check_dtype("e4m3_round", "y", y, torch.float32)
    if y.numel() and bool((y.abs() > E4M3_MAX).any()):
        raise input_error("e4m3_round", "y", "|y| <= 448 (clamp first)", f"max |y| {float(y.abs().max())}")
    mag = y.abs()
    m = f32_bits(mag)
    m = (m + 0x7FFFF + ((m >> 20) & 1)) & 0xFFF00000
    normal = bits_f32(m).reshape(y.shape)
    t = mag * 512.0  # exact: |y| < 2**-6 so t < 8
    i = torch.floor(t)
    f = t - i  # exact
    odd = torch.remainder(i, 2.0) == 1.0
    k = torch.where((f > 0.5) | ((f == 0.5) & odd), i + 1.0, i)
    sub = k / 512.0  # exact
    out = torch.where(mag >= 2.0**-6, normal, sub)
    return torch.copysign(out, y)


def e4m3_encode(y: torch.Tensor) -> torch.Tensor:
    """``e4m3(y)`` as float8_e4m3fn byte codes (uint8). Same preconditions as :func:`e4m3_round`.

    The byte is assembled from the rounded value's bits (no float8 cast involved):
    normals ``((E - 120) << 3) | top-3 mantissa bits``, subnormals ``k`` (k = value * 512),
    sign ``0x80`` (so -0 -> 0x80).
    """
    r = e4m3_round(y)
    u = f32_bits(r.abs())
    exp_f = (u >> 23) & 0xFF
    normal_code = ((exp_f - 120) << 3) | ((u >> 20) & 0x7)
    sub_code = (r.abs() * 512.0).to(torch.int64)
    code = torch.where(r.abs() >= 2.0**-6, normal_code, sub_code)
    sign = (f32_bits(r) >> 31) << 7
    return (code | sign).to(torch.uint8).reshape(y.shape)


def _build_e4m3_table() -> torch.Tensor:
    vals = []
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        ef, mf = (b >> 3) & 0xF, b & 0x7
        if ef == 0xF and mf == 0x7:
            vals.append(float("nan"))
        elif ef == 0:
            vals.append(s * mf * 2.0**-9)
        else:
            vals.append(s * (1.0 + mf / 8.0) * 2.0 ** (ef - 7))
    return torch.tensor(vals, dtype=torch.float32)


_E4M3_TABLE = _build_e4m3_table()


def e4m3_table() -> torch.Tensor:
    """The 256-entry exact decode table of float8_e4m3fn (NaN at 0x7F and 0xFF), fp32."""
    return _E4M3_TABLE.clone()


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """``e4m3_val(byte)``: exact fp32 value of each uint8 (or float8_e4m3fn) code."""
    check_dtype("e4m3_decode", "codes", codes, torch.uint8, torch.float8_e4m3fn)
    if codes.dtype == torch.float8_e4m3fn:
        codes = codes.view(torch.uint8)
    return _E4M3_TABLE.to(codes.device)[codes.to(torch.int64)]


def _build_ue8m0_table() -> torch.Tensor:
    vals = [2.0 ** (b - 127) for b in range(255)] + [float("nan")]
    return torch.tensor(vals, dtype=torch.float32)  # byte 0 -> 2**-127 (an fp32 subnormal, exact)


_UE8M0_TABLE = _build_ue8m0_table()


def ue8m0_decode(scale_bytes: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**(byte - 127)`` for each ue8m0 byte; 255 (the OCP NaN code) -> NaN."""
    check_dtype("ue8m0_decode", "scale_bytes", scale_bytes, torch.uint8)
    return _UE8M0_TABLE.to(scale_bytes.device)[scale_bytes.to(torch.int64)]


def _le_bytes(u: torch.Tensor, nbytes: int) -> torch.Tensor:
    return torch.stack([(u >> (8 * i)) & 0xFF for i in range(nbytes)], dim=-1).flatten(-2).to(torch.uint8)


def _from_le_bytes(name: str, b: torch.Tensor, nbytes: int) -> torch.Tensor:
    check_dtype(name, "b", b, torch.uint8)
    if b.dim() == 0 or b.shape[-1] % nbytes != 0:
        raise input_error(name, "b", f"last dim a multiple of {nbytes}", f"shape {tuple(b.shape)}")
    g = b.to(torch.int64).reshape(*b.shape[:-1], b.shape[-1] // nbytes, nbytes)
    return sum(g[..., i] << (8 * i) for i in range(nbytes))


def bf16_to_bytes(x: torch.Tensor) -> torch.Tensor:
    """bf16 ``[..., n]`` -> uint8 ``[..., 2n]``, each value little-endian (independent of host order)."""
    check_dtype("bf16_to_bytes", "x", x, torch.bfloat16)
    u = x.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    return _le_bytes(u, 2)


def bytes_to_bf16(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 2n]`` (little-endian) -> bf16 ``[..., n]``; a pure bit copy."""
    u = _from_le_bytes("bytes_to_bf16", b, 2)
    return torch.where(u >= 2**15, u - 2**16, u).to(torch.int16).view(torch.bfloat16)


def f32_to_bytes(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``[..., n]`` -> uint8 ``[..., 4n]``, little-endian."""
    return _le_bytes(f32_bits(x).reshape(x.shape), 4)


def bytes_to_f32(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4n]`` (little-endian) -> fp32 ``[..., n]``; a pure bit copy."""
    u = _from_le_bytes("bytes_to_f32", b, 4)
    return bits_f32(u).reshape(u.shape)
