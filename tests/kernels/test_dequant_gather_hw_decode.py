"""K3 on sm_90a decodes e4m3 with the hardware conversion, in both backends (no GPU needed).

The GPU compile of each backend is read ahead of time, as warmup compiles it: every pair of code
bytes goes through one ``cvt.rn.f16x2.e4m3x2`` (SASS ``F2FP.F16.E4M3.UNPACK_B``), each f16 is
widened exactly (``cvt.f32.f16``) and scaled by one ``mul.rn.f32``, and nothing is left of the
integer decode the kernels had before (an integer -> float conversion for the subnormals,
``I2F``). Bit-exactness on the GPU is ``dsv4kit verify --families dequant_gather``'s; the Triton
interpreter's is ``test_dequant_gather_numerics.py``'s (the exhaustive byte x scale-byte table).
"""

from __future__ import annotations

import re
import subprocess
import tempfile

import pytest

from dsv4kit.bench_cli import sass_tool
from dsv4kit.kernels.dequant_gather import cutedsl as k3_cute
from dsv4kit.kernels.dequant_gather import triton as k3_triton
from dsv4kit.platform import cpu_platform

ARCH = "sm_90a"

#: e4m3 bytes one thread decodes per loop step of the compiled code: Triton's ``[ROWS, 8, 64]``
#: tile over ``NUM_WARPS`` warps (block 7, masked off, is decoded too); CuTeDSL's ``UNROLL`` rows
#: of 8 bytes.
BYTES_PER_THREAD = {
    "triton": k3_triton.ROWS * 8 * 64 // (k3_triton.NUM_WARPS * 32),
    "cutedsl": k3_cute.UNROLL * 8,
}


def _artifact(backend: str):
    cls = k3_triton.DequantGatherTriton if backend == "triton" else k3_cute.DequantGatherCuTeDSL
    kernel = cls(cpu_platform(ARCH))
    return kernel.compile_for(kernel.CompileKey(256, True), ARCH)


def _sass(cubin: bytes) -> str:
    tool = sass_tool()
    if tool is None:
        pytest.skip("no cuobjdump in this Triton install")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module", params=["triton", "cutedsl"])
def compiled(request):
    return request.param, _artifact(request.param)


def test_ptx_uses_the_hardware_e4m3_conversion(compiled) -> None:
    backend, art = compiled
    ptx = art.text["ptx"]
    assert f".target {ARCH}" in ptx
    pairs = BYTES_PER_THREAD[backend] // 2
    assert len(re.findall(r"\bcvt\.rn\.f16x2\.e4m3x2\b", ptx)) == pairs, backend   # two bytes each
    assert len(re.findall(r"\bcvt\.f32\.f16\b", ptx)) == 2 * pairs, backend        # exact widening
    assert len(re.findall(r"\bmul\.rn\.f32\b", ptx)) == 2 * pairs, backend         # the one scale product
    # No integer -> float conversion (the old subnormal path) and no other float arithmetic.
    assert not re.search(r"\bcvt\.rn\.f32\.[us]\d+\b", ptx), backend
    assert not re.search(r"\b(fma|mad|add|sub)\.(rn\.)?f32\b", ptx), backend


def test_sass_uses_the_hardware_e4m3_conversion(compiled) -> None:
    backend, art = compiled
    sass = _sass(art.binary["cubin"])
    pairs = BYTES_PER_THREAD[backend] // 2
    # Every nope pair, and at most the masked block 7's pairs besides (ptxas may drop those where
    # a thread's share of block 7 is never stored: Triton's one-warp tile).
    assert pairs * 7 // 8 <= len(re.findall(r"\bF2FP\.F16\.E4M3\.UNPACK_B\b", sass)) <= pairs, backend
    assert not re.search(r"\bI2F\b", sass), backend


@pytest.mark.parametrize("key", [(256, True), (64, False), (2, False)])
def test_triton_issues_every_load_of_a_tile_before_its_stores(key) -> None:
    """The rope row is loaded with the codes, not after the nope stores: a load below a store that
    Triton cannot prove apart stays below it, one dependent DRAM round trip more per tile."""
    kernel = k3_triton.DequantGatherTriton(cpu_platform(ARCH))
    ptx = kernel.compile_for(kernel.CompileKey(*key), ARCH).text["ptx"]
    body = ptx[ptx.index(".entry"):]
    assert "st.global" in body and body.rfind("ld.global") < body.find("st.global")
