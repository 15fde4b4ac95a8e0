"""The Triton store hooks round bf16 and e4m3 with the GPU's own casts, the interpreter with the
integer recipes of :mod:`dsv4kit.kernels.triton_numerics` (which the CPU tests compare with the
reference byte for byte; ``tests/backends/test_rowquant_hw_cvt.py`` checks that RNE and the
recipe agree on every value the cast can get). The GPU half is read here from sm_90a PTX; its
bytes are compared with the reference on a GPU by ``dsv4kit verify``."""

from __future__ import annotations

import re

import pytest

from dsv4kit.backends.triton import Const
from dsv4kit.kernels.encoders.spec import E1, E2, E3, E4, E5, key_encoder
from dsv4kit.kernels.encoders.triton import StoreRowsDsTriton, StoreRowsIndexerTriton, StoreRowsPlainTriton
from dsv4kit.platform import cpu_platform

CLASSES = (StoreRowsDsTriton, StoreRowsPlainTriton, StoreRowsIndexerTriton)
E4M3_CVT = "cvt.rn.satfinite.e4m3x2.f32"


@pytest.fixture(scope="module")
def ptx_by_encoder() -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for cls in CLASSES:
        k = cls(cpu_platform())
        for key in k.get_warmup_keys():
            out.setdefault(key_encoder(key), []).append(k.compile_for(key, "sm_90a").text["ptx"])
    return out


def test_every_encoder_has_keys(ptx_by_encoder) -> None:
    assert sorted(ptx_by_encoder) == [E1, E2, E3, E4, E5]


@pytest.mark.parametrize("enc", [E1, E2, E3, E4, E5])
def test_gpu_compiles_round_with_the_casts(ptx_by_encoder, enc) -> None:
    for ptx in ptx_by_encoder[enc]:
        # bf16(y): the hardware RNE conversion, and not the integer recipe's "+ 0x7FFF".
        assert re.search(r"cvt\.rn\.bf16(x2)?\.f32", ptx)
        assert not re.search(r", 32767;", ptx)
        # e4m3: the hardware conversion where the encoder has an e4m3 output (E1, E3, E4), and no
        # magic add of round_e4m3 (its constant 2**20 binade offset, 167772160 = 20 << 23).
        assert (E4M3_CVT in ptx) == (enc in (E1, E3, E4))
        assert "167772160" not in ptx and ".rz" not in ptx


def test_e5_takes_the_shared_mxfp4_recipe(ptx_by_encoder) -> None:
    """E5 runs :func:`~dsv4kit.kernels.triton_numerics.mxfp4_words` (K2's recipe) on bf16 pairs:
    one ``cvt.rn.bf16x2.f32`` per pair and no single-value cast, E2M1 by ``e2m1_magnitude`` (its
    RNE add of 2^43 - 2^23, ``0f54FFFFF0``), the sign bits by ``mul.hi`` with 0x100100 (1048832),
    and not the per-value recipe it replaced (``e2m1_code``, removed: its binade offset 22 << 23 =
    184549376); nothing may flush the subnormal products to zero."""
    for ptx in ptx_by_encoder[E5]:
        assert "cvt.rn.bf16x2.f32" in ptx and not re.search(r"cvt\.rn\.bf16\.f32", ptx)
        assert "0f54FFFFF0" in ptx
        assert re.search(r"mov\.b32\s+%r\d+, 1048832;", ptx) and "mul.hi.u32" in ptx
        assert "184549376" not in ptx and ".ftz" not in ptx


def test_only_the_interpreter_takes_the_integer_recipes() -> None:
    for cls in CLASSES:
        assert cls.params["HW_CVT"] == Const(True)
        k = cls(cpu_platform())
        key = k.get_warmup_keys()[0]
        assert k.interpreted_constexprs(key) == {"HW_CVT": False}
