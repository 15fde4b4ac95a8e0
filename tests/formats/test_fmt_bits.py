"""§2.1 primitives: clog2, pow2, bf16 RNE, e4m3 RNE encode/decode (hand vectors + torch casts)."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import (
    bf16_round,
    bf16_to_bytes,
    bits_f32,
    bytes_to_bf16,
    bytes_to_f32,
    clog2,
    e4m3_decode,
    e4m3_encode,
    e4m3_round,
    e4m3_table,
    f32_bits,
    f32_to_bytes,
    pow2,
    ue8m0_decode,
)


def f32(*vals: float) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.float32)


def fp32_bits_py(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


# ------------------------------------------------------------------ clog2 / pow2


@pytest.mark.parametrize(
    ("v", "e"),
    [
        (1.0, 0),
        (1.0000001, 1),  # any mantissa bit carries
        (0.75, 0),
        (0.5, -1),
        (3.0, 2),
        (4.0, 2),
        (448.0, 9),
        (2.0**-126, -126),
        (2.0**127, 127),
        (1.9999999 * 2.0**126, 127),
    ],
)
def test_clog2_hand_vectors(v: float, e: int) -> None:
    assert int(clog2(f32(v))[0]) == e


def test_clog2_of_d1_floor_is_minus_22() -> None:
    # §0 D1: fl(fl(1e-4) / 448) -> e = -22 -> ue8m0 byte 105.
    v = torch.tensor(1e-4, dtype=torch.float32) / torch.tensor(448.0)
    assert int(clog2(v.reshape(1))[0]) == -22


@settings(deadline=None, max_examples=200)
@given(st.floats(min_value=2.0**-126, max_value=2.0**127, width=32))
def test_clog2_is_smallest_power_of_two_at_least_v(v: float) -> None:
    e = int(clog2(f32(v))[0])
    assert 2.0**e >= v and 2.0 ** (e - 1) < v


def test_pow2_bits_and_range() -> None:
    e = torch.arange(-126, 128, dtype=torch.int32)
    got = pow2(e)
    assert all(got[i].item() == 2.0 ** int(e[i]) for i in range(e.numel()))
    assert int(f32_bits(pow2(torch.tensor([0], dtype=torch.int32)))[0]) == 0x3F800000
    with pytest.raises(KernelInputError, match="pow2: e: expected"):
        pow2(torch.tensor([-127], dtype=torch.int32))
    with pytest.raises(KernelInputError, match="pow2: e: expected dtype"):
        pow2(torch.tensor([1.0]))


def test_bits_roundtrip() -> None:
    x = f32(0.0, -0.0, 1.0, -2.5, 3.4e38, 1e-40)
    assert torch.equal(bits_f32(f32_bits(x)).view(torch.int32), x.view(torch.int32))
    assert int(f32_bits(f32(-0.0))[0]) == 0x80000000


# ------------------------------------------------------------------ bf16


@pytest.mark.parametrize(
    ("x", "want"),
    [
        (1 + 3 * 2.0**-8, 1 + 2.0**-6),  # tie, odd below -> up to even
        (1 + 2.0**-8, 1.0),  # tie, even below -> stays
        (1 + 2.0**-8 + 2.0**-20, 1 + 2.0**-7),  # above the tie
        (-(1 + 3 * 2.0**-8), -(1 + 2.0**-6)),
        (-0.0, -0.0),
        ((2 - 2.0**-7) * 2.0**127, (2 - 2.0**-7) * 2.0**127),  # bf16 max stays
        (3.4028235e38, math.inf),  # fp32 max rounds up to inf
    ],
)
def test_bf16_round_hand_vectors(x: float, want: float) -> None:
    got = bf16_round(f32(x))
    assert got.item() == want
    assert math.copysign(1.0, got.item()) == math.copysign(1.0, want)


def test_bf16_round_matches_torch_cast_on_random_and_tie_values() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=g) * torch.exp2(
        torch.randint(-60, 60, (200_000,), generator=g).float()
    )
    ties = bits_f32((torch.randint(0, 2**31, (50_000,), generator=g) & ~0xFFFF) | 0x8000)
    ties = ties[torch.isfinite(ties)]
    for v in (x, ties):
        assert torch.equal(f32_bits(bf16_round(v)), f32_bits(v.to(torch.bfloat16).float()))


@settings(deadline=None, max_examples=200)
@given(st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_bf16_round_property(v: float) -> None:
    x = f32(v)
    assert int(f32_bits(bf16_round(x))[0]) == int(f32_bits(x.to(torch.bfloat16).float())[0])


def test_bf16_bytes_little_endian() -> None:
    x = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)  # 0x3F80, 0xC000
    assert bf16_to_bytes(x).tolist() == [0x80, 0x3F, 0x00, 0xC0]
    assert torch.equal(bytes_to_bf16(bf16_to_bytes(x)).view(torch.int16), x.view(torch.int16))
    assert f32_to_bytes(f32(1.0)).tolist() == [0, 0, 0x80, 0x3F]
    assert bytes_to_f32(torch.tensor([0, 0, 0x80, 0x3F], dtype=torch.uint8)).item() == 1.0
    with pytest.raises(KernelInputError, match="bytes_to_f32: b: expected last dim a multiple of 4"):
        bytes_to_f32(torch.zeros(3, dtype=torch.uint8))


# ------------------------------------------------------------------ e4m3


@pytest.mark.parametrize(
    ("y", "byte"),
    [
        (0.0, 0x00),
        (-0.0, 0x80),
        (1.0, 0x38),
        (1.97, 0x40),  # carry: 1.97 -> 2.0
        (15.9, 0x58),  # carry into the exponent: 15.9 -> 16
        (17.0, 0x58),  # tie 17 -> 16 (even mantissa)
        (19.0, 0x5A),  # tie 19 -> 20 (even mantissa)
        (448.0, 0x7E),
        (-448.0, 0xFE),
        (2.0**-6, 0x08),  # smallest normal
        (2.0**-9, 0x01),  # smallest subnormal
        (7 * 2.0**-9, 0x07),
        (2.0**-10, 0x00),  # tie between 0 and 2^-9 -> 0 (even)
        (3 * 2.0**-10, 0x02),  # tie 1.5 -> 2 (even)
        (7.5 * 2.0**-9, 0x08),  # subnormal rounding carries into the normal range
        (-(2.0**-11), 0x80),  # small negative -> -0
        (2.0**-60, 0x00),
    ],
)
def test_e4m3_hand_vectors(y: float, byte: int) -> None:
    assert int(e4m3_encode(f32(y))[0]) == byte


@pytest.mark.parametrize("k", [-9, -3, 0, 4])
def test_e4m3_ties_and_carries_scale_invariant(k: int) -> None:
    # Scaled versions of 17 -> 16, 19 -> 20, 15.9 -> 16 (all stay in the normal range here).
    s = 2.0**k
    got = e4m3_decode(e4m3_encode(f32(17 * s, 19 * s, 15.9 * s, -17 * s)))
    assert got.tolist() == [16 * s, 20 * s, 16 * s, -16 * s]


def test_e4m3_encode_matches_torch_cast_on_all_bf16_values() -> None:
    u = torch.arange(0, 2**16, dtype=torch.int64) << 16
    x = bits_f32(u)
    x = x[torch.isfinite(x) & (x.abs() <= 448)]
    assert torch.equal(e4m3_encode(x), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3_encode_matches_torch_cast_on_fp32_midpoints() -> None:
    # Exact midpoints between neighbouring e4m3 values, and one fp32 ulp either side.
    vals = e4m3_table()
    vals = vals[torch.isfinite(vals) & (vals >= 0)].unique().double()
    mids = ((vals[1:] + vals[:-1]) / 2).float()
    cand = torch.cat((mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)))
    cand = torch.cat((cand, -cand))
    assert torch.equal(e4m3_encode(cand), cand.to(torch.float8_e4m3fn).view(torch.uint8))


@settings(deadline=None, max_examples=300)
@given(st.floats(min_value=-448.0, max_value=448.0, width=32))
def test_e4m3_property_matches_torch(v: float) -> None:
    x = f32(v)
    assert int(e4m3_encode(x)[0]) == int(x.to(torch.float8_e4m3fn).view(torch.uint8)[0])


def test_e4m3_table_and_roundtrip() -> None:
    t = e4m3_table()
    assert t[0x7E].item() == 448.0 and t[0xFE].item() == -448.0
    assert math.isnan(t[0x7F].item()) and math.isnan(t[0xFF].item())
    assert t[0x01].item() == 2.0**-9 and t[0x08].item() == 2.0**-6
    codes = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    assert torch.equal(e4m3_encode(e4m3_decode(codes)), codes)
    fp8 = codes.view(torch.float8_e4m3fn)
    assert torch.equal(e4m3_decode(fp8), fp8.float())
    assert torch.equal(e4m3_round(e4m3_decode(codes)), e4m3_decode(codes))


def test_e4m3_rejects_unclamped_and_bad_dtype() -> None:
    with pytest.raises(KernelInputError, match=r"e4m3_round: y: expected \|y\| <= 448"):
        e4m3_encode(f32(449.0))
    with pytest.raises(KernelInputError, match="e4m3_round: y: expected dtype float32, got bfloat16"):
        e4m3_encode(torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(KernelInputError, match="e4m3_decode: codes: expected dtype"):
        e4m3_decode(torch.zeros(2, dtype=torch.int32))


def test_ue8m0_decode() -> None:
    b = torch.tensor([105, 127, 128, 254, 0, 255], dtype=torch.uint8)
    got = ue8m0_decode(b)
    assert got[:4].tolist() == [2.0**-22, 1.0, 2.0, 2.0**127]
    assert got[4].item() == 2.0**-127 and math.isnan(got[5].item())
    with pytest.raises(KernelInputError, match="ue8m0_decode: scale_bytes"):
        ue8m0_decode(torch.zeros(1, dtype=torch.int8))
