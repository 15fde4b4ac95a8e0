"""§2.2 RoPE: GPT-J pairs without FMA, YaRN cache construction, compressed-token positions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import (
    YarnConfig,
    build_cos_sin_cache,
    compressed_position,
    plain_inv_freq,
    rope_at_positions,
    rope_rotate,
    yarn_correction_range,
    yarn_inv_freq,
)


def rope_scalar_np(x: np.ndarray, cs: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Loop restatement of §2.2 in numpy float32: each product and sum rounded separately."""
    x = x.astype(np.float32)
    y = x.copy()
    d = x.shape[-1]
    for i in range(32):
        c = np.float32(cs[i])
        s = np.float32(-cs[32 + i] if inverse else cs[32 + i])
        xe, xo = x[d - 64 + 2 * i], x[d - 64 + 2 * i + 1]
        y[d - 64 + 2 * i] = np.float32(np.float32(xe * c) - np.float32(xo * s))
        y[d - 64 + 2 * i + 1] = np.float32(np.float32(xo * c) + np.float32(xe * s))
    return y


@pytest.mark.parametrize("d", [64, 128, 512])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_matches_scalar_restatement_bitwise(d: int, inverse: bool) -> None:
    g = torch.Generator().manual_seed(d)
    x = torch.randn((5, d), generator=g)
    cs = torch.randn((5, 64), generator=g)
    got = rope_rotate(x, cs, inverse=inverse)
    for t in range(5):
        want = rope_scalar_np(x[t].numpy(), cs[t].numpy(), inverse)
        assert np.array_equal(got[t].numpy().view(np.uint32), want.view(np.uint32))
    assert torch.equal(got[:, : d - 64], x[:, : d - 64])


def test_rope_is_not_fused() -> None:
    # With one rounding (FMA-like, exact then round) some outputs differ; ours must equal the
    # twice-rounded form everywhere and differ from the single-rounded form somewhere.
    g = torch.Generator().manual_seed(7)
    x = torch.randn((64, 64), generator=g)
    cs = torch.randn((64, 64), generator=g)
    got = rope_rotate(x, cs)
    xd, cd = x.double(), cs.double()
    ye_exact = (xd[:, 0::2] * cd[:, :32] - xd[:, 1::2] * cd[:, 32:]).float()
    assert not torch.equal(got[:, 0::2], ye_exact)


def test_rope_crafted_bf16_tie() -> None:
    # c = 1 + 3*2^-8, s = 0, x = 1: the rotated value is exactly the bf16 tie 1 + 3*2^-8.
    cs = torch.zeros(64)
    cs[:32] = 1 + 3 * 2.0**-8
    y = rope_rotate(torch.ones(64), cs)
    assert torch.all(y == 1 + 3 * 2.0**-8)


def test_rope_bf16_cache_is_upcast_exactly() -> None:
    cs = build_cos_sin_cache(16, 10_000.0, dtype=torch.bfloat16)
    x = torch.randn(16, 128)
    pos = torch.arange(16)
    assert torch.equal(rope_at_positions(x, cs, pos), rope_at_positions(x, cs.float(), pos))


def test_rope_inverse_undoes_forward_approximately() -> None:
    cs = build_cos_sin_cache(64, 160_000.0, yarn=YarnConfig())
    x = torch.randn(64, 128)
    pos = torch.arange(64)
    back = rope_at_positions(rope_at_positions(x, cs, pos), cs, pos, inverse=True)
    assert torch.allclose(back, x, atol=1e-5, rtol=1e-5)


def test_compressed_position() -> None:
    assert compressed_position(3, 4) == 0
    assert compressed_position(7, 4) == 4
    assert compressed_position(127, 128) == 0
    assert compressed_position(1_048_575, 128) == 1_048_575 - 128 + 1
    p = torch.tensor([3, 7, 11, 255], dtype=torch.int64)
    assert compressed_position(p, 4).tolist() == [0, 4, 8, 252]
    with pytest.raises(KernelInputError, match="compressed_position: ratio"):
        compressed_position(3, 0)


