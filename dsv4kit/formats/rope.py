"""GPT-J interleaved RoPE on the last 64 dims, cos|sin caches (plain and YaRN), §2.2.

Rotation is done without FMA: each product is materialised as its own fp32 tensor before the
sum, so every product and sum is rounded separately (§2.1 rule 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.checks import (
    check_dtype,
    check_last_dim,
    check_ndim,
    check_positive_float,
    check_values_in_range,
)

__all__ = [
    "ROPE_DIM",
    "YarnConfig",
    "rope_rotate",
    "rope_at_positions",
    "compressed_position",
    "plain_inv_freq",
    "yarn_correction_range",
    "yarn_inv_freq",
    "build_cos_sin_cache",
]

ROPE_DIM = 64


def rope_rotate(x: torch.Tensor, cos_sin: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """Rotate the last 64 dims of ``x`` (GPT-J pairs) with per-row ``cos_sin`` rows (§2.2).

    ``x``: fp32/bf16 ``[..., D]`` with ``D >= 64``; ``cos_sin``: fp32/bf16 ``[..., 64]`` broadcastable
    to ``x``'s leading dims, laid out ``[cos_0..cos_31 | sin_0..sin_31]``. Returns fp32 ``[..., D]``;
    the leading ``D - 64`` dims pass through unchanged. ``inverse=True`` negates sin (App. A).
    """
    name = "rope_rotate"
    check_dtype(name, "x", x, torch.float32, torch.bfloat16)
    check_dtype(name, "cos_sin", cos_sin, torch.float32, torch.bfloat16)
    check_last_dim(name, "cos_sin", cos_sin, ROPE_DIM)
    if x.dim() == 0 or x.shape[-1] < ROPE_DIM:
        raise input_error(name, "x", f"last dim >= {ROPE_DIM}", f"shape {tuple(x.shape)}")
    x = x.to(torch.float32)
    cs = cos_sin.to(torch.float32)  # bf16 caches upcast exactly
    half = ROPE_DIM // 2
    c, s = cs[..., :half], cs[..., half:]
    if inverse:
        s = -s
    rope = x[..., -ROPE_DIM:]
    xe, xo = rope[..., 0::2], rope[..., 1::2]
    # Separate tensors for each product: no fused multiply-add (§2.1 rule 1, §2.2).
    ec, os_ = xe * c, xo * s
    oc, es = xo * c, xe * s
    ye = ec - os_
    yo = oc + es
    rotated = torch.stack((ye, yo), dim=-1).flatten(-2)
    return torch.cat((x[..., :-ROPE_DIM], rotated), dim=-1)


def rope_at_positions(
    x: torch.Tensor, cos_sin_cache: torch.Tensor, rows: torch.Tensor, *, inverse: bool = False
) -> torch.Tensor:
    """Rotate ``x [T, ..., D]`` with cache rows ``rows [T]`` (int64); rows are range-checked."""
    name = "rope_at_positions"
    check_dtype(name, "cos_sin_cache", cos_sin_cache, torch.float32, torch.bfloat16)
    check_ndim(name, "cos_sin_cache", cos_sin_cache, 2)
    check_last_dim(name, "cos_sin_cache", cos_sin_cache, ROPE_DIM)
    check_dtype(name, "rows", rows, torch.int64)
    check_ndim(name, "rows", rows, 1)
    if x.dim() == 0 or x.shape[0] != rows.shape[0]:
        raise input_error(name, "x", f"first dim {rows.shape[0]} (len(rows))", f"shape {tuple(x.shape)}")
    check_values_in_range(name, "rows", rows, 0, cos_sin_cache.shape[0])
    cs = cos_sin_cache[rows]
    cs = cs.reshape(cs.shape[:1] + (1,) * (x.dim() - 2) + cs.shape[1:])
    return rope_rotate(x, cs, inverse=inverse)


def compressed_position(p: torch.Tensor | int, ratio: int) -> torch.Tensor | int:
    """RoPE row of a compressed entry produced at boundary position ``p`` with ratio R (§2.2).

    ``(p // R) * R``: the first position of the entry's R-block (``p - R + 1`` at a boundary).
    """
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
        raise input_error("compressed_position", "ratio", "an int >= 1", ratio)
    if isinstance(p, torch.Tensor):
        check_dtype("compressed_position", "p", p, torch.int64, torch.int32)
        return torch.div(p, ratio, rounding_mode="floor") * ratio
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise input_error("compressed_position", "p", "an int >= 0 or an int tensor", p)
    return (p // ratio) * ratio


@dataclass(frozen=True)
class YarnConfig:
    """YaRN parameters (§1, ext): factor, original context L0, beta_fast, beta_slow."""

    factor: float = 16.0
    original_max_position_embeddings: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def plain_inv_freq(theta: float, rope_dim: int = ROPE_DIM) -> torch.Tensor:
    """``theta ** (-2i / rope_dim)`` for i < rope_dim / 2, float64 (``extrap_i`` of §2.2)."""
    theta = check_positive_float("plain_inv_freq", "theta", theta)
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim <= 0 or rope_dim % 2:
        raise input_error("plain_inv_freq", "rope_dim", "a positive even int", rope_dim)
    i = torch.arange(rope_dim // 2, dtype=torch.float64)
    return theta ** (-2.0 * i / rope_dim)


def yarn_correction_range(theta: float, yarn: YarnConfig, rope_dim: int = ROPE_DIM) -> tuple[int, int]:
    """``(low, high)`` of §2.2: ``floor(d(beta_fast))``, ``ceil(d(beta_slow))`` clamped to [0, rope_dim-1].

    ``d(beta) = rope_dim * ln(L0 / (2 pi beta)) / (2 ln theta)``. For theta = 160 000: (15, 25).
    """
    theta = check_positive_float("yarn_correction_range", "theta", theta)

    def d(beta: float) -> float:
        return (
            rope_dim
            * math.log(yarn.original_max_position_embeddings / (2 * math.pi * beta))
            / (2 * math.log(theta))
        )

    low = max(math.floor(d(yarn.beta_fast)), 0)
    high = min(math.ceil(d(yarn.beta_slow)), rope_dim - 1)
    return low, high


def yarn_inv_freq(theta: float, yarn: YarnConfig, rope_dim: int = ROPE_DIM) -> torch.Tensor:
    """YaRN-blended inverse frequencies of §2.2, float64.

    ``inv_i = interp_i (1 - mask_i) + extrap_i mask_i``, ``interp = extrap / factor``,
    ``mask_i = 1 - clamp((i - low) / (high - low), 0, 1)``. If ``low == high`` the ramp width is
    taken as 0.001 (the spec is silent; this avoids a division by zero like the model code does).
    """
    extrap = plain_inv_freq(theta, rope_dim)
    interp = extrap / yarn.factor
    low, high = yarn_correction_range(theta, yarn, rope_dim)
    width = (high - low) if high != low else 0.001
    i = torch.arange(rope_dim // 2, dtype=torch.float64)
    mask = 1.0 - torch.clamp((i - low) / width, 0.0, 1.0)
    return interp * (1.0 - mask) + extrap * mask


def build_cos_sin_cache(
    max_pos: int,
    theta: float,
    *,
    yarn: YarnConfig | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Contiguous ``[max_pos, 64]`` cache, row p = ``[cos(p f_0..f_31) | sin(p f_0..f_31)]`` (§2.2).

    ``yarn=None``: plain RoPE (sliding-window-only layers, theta 10 000); otherwise YaRN
    (compressed layers, theta 160 000). Angles and cos/sin are evaluated in float64 and rounded
    once (RNE) to fp32. A bf16 cache (on request) is the RNE bf16 cast of that fp32 cache, i.e.
    what a module-wide cast to the model dtype produces (trap 1). The magnitude multiplier is 1 for
    DSv4 and is not applied. Kernels treat the cache as data, so this choice of evaluation
    precision never affects bit-exactness (it only makes the cache accurate at large p).
    """
    name = "build_cos_sin_cache"
    if isinstance(max_pos, bool) or not isinstance(max_pos, int) or max_pos <= 0:
        raise input_error(name, "max_pos", "an int > 0", max_pos)
    if dtype not in (torch.float32, torch.bfloat16):
        raise input_error(name, "dtype", "float32 or bfloat16", dtype)
    inv = plain_inv_freq(theta) if yarn is None else yarn_inv_freq(theta, yarn)
    p = torch.arange(max_pos, dtype=torch.float64)
    ang = p[:, None] * inv[None, :]
    cache = torch.cat((torch.cos(ang), torch.sin(ang)), dim=1).to(torch.float32).to(dtype).contiguous()
    return cache if device is None else cache.to(device)
