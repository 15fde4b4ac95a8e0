"""The compressor rule checker (spec §2.12, revised): each clause can fail, and conforming cases pass."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4kit.formats.bits import clog2
from dsv4kit.formats.state_cache import pool_windows, rmsnorm
from dsv4kit.testing import (
    ALLOWANCE,
    bf16_ulp,
    boundary_blocks,
    check_compressor_rule,
    e2m1_step,
    e4m3_step,
    step_budget,
    term_magnitudes,
)


def test_grid_steps() -> None:
    v = torch.tensor([0.0, 2.0**-10, 2.0**-6, 1.0, 1.99, 2.0, 17.0, 448.0, 1e4])
    assert e4m3_step(v).tolist() == [2**-9, 2**-9, 2**-9, 2**-3, 2**-3, 2**-2, 2.0, 32.0, 32.0]
    ulps = bf16_ulp(torch.tensor([1.0, 1.5, 2.0, -3.0, 0.0])).tolist()
    assert ulps == [2**-7, 2**-7, 2**-6, 2**-6, 2**-133]
    assert e2m1_step(torch.tensor([0.25, 1.99, 2.0, 3.5, 4.0, 6.0])).tolist() == [0.5, 0.5, 1, 1, 2, 2]
    assert step_budget(100) == 4 and step_budget(4096) == 5 and step_budget(512 * 513) == 263


def test_identical_rows_conform_and_count_as_bit_identical() -> None:
    b = torch.randn(64, 512).bfloat16().float()
    r = check_compressor_rule(b.clone(), b, b.abs(), bf16_ulp)
    assert r.ok and r.bit_identical == r.n == 64 * 512 and r.used_step == 0
    z = torch.zeros(8)
    r = check_compressor_rule(-z, z, z, bf16_ulp)                # +0 and -0 compare equal
    assert r.ok and r.bit_identical == 8


def test_one_step_passes_two_steps_fail() -> None:
    b = torch.ones(1000)
    a = b.clone()
    a[3] = 1 + 2**-7                                             # one bf16 step
    r = check_compressor_rule(a, b, torch.zeros_like(b), bf16_ulp)
    assert r.ok and r.used_step == 1 and r.bit_identical == 999
    a[5] = 1 + 2**-6                                             # two steps, no allowance
    r = check_compressor_rule(a, b, torch.zeros_like(b), bf16_ulp)
    assert not r.ok and r.violations == 1 and "element 5" in r.first_violation
    with pytest.raises(AssertionError, match="compressor rule FAILS"):
        r.assert_ok()


def test_the_allowance_covers_a_cancelling_column() -> None:
    """The revision's case: exact pooled value -2.25e-7 from terms of magnitude P = 0.42."""
    b = torch.tensor([-2.25e-7], dtype=torch.float64)
    m = torch.tensor([0.42], dtype=torch.float64)
    a = b + 20 * bf16_ulp(b)                                     # many bf16 steps of its own binade
    assert float((a - b).abs()) < ALLOWANCE * 0.42
    r = check_compressor_rule(a, b, m, bf16_ulp)
    assert r.ok and r.used_step == 0 and r.within_allowance == 1
    assert not check_compressor_rule(a, b, torch.zeros_like(m), bf16_ulp).ok   # without it: fails


def test_the_step_budget() -> None:
    b = torch.ones(1000)
    a = b.clone()
    a[:4] = 1 + 2**-7
    assert check_compressor_rule(a, b, torch.zeros_like(b), bf16_ulp).ok
    a[:5] = 1 + 2**-7
    r = check_compressor_rule(a, b, torch.zeros_like(b), bf16_ulp)
    assert not r.ok and r.used_step == 5 and r.budget == 4 and r.violations == 0


def test_nan_never_passes() -> None:
    b = torch.ones(16)
    a = b.clone()
    a[0] = float("nan")
    r = check_compressor_rule(a, b, torch.ones_like(b), bf16_ulp)
    assert not r.ok and r.violations == 1


def test_scales_and_boundary_blocks() -> None:
    # Two blocks of 64 e4m3 values; block 1's scale differs between kernel and reference.
    b = torch.full((2, 64), 3.0)
    sa = torch.tensor([[1.0], [2.0]]).expand(2, 64)
    sb = torch.tensor([[1.0], [1.0]]).expand(2, 64)
    a = b.clone()
    a[1, :10] = 3.25                             # one step of the coarser grid: 1.625 x 2, step 0.125 x 2
    plain = check_compressor_rule(a, b, torch.zeros_like(b), e4m3_step, scale_a=sa, scale_b=sb)
    assert not plain.ok and plain.scale_mismatches == 64          # a scale may differ only at a boundary
    edge = torch.tensor([[False], [True]]).expand(2, 64)
    r = check_compressor_rule(a, b, torch.zeros_like(b), e4m3_step, scale_a=sa, scale_b=sb, boundary=edge)
    assert r.ok and r.used_step == 0 and r.scale_mismatches == 0  # boundary elements are not counted


