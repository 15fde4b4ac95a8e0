"""K3 numerics: the Triton kernel under the CPU interpreter is BIT-EXACT against the reference.

Every case poisons the output with 0xA5 (§2.12), so equality with the reference also proves
that rows outside ``[offset, offset + G)`` and rows of requests >= nreq are untouched.
"""

from __future__ import annotations

import random

import pytest
import torch

from dsv4kit.formats.bits import e4m3_table
from dsv4kit.jit import JitMonitor, KeyLedger
from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache as op
from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as ref
from dsv4kit.kernels.dequant_gather.cases import SENTINEL, make_case, same_bits, table_case
from dsv4kit.kernels.dequant_gather.triton import DequantGatherTriton
from dsv4kit.platform import cpu_platform

# The interpreter computes 448 * 2**127 (scale byte 254) in numpy: inf, as IEEE and the spec say.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@pytest.fixture(scope="module")
def kernel() -> DequantGatherTriton:
    k = DequantGatherTriton(cpu_platform("sm_90a"))
    k.warmup(keys=[k.CompileKey(bs, g) for bs in (256, 64, 2, 1) for g in (True, False)])
    return k


def check(kernel: DequantGatherTriton, case, **kw) -> None:
    want = ref(*case.args(case.fresh_out()))
    got = case.fresh_out()
    with JitMonitor("error"):
        res = kernel(*case.args(got), **kw)
    assert res is got
    assert same_bits(got, want), case.label
    untouched = ~case.written_mask()
    assert bool((got.view(torch.uint8)[untouched] == SENTINEL).all()), case.label


SPEC_CASES = [
    # (seq_lens, gather_lens, offset, block_size, page_stride)
    ([9, 23, 7], None, 0, 64, None),
    ([19, 8, 257], [6, 8, 129], 5, 64, None),
    ([19, 8, 257], [6, 8, 129], 5, 256, None),
    ([1], None, 0, 256, None),
    ([7], None, 0, 256, None),
    ([9], None, 3, 2, None),
    ([23], [23], 0, 64, None),           # G == L with explicit gather_lens
    ([32], None, 0, 64, None),
    ([129], [100], 11, 1, None),
    ([257], None, 0, 256, None),
    ([513], None, 0, 64, None),
    ([0], None, 0, 64, None),            # L == 0
    ([12, 0, 5], [0, 0, 5], 2, 2, None),  # G == 0
    ([40, 70], None, 0, 64, 37_440),     # minimal stride of bs 64
    ([40, 70], [3, 65], 1, 64, 39_168),  # a packed-pool stride
    ([5, 3], None, 0, 1, 1_152),
    ([5, 3], [2, 3], 4, 2, 2_304),
]


@pytest.mark.parametrize("seq_lens,gather_lens,offset,bs,stride", SPEC_CASES)
def test_spec_cases(kernel, seq_lens, gather_lens, offset, bs, stride) -> None:
    check(kernel, make_case(seq_lens, gather_lens, offset=offset, block_size=bs, page_stride=stride))


def test_exhaustive_table(kernel) -> None:
    """All 254 non-NaN e4m3 bytes x scale bytes {105, 127, 200, 254}, against the reference and an
    independent expectation (table value x 2**(s-127) in float64, then a bf16 cast)."""
    case = table_case()
    check(kernel, case)
    got = case.fresh_out()
    kernel(*case.args(got))
    data = case.k_cache.as_strided((case.k_cache.shape[0] * case.k_cache.stride(0),), (1,))
    bs, n = case.block_size, int(case.seq_lens[0])
    table = e4m3_table().to(torch.float64)
    for t in range(n):
        base = (t // bs) * case.k_cache.stride(0)
        codes = data[base + 576 * (t % bs): base + 576 * (t % bs) + 448].to(torch.int64)
        sb = data[base + 576 * bs + 8 * (t % bs): base + 576 * bs + 8 * (t % bs) + 7].to(torch.float64)
        want = table[codes] * torch.exp2(sb - 127).repeat_interleave(64)
        row = got[0, case.offset + t]
        assert torch.equal(row[:448].view(torch.int16), want.to(torch.bfloat16).view(torch.int16))
        entry = base + 576 * (t % bs)
        assert torch.equal(row[448:].view(torch.uint8), data[entry + 448 : entry + 576])


@pytest.mark.parametrize("seed", range(12))
def test_random_cases(kernel, seed) -> None:
    """Random requests, lengths, windows, offsets, block sizes, strides and byte content."""
    rnd = random.Random(seed)
    bs = rnd.choice([1, 2, 64, 256])
    nreq = rnd.randint(1, 4)
    seq = [rnd.choice([0, 1, rnd.randint(1, 3 * bs + 5)]) for _ in range(nreq)]
    use_g = rnd.random() < 0.5
    gl = [rnd.randint(0, n) for n in seq] if use_g else None
    stride = None if rnd.random() < 0.5 else (-(-bs * 584 // 576) + rnd.randint(0, 3)) * 576
    case = make_case(seq, gl, offset=rnd.randint(0, 9), block_size=bs, page_stride=stride,
                     content=rnd.choice(["encoded", "bytes"]), seed=seed)
    check(kernel, case)


def test_padding_never_read(kernel) -> None:
    """Block-table entries outside the blocks of the last G entries are never read: replacing
    them (the -1 padding, the freed window pages) with wild page ids changes nothing."""
    case = make_case([130, 40], [70, 40], offset=2, block_size=64, pad_blocks=3)
    want = ref(*case.args(case.fresh_out()))
    wild = case.block_table.clone()
    wild[wild < 0] = 2**30
    case.block_table = wild
    got = case.fresh_out()
    kernel(*case.args(got), debug_checks=False)
    assert same_bits(got, want)


def test_physical_page_order_irrelevant(kernel) -> None:
    a = make_case([150, 77], block_size=64, shuffle_pages=False, seed=3)
    b = make_case([150, 77], block_size=64, shuffle_pages=True, seed=3)
    ga, gb = a.fresh_out(), b.fresh_out()
    kernel(*a.args(ga))
    kernel(*b.args(gb))
    assert not torch.equal(a.block_table, b.block_table)
    assert same_bits(ga, gb)


def test_out_of_contract_bytes_do_not_fault(kernel) -> None:
    """NaN codes and scale bytes outside 105..254 give unspecified values, but no fault; rope is
    still a bit copy and nothing outside the written rows changes."""
    case = make_case([9], block_size=2, content="bytes", seed=5)
    data = case.k_cache.as_strided((case.k_cache.shape[0] * case.k_cache.stride(0),), (1,))
    gen = torch.Generator().manual_seed(0)
    keep = data.clone()
    data.copy_(torch.randint(0, 256, data.shape, generator=gen).to(torch.uint8))
    data[keep == SENTINEL] = SENTINEL
    got = case.fresh_out()
    kernel(*case.args(got))
    want = ref(*case.args(case.fresh_out()))
    assert same_bits(got[..., 448:], want[..., 448:])
    assert bool((got.view(torch.uint8)[~case.written_mask()] == SENTINEL).all())


def test_op_picks_triton_on_cpu() -> None:
    case = make_case([9, 23, 7], block_size=64)
    got = case.fresh_out()
    with KeyLedger() as ledger:
        op(*case.args(got))
    assert same_bits(got, ref(*case.args(case.fresh_out())))
    assert list(ledger.requested) == ["DequantGatherTriton"]


def test_zero_requests_return_immediately(kernel) -> None:
    case = make_case([], block_size=64)
    with KeyLedger() as ledger, JitMonitor("error"):
        assert kernel(*case.args()) is case.out
    assert ledger.requested == {}
