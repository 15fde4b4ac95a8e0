"""Cache layouts: fp8_ds_mla (§2.5, E1), plain rows (§2.6, E2/E3), indexer K cache (§2.7, E4/E5)."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import (
    allocate_ds_cache,
    allocate_indexer_cache,
    allocate_plain_cache,
    bf16_to_bytes,
    bytes_to_f32,
    decode_ds_rows,
    decode_indexer_rows,
    ds_min_page_stride,
    e4m3_decode,
    enc_ds,
    enc_idx_fp8,
    enc_idx_mxfp4,
    enc_row_bf16,
    enc_row_fp8,
    f32_to_bytes,
    pack_nibbles,
    q4_quantize,
    q8_quantize,
    read_ds_entries,
    read_plain_rows,
    store_rows_ds,
    store_rows_indexer,
    store_rows_plain,
)

SENTINEL = 0xA5


def flat(cache: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The raw bytes of a cache's backing buffer (first ``nbytes``)."""
    return cache.view(torch.uint8).as_strided((nbytes,), (1,))


# ------------------------------------------------------------------ fp8_ds_mla


@pytest.mark.parametrize(("bs", "stride"), [(1, 1152), (2, 1728), (64, 37440), (256, 149760)])
def test_ds_min_page_stride(bs: int, stride: int) -> None:
    assert ds_min_page_stride(bs) == stride


@pytest.mark.parametrize(("bs", "stride"), [(3, None), (2, 2304), (64, 39168)])
def test_ds_byte_positions(bs: int, stride: int | None) -> None:
    num_pages = 3
    cache = allocate_ds_cache(num_pages, bs, page_stride=stride, fill=SENTINEL)
    p = cache.stride(0)
    g = torch.Generator().manual_seed(bs)
    rows = torch.randn((2, 512), generator=g) * 3
    slots = torch.tensor(
        [bs + 1 if bs > 1 else 1, 2 * bs], dtype=torch.int64
    )  # page 1 entry 1; page 2 entry 0
    store_rows_ds(rows, cache, slots)
    raw = flat(cache, num_pages * p)
    written = torch.zeros(num_pages * p, dtype=torch.bool)
    for r, s in enumerate(slots.tolist()):
        page, t = s // bs, s % bs
        base = page * p
        codes, e = q8_quantize(rows[r, :448].bfloat16().float(), 64)
        rope = bf16_to_bytes(rows[r, 448:].to(torch.bfloat16))
        assert torch.equal(raw[base + t * 576 : base + t * 576 + 448], codes)
        assert torch.equal(raw[base + t * 576 + 448 : base + t * 576 + 576], rope)
        sc = base + bs * 576 + t * 8
        assert torch.equal(raw[sc : sc + 7], (e + 127).to(torch.uint8))
        assert int(raw[sc + 7]) == 0  # pad byte
        written[base + t * 576 : base + t * 576 + 576] = True
        written[sc : sc + 8] = True
    assert torch.all(raw[~written] == SENTINEL)  # nothing else touched


def test_ds_roundtrip_rope_exact_and_nope_within_half_step() -> None:
    g = torch.Generator().manual_seed(3)
    rows = torch.randn((16, 512), generator=g) * torch.exp2(
        torch.randint(-20, 20, (16, 1), generator=g).float()
    )
    cache = allocate_ds_cache(2, 8)
    store_rows_ds(rows, cache, torch.arange(16))
    dec = decode_ds_rows(cache, torch.arange(16))
    assert torch.equal(dec[:, 448:], rows[:, 448:].bfloat16().float())  # rope dims exact
    entry, pad = read_ds_entries(cache, torch.arange(16))
    assert torch.all(pad == 0)
    z = rows[:, :448].bfloat16().float().reshape(16, 7, 64)
    scale = torch.exp2(entry.scales.float() - 127)[..., None]
    v = (z / scale).abs()
    half = torch.where(v < 2.0**-6, torch.full_like(v, 2.0**-10), torch.exp2(torch.floor(torch.log2(v)) - 4))
    assert torch.all((dec[:, :448].reshape(16, 7, 64) - z).abs() <= half * scale)


