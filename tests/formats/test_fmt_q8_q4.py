"""§2.3 Q8 (UE8M0 FP8, D1 floor) and §2.4 Q4 (MXFP4): hand vectors, ties, bounds, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import (
    E2M1_VALUES,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    exponent_to_ue8m0,
    int32_to_scale_bytes,
    pack_nibbles,
    q4_dequantize,
    q4_quantize,
    q8_dequantize,
    q8_exponent,
    q8_quantize,
    scale_bytes_to_int32,
    ue8m0_to_exponent,
    unpack_nibbles,
)


def block(*vals: float, n: int = 64) -> torch.Tensor:
    z = torch.zeros(n)
    z[: len(vals)] = torch.tensor(vals)
    return z


def e4m3_half_step(v: float) -> float:
    """Half the e4m3 grid spacing at magnitude |v| (scaled domain)."""
    a = abs(v)
    if a < 2.0**-6:
        return 2.0**-10
    return 2.0 ** (math.floor(math.log2(a)) - 3) / 2


# ------------------------------------------------------------------ Q8


def test_q8_zero_block_byte_105() -> None:
    codes, e = q8_quantize(torch.zeros(2, 128), 64)
    assert torch.all(codes == 0) and torch.all(e == -22)
    assert torch.all(exponent_to_ue8m0(e) == 105)
    codes, _ = q8_quantize(torch.full((64,), -0.0), 64)
    assert torch.all(codes == 0x80)


@pytest.mark.parametrize(
    ("amax", "byte"),
    [
        (0.01, 112),  # D1 demo: floor before /448 (deployed CuTe would store 114)
        (1e-4, 105),
        (1e-5, 105),  # below the floor
        (448.0, 127),
        (450.0, 128),  # next bf16 above 448 -> exponent + 1
        (1.0, 119),
        (448 * 2.0**40, 167),
    ],
)
def test_q8_scale_bytes(amax: float, byte: int) -> None:
    _, e = q8_quantize(block(amax), 64)
    assert int(exponent_to_ue8m0(e)[0]) == byte


def test_q8_exponent_matches_spec_formula() -> None:
    amax = torch.tensor([0.0, 1e-4, 0.0273, 0.0274, 1.0, 447.9, 448.0, 449.0])
    got = q8_exponent(amax)
    for a, e in zip(amax.tolist(), got.tolist(), strict=True):
        v = np.float32(max(np.float32(a), np.float32(1e-4))) / np.float32(448.0)
        want = math.frexp(float(np.float32(v)))
        # smallest e with 2^e >= v
        m, ex = want
        assert e == (ex - 1 if m == 0.5 else ex)


@pytest.mark.parametrize("k", [-20, -3, 0, 7, 60])
def test_q8_ties_and_carry_at_scale(k: int) -> None:
    s = 2.0**k
    z = block(448 * s, 17 * s, 19 * s, 15.9 * s, -17 * s, 1.97 * s)
    codes, e = q8_quantize(z, 64)
    assert int(e[0]) == k
    got = e4m3_decode(codes[:6]).tolist()
    assert got == [448.0, 16.0, 20.0, 16.0, -16.0, 2.0]
    assert int(codes[0]) == 0x7E


def test_q8_saturation_and_subnormals() -> None:
    z = block(-448.0, 2.0**-9, 2.0**-10, 3 * 2.0**-10, -(2.0**-12))
    codes, e = q8_quantize(z, 64)
    assert int(e[0]) == 0
    assert codes[:5].tolist() == [0xFE, 0x01, 0x00, 0x02, 0x80]


def test_q8_outlier_drives_others_to_zero() -> None:
    z = block(1e4, 1e-3, -1e-3)
    codes, e = q8_quantize(z, 64)
    assert codes[1].item() == 0x00 and codes[2].item() == 0x80


def test_q8_amax_lands_in_224_448() -> None:
    g = torch.Generator().manual_seed(1)
    z = (
        torch.randn(50, 128, generator=g) * torch.exp2(torch.randint(-30, 30, (50, 1), generator=g))
    ).bfloat16()
    codes, e = q8_quantize(z.float(), 128)
    amax = z.float().abs().amax(dim=1)
    above_floor = amax > 1e-4  # below the D1 floor the block uses e = -22 and lands lower
    assert 10 < int(above_floor.sum()) < 50
    scaled = (amax * torch.exp2(-e[:, 0].float()))[above_floor]
    assert torch.all(scaled > 224) and torch.all(scaled <= 448)
    decoded = e4m3_decode(codes).abs().amax(dim=1)[above_floor]  # e4m3 grid step is 32 there
    assert torch.all(decoded >= 224) and torch.all(decoded <= 448)
    assert torch.all(e[~above_floor] == -22)


def test_ue8m0_to_exponent() -> None:
    assert ue8m0_to_exponent(torch.tensor([105, 127], dtype=torch.uint8)).tolist() == [-22, 0]


# ------------------------------------------------------------------ Q4 / E2M1


@pytest.mark.parametrize(
    ("v", "code"),
    [
        (0.0, 0),
        (-0.0, 8),
        (0.25, 0),  # tie 0 | 0.5 -> even code 0
        (0.2500001, 1),
        (0.75, 2),  # tie 0.5 | 1 -> code 2
        (0.7499999, 1),
        (1.25, 2),  # tie 1 | 1.5 -> code 2
        (1.2500001, 3),
        (1.75, 4),  # tie 1.5 | 2 -> code 4
        (1.7499999, 3),
        (2.5, 4),  # tie 2 | 3 -> code 4
        (2.5000002, 5),
        (3.5, 6),  # tie 3 | 4 -> code 6
        (3.4999998, 5),
        (5.0, 6),  # tie 4 | 6 -> code 6
        (5.0000005, 7),
        (6.0, 7),
        (7.5, 7),  # saturates
        (-1.75, 12),
        (-1e-30, 8),  # tiny negative -> -0 code
    ],
)
def test_e2m1_thresholds(v: float, code: int) -> None:
    assert int(e2m1_encode(torch.tensor([v]))[0]) == code


def nearest_e2m1_code(v: float) -> int:
    """Independent statement: nearest grid value, ties to the even code, saturating."""
    a = min(abs(v), 6.0)
    dists = [abs(a - g) for g in E2M1_VALUES]
    best = min(dists)
    cands = [i for i, d in enumerate(dists) if d == best]
    mag = cands[0] if len(cands) == 1 else next(i for i in cands if i % 2 == 0)
    return mag | (8 if math.copysign(1.0, v) < 0 else 0)


@settings(deadline=None, max_examples=300)
@given(st.floats(min_value=-8.0, max_value=8.0, width=32))
def test_e2m1_matches_nearest_ties_even(v: float) -> None:
    assert int(e2m1_encode(torch.tensor([v]))[0]) == nearest_e2m1_code(v)


@pytest.mark.parametrize("k", [-100, -10, 0, 3, 100])
def test_q4_thresholds_at_scale(k: int) -> None:
    s = 2.0**k
    ths = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    z = torch.zeros(32)
    z[0] = 6 * s  # fixes e = k
    z[1 : 1 + len(ths)] = torch.tensor(ths) * s
    codes, sb = q4_quantize(z)
    assert int(sb[0]) == 127 + k
    assert codes[: 1 + len(ths)].tolist() == [7, 0, 2, 2, 4, 4, 6, 6]


def test_q4_zero_block_and_signed_zero() -> None:
    z = torch.zeros(64)
    z[32:] = -0.0
    codes, sb = q4_quantize(z)
    assert sb.tolist() == [1, 1]
    assert codes[:32].tolist() == [0] * 32 and codes[32:].tolist() == [8] * 32


def test_q4_amax_next_bf16_above_6() -> None:
    nxt = 6.0 + 2.0**-5  # next bf16 above 6
    z = torch.zeros(32)
    z[0], z[1] = nxt, 6.0
    codes, sb = q4_quantize(z)
    assert int(sb[0]) == 128  # exponent + 1
    assert codes[:2].tolist() == [5, 5]  # 3.015625 -> 3, 3.0 -> 3




def test_packing_even_element_low_nibble() -> None:
    codes = torch.tensor([1, 2, 15, 0, 8, 7], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [0x21, 0x0F, 0x78]
    assert torch.equal(unpack_nibbles(packed), codes)
    with pytest.raises(KernelInputError, match="pack_nibbles: codes: expected an even last dim"):
        pack_nibbles(torch.zeros(5, dtype=torch.uint8))
    with pytest.raises(KernelInputError, match="pack_nibbles: codes: expected 4-bit codes"):
        pack_nibbles(torch.tensor([16, 0], dtype=torch.uint8))


def test_scale_bytes_int32_little_endian() -> None:
    b = torch.tensor([[1, 2, 3, 4], [0x7D, 0x80, 0x7B, 0x83]], dtype=torch.uint8)
    got = scale_bytes_to_int32(b)
    assert got.dtype == torch.int32
    assert got[0].item() == 0x04030201
    assert got[1].item() == 0x837B807D - 2**32
    assert torch.equal(int32_to_scale_bytes(got), b)
    assert np.array_equal(got.numpy().view(np.uint8).reshape(2, 4), b.numpy())  # host LE view agrees
    with pytest.raises(KernelInputError, match="scale_bytes_to_int32: scale_bytes: expected last dim 4"):
        scale_bytes_to_int32(torch.zeros(3, dtype=torch.uint8))


def test_e2m1_decode_signs() -> None:
    assert e2m1_decode(torch.tensor([8, 15], dtype=torch.uint8)).tolist() == [-0.0, -6.0]


# ------------------------------------------------------------------ both: round trip, bad inputs


def _q8_roundtrip(z: torch.Tensor) -> tuple[torch.Tensor, float]:
    codes, e = q8_quantize(z, 64)
    return q8_dequantize(codes, e, 64), 2.0 ** int(e[0])


def _q4_roundtrip(z: torch.Tensor) -> tuple[torch.Tensor, float]:
    codes, sb = q4_quantize(z)
    return q4_dequantize(codes, sb), 2.0 ** (int(sb[0]) - 127)


def e2m1_half_step(v: float) -> float:
    """Half the E2M1 grid spacing at magnitude |v| (scaled domain)."""
    a = abs(v)
    return (0.5 if a < 2 else (1.0 if a < 4 else 2.0)) / 2


#: format -> (block, |value| bound, |k| bound, round trip -> (decoded, scale), half step in the scaled domain)
ROUNDTRIPS = {
    "q8": (64, 1e6, 40, _q8_roundtrip, e4m3_half_step),
    "q4": (32, 1e4, 60, _q4_roundtrip, e2m1_half_step),
}


@pytest.mark.parametrize("fmt", sorted(ROUNDTRIPS))
@settings(deadline=None, max_examples=60)
@given(data=st.data())
def test_roundtrip_error_at_most_half_step(fmt: str, data: st.DataObject) -> None:
    n, bound, kmax, roundtrip, half_step = ROUNDTRIPS[fmt]
    vals = data.draw(st.lists(st.floats(min_value=-bound, max_value=bound, width=32), min_size=n, max_size=n))
    k = data.draw(st.integers(min_value=-kmax, max_value=kmax))
    z = (torch.tensor(vals) * 2.0**k).bfloat16().float()
    deq, scale = roundtrip(z)
    for zi, di in zip(z.tolist(), deq.tolist(), strict=True):
        assert abs(zi - di) <= half_step(zi / scale) * scale


BAD_INPUTS = [
    (lambda: q8_quantize(torch.zeros(100), 64), "q8_quantize: z: expected last dim a multiple of block 64"),
    (lambda: q8_quantize(torch.zeros(64, dtype=torch.float16), 64), "q8_quantize: z: expected dtype"),
    (lambda: q8_quantize(torch.zeros(64), 0), "q8_quantize: block"),
    (lambda: q8_dequantize(torch.zeros(128, dtype=torch.uint8), torch.zeros(3, dtype=torch.int32), 64),
     "q8_dequantize: e: expected shape"),
    (lambda: exponent_to_ue8m0(torch.tensor([200])), "exponent_to_ue8m0: e"),
    (lambda: q4_quantize(torch.zeros(48)), "q4_quantize: z: expected last dim a multiple of 32"),
    (lambda: q4_quantize(torch.zeros(32, dtype=torch.int64)), "q4_quantize: z: expected dtype"),
    (lambda: q4_dequantize(torch.zeros(64, dtype=torch.uint8), torch.zeros(3, dtype=torch.uint8)),
     "q4_dequantize: scale_bytes: expected shape"),
]


@pytest.mark.parametrize(("call", "match"), BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_inputs(call, match: str) -> None:
    with pytest.raises(KernelInputError, match=match):
        call()
