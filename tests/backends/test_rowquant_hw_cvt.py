"""rowquant's e4m3 rounding: the hardware conversion on GPU compiles, the integer recipe under
the interpreter, and the two give the same byte for every value the kernel can round.

The GPU half can only be read here (PTX of the ahead-of-time compiles); its bytes are compared
with the reference on a GPU by ``benchmarks/verify_backends.py``.
"""

import pytest
import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const
from dsv4kit.backends.triton_interpreter import _interpreted, _interpreting
from dsv4kit.formats.bits import e4m3_encode, e4m3_table
from dsv4kit.kernels.rowquant.triton import RowQuantTriton, _e4m3_code, _rowquant_kernel

ARCHS = ("sm_90a", "sm_100a")
HW_CVT = "cvt.rn.satfinite.e4m3x2.f32"
N = 4096


@pytest.mark.parametrize("backend", ["triton", "cutedsl"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_compiles_round_with_the_hardware_conversion(aot_artifacts, backend, arch):
    arts = [a for (b, ar, _), a in aot_artifacts.items() if b == backend and ar == arch]
    assert len(arts) == 4
    for art in arts:
        ptx = art.text["ptx"]
        assert HW_CVT in ptx
        # No detour through f16 (a second rounding), no other rounding mode, and no integer
        # recipe left: its RNE add of 0x7FFFF and its subnormal shift ``141 - exp`` are gone.
        assert "e4m3x2.f16x2" not in ptx and ".rz" not in ptx
        assert ", 524287;" not in ptx and " 141, %r" not in ptx


def test_only_the_interpreter_uses_the_integer_recipe():
    assert RowQuantTriton.params["HW_CVT"] == Const(True)
    k = RowQuantTriton.__new__(RowQuantTriton)
    key = RowQuantTriton.CompileKey(n_cols=512, x_stride_class="div16", rows_per_program=4)
    assert k.interpreted_constexprs(key) == {"HW_CVT": False}
    # A raw launch that names only ROWS and BLOCK (benchmarks/verify_backends.py) gets the GPU path.
    hw = next(p for p in _rowquant_kernel.params if p.name == "HW_CVT")
    assert hw.is_constexpr and hw.default is True


@triton.jit
def _codes(y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    y = tl.load(y_ptr + i, mask=m, other=0.0)
    tl.store(out_ptr + i, _e4m3_code(y.to(tl.int32, bitcast=True)).to(tl.uint8), mask=m)


def _around(points: torch.Tensor) -> torch.Tensor:
    up = torch.nextafter(points, torch.full_like(points, float("inf")))
    down = torch.nextafter(points, torch.full_like(points, -float("inf")))
    return torch.cat([points, up, down, -points, -up, -down])


def test_integer_recipe_equals_rne_conversion_for_every_scaled_value():
    # y = x * 2**-e with x bf16 is itself a bf16 value, so every finite bf16 with |y| <= 448 is
    # every y the kernel rounds; the midpoints of the e4m3 grid and their neighbours are where RNE
    # goes wrong. Oracle for cvt.rn.satfinite (IEEE RNE, sign of zero kept, no saturation
    # reached): torch's float8_e4m3fn cast; and the reference encoder.
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    grid = e4m3_table()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    y = torch.cat([x[torch.isfinite(x)], _around((grid[1:] + grid[:-1]) / 2), _around(grid),
                   torch.tensor([-0.0, -1e-9, -(2.0**-10)])])
    y = y[y.abs() <= 448].contiguous()
    out = torch.empty(y.shape, dtype=torch.uint8)
    with _interpreting():
        _interpreted(_codes)[(triton.cdiv(y.numel(), N),)](y, out, y.numel(), BLOCK=N)
    rne = y.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(out, rne)
    assert torch.equal(out, e4m3_encode(y))
    assert int(rne[-3:].min()) == int(rne[-3:].max()) == 0x80  # negatives rounding to zero: 0x80