def test_boundary_blocks_are_the_amaxes_next_to_a_power_of_two() -> None:
    def q8(amax: torch.Tensor) -> torch.Tensor:
        return clog2((torch.maximum(amax, torch.tensor(1e-4)) / 448).float())

    # bf16(449 (1 -+ 1e-6)) = 448 / 450: the Q8 exponent steps at 448 = 448 * 2**0; 56.125 likewise
    # at 56 = 448 * 2**-3. A block amax of exactly 448 rounds to 448 both ways: not a boundary.
    amax = torch.tensor([449.0, 448.0, 448.0 * 1.5, 56.125, 0.01, 100.0])
    assert boundary_blocks(amax, q8).tolist() == [True, False, False, True, False, False]


def test_term_magnitudes_match_the_definition() -> None:
    g = torch.Generator().manual_seed(0)
    n, w, d = 3, 8, 128
    k = torch.randn(n, w, d, generator=g)
    s = torch.randn(n, w, d, generator=g)
    s[0, :4] = float("-inf")                                      # the first C4 boundary: rows 4..7
    weight = torch.randn(d, generator=g).bfloat16()
    cs = torch.rand(n, 64, generator=g) * 2 - 1
    m = term_magnitudes(k, s, weight, 1e-6, cs)
    # by hand, row 0, a nope dim and one RoPE pair
    wts = torch.softmax(s[0].double(), dim=0)
    c = (wts * k[0].double()).sum(0)
    rr = 1 / math.sqrt(float((c * c).mean()) + 1e-6)
    nd = rr * weight.double().abs() * (wts * k[0].double().abs()).sum(0)
    assert torch.allclose(m[0, :64], nd[:64], rtol=1e-12)
    e, o, i = d - 64, d - 63, 0
    ci, si = abs(float(cs[0, i])), abs(float(cs[0, 32 + i]))
    assert math.isclose(float(m[0, e]), ci * float(nd[e]) + si * float(nd[o]), rel_tol=1e-12)
    assert math.isclose(float(m[0, o]), ci * float(nd[o]) + si * float(nd[e]), rel_tol=1e-12)
    assert torch.equal(term_magnitudes(k, s, weight, 1e-6, None)[:, -64:] > 0, torch.ones(n, 64, dtype=bool))


def test_two_conforming_poolings_agree_under_the_rule() -> None:
    """fp32 pooling (the kit's reference) vs float64 pooling, normalized and rounded to bf16, with
    every 7th column made to cancel (pooled value ~0 from terms of magnitude ~1): the step-only
    first version of the rule fails this pair of conforming implementations, the revised passes."""
    g = torch.Generator().manual_seed(7)
    n, w, d = 513, 8, 512
    k = torch.randn(n, w, d, generator=g)
    s = torch.randn(n, w, d, generator=g)
    wts = torch.softmax(s.double(), dim=1)
    kc = k[:, :, ::7].double()
    k[:, :, ::7] = (kc - (wts[:, :, ::7] * kc).sum(1, keepdim=True)).float()
    weight = torch.ones(d).bfloat16()
    y32 = rmsnorm(pool_windows(k, s), weight, 1e-6)
    c64 = pool_windows(k.double(), s.double())
    y64 = (c64 / torch.sqrt((c64 * c64).mean(-1, keepdim=True) + 1e-6)).float()
    a, b = y32.bfloat16().float(), y64.bfloat16().float()
    r = check_compressor_rule(a, b, term_magnitudes(k, s, weight, 1e-6), bf16_ulp)
    assert r.ok, r.summary()
    assert r.bit_identical > 0.8 * r.n                    # the cancelling columns are the exceptions
    assert not check_compressor_rule(a, b, torch.zeros_like(a), bf16_ulp).ok   # no allowance: fails


def test_shapes_are_checked() -> None:
    from dsv4kit.errors import KernelInputError

    with pytest.raises(KernelInputError, match="check_compressor_rule: m: expected shape"):
        check_compressor_rule(torch.ones(4), torch.ones(4), torch.ones(3), bf16_ulp)
