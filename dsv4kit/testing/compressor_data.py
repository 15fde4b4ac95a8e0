"""Seeded data of the compressor cases (C4 and C128): the spec's score and kv regimes (§2.12),
norm weights, the compressed layers' RoPE cache, request splits. Tests, notebooks and GPU scripts
build their cases from these, so a regime means the same thing for every compressor.
"""

from __future__ import annotations

import functools

import torch

from dsv4kit.formats.rope import build_cos_sin_cache

__all__ = [
    "EPS",
    "KV_REGIMES",
    "LAST_POSITION",
    "SCORE_REGIMES",
    "SENTINEL",
    "SMALL_MAX_POS",
    "TEST_TOKENS",
    "cos_sin",
    "kv_values",
    "norm_weight",
    "odd_block_stride",
    "request_regime",
    "scores",
    "split_lens",
]

SENTINEL = 0xA5
KV_REGIMES = ("normal", "zero", "tiny", "large")
SCORE_REGIMES = ("normal", "uniform", "saturating", "huge")
TEST_TOKENS = (1, 7, 32, 257, 513)
EPS = 1e-6
#: The largest position of the compressed layers' RoPE cache (§1): 1 048 575.
LAST_POSITION = 65_536 * 16 - 1
SMALL_MAX_POS = 4096


@functools.lru_cache(maxsize=2)
def cos_sin(max_pos: int) -> torch.Tensor:
    """The compressed layers' fp32 RoPE cache (θ = 160 000, no YaRN here: data, not a model)."""
    return build_cos_sin_cache(max_pos, 160_000.0, yarn=None)


def scores(shape: tuple[int, ...], regime: str, g: torch.Generator) -> torch.Tensor:
    """Scores of ``regime``: normal (3 N(0,1)), uniform (equal rows), saturating, huge (|s| = 1e4);
    on the generator's device."""
    d = g.device
    if regime == "uniform":
        return torch.full(shape, 0.5, device=d)
    if regime == "saturating":  # one row +60, the others -60 (per column: which row varies)
        s = torch.full(shape, -60.0, device=d)
        s[torch.rand(shape[:-1], generator=g, device=d) < 0.25] = 60.0
        return s
    if regime == "huge":  # |s| = 1e4
        return torch.where(torch.rand(shape, generator=g, device=d) < 0.5, -1e4, 1e4)
    return torch.randn(shape, generator=g, device=d) * 3


def kv_values(shape: tuple[int, ...], regime: str, g: torch.Generator) -> torch.Tensor:
    """kv values of ``regime``: zero, tiny (2^-60..2^-50), normal, large (up to 2^40); on the
    generator's device."""
    d = g.device
    if regime == "zero":
        return torch.zeros(shape, device=d)
    x = torch.randn(shape, generator=g, device=d)
    if regime == "tiny":  # magnitudes 2^-60 .. 2^-50
        return x * torch.exp2(-60 + 10 * torch.rand(shape, generator=g, device=d))
    if regime == "large":  # up to 2^40 (the state's domain, §2.1)
        return x * torch.exp2(30 + 9 * torch.rand(shape, generator=g, device=d))
    return x


def request_regime(kv_regime: str, r: int) -> str:
    """kv regime of request ``r``: ``tiny`` alternates tiny rows (far below the norm's eps, so
    the rows normalize to ~0: every block at the D1 floor, byte 105) with normal rows, whose tiny
    norm-weight blocks give block amax in (0, 0.0273] (the D1 demonstration)."""
    return "normal" if kv_regime == "tiny" and r % 2 else kv_regime


def norm_weight(head: int, dtype: torch.dtype, regime: str, g: torch.Generator) -> torch.Tensor:
    """RMSNorm weights near 1; ``tiny``: two blocks scaled down (the D1 demonstration)."""
    w = 1.0 + 0.1 * torch.randn(head, generator=g)
    if regime == "tiny":  # blocks of amax <= 0.0273 after the norm: the D1 demonstration
        w[64:128] *= 0.004
        w[192:256] *= 0.02
    return w.to(dtype)


def split_lens(t: int, nreq: int, g: torch.Generator) -> tuple[int, ...]:
    """``t`` tokens split into at most ``nreq`` non-empty requests at random cuts."""
    cuts = sorted(torch.randperm(max(t - 1, 1), generator=g)[: nreq - 1].add(1).tolist()) if t > nreq else []
    bounds = [0, *cuts, t]
    lens = tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False) if b > a)
    return lens or (t,)


def odd_block_stride(state_cache: torch.Tensor, extra: int = 3) -> torch.Tensor:
    """``state_cache`` ``[nsb, sbs, 2SW]`` re-laid at block stride ``stride + extra`` (the GPU
    checks' element-load path: not a multiple of 4 for extra = 1..3; the base stays 16-byte
    aligned, §2.8 allows any stride >= sbs * 2SW). The gaps hold NaN, which no read may reach."""
    nsb, _, row = state_cache.shape
    stride = state_cache.stride(0) + extra
    buf = torch.full((nsb * stride,), float("nan"))
    odd = buf.as_strided(state_cache.shape, (stride, row, 1))
    odd.copy_(state_cache)
    return odd
