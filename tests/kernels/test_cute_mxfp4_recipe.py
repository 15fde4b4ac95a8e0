"""The CuTeDSL MXFP4 recipes of :mod:`dsv4kit.kernels.cute_numerics` (``mx_scale_byte``,
``e2m1_pair``, ``mxfp4_lane``: K2 and E5, hence K9's MXFP4 store) against the reference encoder
of :mod:`dsv4kit.formats.mxfp4`, on every input the kernels can give them. CPU only: numpy
emulates each PTX instruction of the recipes (integer ops on uint32, ``prmt.b32``, and the bf16x2
arithmetic as exact float64 values rounded once to bf16, RNE with subnormals, as sm_90 does:
bf16 ``mul`` / ``fma`` have no ``.ftz``), in the same order as the CuTeDSL code, line for line.

The GPU bytes themselves: ``dsv4kit verify --families indexer_q,store_rows_indexer`` on a GPU.
"""

from __future__ import annotations

import numpy as np
import torch

from dsv4kit.formats.bits import pow2
from dsv4kit.formats.mxfp4 import e2m1_encode, q4_exponent

U32 = np.uint32


# --------------------------------------------------------------------------- the instructions


def _val(h: np.ndarray) -> np.ndarray:
    """bf16 bits (the low 16 of ``h``) -> their exact value, float64."""
    return ((h.astype(U32) & U32(0xFFFF)) << U32(16)).view(np.float32).astype(np.float64)


def _spacing(x: np.ndarray) -> np.ndarray:
    """bf16's spacing at |x|: 8 significant bits, never below the subnormal step 2^-133."""
    _, e = np.frexp(np.abs(x))                                   # |x| = m 2^e, m in [0.5, 1)
    return np.exp2(np.maximum(e - 8, -133).astype(np.float64))


def _bits(r: np.ndarray) -> np.ndarray:
    """A bf16 value (float64) -> its 16 bits."""
    return r.astype(np.float32).view(U32) >> U32(16)


def _rne(x: np.ndarray, err: np.ndarray | None = None) -> np.ndarray:
    """bf16 bits of ``x + err`` rounded once, RNE (``x`` >= 0, and where ``err`` is given it is the
    exact remainder of a float64 sum: it only decides exact ties of ``x``)."""
    q = _spacing(x)
    r = np.rint(x / q) * q                                      # rint: ties to even
    if err is not None:
        lo = np.floor(x / q) * q
        tie = (x - lo) == q / 2
        r = np.where(tie & (err > 0), lo + q, np.where(tie & (err < 0), lo, r))
    return _bits(r)


