"""The Triton rounding helpers, exhaustively under the CPU interpreter, against the formats module.

Inputs are every fp32 value that is a bf16 (all 65 536 patterns) scaled into each helper's
domain, plus fp32 values one ulp around every grid midpoint, which is where RNE can go wrong;
for ``e2m1_magnitude`` (K2 and E5), every value the kernels can hand it. The CuTeDSL kernels
share the bf16 recipe; their bytes are checked on the GPU.
"""

import pytest
import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton_interpreter import _interpreted, _interpreting
from dsv4kit.formats.bits import bf16_round, e4m3_encode, e4m3_table
from dsv4kit.formats.mxfp4 import e2m1_encode
from dsv4kit.kernels.triton_numerics import e2m1_magnitude, round_bf16, round_e4m3

BLOCK = 4096


@triton.jit
def _apply(x_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    if OP == 0:
        tl.store(out_ptr + i, round_e4m3(x).to(tl.float8e4nv), mask=m)
    elif OP == 1:
        tl.store(out_ptr + i, e2m1_magnitude(x).to(tl.int32, bitcast=True), mask=m)
    else:
        tl.store(out_ptr + i, round_bf16(x), mask=m)


def run(op: int, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=out_dtype)
    with _interpreting():
        _interpreted(_apply)[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), OP=op, BLOCK=BLOCK)
    return out


def all_bf16() -> torch.Tensor:
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    return x[torch.isfinite(x)]


def around(points: torch.Tensor) -> torch.Tensor:
    """Each point and its fp32 neighbours."""
    up = torch.nextafter(points, torch.full_like(points, float("inf")))
    down = torch.nextafter(points, torch.full_like(points, -float("inf")))
    return torch.cat([points, up, down, -points, -up, -down])


def test_round_e4m3_matches_the_reference_encoder():
    grid = e4m3_table()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([all_bf16(), around(mids), around(grid)])
    x = x[x.abs() <= 448].contiguous()
    got = run(0, x, torch.float8_e4m3fn).view(torch.uint8)
    want = e4m3_encode(x)
    bad = got != want
    assert not bad.any(), f"{int(bad.sum())} differ, e.g. x={x[bad][:4].tolist()}"


def kernel_magnitudes() -> torch.Tensor:
    """Every |v| = |z| * 2^-e that K2 and E5 (``mxfp4_words``) can pass to ``e2m1_magnitude``: z a
    bf16 (any of the 65 536 patterns: 8 significant bits), 2^-e a power of two, |v| <= 6, as fp32
    (fl(): subnormal or 0 below 2^-126, where the kernels' product rounds the same way). That is 0
    and every ``(1 + k/128) * 2^E``; it holds each E2M1 threshold and its bf16 neighbours."""
    mant = 1 + torch.arange(128, dtype=torch.float64) / 128
    v = torch.cat([torch.zeros(1, dtype=torch.float64)] + [mant * 2.0**e for e in range(-160, 3)])
    v = v.to(torch.float32)
    return v[v <= 6].contiguous()


def test_e2m1_magnitude_matches_the_reference_encoder():
    v = kernel_magnitudes()
    # Each threshold and the bf16 values either side of it, also scaled into the subnormal range.
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]).to(torch.bfloat16).view(torch.int16)
    near = torch.cat([t - 1, t, t + 1]).view(torch.bfloat16).float()
    for x in torch.cat([near, near * 2.0**-130]).tolist():
        assert (v == x).any(), x
    code = run(1, v, torch.int32) - 0x55000000
    # The low byte is the code (what the packing adds); nothing else is set above it.
    assert int(code.min()) >= 0 and int(code.max()) == 7
    bad = code.to(torch.uint8) != e2m1_encode(v)
    assert not bad.any(), f"{int(bad.sum())} differ, e.g. v={v[bad][:4].tolist()}"


@pytest.mark.parametrize("seed", [0, 1])
def test_round_bf16_is_rne(seed):
    g = torch.Generator().manual_seed(seed)
    exps = torch.randint(-60, 60, (200_000,), generator=g).float()
    x = torch.randn(200_000, generator=g) * torch.exp2(exps)
    # Exact midpoints between neighbouring bf16 values: the bf16 bits plus half a bf16 ulp.
    mids = (all_bf16().view(torch.int32) + (1 << 15)).view(torch.float32)
    x = torch.cat([x, around(mids)]).contiguous()
    x = x[torch.isfinite(x) & (x.abs() < 3e38)]
    got = run(2, x, torch.float32)
    assert torch.equal(got.view(torch.int32), bf16_round(x).view(torch.int32))
