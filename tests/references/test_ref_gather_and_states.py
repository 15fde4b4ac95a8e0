"""K3 (dequantize_and_gather_k_cache) and K4 (save_partial_states) against loop restatements."""

from __future__ import annotations

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.formats import allocate_ds_cache, allocate_state_cache, store_rows_ds
from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as k3
from dsv4kit.kernels.save_partial_states import save_partial_states_reference as k4

SENT = 0xA5


def gather_loop(out: torch.Tensor, cache: torch.Tensor, seq_lens, gather_lens, bt, offset: int) -> None:
    """§K3 semantics over the raw page bytes, decoding with torch's float8 view."""
    bs, p = cache.shape[1], cache.stride(0)
    raw = cache.as_strided((cache.shape[0] * p,), (1,))
    for b, length in enumerate(seq_lens):
        g = length if gather_lens is None else gather_lens[b]
        for i in range(g):
            tok = length - g + i
            base, o = int(bt[b, tok // bs]) * p, tok % bs
            k = torch.arange(448)
            sb = raw[base + 576 * bs + 8 * o + k // 64].double()  # scale byte of dim k
            v = raw[base + 576 * o : base + 576 * o + 448].view(torch.float8_e4m3fn).double()
            out[b, offset + i, :448] = (v * torch.exp2(sb - 127)).to(torch.bfloat16)
            rope = raw[base + 576 * o + 448 : base + 576 * o + 576].clone()
            out[b, offset + i, 448:] = rope.view(torch.bfloat16)


def filled_cache(num_pages: int, bs: int, stride: int | None, seed: int) -> torch.Tensor:
    cache = allocate_ds_cache(num_pages, bs, page_stride=stride, fill=SENT)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn((num_pages * bs, 512), generator=g)
    rows *= torch.exp2(torch.randint(-12, 12, (num_pages * bs, 1), generator=g).float())
    store_rows_ds(rows, cache, torch.arange(num_pages * bs))
    return cache


def block_table_for(seq_lens: list[int], bs: int, num_pages: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)
    maxb = max(1, max(-(-sl // bs) for sl in seq_lens)) + 1
    bt = torch.full((len(seq_lens), maxb), -1, dtype=torch.int32)  # padded with -1 (never read)
    nxt = 0
    for b, sl in enumerate(seq_lens):
        n = -(-sl // bs)
        bt[b, :n] = perm[nxt : nxt + n].to(torch.int32)
        nxt += n
    return bt


@pytest.mark.parametrize(
    ("seq_lens", "gather_lens", "offset", "bs", "stride"),
    [
        ([9, 23, 7], None, 0, 4, None),
        ([19, 8, 257], [6, 8, 129], 5, 64, 39168),
        ([13], [13], 0, 2, None),
        ([5, 0, 3], [0, 0, 2], 1, 1, 1152),
    ],
)
def test_k3_matches_loop(seq_lens, gather_lens, offset: int, bs: int, stride: int | None) -> None:
    need = sum(-(-sl // bs) for sl in seq_lens)
    pages = need + 2
    cache = filled_cache(pages, bs, stride, seed=bs)
    bt = block_table_for(seq_lens, bs, pages, seed=len(seq_lens))
    m = offset + max(max(seq_lens), 1)
    out = torch.full((len(seq_lens) + 1, m, 512), float("nan"), dtype=torch.bfloat16)
    want = out.clone()
    gl = None if gather_lens is None else torch.tensor(gather_lens, dtype=torch.int32)
    ret = k3(out, cache, torch.tensor(seq_lens, dtype=torch.int32), gl, bt, bs, offset)
    assert ret is out
    gather_loop(want, cache, seq_lens, gather_lens, bt, offset)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))  # bitwise, untouched rows stay NaN


def test_k3_exhaustive_table() -> None:
    codes = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    cache = allocate_ds_cache(1, 4)
    raw = cache.as_strided((cache.stride(0),), (1,))
    sbytes = [105, 127, 200, 254]
    for t, sb in enumerate(sbytes):
        raw[t * 576 : t * 576 + 254] = codes
        raw[4 * 576 + 8 * t : 4 * 576 + 8 * t + 7] = sb
    out = torch.zeros(1, 4, 512, dtype=torch.bfloat16)
    k3(out, cache, torch.tensor([4], dtype=torch.int32), None, torch.zeros(1, 1, dtype=torch.int32), 4, 0)
    vals = codes.view(torch.float8_e4m3fn).double()
    for t, sb in enumerate(sbytes):
        want = (vals * 2.0 ** (sb - 127)).float().to(torch.bfloat16)  # exact, or +-inf on overflow
        assert torch.equal(out[0, t, :254].view(torch.int16), want.view(torch.int16))


def test_k3_bad_inputs() -> None:
    cache = filled_cache(2, 4, None, 0)
    out = torch.zeros(2, 8, 512, dtype=torch.bfloat16)
    sl = torch.tensor([5, 3], dtype=torch.int32)
    bt = torch.tensor([[0, 1], [1, -1]], dtype=torch.int32)
    name = "dequantize_and_gather_k_cache"
    cases = [
        ((out.float(), cache, sl, None, bt, 4, 0), "out: expected dtype bfloat16"),
        ((out[..., :256], cache, sl, None, bt, 4, 0), "out: expected shape"),
        ((out[:1], cache, sl, None, bt, 4, 0), r"out: expected shape\[0\] >= nreq"),
        ((out.transpose(0, 1), cache, sl, None, bt, 4, 0), "out: expected contiguous"),
        ((out, cache, sl, None, bt, 2, 0), "block_size: expected k_cache.shape"),
        ((out, cache, sl.long(), None, bt, 4, 0), "seq_lens: expected dtype int32"),
        ((out, cache, sl, sl.long(), bt, 4, 0), "gather_lens: expected dtype int32"),
        ((out, cache, sl, sl[:1], bt, 4, 0), "gather_lens: expected length 2"),
        ((out, cache, sl, None, bt.long(), 4, 0), "block_table: expected dtype int32"),
        ((out, cache, sl, None, bt[:1], 4, 0), "block_table: expected shape"),
        ((out, cache, sl, None, bt, 4, -1), "offset: expected an int >= 0"),
        ((out, cache, sl, sl + 1, bt, 4, 0), "gather_lens: expected 0 <= G <= L"),
        ((out, cache, sl, None, bt, 4, 4), "out: expected offset \\+ G <= M"),
        (
            (out, cache, torch.tensor([9, 3], dtype=torch.int32), sl - 3, bt, 4, 0),
            "block_table: expected ceil",
        ),
        (
            (out, cache, sl, None, torch.tensor([[0, 7], [1, -1]], dtype=torch.int32), 4, 0),
            "block_table: expected",
        ),
        (
            (out, torch.zeros(2, 4, 584, dtype=torch.uint8), sl, None, bt, 4, 0),
            "k_cache: expected page stride",
        ),
    ]
    for args, msg in cases:
        with pytest.raises(KernelInputError, match=f"{name}: {msg}"):
            k3(*args)
    # nreq == 0 and L == 0 write nothing
    z = torch.zeros(0, dtype=torch.int32)
    k3(out, cache, z, None, torch.zeros(0, 1, dtype=torch.int32), 4, 0)
    assert torch.all(out == 0)


# ------------------------------------------------------------------ K4


@pytest.mark.parametrize(("sw", "ratio", "sbs"), [(1024, 4, 4), (512, 128, 8), (256, 4, 4)])
@pytest.mark.parametrize("t", [1, 7, 33])
def test_k4_matches_loop(sw: int, ratio: int, sbs: int, t: int) -> None:
    g = torch.Generator().manual_seed(t * sw)
    nsb = (t + sbs - 1) // sbs + 3
    state = allocate_state_cache(nsb, sbs, sw, block_stride=sbs * 2 * sw + 16, fill=float("nan"))
    buf = torch.randn((t + 2, 2 * sw), generator=g)
    kv, score = buf[:, :sw], buf[:, sw:]  # non-contiguous column slices of one buffer
    ape = torch.randn((ratio, sw), generator=g)
    positions = torch.randint(0, 4 * ratio, (t + 3,), generator=g)
    slots = torch.randperm(nsb * sbs, generator=g)[:t]
    slots[::3] = -1
    before = state.clone()
    k4(kv, score, ape, positions, state, slots, sbs, sw, ratio)
    want = before.clone()
    for i in range(t):
        s = int(slots[i])
        if s < 0:
            continue
        want[s // sbs, s % sbs, :sw] = kv[i]
        for d in range(0, sw, max(1, sw // 8)):  # scalar restatement on a sample of columns
            assert (
                state[s // sbs, s % sbs, sw + d].item()
                == (
                    torch.tensor(score[i, d].item()) + torch.tensor(ape[int(positions[i]) % ratio, d].item())
                ).item()
            )
        want[s // sbs, s % sbs, sw:] = score[i] + ape[int(positions[i]) % ratio]
    assert torch.equal(state.view(torch.int32), want.view(torch.int32))  # NaN sentinels untouched


def test_k4_t0_and_bad_inputs() -> None:
    sw, r, sbs = 256, 4, 4
    state = allocate_state_cache(4, sbs, sw)
    kv, score, ape = torch.zeros(3, sw), torch.zeros(3, sw), torch.zeros(r, sw)
    pos, slots = torch.arange(3), torch.tensor([0, 1, 2])
    k4(kv, score, ape, pos, state, slots[:0], sbs, sw, r)  # T == 0
    cases = [
        ((kv.double(), score, ape, pos, state, slots, sbs, sw, r), "kv: expected dtype float32"),
        ((kv[:, :128], score, ape, pos, state, slots, sbs, sw, r), "kv: expected shape"),
        ((kv, score[:, :128], ape, pos, state, slots, sbs, sw, r), "score: expected shape"),
        ((kv, score, ape[:3], pos, state, slots, sbs, sw, r), "ape: expected shape"),
        ((kv, score, torch.zeros(r, sw).t(), pos, state, slots, sbs, sw, r), "ape: expected"),
        ((kv[:2], score, ape, pos, state, slots, sbs, sw, r), "kv: expected at least T"),
        ((kv, score, ape, pos[:2], state, slots, sbs, sw, r), "positions: expected at least 3"),
        ((kv, score, ape, pos.int(), state, slots, sbs, sw, r), "positions: expected dtype int64"),
        ((kv, score, ape, pos, state, slots.int(), sbs, sw, r), "slot_mapping: expected dtype int64"),
        ((kv, score, ape, pos, state, slots, 8, sw, r), "state_block_size: expected"),
        ((kv, score, ape, pos, state, slots, sbs, sw, 8), "compress_ratio: expected one of 4, 128, got 8"),
        (
            (kv, score, ape, pos, allocate_state_cache(4, sbs, 128), slots, sbs, sw, r),
            "state_cache: expected shape",
        ),
        ((kv, score, ape, pos, state.double(), slots, sbs, sw, r), "state_cache: expected dtype float32"),
        ((kv, score, ape, pos, state, torch.tensor([0, 16, 1]), sbs, sw, r), "slot_mapping: expected values"),
        ((kv, score, ape, pos, state, torch.tensor([0, 0, 1]), sbs, sw, r), "slot_mapping: expected unique"),
        ((kv, score, ape, torch.tensor([0, -1, 2]), state, slots, sbs, sw, r), "positions: expected values"),
    ]
    for args, msg in cases:
        with pytest.raises(KernelInputError, match=f"save_partial_states: {msg}"):
            k4(*args)
