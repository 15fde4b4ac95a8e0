"""§2.8 state cache helpers: allocation, row addressing through the block table, pool(), rmsnorm()."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import allocate_state_cache, is_boundary, pool, rmsnorm, write_state_row


def pool_loop(state: torch.Tensor, bt_r: list[int], p: int, r: int, overlap: bool, d: int) -> list[float]:
    """Loop restatement of pool() from §2.8, in float64."""
    sbs, sw = state.shape[1], state.shape[2] // 2
    w = 2 * r if overlap else r
    ks, ss = [], []
    for j in range(w):
        q = p - w + 1 + j
        if q < 0:
            continue
        h = (1 if j >= r else 0) if overlap else 0
        row = state[bt_r[q // sbs], q % sbs].double()
        ks.append(row[h * d : h * d + d])
        ss.append(row[sw + h * d : sw + h * d + d])
    out = []
    for col in range(d):
        m = max(s[col].item() for s in ss)
        ex = [math.exp(s[col].item() - m) for s in ss]
        tot = sum(ex)
        out.append(sum(e / tot * k[col].item() for e, k in zip(ex, ks, strict=True)))
    return out


def fill_state(nsb: int, sbs: int, sw: int, stride: int | None = None) -> torch.Tensor:
    state = allocate_state_cache(nsb, sbs, sw, block_stride=stride, fill=float("nan"))
    g = torch.Generator().manual_seed(nsb * sbs)
    state[:] = torch.randn(state.shape, generator=g) * 2
    return state


@pytest.mark.parametrize("p", [3, 7, 11, 30])
def test_pool_c4_overlap_matches_loop(p: int) -> None:
    d = 16
    state = fill_state(10, 4, 2 * d, stride=4 * 4 * d + 8)
    bt = torch.tensor([5, 2, 7, 0, 9, 1, 3, 8], dtype=torch.int32)
    got = pool(state, bt, p, 4, True, d)
    want = pool_loop(state, bt.tolist(), p, 4, True, d)
    kmax = max(abs(v) for v in state[:, :, : 2 * d].flatten().tolist())
    assert max(abs(a - b) for a, b in zip(got.tolist(), want, strict=True)) <= 1e-5 * kmax


def test_pool_first_boundary_excludes_negative_rows() -> None:
    # p = 3: rows q = -4..-1 are excluded; only the B halves of rows 0..3 matter.
    d = 8
    state = fill_state(2, 4, 2 * d)
    bt = torch.tensor([1, 0], dtype=torch.int32)
    base = pool(state, bt, 3, 4, True, d)
    state[0] = float("nan")  # block 0 is never referenced by q >= 0 rows of request bt
    assert torch.equal(pool(state, bt, 3, 4, True, d), base)


def test_pool_c128_matches_loop_and_uniform_scores() -> None:
    d = 4
    state = fill_state(32, 8, d)
    bt = torch.arange(32, dtype=torch.int32).flip(0)
    got = pool(state, bt, 255, 128, False, d)
    want = pool_loop(state, bt.tolist(), 255, 128, False, d)
    assert max(abs(a - b) for a, b in zip(got.tolist(), want, strict=True)) <= 1e-5 * 10
    state[..., d:] = 0.5  # equal scores -> plain mean
    mean = torch.stack([state[bt[q // 8], q % 8, :d] for q in range(128, 256)]).double().mean(0)
    assert torch.allclose(pool(state, bt, 255, 128, False, d).double(), mean, atol=1e-6)


def test_pool_saturating_scores_pick_one_row() -> None:
    d = 4
    state = fill_state(1, 8, d)
    state[0, :, d:] = -60.0
    state[0, 5, d:] = 60.0
    bt = torch.zeros(1, dtype=torch.int32)
    got = pool(state, bt, 7, 8, False, d)
    assert torch.allclose(got, state[0, 5, :d], rtol=1e-6, atol=0)


def test_write_state_row_via_block_table() -> None:
    state = allocate_state_cache(4, 4, 8, block_stride=4 * 16 + 4)
    assert state.stride() == (68, 16, 1)
    bt = torch.tensor([2, 0], dtype=torch.int32)
    kv, sc = torch.arange(8.0), -torch.arange(8.0)
    write_state_row(state, bt, 6, kv, sc)
    assert torch.equal(state[0, 2, :8], kv) and torch.equal(state[0, 2, 8:], sc)
    assert int((state != 0).sum()) == 14  # only that row changed (kv[0] = 0, sc[0] = -0)
    with pytest.raises(KernelInputError, match="write_state_row: q"):
        write_state_row(state, bt, 8, kv, sc)
    with pytest.raises(KernelInputError, match="write_state_row: kv: expected shape"):
        write_state_row(state, bt, 1, torch.zeros(4), sc)


def test_rmsnorm_matches_formula() -> None:
    c = torch.randn(3, 512) * 100
    w = torch.randn(512).bfloat16()
    got = rmsnorm(c, w, 1e-6)
    rr = 1.0 / torch.sqrt((c * c).sum(-1, keepdim=True) / 512 + 1e-6)
    assert torch.equal(got, (c * rr) * w.float())  # two separately rounded products
    cd = c.double()
    want = cd / torch.sqrt((cd * cd).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


def test_is_boundary() -> None:
    p = torch.tensor([0, 3, 4, 7, 127, 255])
    assert is_boundary(p, 4).tolist() == [False, True, False, True, True, True]
    assert is_boundary(p, 128).tolist() == [False, False, False, False, True, True]


def test_state_bad_inputs() -> None:
    s = allocate_state_cache(2, 4, 8)
    bt = torch.zeros(2, dtype=torch.int32)
    cases = [
        (lambda: pool(s.double(), bt, 3, 4, True, 4), "pool: state: expected dtype float32"),
        (lambda: pool(s, bt.long(), 3, 4, True, 4), "pool: bt_r: expected dtype int32"),
        (lambda: pool(s, bt, 3, 4, True, 8), "pool: head_dim"),
        (lambda: pool(s, bt, -1, 4, True, 4), "pool: p"),
        (lambda: pool(s, torch.tensor([0, 9], dtype=torch.int32), 7, 4, True, 4), "pool: block_table"),
        (lambda: rmsnorm(torch.zeros(4, 8), torch.ones(7), 1e-6), "rmsnorm: weight: expected shape"),
        (lambda: rmsnorm(torch.zeros(4, 8), torch.ones(8), 0.0), "rmsnorm: eps"),
        (lambda: allocate_state_cache(2, 4, 8, block_stride=10), "allocate_state_cache: block_stride"),
    ]
    for fn, msg in cases:
        with pytest.raises(KernelInputError, match=msg):
            fn()