def test_ds_zero_rows_and_bf16_input() -> None:
    e = enc_ds(torch.zeros(2, 512))
    assert torch.all(e.nope == 0) and torch.all(e.scales == 105)
    neg = enc_ds(torch.full((1, 512), -0.0))
    assert torch.all(neg.nope == 0x80)
    y = torch.randn(3, 512).bfloat16()
    a, b = enc_ds(y), enc_ds(y.float())  # sliding-window insert: bf16 rows
    assert all(torch.equal(x, w) for x, w in zip(a, b, strict=True))


def test_ds_skips_negative_slots_and_t0() -> None:
    cache = allocate_ds_cache(1, 2, fill=SENTINEL)
    store_rows_ds(torch.randn(2, 512), cache, torch.tensor([-1, -5]))
    store_rows_ds(torch.zeros(0, 512), cache, torch.zeros(0, dtype=torch.int64))
    assert torch.all(flat(cache, 1728) == SENTINEL)


def test_ds_bad_inputs() -> None:
    c = allocate_ds_cache(2, 2)
    rows = torch.zeros(1, 512)
    s = torch.tensor([0])
    cases = [
        (lambda: store_rows_ds(rows.bfloat16(), c, s), "store_rows_ds: rows: expected dtype float32"),
        (lambda: store_rows_ds(torch.zeros(1, 511), c, s), "store_rows_ds: rows: expected shape"),
        (lambda: store_rows_ds(rows, c, s.int()), "store_rows_ds: kv_slot_mapping: expected dtype int64"),
        (
            lambda: store_rows_ds(rows, c, torch.tensor([0, 1])),
            "store_rows_ds: kv_slot_mapping: expected length 1",
        ),
        (lambda: store_rows_ds(rows, c, torch.tensor([4])), r"kv_slot_mapping: expected values in \[0, 4\)"),
        (
            lambda: store_rows_ds(torch.zeros(2, 512), c, torch.tensor([1, 1])),
            "kv_slot_mapping: expected unique",
        ),
        (lambda: store_rows_ds(rows, c.view(torch.int8), s), "store_rows_ds: k_cache: expected dtype uint8"),
        (
            lambda: store_rows_ds(rows, torch.zeros(2, 2, 576, dtype=torch.uint8), s),
            "k_cache: expected shape",
        ),
        (lambda: store_rows_ds(rows, c[:, :, :584].transpose(0, 1), s), "k_cache: expected"),
        (
            lambda: store_rows_ds(rows, torch.zeros(2, 2, 584, dtype=torch.uint8), s),
            "k_cache: expected page stride",
        ),
        (lambda: allocate_ds_cache(2, 2, page_stride=1700), "allocate_ds_cache: page_stride"),
        (lambda: allocate_ds_cache(2, 2, page_stride=1152), "allocate_ds_cache: page_stride"),
        (lambda: enc_ds(torch.zeros(3, 448)), "enc_ds: y: expected last dim 512"),
    ]
    for fn, msg in cases:
        with pytest.raises(KernelInputError, match=msg):
            fn()
    buf = torch.zeros(1728 * 2 + 64, dtype=torch.uint8)
    misaligned = buf[1:].as_strided((2, 2, 584), (1728, 584, 1))
    with pytest.raises(KernelInputError, match="store_rows_ds: k_cache: expected data_ptr % 32 == 0"):
        store_rows_ds(rows, misaligned, s)


# ------------------------------------------------------------------ plain rows (E2 / E3)


def test_e2_is_rne_bf16() -> None:
    y = torch.randn(4, 512)
    assert torch.equal(enc_row_bf16(y), y.to(torch.bfloat16))