def _halves(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return w & U32(0xFFFF), w >> U32(16)


def _join(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(U32) | (hi.astype(U32) << U32(16))).astype(U32)


def bf16x2_max(a, b):
    """``max.bf16x2`` (the operands here are never NaN)."""
    out = [np.where(_val(x) >= _val(y), x, y) for x, y in zip(_halves(a), _halves(b), strict=True)]
    return _join(*out)


def bf16x2_mul(a, b):
    """``mul.rn.bf16x2``: the exact product (a bf16 times a power of two: exact in float64), one RNE."""
    return _join(*[_rne(_val(x) * _val(y)) for x, y in zip(_halves(a), _halves(b), strict=True)])


def bf16x2_fma(a, b, c):
    """``fma.rn.bf16x2``: ``a * b + c`` exact, one RNE. Here ``a * b`` = 64 B (a power of two, exact);
    the float64 sum's remainder (Knuth's two-sum) settles the ties it may hide when ``c`` is tiny."""
    out = []
    for x, y, z in zip(_halves(a), _halves(b), _halves(c), strict=True):
        p, v = _val(x) * _val(y), _val(z)
        s = p + v
        bb = s - p
        err = (p - (s - bb)) + (v - bb)
        out.append(_rne(s, err))
    return _join(*out)


def prmt(a, b, sel: int):
    """``prmt.b32 d, a, b, sel`` (default mode): byte i of d is byte ``sel_i & 7`` of {b, a},
    or that byte's sign bit replicated when ``sel_i & 8``."""
    src = [(w >> U32(8 * i)) & U32(0xFF) for w in (a, b) for i in range(4)]
    d = np.zeros_like(a, dtype=U32)
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        byte = src[n & 7]
        if n & 8:
            byte = np.where(byte & U32(0x80), U32(0xFF), U32(0))
        d |= byte.astype(U32) << U32(8 * i)
    return d


# --------------------------------------------------------------------------- the recipes, line for line

_MX_FLOOR = np.array(0x01C00000, dtype=U32).view(np.float32)
_INV6 = np.array(0x3E2AAAAB, dtype=U32).view(np.float32)


def mx_scale_byte(amax: np.ndarray) -> np.ndarray:
    a = np.fmax(amax.astype(np.float32), _MX_FLOOR)
    m = (a * _INV6).astype(np.float32)                          # mul.rn.f32 (numpy: RNE, no flush)
    return np.minimum((m.view(U32) + U32(0x7FFFFF)) >> U32(23), U32(254))


def e2m1_pair(av):
    b = bf16x2_max(av & U32(0x7F807F80), np.full_like(av, 0x3F803F80))
    s = bf16x2_fma(b, np.full_like(av, 0x42804280), av)
    return (s & U32(0x007F007F)) + (s >> U32(6))


def mxfp4_lane(w0, w1, byte):
    inv2 = U32(0x7F007F00) - byte * U32(0x00800080)
    k0 = e2m1_pair(bf16x2_mul(w0 & U32(0x7FFF7FFF), inv2))
    k1 = e2m1_pair(bf16x2_mul(w1 & U32(0x7FFF7FFF), inv2))
    signs = prmt(w0, w1, 0xFBD9) & U32(0x08080808)
    x = (prmt(k0, k1, 0x6240) - U32(0x0A0A0A0A)) | signs
    return x + (x >> U32(12))


# --------------------------------------------------------------------------- the proofs


def _bf16_tensor(h: np.ndarray) -> torch.Tensor:
    """bf16 bits -> the fp32 tensor of their values."""
    return torch.from_numpy(((h.astype(U32) & U32(0xFFFF)) << U32(16)).view(np.float32).copy())


def test_scale_byte_on_every_bf16_amax() -> None:
    h = np.arange(0x7F80, dtype=U32)                            # every finite bf16 >= 0 (zero, subnormals)
    amax = _bf16_tensor(h)
    want = (q4_exponent(amax) + 127).numpy()
    got = mx_scale_byte(amax.numpy())
    assert (got == want).all(), h[got != want][:4]
    assert int(got.min()) == 1 and int(got.max()) == 253
    # Every value of a block lands in [0, 6] (what e2m1_pair assumes): amax * 2^-e <= 6.
    assert bool((amax * pow2(127 - torch.from_numpy(got.astype(np.int64))) <= 6).all())
    # +inf (out of the spec's domain) takes the clamp: byte 254, as the reference's 129 -> 127.
    assert int(mx_scale_byte(np.array([np.inf], dtype=np.float32))[0]) == 254


def test_mxfp4_lane_on_every_value_the_kernels_give() -> None:
    """Every (z, e) a block can hold: z any bf16 (every magnitude pattern, subnormals and zero,
    with both signs, -0 included) and every block exponent e that its scale byte 1..253 can give
    with |z| 2^-e <= 6 (test above). Each z sits in each of the lane's 4 slots, beside varying
    partners (the slots share words, so the cross-half and cross-byte steps are exercised)."""
    rng = np.random.default_rng(0)
    mags = np.arange(0x7F80, dtype=U32)
    mag_vals = _val(mags)
    checked = 0
    for byte in range(1, 254):
        e = byte - 127
        z = mags[mag_vals * 2.0**-e <= 6]
        n = len(z)
        for flip in (0, 1):
            sign = (rng.integers(0, 2, n, dtype=np.uint32) ^ U32(flip)) << U32(15)
            zs = z | sign
            el = [zs] + [zs[rng.permutation(n)] for _ in range(3)]
            w0, w1 = _join(el[0], el[1]), _join(el[2], el[3])
            got = mxfp4_lane(w0, w1, np.full(n, byte, dtype=U32)) & U32(0xFFFF)

            v = torch.stack([_bf16_tensor(x) for x in el], dim=1) * pow2(torch.tensor(-e))
            codes = e2m1_encode(v).numpy().astype(U32)          # [n, 4]: the spec's codes
            want = codes[:, 0] | (codes[:, 1] << 4) | (codes[:, 2] << 8) | (codes[:, 3] << 12)
            bad = got != want
            assert not bad.any(), (byte, el[0][bad][:4], got[bad][:4], want[bad][:4])
            checked += n
    assert checked > 8_000_000


def test_e2m1_pair_codes_at_every_threshold() -> None:
    """The ties (RNE to the even code) and the bf16 values either side of each E2M1 threshold, in
    both halves; 0 and the smallest subnormal are code 0; 6 is code 7."""
    t = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32).view(U32) >> U32(16)
    h = np.concatenate([t - 1, t, t + 1, [0, 1, 0x40C0]]).astype(U32)       # 0x40C0 = 6.0
    want = e2m1_encode(_bf16_tensor(h)).numpy().astype(U32)
    for partner in (U32(0), U32(0x40C0), U32(1)):
        k = e2m1_pair(_join(h, np.full_like(h, partner))) & U32(0xFF)
        assert ((k - U32(10)) == want).all()
        k = (e2m1_pair(_join(np.full_like(h, partner), h)) >> U32(16)) & U32(0xFF)
        assert ((k - U32(10)) == want).all()
