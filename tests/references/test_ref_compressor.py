"""K5-K9 references against a float64 loop restatement of pool -> rmsnorm -> rope (§2.8, §3).

The restatement is independent of the reference's vectorised code; stored values must lie within
one quantization step of the float64 row plus §2.12's allowance (2^-16 of the element's term
magnitude: fp32 pooling of a cancelling column can land several steps of its own binade away),
scale bytes must match, pad bytes are 0 and every byte that is not written keeps its sentinel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import (
    allocate_ds_cache,
    allocate_indexer_cache,
    allocate_plain_cache,
    allocate_state_cache,
    build_cos_sin_cache,
    decode_ds_rows,
    decode_indexer_rows,
    read_ds_entries,
    read_indexer_entries,
    read_plain_rows,
)
from dsv4kit.kernels.c4_compress.reference import (
    c4_compress_ds_mla_reference,
    c4_compress_plain_reference,
    indexer_compress_reference,
)
from dsv4kit.kernels.c128_compress.reference import (
    c128_compress_reference,
    c128_norm_rope_store_ds_mla_reference,
    c128_norm_rope_store_plain_reference,
)

SENT = 0xA5
EPS = 1e-6
CS = build_cos_sin_cache(1024, 160_000.0, yarn=None)


@dataclass
class Scenario:
    state: torch.Tensor
    token_to_req: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    kv_slots: torch.Tensor
    sbs: int

    def c4_args(self, sbs: int, w: torch.Tensor) -> tuple:
        """A C4 op's arguments before its cache (``state_cache`` .. ``cos_sin_cache``), positionally."""
        return (self.state, self.token_to_req, self.positions, self.slot_mapping, self.block_table, sbs, w,
                EPS, CS)