def test_yarn_correction_range_theta_160000() -> None:
    assert yarn_correction_range(160_000.0, YarnConfig()) == (15, 25)


def test_yarn_inv_freq_against_direct_float64() -> None:
    theta, factor = 160_000.0, 16.0
    got = yarn_inv_freq(theta, YarnConfig())
    for i in range(32):
        extrap = theta ** (-2 * i / 64)
        mask = 1.0 - min(max((i - 15) / (25 - 15), 0.0), 1.0)
        want = extrap / factor * (1 - mask) + extrap * mask
        assert got[i].item() == pytest.approx(want, rel=1e-15)
    assert got[0].item() == 1.0  # i < low: extrapolated (unchanged)
    assert got[31].item() == pytest.approx(theta ** (-62 / 64) / factor, rel=1e-15)


@pytest.mark.parametrize(("theta", "yarn"), [(160_000.0, YarnConfig()), (10_000.0, None)])
def test_cos_sin_cache_against_direct_float64(theta: float, yarn: YarnConfig | None) -> None:
    max_pos = 4096
    cache = build_cos_sin_cache(max_pos, theta, yarn=yarn)
    assert cache.shape == (max_pos, 64) and cache.dtype == torch.float32 and cache.is_contiguous()
    inv = yarn_inv_freq(theta, yarn) if yarn else plain_inv_freq(theta)
    for p in (0, 1, 17, 1000, max_pos - 1):
        for i in (0, 5, 15, 20, 25, 31):
            ang = p * inv[i].item()
            # rounded once from float64: within half an fp32 ulp (<= 2^-25 for |v| <= 1) + libm error
            assert abs(cache[p, i].item() - math.cos(ang)) <= 2.0**-25 + 1e-15
            assert abs(cache[p, 32 + i].item() - math.sin(ang)) <= 2.0**-25 + 1e-15
    assert torch.all(cache[0, :32] == 1) and torch.all(cache[0, 32:] == 0)


def test_bf16_cache_is_bf16_of_fp32_cache() -> None:
    a = build_cos_sin_cache(256, 160_000.0, yarn=YarnConfig())
    b = build_cos_sin_cache(256, 160_000.0, yarn=YarnConfig(), dtype=torch.bfloat16)
    assert b.dtype == torch.bfloat16 and torch.equal(b, a.to(torch.bfloat16))


def test_rope_bad_inputs() -> None:
    with pytest.raises(KernelInputError, match="rope_rotate: cos_sin: expected last dim 64"):
        rope_rotate(torch.zeros(2, 128), torch.zeros(2, 63))
    with pytest.raises(KernelInputError, match="rope_rotate: x: expected last dim >= 64"):
        rope_rotate(torch.zeros(2, 32), torch.zeros(2, 64))
    with pytest.raises(KernelInputError, match="rope_rotate: x: expected dtype"):
        rope_rotate(torch.zeros(2, 64, dtype=torch.int32), torch.zeros(2, 64))
    cs = build_cos_sin_cache(8, 10_000.0)
    with pytest.raises(KernelInputError, match=r"rope_at_positions: rows: expected values in \[0, 8\)"):
        rope_at_positions(torch.zeros(1, 64), cs, torch.tensor([8]))
    with pytest.raises(KernelInputError, match="rope_at_positions: rows: expected dtype int64"):
        rope_at_positions(torch.zeros(1, 64), cs, torch.tensor([1], dtype=torch.int32))
    with pytest.raises(KernelInputError, match="build_cos_sin_cache: dtype"):
        build_cos_sin_cache(8, 10_000.0, dtype=torch.float16)
    with pytest.raises(KernelInputError, match="build_cos_sin_cache: max_pos"):
        build_cos_sin_cache(0, 10_000.0)
    with pytest.raises(KernelInputError, match="plain_inv_freq: theta"):
        plain_inv_freq(-1.0)
