"""MXFP4 ("Q4", §2.4): E2M1 codes by comparisons, 32-element blocks, ue8m0 scales, nibble packing.

E2M1 grid (code 0..7): 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign. Codes are computed with
the seven comparisons of §2.4 (RNE, ties to the even code, saturating at 6), never with a
hardware conversion, so every backend (and the interpreter) can match bit for bit.
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.bits import clog2, f32_bits, pow2, ue8m0_decode
from dsv4kit.formats.checks import check_dtype

__all__ = [
    "MXFP4_BLOCK",
    "E2M1_VALUES",
    "e2m1_encode",
    "e2m1_decode",
    "q4_exponent",
    "q4_quantize",
    "q4_dequantize",
    "pack_nibbles",
    "unpack_nibbles",
    "scale_bytes_to_int32",
    "int32_to_scale_bytes",
]

MXFP4_BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_TABLE = torch.tensor([*E2M1_VALUES, *(-v for v in E2M1_VALUES)], dtype=torch.float32)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, 0..15) of already-scaled fp32 values ``v`` (§2.4).

    ``mag = [|v|>0.25] + [|v|>=0.75] + [|v|>1.25] + [|v|>=1.75] + [|v|>2.5] + [|v|>=3.5] + [|v|>5]``:
    strict ``>`` where the tie goes down to an even code, ``>=`` where it goes up to one. The sign
    bit comes from the fp32 sign bit, so -0 and tiny negatives give code 8.
    """
    check_dtype("e2m1_encode", "v", v, torch.float32)
    a = v.abs()
    mag = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75).to(torch.uint8)
        + (a > 1.25).to(torch.uint8)
        + (a >= 1.75).to(torch.uint8)
        + (a > 2.5).to(torch.uint8)
        + (a >= 3.5).to(torch.uint8)
        + (a > 5.0).to(torch.uint8)
    )
    sign = ((f32_bits(v) >> 31).to(torch.uint8) << 3).reshape(v.shape)
    return mag | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 value of each E2M1 code (uint8, low 4 bits used); code 8 decodes to -0.0."""
    check_dtype("e2m1_decode", "codes", codes, torch.uint8)
    return _E2M1_TABLE.to(codes.device)[(codes & 0xF).to(torch.int64)]


def _check_block_multiple(name: str, arg: str, z: torch.Tensor) -> None:
    if z.dim() == 0 or z.shape[-1] % MXFP4_BLOCK != 0:
        raise input_error(name, arg, f"last dim a multiple of {MXFP4_BLOCK}", f"shape {tuple(z.shape)}")


def q4_exponent(amax: torch.Tensor) -> torch.Tensor:
    """``e = clamp(clog2(fl(max(amax, 6*2**-126) * fl(1/6))), -127, 127)`` as int32 (§2.4)."""
    check_dtype("q4_exponent", "amax", amax, torch.float32)
    a = torch.maximum(amax, torch.full_like(amax, 6.0 * 2.0**-126))
    inv6 = torch.full_like(a, 1.0 / 6.0)  # fl(1/6), an fp32 constant
    return torch.clamp(clog2(a * inv6), -127, 127)


def q4_quantize(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``z [..., N]`` (N % 32 == 0) to E2M1 codes and ue8m0 bytes (§2.4).

    Returns ``(codes uint8 [..., N] (unpacked, 0..15), scale_bytes uint8 [..., N // 32])``.
    ``z`` fp32 (normally bf16-valued) or bf16. Zero block -> byte 1, codes 0 (8 for -0).
    """
    name = "q4_quantize"
    check_dtype(name, "z", z, torch.float32, torch.bfloat16)
    _check_block_multiple(name, "z", z)
    z = z.to(torch.float32)
    blocks = z.reshape(*z.shape[:-1], z.shape[-1] // MXFP4_BLOCK, MXFP4_BLOCK)
    e = q4_exponent(blocks.abs().amax(dim=-1))
    v = blocks * pow2(-e)[..., None]  # exact, or underflows to a signed zero
    codes = e2m1_encode(v).reshape(z.shape)
    return codes, (e.to(torch.int64) + 127).to(torch.uint8)


def q4_dequantize(codes: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """``e2m1_val(code) * 2**(byte - 127)`` per 32-block, fp32 (codes unpacked, [..., N]).

    Byte 255 (the OCP NaN scale) decodes to NaN; the encoder never produces it.
    """
    name = "q4_dequantize"
    check_dtype(name, "codes", codes, torch.uint8)
    check_dtype(name, "scale_bytes", scale_bytes, torch.uint8)
    _check_block_multiple(name, "codes", codes)
    nb = codes.shape[-1] // MXFP4_BLOCK
    if tuple(scale_bytes.shape) != (*codes.shape[:-1], nb):
        raise input_error(
            name, "scale_bytes", f"shape {(*codes.shape[:-1], nb)}", f"shape {tuple(scale_bytes.shape)}"
        )
    vals = e2m1_decode(codes).reshape(*codes.shape[:-1], nb, MXFP4_BLOCK)
    return (vals * ue8m0_decode(scale_bytes)[..., None]).reshape(codes.shape)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[..., N]`` 4-bit codes -> ``[..., N // 2]`` bytes, element 2k in the LOW nibble (§2.4)."""
    name = "pack_nibbles"
    check_dtype(name, "codes", codes, torch.uint8)
    if codes.dim() == 0 or codes.shape[-1] % 2 != 0:
        raise input_error(name, "codes", "an even last dim", f"shape {tuple(codes.shape)}")
    if codes.numel() and int(codes.max()) > 15:
        raise input_error(name, "codes", "4-bit codes (0..15)", int(codes.max()))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: ``[..., M]`` bytes -> ``[..., 2M]`` codes."""
    check_dtype("unpack_nibbles", "packed", packed, torch.uint8)
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def scale_bytes_to_int32(scale_bytes: torch.Tensor) -> torch.Tensor:
    """``[..., 4]`` ue8m0 bytes -> ``[...]`` int32 read little-endian (block 0 = low byte), §2.4/K2."""
    name = "scale_bytes_to_int32"
    check_dtype(name, "scale_bytes", scale_bytes, torch.uint8)
    if scale_bytes.dim() == 0 or scale_bytes.shape[-1] != 4:
        raise input_error(name, "scale_bytes", "last dim 4", f"shape {tuple(scale_bytes.shape)}")
    b = scale_bytes.to(torch.int64)
    u = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32)


def int32_to_scale_bytes(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`scale_bytes_to_int32`: ``[...]`` int32 -> ``[..., 4]`` uint8."""
    check_dtype("int32_to_scale_bytes", "packed", packed, torch.int32)
    u = packed.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(u >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)
