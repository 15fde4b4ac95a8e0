"""The Triton compressors' encode step (K5, K6, K9; K8a, K8b) rounds bf16 and e4m3 with the GPU's
own casts, the interpreter with the integer recipes of :mod:`dsv4kit.kernels.triton_numerics`
(which the CPU tests compare with the reference). The GPU half is read here from sm_90a PTX, as
``test_encoders_hw_cvt.py`` does for the store hooks.

Keys: the warmup keys of every cache configuration (fp8_ds_mla, bf16, fp8 caches; fp8 and mxfp4
indexer caches), so every encoder E1..E5 each kernel can run; norm weight bf16 only (its dtype
changes a load, not the encode step), 8 compiles in all. K7 (``c128_compress``) encodes nothing.
"""

from __future__ import annotations

import re

import pytest

from dsv4kit.backends.triton import Const
from dsv4kit.kernels.c4_compress.spec import C4CompressConfig
from dsv4kit.kernels.c4_compress.triton import (
    C4CompressDsMlaTriton,
    C4CompressPlainTriton,
    IndexerCompressTriton,
)
from dsv4kit.kernels.c128_compress.spec import C128CompressConfig
from dsv4kit.kernels.c128_compress.triton import (
    C128CompressTriton,
    C128StoreDsMlaTriton,
    C128StorePlainTriton,
)
from dsv4kit.kernels.encoders.spec import E1, E2, E3, E4, E5, key_encoder
from dsv4kit.platform import cpu_platform

C4_CLASSES = (C4CompressDsMlaTriton, C4CompressPlainTriton, IndexerCompressTriton)
C128_CLASSES = (C128StoreDsMlaTriton, C128StorePlainTriton)
C4_CONFIGS = [C4CompressConfig(cache_dtype=c, indexer_cache_dtype=i)
              for c, i in (("fp8_ds_mla", "fp8"), ("bf16", "mxfp4"), ("fp8", "fp8"))]
C128_CONFIGS = [C128CompressConfig(cache_dtype=c) for c in ("fp8_ds_mla", "bf16", "fp8")]
E4M3_CVT = "cvt.rn.satfinite.e4m3x2.f32"


def _keys(cls, configs) -> list:
    k = cls(cpu_platform())
    return list(dict.fromkeys(key for cfg in configs for key in k.get_warmup_keys(cfg)))


@pytest.fixture(scope="module")
def ptx_by_kernel() -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for classes, configs in ((C4_CLASSES, C4_CONFIGS), (C128_CLASSES, C128_CONFIGS)):
        for cls in classes:
            k = cls(cpu_platform())
            for key in _keys(cls, configs):
                ptx = k.compile_for(key, "sm_90a").text["ptx"]
                out.setdefault((cls.__name__, key_encoder(key)), []).append(ptx)
    return out


def test_every_encoder_of_every_kernel_is_compiled(ptx_by_kernel) -> None:
    assert sorted(ptx_by_kernel) == sorted([
        ("C4CompressDsMlaTriton", E1), ("C4CompressPlainTriton", E2), ("C4CompressPlainTriton", E3),
        ("IndexerCompressTriton", E4), ("IndexerCompressTriton", E5),
        ("C128StoreDsMlaTriton", E1), ("C128StorePlainTriton", E2), ("C128StorePlainTriton", E3),
    ])


@pytest.mark.parametrize("enc", [E1, E2, E3, E4, E5])
def test_gpu_compiles_round_with_the_casts(ptx_by_kernel, enc) -> None:
    for (name, e), ptxs in ptx_by_kernel.items():
        if e != enc:
            continue
        for ptx in ptxs:
            # bf16(y): the hardware RNE conversion, and not round_bf16's "+ 0x7FFF".
            assert re.search(r"cvt\.rn\.bf16(x2)?\.f32", ptx), name
            assert not re.search(r", 32767;", ptx), name
            # e4m3: the hardware conversion exactly where the encoder has an e4m3 output, and no
            # magic add of round_e4m3 (its 2**20 binade offset, 167772160 = 20 << 23).
            assert (E4M3_CVT in ptx) == (enc in (E1, E3, E4)), name
            assert "167772160" not in ptx and ".rz" not in ptx, name


def test_only_the_interpreter_takes_the_integer_recipes() -> None:
    for cls in (*C4_CLASSES, *C128_CLASSES):
        assert cls.params["HW_CVT"] == Const(True)
        k = cls(cpu_platform())
        key = _keys(cls, C4_CONFIGS if cls in C4_CLASSES else C128_CONFIGS)[0]
        assert k.interpreted_constexprs(key) == {"HW_CVT": False}
    # K7 rounds nothing; its interpreter overrides stay the column-width ones.
    k7 = C128CompressTriton(cpu_platform())
    assert "HW_CVT" not in k7.params
    assert k7.interpreter_constexprs(k7.get_warmup_keys()[0]) == {"BD_TILE": 512, "BD_STREAM": 512}