def make_scenario(
    ratio: int, head: int, sbs: int, lens: list[int], seed: int, kv_capacity: int, regime: str = "normal"
) -> Scenario:
    """Requests of the given lengths, shuffled state blocks, every position written to the state.

    Tokens are all positions of all requests (interleaved); a few get slot -1 (padding); boundary
    tokens get unique shuffled kv slots, other tokens -1.
    """
    g = torch.Generator().manual_seed(seed)
    sw = (2 if ratio == 4 else 1) * head
    nblk = [-(-n // sbs) for n in lens]
    nsb = sum(nblk) + 2
    state = allocate_state_cache(nsb, sbs, sw, block_stride=sbs * 2 * sw + 4, fill=float("nan"))
    perm = torch.randperm(nsb, generator=g)
    bt = torch.full((len(lens), max(nblk) + 1), -1, dtype=torch.int32)
    off = 0
    for r, n in enumerate(nblk):
        bt[r, :n] = perm[off : off + n].to(torch.int32)
        off += n
    for r, n in enumerate(lens):
        for q in range(n):
            kv = torch.randn(sw, generator=g)
            if regime == "large":
                kv *= 2.0**30
            elif regime == "tiny":
                kv *= 2.0**-55
            elif regime == "zero":
                kv *= 0
            sc = torch.randn(sw, generator=g) * 3
            state[bt[r, q // sbs], q % sbs] = torch.cat((kv, sc))
    req = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(lens)])
    pos = torch.cat([torch.arange(n) for n in lens])
    order = torch.randperm(len(pos), generator=g)
    req, pos = req[order], pos[order]
    slot = torch.stack(
        [bt[r, p // sbs].long() * sbs + p % sbs for r, p in zip(req.tolist(), pos.tolist(), strict=True)]
    )
    slot[::5] = -1  # padding
    boundary = (pos + 1) % ratio == 0
    kv_slots = torch.full_like(pos, -1)
    kv_slots[boundary] = torch.randperm(kv_capacity, generator=g)[: int(boundary.sum())]
    return Scenario(state, req, pos, slot, bt, kv_slots, sbs)


def pool64(sc: Scenario, r: int, p: int, ratio: int, head: int) -> torch.Tensor:
    """pool() of §2.8 for request row ``r`` at position ``p``, in float64: window rows ``p - w + 1 .. p``
    present (>= 0); under overlap (C4) the older half reads the state's first head, the newer its second."""
    overlap = ratio == 4
    w = 2 * ratio if overlap else ratio
    sw = sc.state.shape[2] // 2
    window = [(j, p - w + 1 + j) for j in range(w) if p - w + 1 + j >= 0]
    rows = [sc.state[sc.block_table[r, q // sc.sbs], q % sc.sbs].double() for _, q in window]
    lo = [head if overlap and j >= ratio else 0 for j, _ in window]
    k = torch.stack([row[o : o + head] for row, o in zip(rows, lo, strict=True)])
    s = torch.stack([row[sw + o : sw + o + head] for row, o in zip(rows, lo, strict=True)])
    wts = torch.exp(s - s.max(0).values)
    return (wts / wts.sum(0) * k).sum(0)


def allowance64(sc: Scenario, r: int, p: int, ratio: int, head: int, w: torch.Tensor) -> torch.Tensor:
    """§2.12's allowance 2^-16 m_d of every dim of the row at (r, p): the term magnitude m_d from
    P_d = sum_j w_j |k_j[d]| (the same weights, |kv| pooled), n_d = rr |w_norm[d]| P_d, and for a
    RoPE pair (e, o) m_e = |c| n_e + |s| n_o (m_o alike)."""
    sw = sc.state.shape[2] // 2
    c = pool64(sc, r, p, ratio, head)
    absolute = replace(sc, state=torch.cat((sc.state[..., :sw].abs(), sc.state[..., sw:]), dim=2))
    n = w.double().abs() * pool64(absolute, r, p, ratio, head) / torch.sqrt((c * c).mean() + EPS)
    cs = CS[(p // ratio) * ratio].double().abs()
    m = n.clone()
    d = n.shape[0]
    for i in range(32):
        ne, no = n[d - 64 + 2 * i], n[d - 64 + 2 * i + 1]
        m[d - 64 + 2 * i] = cs[i] * ne + cs[32 + i] * no
        m[d - 64 + 2 * i + 1] = cs[i] * no + cs[32 + i] * ne
    return m * 2.0**-16


def norm_rope64(c: torch.Tensor, w: torch.Tensor, p: int, ratio: int) -> torch.Tensor:
    n = c / torch.sqrt((c * c).mean() + EPS) * w.double()
    cs = CS[(p // ratio) * ratio].double()
    y = n.clone()
    d = n.shape[0]
    for i in range(32):
        xe, xo = n[d - 64 + 2 * i], n[d - 64 + 2 * i + 1]
        y[d - 64 + 2 * i] = xe * cs[i] - xo * cs[32 + i]
        y[d - 64 + 2 * i + 1] = xo * cs[i] + xe * cs[32 + i]
    return y


def _written(sc: Scenario, ratio: int) -> list[tuple[int, int, int]]:
    """(kv slot, request, position) of every token that must be written."""
    out = []
    for t in range(len(sc.positions)):
        p, s, kvs = int(sc.positions[t]), int(sc.slot_mapping[t]), int(sc.kv_slots[t])
        if s >= 0 and (p + 1) % ratio == 0 and kvs >= 0:
            out.append((kvs, int(sc.token_to_req[t]), p))
    return out


def expected_rows(sc: Scenario, ratio: int, head: int, w: torch.Tensor) -> dict[int, torch.Tensor]:
    """kv slot -> float64 row y for every token that must be written."""
    return {kvs: norm_rope64(pool64(sc, r, p, ratio, head), w, p, ratio) for kvs, r, p in _written(sc, ratio)}


def expected_allowances(sc: Scenario, ratio: int, head: int, w: torch.Tensor) -> dict[int, torch.Tensor]:
    """kv slot -> §2.12's per-element allowance of that row (:func:`allowance64`)."""
    return {kvs: allowance64(sc, r, p, ratio, head, w) for kvs, r, p in _written(sc, ratio)}


def e4m3_step(v: torch.Tensor) -> torch.Tensor:
    """e4m3 grid spacing at magnitude v (scaled domain)."""
    return torch.where(v < 2.0**-6, torch.full_like(v, 2.0**-9), torch.exp2(torch.floor(torch.log2(v)) - 3))


def bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.floor(torch.log2(v.clamp_min(2.0**-126))) - 7)


def _allowed(want: dict[int, torch.Tensor], allow: dict[int, torch.Tensor] | None) -> torch.Tensor:
    """The allowances of ``want``'s rows stacked in slot order (0 without any: a step alone)."""
    slots = sorted(want)
    if not allow:
        return torch.zeros(len(slots), 1, dtype=torch.float64)
    return torch.stack([allow[s] for s in slots])


def assert_ds_rows_close(cache: torch.Tensor, want: dict[int, torch.Tensor],
                         allow: dict[int, torch.Tensor] | None = None) -> None:
    """Every element within one step of the float64 row plus its allowance (``allow``: §2.12's
    2^-16 m_d per element; none: the step alone)."""
    slots = torch.tensor(sorted(want))
    dec = decode_ds_rows(cache, slots).double()
    entry, pad = read_ds_entries(cache, slots)
    assert torch.all(pad == 0)
    y = torch.stack([want[s] for s in slots.tolist()])
    a = _allowed(want, allow).expand_as(y)
    scale = torch.exp2(entry.scales.double() - 127).repeat_interleave(64, dim=1)
    mag = torch.maximum(dec[:, :448].abs(), y[:, :448].abs()) / scale
    assert torch.all((dec[:, :448] - y[:, :448]).abs() <= e4m3_step(mag) * scale + a[:, :448])
    # scale bytes: Q8 exponent of the float64 row's bf16 block amax (no boundary blocks here)
    amax = y[:, :448].float().bfloat16().double().abs().reshape(-1, 7, 64).amax(-1).clamp_min(1e-4)
    assert torch.equal(entry.scales.long(), (torch.ceil(torch.log2(amax / 448)) + 127).long())
    rmag = torch.maximum(dec[:, 448:].abs(), y[:, 448:].abs())
    assert torch.all((dec[:, 448:] - y[:, 448:]).abs() <= bf16_ulp(rmag) + a[:, 448:])


def untouched_except(cache: torch.Tensor, written: list[int], entry_bytes: list[tuple[int, int]]) -> None:
    """Every byte outside the listed (slot-relative) ranges still holds the sentinel."""
    bs, p = cache.shape[1], cache.stride(0)
    raw = cache.view(torch.uint8).as_strided((cache.shape[0] * p * cache.element_size(),), (1,))
    mask = torch.ones_like(raw, dtype=torch.bool)
    for s in written:
        for start, size in entry_bytes:
            base = (s // bs) * p * cache.element_size()
            o = base + start(s % bs) if callable(start) else base + start
            mask[o : o + size] = False
    assert torch.all(raw[mask] == SENT)


def ds_ranges(bs: int) -> list[tuple]:
    return [(lambda t: t * 576, 576), (lambda t, bs=bs: bs * 576 + t * 8, 8)]


# ------------------------------------------------------------------ K5


@pytest.mark.parametrize(("sbs", "kv_bs", "stride"), [(4, 64, None), (16, 2, None), (4, 1, 2304)])
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
def test_k5_matches_float64_loop(sbs: int, kv_bs: int, stride: int | None, w_dtype: torch.dtype) -> None:
    lens = [21, 9, 3]
    pages = 16 // kv_bs + 1
    sc = make_scenario(4, 512, sbs, lens, seed=sbs + kv_bs, kv_capacity=pages * kv_bs)
    w = (1 + 0.1 * torch.randn(512, generator=torch.Generator().manual_seed(sbs))).to(w_dtype)
    cache = allocate_ds_cache(pages, kv_bs, page_stride=stride, fill=SENT)
    c4_compress_ds_mla_reference(*sc.c4_args(sbs, w), cache, sc.kv_slots)
    want = expected_rows(sc, 4, 512, w)
    assert len(want) >= 4  # includes p = 3 (half window) tokens unless padded
    assert_ds_rows_close(cache, want, expected_allowances(sc, 4, 512, w))
    untouched_except(cache, list(want), ds_ranges(kv_bs))


@pytest.mark.parametrize("regime", ["zero", "tiny", "large"])
def test_k5_regimes(regime: str) -> None:
    sc = make_scenario(4, 512, 4, [12], seed=3, kv_capacity=8, regime=regime)
    w = torch.ones(512, dtype=torch.bfloat16)
    cache = allocate_ds_cache(2, 4, fill=SENT)
    c4_compress_ds_mla_reference(*sc.c4_args(4, w), cache, sc.kv_slots)
    want = expected_rows(sc, 4, 512, w)
    if regime == "zero":
        entry, pad = read_ds_entries(cache, torch.tensor(sorted(want)))
        assert torch.all(entry.nope == 0) and torch.all(entry.scales == 105) and torch.all(pad == 0)
    else:
        assert_ds_rows_close(cache, want, expected_allowances(sc, 4, 512, w))


# ------------------------------------------------------------------ K6 / K8b (plain rows)


@pytest.mark.parametrize(
    ("dtype", "scale"), [(torch.bfloat16, None), (torch.float8_e4m3fn, 0.37), (torch.float8_e4m3fn, 2.0**-4)]
)
def test_k6_matches_float64_loop(dtype: torch.dtype, scale: float | None) -> None:
    sc = make_scenario(4, 512, 4, [17, 8], seed=5, kv_capacity=12)
    w = (1 + 0.1 * torch.randn(512, generator=torch.Generator().manual_seed(6))).bfloat16()
    cache = allocate_plain_cache(3, 4, dtype, page_stride=4 * 512 + 64, fill_byte=SENT)
    fs = None if scale is None else torch.tensor([scale])
    c4_compress_plain_reference(*sc.c4_args(4, w), cache, sc.kv_slots, fs)
    want = expected_rows(sc, 4, 512, w)
    assert_plain_close(cache, want, fs, expected_allowances(sc, 4, 512, w))
    untouched_except(
        cache, list(want), [(lambda t: t * 512 * cache.element_size(), 512 * cache.element_size())]
    )


def assert_plain_close(cache: torch.Tensor, want: dict[int, torch.Tensor], fs: torch.Tensor | None,
                       allow: dict[int, torch.Tensor] | None = None) -> None:
    """As :func:`assert_ds_rows_close`, for plain bf16 / e4m3 rows."""
    slots = torch.tensor(sorted(want))
    dec = read_plain_rows(cache, slots, fs).double()
    y = torch.stack([want[s] for s in slots.tolist()])
    a = _allowed(want, allow).expand_as(y)
    if fs is None:
        assert torch.all((dec - y).abs() <= bf16_ulp(torch.maximum(dec.abs(), y.abs())) + a)
    else:
        s = float(fs[0])
        ys = (y / s).clamp(-448, 448)
        mag = torch.maximum((dec / s).abs(), ys.abs())
        assert torch.all((dec / s - ys).abs() <= e4m3_step(mag) + a / s)


# ------------------------------------------------------------------ K7 / K8


def test_k7_fp32_rule_and_untouched_rows() -> None:
    lens = [256, 130]
    sc = make_scenario(128, 512, 8, lens, seed=7, kv_capacity=4)
    t = len(sc.positions)
    out = torch.full((t + 3, 512), float("nan"))
    ret = c128_compress_reference(
        sc.state, sc.token_to_req, sc.positions, sc.slot_mapping, sc.block_table, out
    )
    assert ret.data_ptr() == out.data_ptr() and ret.shape == (t, 512)
    n_rows = 0
    for i in range(t):
        p, s = int(sc.positions[i]), int(sc.slot_mapping[i])
        if s < 0 or (p + 1) % 128:
            assert torch.all(torch.isnan(out[i]))
            continue
        n_rows += 1
        r = int(sc.token_to_req[i])
        c64 = pool64(sc, r, p, 128, 512)
        kmax = torch.stack(
            [sc.state[sc.block_table[r, q // 8], q % 8, :512].abs() for q in range(p - 127, p + 1)]
        ).amax(0)
        assert torch.all((ret[i].double() - c64).abs() <= 1e-5 * kmax.double())
    assert n_rows >= 1 and torch.all(torch.isnan(out[t:]))
    fresh = c128_compress_reference(sc.state, sc.token_to_req, sc.positions, sc.slot_mapping, sc.block_table)
    assert fresh.shape == (t, 512)


@pytest.mark.parametrize(("kv_bs", "stride"), [(1, 1152), (2, 1728), (2, 2304)])
def test_k8a_matches_float64_loop(kv_bs: int, stride: int) -> None:
    g = torch.Generator().manual_seed(kv_bs)
    pos = torch.tensor([127, 5, 255, 383, 511, 128])
    ckv = torch.randn((6, 512), generator=g) * 3
    slot = torch.tensor([0, 1, 2, -1, 4, 5])
    kv_slots = torch.tensor([3, 0, 1, 2, -1, 4])
    w = (1 + 0.1 * torch.randn(512, generator=g)).bfloat16()
    cache = allocate_ds_cache(5 // kv_bs + 1, kv_bs, page_stride=stride, fill=SENT)
    c128_norm_rope_store_ds_mla_reference(ckv, pos, slot, kv_slots, w, EPS, CS, cache)
    want = {3: norm_rope64(ckv[0].double(), w, 127, 128), 1: norm_rope64(ckv[2].double(), w, 255, 128)}
    assert_ds_rows_close(cache, want)
    untouched_except(cache, list(want), ds_ranges(kv_bs))


@pytest.mark.parametrize(("dtype", "scale"), [(torch.bfloat16, None), (torch.float8_e4m3fn, 1.0)])
def test_k8b_matches_float64_loop(dtype: torch.dtype, scale: float | None) -> None:
    pos = torch.tensor([127, 255, 200])
    ckv = torch.randn((3, 512)) * 100
    fs = None if scale is None else torch.tensor([scale])
    w = torch.ones(512)
    cache = allocate_plain_cache(2, 2, dtype, fill_byte=SENT)
    c128_norm_rope_store_plain_reference(
        ckv, pos, torch.zeros(3, dtype=torch.int64), torch.tensor([2, 1, 0]), w, EPS, CS, cache, fs
    )
    want = {2: norm_rope64(ckv[0].double(), w, 127, 128), 1: norm_rope64(ckv[1].double(), w, 255, 128)}
    assert_plain_close(cache, want, fs)
    untouched_except(
        cache, list(want), [(lambda t: t * 512 * cache.element_size(), 512 * cache.element_size())]
    )


# ------------------------------------------------------------------ K9


@pytest.mark.parametrize("use_fp4", [False, True])
@pytest.mark.parametrize(("sbs", "kv_bs", "stride"), [(4, 64, 8640), (16, 1, None)])
def test_k9_matches_float64_loop(use_fp4: bool, sbs: int, kv_bs: int, stride: int | None) -> None:
    pages = 9 if kv_bs == 1 else 1
    sc = make_scenario(4, 128, sbs, [19, 12], seed=9, kv_capacity=kv_bs * pages)
    w = (1 + 0.1 * torch.randn(128, generator=torch.Generator().manual_seed(sbs))).bfloat16()
    cache = allocate_indexer_cache(pages, kv_bs, page_stride=stride, fill=SENT)
    indexer_compress_reference(*sc.c4_args(sbs, w), cache, sc.kv_slots, use_fp4)
    want = expected_rows(sc, 4, 128, w)
    slots = torch.tensor(sorted(want))
    dec = decode_indexer_rows(cache, slots, use_fp4).double()
    y = torch.stack([want[s] for s in slots.tolist()])
    a = _allowed(want, expected_allowances(sc, 4, 128, w))
    _, sbytes = read_indexer_entries(cache, slots, use_fp4)
    z = y.float().bfloat16().double()
    if use_fp4:
        scale = torch.exp2(sbytes.double() - 127).repeat_interleave(32, dim=1)
        amax = z.abs().reshape(-1, 4, 32).amax(-1)
        assert torch.equal(sbytes.long(), (torch.ceil(torch.log2(amax / 6)) + 127).long())
        mag = torch.maximum(dec.abs(), y.abs()) / scale
        step = torch.where(mag < 2, 0.5, torch.where(mag < 4, 1.0, 2.0))
        assert torch.all((dec - y).abs() <= step * scale + a)
    else:
        scale = torch.stack([sbytes[i].view(torch.float32) for i in range(len(slots))]).double()
        amax = z.abs().amax(-1, keepdim=True)
        assert torch.equal(scale, torch.exp2(torch.ceil(torch.log2(amax / 448))))
        mag = torch.maximum(dec.abs(), y.abs()) / scale
        assert torch.all((dec - y).abs() <= e4m3_step(mag) * scale + a)
    width = 64 if use_fp4 else 128
    untouched_except(cache, list(want), [(lambda t: t * width, width), (lambda t: kv_bs * width + t * 4, 4)])


# ------------------------------------------------------------------ T == 0 and bad inputs


def c4_args(head: int = 512) -> dict:
    sw = 2 * head
    return dict(
        state_cache=allocate_state_cache(4, 4, sw),
        token_to_req=torch.zeros(2, dtype=torch.int32),
        positions=torch.tensor([3, 7]),
        slot_mapping=torch.tensor([3, 7]),
        block_table=torch.tensor([[0, 1]], dtype=torch.int32),
        state_block_size=4,
        rms_norm_weight=torch.ones(head, dtype=torch.bfloat16),
        rms_norm_eps=EPS,
        cos_sin_cache=CS,
        kv_slot_mapping=torch.tensor([0, 1]),
    )


def test_t0_writes_nothing() -> None:
    cache = allocate_ds_cache(1, 2, fill=SENT)
    a = c4_args()
    e = torch.zeros(0, dtype=torch.int64)
    a.update(token_to_req=e.int(), positions=e, slot_mapping=e, kv_slot_mapping=e)
    c4_compress_ds_mla_reference(k_cache=cache, **a)
    assert torch.all(cache.as_strided((1728,), (1,)) == SENT)
    assert c128_compress_reference(
        allocate_state_cache(2, 8, 512), e.int(), e, e, a["block_table"]
    ).shape == (0, 512)


def test_k5_k6_k9_bad_inputs() -> None:
    ds = allocate_ds_cache(1, 2)
    bf = allocate_plain_cache(1, 2, torch.bfloat16)
    f8 = allocate_plain_cache(1, 2, torch.float8_e4m3fn)
    idx = allocate_indexer_cache(1, 2)
    base = c4_args()
    cases = [
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, cos_sin_cache=CS.bfloat16()),
            "cos_sin_cache: expected dtype float32",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, cos_sin_cache=CS[:, :32].contiguous()),
            "cos_sin_cache: expected shape",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, state_cache=allocate_state_cache(4, 4, 512)),
            "state_cache: expected shape",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, state_cache=allocate_state_cache(4, 4, 1024).double()),
            "state_cache: expected dtype",
        ),
        ("c4_compress_ds_mla", dict(k_cache=ds, state_block_size=8), "state_block_size: expected"),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, rms_norm_weight=torch.ones(256)),
            "rms_norm_weight: expected shape",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, rms_norm_weight=torch.ones(512).half()),
            "rms_norm_weight: expected dtype",
        ),
        ("c4_compress_ds_mla", dict(k_cache=ds, rms_norm_eps=0.0), "rms_norm_eps: expected"),
        (
            "c4_compress_ds_mla",
            dict(k_cache=torch.zeros(1, 2, 584, dtype=torch.uint8)),
            "k_cache: expected page stride",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, kv_slot_mapping=torch.tensor([0])),
            "kv_slot_mapping: expected length 2",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, kv_slot_mapping=torch.tensor([0, 1]).int()),
            "kv_slot_mapping: expected dtype",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, kv_slot_mapping=torch.tensor([1, 1])),
            "kv_slot_mapping: expected unique",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, kv_slot_mapping=torch.tensor([0, 2])),
            "kv_slot_mapping: expected values",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, token_to_req=torch.zeros(2, dtype=torch.int64)),
            "token_to_req: expected dtype int32",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, token_to_req=torch.ones(2, dtype=torch.int32)),
            "token_to_req: expected values",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, positions=torch.tensor([3])),
            "token_to_req: expected length 1",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, block_table=torch.tensor([[0, 9]], dtype=torch.int32)),
            "block_table: expected",
        ),
        (
            "c4_compress_ds_mla",
            dict(k_cache=ds, block_table=torch.tensor([[0]], dtype=torch.int32)),
            "block_table",
        ),
        ("c4_compress_ds_mla", dict(k_cache=ds, cos_sin_cache=CS[:4]), "positions \\(rope row"),
        ("c4_compress_plain", dict(kv_cache=f8), "fp8_scale: expected a \\[1\\] fp32 tensor"),
        ("c4_compress_plain", dict(kv_cache=bf, fp8_scale=torch.tensor([1.0])), "fp8_scale: expected None"),
        (
            "c4_compress_plain",
            dict(kv_cache=torch.zeros(1, 2, 512, dtype=torch.float8_e5m2)),
            "kv_cache: expected dtype",
        ),
        (
            "indexer_compress",
            dict(k_cache=idx, use_fp4_cache=False, state_cache=allocate_state_cache(4, 4, 1024)),
            "state_cache: expected shape",
        ),
        (
            "indexer_compress",
            dict(k_cache=torch.zeros(1, 2, 128, dtype=torch.uint8), use_fp4_cache=False),
            "k_cache: expected shape",
        ),
        ("indexer_compress", dict(k_cache=idx, use_fp4_cache=None), "use_fp4_cache: expected a bool"),
    ]
    fns = {
        "c4_compress_ds_mla": c4_compress_ds_mla_reference,
        "c4_compress_plain": c4_compress_plain_reference,
        "indexer_compress": indexer_compress_reference,
    }
    for name, over, msg in cases:
        args = c4_args(128) if name == "indexer_compress" else dict(base)
        args.update(over)
        with pytest.raises(KernelInputError, match=f"{name}: {msg}"):
            fns[name](**args)