@pytest.mark.parametrize("s", [1.0, 2.0**-4, 0.37])
def test_e3_hand_restatement(s: float) -> None:
    g = torch.Generator().manual_seed(5)
    y = torch.randn(3, 512, generator=g) * 100
    y[0, 0], y[0, 1] = 448.0 * s * 1.5, -1e6  # saturating after the scale -> +-448
    inv = torch.tensor(1.0) / torch.tensor(s, dtype=torch.float32)
    want = torch.clamp(y.bfloat16().float() * inv, -448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    got = enc_row_fp8(y, torch.tensor([s]))
    assert torch.equal(got, want)
    assert got[0, 0].item() == 0x7E and got[0, 1].item() == 0xFE


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_plain_store_addresses_and_untouched(dtype: torch.dtype) -> None:
    bs, pages, stride = 4, 3, 4 * 512 + 32
    cache = allocate_plain_cache(pages, bs, dtype, page_stride=stride, fill_byte=SENTINEL)
    scale = torch.tensor([0.37]) if dtype == torch.float8_e4m3fn else None
    rows = torch.randn(3, 512)
    slots = torch.tensor([5, -1, 11])
    store_rows_plain(rows, cache, slots, scale)
    esize = cache.element_size()
    raw = flat(cache, pages * stride * esize)
    written = torch.zeros_like(raw, dtype=torch.bool)
    for r, slot in ((0, 5), (2, 11)):
        off = ((slot // bs) * stride + (slot % bs) * 512) * esize
        want = enc_row_bf16(rows[r]).view(torch.uint8) if scale is None else enc_row_fp8(rows[r], scale)
        assert torch.equal(raw[off : off + 512 * esize], want)
        written[off : off + 512 * esize] = True
    assert torch.all(raw[~written] == SENTINEL)
    dec = read_plain_rows(cache, torch.tensor([5, 11]), scale)
    if scale is None:
        assert torch.equal(dec, rows[[0, 2]].bfloat16().float())
    else:
        assert torch.equal(dec, e4m3_decode(enc_row_fp8(rows[[0, 2]], scale)) * 0.37)


def test_plain_bad_inputs() -> None:
    bf = allocate_plain_cache(2, 2, torch.bfloat16)
    f8 = allocate_plain_cache(2, 2, torch.float8_e4m3fn)
    rows, s = torch.zeros(1, 512), torch.tensor([0])
    e5 = torch.zeros(2, 2, 512, dtype=torch.float8_e5m2)
    cases = [
        (
            lambda: store_rows_plain(rows, f8, s),
            "store_rows_plain: fp8_scale: expected a \\[1\\] fp32 tensor",
        ),
        (
            lambda: store_rows_plain(rows, bf, s, torch.tensor([1.0])),
            "store_rows_plain: fp8_scale: expected None",
        ),
        (
            lambda: store_rows_plain(rows, f8, s, torch.tensor([1.0]).double()),
            "fp8_scale: expected dtype float32",
        ),
        (lambda: store_rows_plain(rows, f8, s, torch.tensor([1.0, 2.0])), "fp8_scale: expected shape"),
        (
            lambda: store_rows_plain(rows, f8, s, torch.tensor([0.0])),
            "fp8_scale: expected a finite value > 0",
        ),
        (
            lambda: store_rows_plain(rows, e5, s),
            "store_rows_plain: cache: expected dtype bfloat16 or float8_e4m3fn",
        ),
        (lambda: store_rows_plain(rows, bf[:, :, :256], s), "store_rows_plain: cache: expected shape"),
        (lambda: store_rows_plain(torch.zeros(1, 128), bf, s), "store_rows_plain: rows: expected shape"),
        (lambda: enc_row_fp8(rows, math.inf), "enc_row_fp8: scale: expected a finite value > 0"),
        (lambda: enc_row_bf16(torch.zeros(2, 100)), "enc_row_bf16: y: expected last dim 512"),
    ]
    for fn, msg in cases:
        with pytest.raises(KernelInputError, match=msg):
            fn()


# ------------------------------------------------------------------ indexer K cache (E4 / E5)


def test_e4_e5_are_q8_q4_of_bf16() -> None:
    y = torch.randn(6, 128) * 7
    codes, scale = enc_idx_fp8(y)
    c2, e2 = q8_quantize(y.bfloat16().float(), 128)
    assert torch.equal(codes, c2) and torch.equal(scale, torch.exp2(e2[:, 0].float()))
    packed, sb = enc_idx_mxfp4(y)
    c4, sb4 = q4_quantize(y.bfloat16().float())
    assert torch.equal(packed, pack_nibbles(c4)) and torch.equal(sb, sb4)
    zc, zs = enc_idx_fp8(torch.zeros(1, 128))
    assert torch.all(zc == 0) and zs.item() == 2.0**-22
    _, zsb = enc_idx_mxfp4(torch.zeros(1, 128))
    assert zsb.tolist() == [[1, 1, 1, 1]]


@pytest.mark.parametrize("use_fp4", [False, True])
@pytest.mark.parametrize(("bs", "stride"), [(4, None), (64, 8448), (64, 8640), (1, 136)])
def test_indexer_byte_positions(use_fp4: bool, bs: int, stride: int | None) -> None:
    pages = 2
    cache = allocate_indexer_cache(pages, bs, page_stride=stride, fill=SENTINEL)
    p = cache.stride(0)
    rows = torch.randn(2, 128) * 3
    slots = torch.tensor([bs + bs // 2, 0])
    store_rows_indexer(rows, cache, slots, use_fp4)
    raw = flat(cache, pages * p)
    written = torch.zeros_like(raw, dtype=torch.bool)
    width = 64 if use_fp4 else 128
    for r, s in enumerate(slots.tolist()):
        base, t = (s // bs) * p, s % bs
        d0, s0 = base + t * width, base + bs * width + t * 4
        if use_fp4:
            packed, sb = enc_idx_mxfp4(rows[r])
            assert torch.equal(raw[d0 : d0 + 64], packed) and torch.equal(raw[s0 : s0 + 4], sb)
        else:
            codes, scale = enc_idx_fp8(rows[r])
            assert torch.equal(raw[d0 : d0 + 128], codes)
            assert torch.equal(raw[s0 : s0 + 4], f32_to_bytes(scale.reshape(1)))
            assert bytes_to_f32(raw[s0 : s0 + 4]).item() == scale.item()
        written[d0 : d0 + width] = True
        written[s0 : s0 + 4] = True
    assert torch.all(raw[~written] == SENTINEL)  # incl. bytes >= 68*bs of MXFP4 pages


@pytest.mark.parametrize("use_fp4", [False, True])
def test_indexer_roundtrip_bound(use_fp4: bool) -> None:
    rows = torch.randn(8, 128)
    cache = allocate_indexer_cache(1, 8)
    store_rows_indexer(rows, cache, torch.arange(8), use_fp4)
    dec = decode_indexer_rows(cache, torch.arange(8), use_fp4)
    z = rows.bfloat16().float()
    if use_fp4:
        amax = z.reshape(8, 4, 32).abs().amax(-1, keepdim=True)
        bound = (
            (amax / 3).expand(8, 4, 32).reshape(8, 128)
        )  # half the coarsest step (2 * scale), scale < amax/3
    else:
        bound = z.abs().amax(-1, keepdim=True) / 448 * 2 * 16  # half step (32 in [256, 448]) * scale
    assert torch.all((dec - z).abs() <= bound)


def test_indexer_bad_inputs() -> None:
    c = allocate_indexer_cache(2, 4)
    rows, s = torch.zeros(1, 128), torch.tensor([0])
    bad_stride = torch.zeros(2 * 600, dtype=torch.uint8).as_strided((2, 4, 132), (530, 132, 1))
    small_stride = torch.zeros(2 * 600, dtype=torch.uint8).as_strided((2, 4, 132), (524, 132, 1))
    cases = [
        (
            lambda: store_rows_indexer(rows, torch.zeros(2, 4, 128, dtype=torch.uint8), s, False),
            "k_cache: expected shape",
        ),
        (lambda: store_rows_indexer(rows, bad_stride, s, False), "k_cache: expected page stride"),
        (lambda: store_rows_indexer(rows, small_stride, s, True), "k_cache: expected page stride"),
        (
            lambda: store_rows_indexer(torch.zeros(1, 64), c, s, False),
            "store_rows_indexer: rows: expected shape",
        ),
        (lambda: store_rows_indexer(rows, c, s, 1), "store_rows_indexer: use_fp4: expected a bool"),
        (lambda: enc_idx_mxfp4(torch.zeros(2, 96)), "enc_idx_mxfp4: y: expected last dim 128"),
        (lambda: allocate_indexer_cache(2, 4, page_stride=530), "allocate_indexer_cache: page_stride"),
    ]
    for fn, msg in cases:
        with pytest.raises(KernelInputError, match=msg):
            fn()
