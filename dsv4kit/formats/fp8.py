"""UE8M0 block-scaled FP8 e4m3fn quantization ("Q8", §2.3) with the D1 amax floor.

``q8_quantize`` returns e4m3 byte codes and the per-block exponent ``e``; the scale can then be
stored as a ue8m0 byte (``e + 127``), as the fp32 value ``2**e``, or folded into weights (K1).
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.bits import E4M3_MAX, clog2, e4m3_decode, e4m3_encode, pow2
from dsv4kit.formats.checks import check_dtype

__all__ = [
    "Q8_AMAX_FLOOR",
    "Q8_MIN_EXPONENT",
    "Q8_MIN_SCALE_BYTE",
    "q8_exponent",
    "q8_quantize",
    "q8_dequantize",
    "exponent_to_ue8m0",
    "ue8m0_to_exponent",
]

Q8_AMAX_FLOOR = 1e-4  # D1: amax floored *before* dividing by 448
Q8_MIN_EXPONENT = -22  # clog2(fl(1e-4 / 448))
Q8_MIN_SCALE_BYTE = 105


def _check_blocks(name: str, arg: str, z: torch.Tensor, block: int) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise input_error(name, "block", "an int > 0", block)
    if z.dim() == 0 or z.shape[-1] % block != 0:
        raise input_error(name, arg, f"last dim a multiple of block {block}", f"shape {tuple(z.shape)}")


def q8_exponent(amax: torch.Tensor) -> torch.Tensor:
    """Block exponent ``e = clog2(fl(max(amax, fl(1e-4)) / 448))`` as int32 (§2.3, D1)."""
    check_dtype("q8_exponent", "amax", amax, torch.float32)
    floor = torch.tensor(Q8_AMAX_FLOOR, dtype=torch.float32, device=amax.device)
    a = torch.maximum(amax, floor)
    # A true fp32 division fl(a / 448): a Python-scalar divisor would let torch multiply by the
    # reciprocal instead (§2.1 says both give the same clog2 here; we keep the literal form).
    return clog2(a / torch.full_like(a, E4M3_MAX))


def q8_quantize(z: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``z [..., N]`` in blocks of ``block`` along the last dim (§2.3).

    ``z`` must be fp32 (normally bf16-valued, the caller rounds) or bf16 (upcast exactly).
    Returns ``(codes uint8 [..., N], e int32 [..., N // block])``; ``e >= -22``. Scaling by
    ``pow2(-e)`` is exact in domain; the clamp to +-448 is a no-op in domain but kept as specified.
    """
    name = "q8_quantize"
    check_dtype(name, "z", z, torch.float32, torch.bfloat16)
    _check_blocks(name, "z", z, block)
    z = z.to(torch.float32)
    blocks = z.reshape(*z.shape[:-1], z.shape[-1] // block, block)
    e = q8_exponent(blocks.abs().amax(dim=-1))
    scaled = torch.clamp(blocks * pow2(-e)[..., None], -E4M3_MAX, E4M3_MAX)
    return e4m3_encode(scaled).reshape(z.shape), e


def q8_dequantize(codes: torch.Tensor, e: torch.Tensor, block: int) -> torch.Tensor:
    """``e4m3_val(code) * 2**e`` per block, fp32 (exact while the product is a normal fp32)."""
    name = "q8_dequantize"
    check_dtype(name, "codes", codes, torch.uint8, torch.float8_e4m3fn)
    check_dtype(name, "e", e, torch.int32, torch.int64)
    _check_blocks(name, "codes", codes, block)
    nb = codes.shape[-1] // block
    if tuple(e.shape) != (*codes.shape[:-1], nb):
        raise input_error(name, "e", f"shape {(*codes.shape[:-1], nb)}", f"shape {tuple(e.shape)}")
    vals = e4m3_decode(codes).reshape(*codes.shape[:-1], nb, block)
    return (vals * pow2(e)[..., None]).reshape(codes.shape)


def exponent_to_ue8m0(e: torch.Tensor) -> torch.Tensor:
    """int exponent -> ue8m0 byte ``e + 127`` (uint8); requires ``-127 <= e <= 127``."""
    check_dtype("exponent_to_ue8m0", "e", e, torch.int32, torch.int64)
    if e.numel() and (int(e.min()) < -127 or int(e.max()) > 127):
        raise input_error(
            "exponent_to_ue8m0", "e", "exponents in [-127, 127]", f"[{int(e.min())}, {int(e.max())}]"
        )
    return (e.to(torch.int64) + 127).to(torch.uint8)


def ue8m0_to_exponent(scale_bytes: torch.Tensor) -> torch.Tensor:
    """ue8m0 byte -> int32 exponent ``byte - 127``."""
    check_dtype("ue8m0_to_exponent", "scale_bytes", scale_bytes, torch.uint8)
    return scale_bytes.to(torch.int32) - 127