def test_k7_k8_bad_inputs() -> None:
    st = allocate_state_cache(2, 8, 512)
    e = dict(
        token_to_req=torch.zeros(1, dtype=torch.int32),
        positions=torch.tensor([127]),
        slot_mapping=torch.tensor([0]),
        block_table=torch.zeros(1, 16, dtype=torch.int32),
    )
    with pytest.raises(KernelInputError, match=r"c128_compress: state_cache: expected shape\[1\]"):
        c128_compress_reference(allocate_state_cache(2, 4, 512), **e)
    with pytest.raises(KernelInputError, match="c128_compress: state_cache: expected shape"):
        c128_compress_reference(allocate_state_cache(2, 8, 256), **e)
    with pytest.raises(KernelInputError, match="c128_compress: out: expected strides"):
        c128_compress_reference(st, **e, out=torch.zeros(512, 2).t())
    with pytest.raises(KernelInputError, match="c128_compress: out: expected dtype"):
        c128_compress_reference(st, **e, out=torch.zeros(1, 512).double())
    ckv, pos, z = torch.zeros(1, 512), torch.tensor([127]), torch.tensor([0])
    w = torch.ones(512)
    ds = allocate_ds_cache(1, 2)
    with pytest.raises(KernelInputError, match="c128_norm_rope_store_ds_mla: compressed_kv: expected shape"):
        c128_norm_rope_store_ds_mla_reference(torch.zeros(2, 512), pos, z, z, w, EPS, CS, ds)
    with pytest.raises(KernelInputError, match="c128_norm_rope_store_ds_mla: compressed_kv: expected dtype"):
        c128_norm_rope_store_ds_mla_reference(ckv.bfloat16(), pos, z, z, w, EPS, CS, ds)
    with pytest.raises(
        KernelInputError, match="c128_norm_rope_store_ds_mla: cos_sin_cache: expected dtype float32"
    ):
        c128_norm_rope_store_ds_mla_reference(ckv, pos, z, z, w, EPS, CS.bfloat16(), ds)
    with pytest.raises(KernelInputError, match="c128_norm_rope_store_plain: fp8_scale"):
        c128_norm_rope_store_plain_reference(
            ckv, pos, z, z, w, EPS, CS, allocate_plain_cache(1, 2, torch.float8_e4m3fn)
        )
    assert math.isfinite(EPS)
