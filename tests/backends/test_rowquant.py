"""rowquant, the backends example: reference, Triton interpreter bit-exactness, keys, bad input."""

import pytest
import torch

from dsv4kit.backends.triton import int_class
from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.formats.bits import clog2
from dsv4kit.jit import JitMonitor, WarmupRegistry
from dsv4kit.kernels.rowquant import (
    COARSEN_AT,
    SPEC,
    RowQuantConfig,
    rowquant_reference,
)
from dsv4kit.kernels.rowquant.cases import REGIMES, assert_bit_exact, bits, regime
from dsv4kit.platform import cpu_platform, use_platform

ARCHS = ("sm_90a", "sm_100a")




# --------------------------------------------------------------------------- the reference


def test_reciprocal_multiply_gives_the_division_exponent_for_every_bf16():
    # The kernels compute fl(a * fl(1/448)); the reference fl(a / 448). Spec §2.1 says both give
    # the same clog2 for bf16-valued amax: check every positive finite bf16 (and the floor).
    u = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    a = torch.maximum(u, torch.tensor(1e-4))
    inv = torch.tensor(1.0) / torch.tensor(448.0)
    assert torch.equal(clog2(a / torch.full_like(a, 448.0)), clog2(a * inv))


@pytest.mark.parametrize("name", REGIMES)
def test_reference_agrees_with_an_independent_oracle(name):
    # Oracle: frexp for the exponent and torch's own RNE float8 cast for the codes.
    x = regime(name, 4, 256, seed=1)
    q, s = rowquant_reference(x)
    blocks = x.float().view(4, 2, 128)
    a = torch.maximum(blocks.abs().amax(-1), torch.tensor(1e-4))
    mant, ex = torch.frexp(a / 448)
    e = torch.where(mant == 0.5, ex - 1, ex)
    assert torch.equal(s, torch.exp2(e.float()))
    want = (blocks / torch.exp2(e.float())[..., None]).to(torch.float8_e4m3fn).view(4, 256)
    assert torch.equal(bits(q), bits(want))
    assert int(bits(s).min()) >= (105 << 23)  # D1: scale exponent >= -22


# --------------------------------------------------------------------------- Triton interpreter


@pytest.mark.parametrize("name", REGIMES)
@pytest.mark.parametrize("m, n", [(1, 128), (5, 256), (3, 512)])
def test_triton_interpreter_is_bit_exact(rq_triton, name, m, n):
    x = regime(name, m, n, seed=m * n)
    with JitMonitor("error"):
        assert_bit_exact(rq_triton(x), rowquant_reference(x))


def test_triton_interpreter_coarsened_and_strided(rq_triton):
    x = regime("normal", COARSEN_AT + 3, 128, seed=3)  # 4 rows per program, a partial last program
    with JitMonitor("error"):
        assert_bit_exact(rq_triton(x), rowquant_reference(x))
        wide = regime("outlier", 9, 640, seed=4)
        view = wide[:, :512]  # row stride 640: a multiple of 16, so the contiguous key serves it
        assert rq_triton.dispatch(512, view.stride(0), 9) == rq_triton.dispatch(512, 512, 9)
        assert_bit_exact(rq_triton(view), rowquant_reference(view.contiguous()))


def test_unwarmed_stride_class_raises_with_the_nearest_key(rq_triton):
    view = torch.zeros(4, 520, dtype=torch.bfloat16)[:, :512]  # row stride 520: class "other"
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError) as info:
        rq_triton(view)
    err = info.value
    assert err.key == rq_triton.dispatch(512, 520, 4)
    assert err.nearest == rq_triton.dispatch(512, 512, 4)
    assert err.diff == {"x_stride_class": ("div16", "other")}
    assert "differs in x_stride_class: warmed div16, requested other" in str(err)


def test_a_single_row_with_any_stride_uses_the_warmed_key(rq_triton):
    # torch lets a size-1 dim carry any stride; Triton would specialize on it (132 is "other").
    wide = torch.zeros(1, 132, dtype=torch.bfloat16)
    wide[:, :128] = regime("crafted", 1, 128)
    row = wide[:, :128]
    assert row.stride(0) == 132 and int_class(132) == "other"
    with JitMonitor("error"):
        assert_bit_exact(rq_triton(row), rowquant_reference(row.contiguous()))


def test_empty_input_returns_without_dispatch(rq_triton):
    with JitMonitor("error"):
        q, s = rq_triton(torch.zeros(0, 384, dtype=torch.bfloat16))  # width 384 was never warmed
    assert q.shape == (0, 384) and q.dtype == torch.float8_e4m3fn and s.shape == (0, 3)


@pytest.mark.parametrize("make, message", [
    (lambda: torch.zeros(2, 128), "x: expected dtype bfloat16, got float32"),
    (lambda: torch.zeros(128, dtype=torch.bfloat16), "x: expected 2-D tensor"),
    (lambda: torch.zeros(2, 100, dtype=torch.bfloat16), "last dim a positive multiple of 128"),
    (lambda: torch.zeros(128, 2, dtype=torch.bfloat16).t(), "rows with unit stride"),
    (lambda: torch.zeros(2 * 128 + 8, dtype=torch.bfloat16)[1:257].view(2, 128), "16-byte aligned"),
    (lambda: "x", "x: expected a torch.Tensor"),
])
def test_bad_input(rq_triton, make, message):
    with pytest.raises(KernelInputError, match=message):
        rq_triton(make())


# --------------------------------------------------------------------------- keys and warmup


def test_warmup_keys_cover_the_coarsen_switch():
    k = SPEC.kernel(device="cpu", platform=cpu_platform())
    keys = k.get_warmup_keys(RowQuantConfig(widths=(512,), max_tokens=8192))
    assert [(key.n_cols, key.x_stride_class, key.rows_per_program) for key in keys] == [
        (512, "div16", 1), (512, "div16", 4)]
    assert k.get_warmup_keys(RowQuantConfig(widths=(512,), max_tokens=COARSEN_AT - 1)) == keys[:1]


def test_registration_registers_the_kernel_the_runtime_selects():
    reg = WarmupRegistry()
    with use_platform(cpu_platform()), reg.activate():
        kernel = SPEC.register(RowQuantConfig(widths=(256,)))
        assert kernel is SPEC.kernel(device="cpu")
    assert list(reg.keys()) == ["RowQuantTriton"] and len(reg) == 2


@pytest.mark.parametrize("backend", ["triton", "cutedsl"])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_key_compiles_for_both_archs(aot_artifacts, backend, arch):
    arts = {key: a for (b, ar, key), a in aot_artifacts.items() if b == backend and ar == arch}
    assert len(arts) == 4
    for art in arts.values():
        assert art.backend == backend and art.target == arch
        assert f".target {arch}" in art.text["ptx"] and art.binary["cubin"][:4] == b"\x7fELF"
        assert 0 < art.info["registers"] <= 64 and art.info["spills"] == 0
