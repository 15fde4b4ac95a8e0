"""K1 / K2 references against a scalar loop restatement of the spec (numpy float32 + torch casts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import E2M1_VALUES, build_cos_sin_cache, enc_idx_fp8, enc_idx_mxfp4, rope_rotate
from dsv4kit.kernels.indexer_q import indexer_q_fp8_reference, indexer_q_mxfp4_reference

F = np.float32
SS, HS = 128**-0.5, 64**-0.5


def smallest_pow2_exp(v: float) -> int:
    m, ex = math.frexp(v)
    return ex - 1 if m == 0.5 else ex


def rope_bf16_scalar(x: np.ndarray, cs: np.ndarray) -> np.ndarray:
    y = x.astype(F).copy()
    for i in range(32):
        c, s = F(cs[i]), F(cs[32 + i])
        xe, xo = x[64 + 2 * i], x[65 + 2 * i]
        y[64 + 2 * i] = F(F(xe * c) - F(xo * s))
        y[65 + 2 * i] = F(F(xo * c) + F(xe * s))
    y[64:] = torch.from_numpy(y[64:]).to(torch.bfloat16).float().numpy()  # torch's CPU cast is RNE
    return y


def k1_scalar(x: np.ndarray, cs: np.ndarray, w: float) -> tuple[bytes, float]:
    y = rope_bf16_scalar(x, cs)
    a = max(F(np.abs(y).max()), F(1e-4))
    e = smallest_pow2_exp(float(F(a / F(448.0))))
    scaled = torch.from_numpy((y * F(2.0**-e)).astype(F))
    codes = bytes(scaled.to(torch.float8_e4m3fn).view(torch.uint8).tolist())
    wout = F(F(F(F(w) * F(2.0**e)) * F(SS)) * F(HS))
    return codes, float(wout)


def e2m1_nearest(v: float) -> int:
    a = min(abs(v), 6.0)
    d = [abs(a - g) for g in E2M1_VALUES]
    cands = [i for i, di in enumerate(d) if di == min(d)]
    mag = cands[0] if len(cands) == 1 else next(i for i in cands if i % 2 == 0)
    return mag | (8 if math.copysign(1.0, v) < 0 else 0)


def k2_scalar(x: np.ndarray, cs: np.ndarray) -> tuple[bytes, int]:
    y = rope_bf16_scalar(x, cs)
    packed, word = [], 0
    for b in range(4):
        blk = y[32 * b : 32 * b + 32]
        a = max(F(np.abs(blk).max()), F(6 * 2.0**-126))
        e = smallest_pow2_exp(float(F(a * F(1 / 6))))
        codes = [e2m1_nearest(float(F(v * F(2.0**-e)))) for v in blk]
        packed += [codes[2 * k] | (codes[2 * k + 1] << 4) for k in range(16)]
        word |= (e + 127) << (8 * b)
    return bytes(packed), word - (2**32 if word >= 2**31 else 0)


def make_inputs(t: int, seed: int, cs_dtype: torch.dtype = torch.float32, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    cache = build_cos_sin_cache(512, 160_000.0, dtype=cs_dtype)
    pos = torch.randint(0, 512, (t,), generator=g)
    pos[0] = 511
    q = (torch.randn((t, 64, 128), generator=g) * scale).bfloat16()
    w = torch.randn((t, 64), generator=g).bfloat16()
    return pos, q, cache, w


@pytest.mark.parametrize("cs_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 2.0**-40, 2.0**30])
def test_k1_matches_scalar_loop(cs_dtype: torch.dtype, scale: float) -> None:
    pos, q, cache, w = make_inputs(3, 11, cs_dtype, scale)
    q_fp8, wout = indexer_q_fp8_reference(pos, q, cache, w)
    assert q_fp8.dtype == torch.float8_e4m3fn and q_fp8.shape == (3, 64, 128) and wout.dtype == torch.float32
    for t in range(3):
        for h in (0, 17, 63):
            codes, wv = k1_scalar(q[t, h].float().numpy(), cache[pos[t]].float().numpy(), float(w[t, h]))
            assert bytes(q_fp8[t, h].view(torch.uint8).tolist()) == codes
            assert np.float32(wout[t, h].item()).tobytes() == np.float32(wv).tobytes()


@pytest.mark.parametrize("cs_dtype", [torch.float32, torch.bfloat16])
def test_k2_matches_scalar_loop(cs_dtype: torch.dtype) -> None:
    pos, q, cache, w = make_inputs(2, 12, cs_dtype)
    packed, qscale, wout = indexer_q_mxfp4_reference(pos, q, cache, w)
    assert packed.shape == (2, 64, 64) and qscale.dtype == torch.int32
    for t in range(2):
        for h in (0, 40):
            pk, word = k2_scalar(q[t, h].float().numpy(), cache[pos[t]].float().numpy())
            assert bytes(packed[t, h].tolist()) == pk
            assert int(qscale[t, h]) == word
    want_w = (w.float() * torch.tensor(SS, dtype=torch.float32)) * torch.tensor(HS, dtype=torch.float32)
    assert torch.equal(wout, want_w)


def test_k1_k2_share_encoders_e4_e5() -> None:
    pos, q, cache, w = make_inputs(4, 13)
    y = rope_rotate(q.float(), cache[pos][:, None, :])
    codes, scale = enc_idx_fp8(y)
    q_fp8, wout = indexer_q_fp8_reference(pos, q, cache, w)
    assert torch.equal(q_fp8.view(torch.uint8), codes)
    assert torch.equal(wout, ((w.float() * scale) * torch.tensor(SS)) * torch.tensor(HS))
    packed, sb = enc_idx_mxfp4(y)
    p2, s2, _ = indexer_q_mxfp4_reference(pos, q, cache, w)
    assert torch.equal(p2, packed)
    assert torch.equal(s2.view(torch.uint8).reshape(4, 64, 4), sb)  # little-endian host


def test_k1_zero_regime() -> None:
    pos, q, cache, w = make_inputs(2, 14)
    q_fp8, wout = indexer_q_fp8_reference(pos, torch.zeros_like(q), cache, w)
    codes = q_fp8.view(torch.uint8)
    assert torch.all(codes[..., :64] == 0)
    # Rope dims follow IEEE signed-zero arithmetic (the spec's "all bytes 0" is loose here):
    # y_e = fl(0*c) - fl(0*s) is -0 iff c < 0 <= s; y_o = fl(0*c) + fl(0*s) is -0 iff c < 0 and s < 0.
    c, s_ = cache[pos][:, :32], cache[pos][:, 32:]
    neg_e = (c < 0) & ~torch.signbit(s_)
    neg_o = (c < 0) & (s_ < 0)
    assert torch.equal(codes[..., 64::2], (neg_e[:, None, :].expand(2, 64, 32) * 0x80).to(torch.uint8))
    assert torch.equal(codes[..., 65::2], (neg_o[:, None, :].expand(2, 64, 32) * 0x80).to(torch.uint8))
    want = ((w.float() * 2.0**-22) * torch.tensor(SS)) * torch.tensor(HS)
    assert torch.equal(wout, want)
    packed, qscale, _ = indexer_q_mxfp4_reference(pos, torch.zeros_like(q), cache, w)
    assert torch.all(packed[..., :32] == 0) and torch.all(qscale == 0x01010101)


def test_k1_crafted_bf16_tie_from_rope() -> None:
    # c = 1 + 3*2^-8, s = 0, x = 1: rope output is a bf16 tie -> 1 + 2^-6 before quantization.
    cache = torch.zeros(4, 64)
    cache[:, :32] = 1 + 3 * 2.0**-8
    q = torch.zeros(1, 64, 128, dtype=torch.bfloat16)
    q[..., 64:] = 1.0
    q[..., 0] = 448 * (1 + 2.0**-6)  # pins the exponent: amax 455 -> e = 1
    q_fp8, _ = indexer_q_fp8_reference(torch.tensor([2]), q, cache, torch.ones(1, 64, dtype=torch.bfloat16))
    vals = q_fp8.float()[0, 0]
    # (1 + 2^-6) / 2 = 0.5078125 -> e4m3 grid step 2^-4 at [0.5, 1) -> 0.5
    assert vals[64:].unique().tolist() == [0.5]


def test_t0_returns_empty() -> None:
    cache = build_cos_sin_cache(8, 10_000.0)
    q = torch.zeros(0, 64, 128, dtype=torch.bfloat16)
    w = torch.zeros(0, 64, dtype=torch.bfloat16)
    pos = torch.zeros(0, dtype=torch.int64)
    a, b = indexer_q_fp8_reference(pos, q, cache, w)
    assert a.shape == (0, 64, 128) and b.shape == (0, 64)
    c, d, e = indexer_q_mxfp4_reference(pos, q, cache, w)
    assert c.shape == (0, 64, 64) and d.shape == (0, 64) and e.shape == (0, 64)


@pytest.mark.parametrize("fn", [indexer_q_fp8_reference, indexer_q_mxfp4_reference])
def test_bad_inputs(fn) -> None:  # noqa: ANN001
    pos, q, cache, w = make_inputs(2, 15)
    name = "indexer_q_fp8" if fn is indexer_q_fp8_reference else "indexer_q_mxfp4"
    cases = [
        ((pos, q.float(), cache, w), "index_q: expected dtype bfloat16"),
        ((pos, q[:, :32], cache, w), "index_q: expected shape"),
        ((pos, q[..., :64], cache, w), "index_q: expected shape"),
        ((pos, q.transpose(0, 1), cache, w), "index_q: expected shape"),
        ((pos, q, cache.half(), w), "cos_sin_cache: expected dtype float32 or bfloat16"),
        ((pos, q, cache[:, :32], w), "cos_sin_cache: expected shape"),
        ((pos, q, cache.t().contiguous().t(), w), "cos_sin_cache: expected contiguous"),
        ((pos, q, cache, w.float()), "index_weights: expected dtype bfloat16"),
        ((pos, q, cache, w[:, :32]), "index_weights: expected shape"),
        ((pos.int(), q, cache, w), "positions: expected dtype int64"),
        ((pos[:1], q, cache, w), "positions: expected length 2"),
        ((torch.tensor([0, 512]), q, cache, w), r"positions: expected values in \[0, 512\)"),
        ((torch.tensor([-1, 0]), q, cache, w), r"positions: expected values in \[0, 512\)"),
    ]
    for args, msg in cases:
        with pytest.raises(KernelInputError, match=f"{name}: {msg}"):
            fn(*args)
    qq = torch.zeros(2 * 64 * 128 + 8, dtype=torch.bfloat16)[1:].as_strided((2, 64, 128), (64 * 128, 128, 1))
    with pytest.raises(KernelInputError, match=f"{name}: index_q: expected data_ptr % 16 == 0"):
        fn(pos, qq, cache, w)
