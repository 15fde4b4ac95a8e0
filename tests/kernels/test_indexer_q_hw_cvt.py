"""The Triton indexer-Q kernels (K1, K2) round bf16 and e4m3 with the GPU's own casts and the CPU
interpreter with the integer recipes of :mod:`dsv4kit.kernels.triton_numerics` (``HW_CVT``), and
K2's E2M1 codes come from fp32 arithmetic that both run alike (``triton_numerics.e2m1_magnitude``,
which E5 shares). Here: the casts and not the recipes in the sm_90a PTX, the interpreter's switch,
and K2 bit for bit against the reference on every bf16 pattern (the E2M1 step alone, on every
value it can be handed, is in ``test_triton_numerics.py``). The GPU bytes themselves are checked
by ``dsv4kit verify --families indexer_q``."""

from __future__ import annotations

import re

import pytest
import torch

from dsv4kit.backends.triton import Const
from dsv4kit.kernels.indexer_q import IndexerQConfig, indexer_q_mxfp4_reference
from dsv4kit.kernels.indexer_q.triton import INTERPRETER_ROWS, IndexerQFp8Triton, IndexerQMxfp4Triton
from dsv4kit.platform import cpu_platform

CLASSES = {"fp8": IndexerQFp8Triton, "mxfp4": IndexerQMxfp4Triton}
E4M3_CVT = "cvt.rn.satfinite.e4m3x2.f32"


@pytest.fixture(scope="module")
def ptx_by_format() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for fmt, cls in CLASSES.items():
        k = cls(cpu_platform())
        keys = k.get_warmup_keys(IndexerQConfig(indexer_cache_dtype=fmt))
        assert len(keys) == 4
        out[fmt] = [k.compile_for(key, "sm_90a").text["ptx"] for key in keys]
    return out


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_gpu_compiles_round_with_the_casts(ptx_by_format, fmt) -> None:
    for ptx in ptx_by_format[fmt]:
        # RoPE's bf16: the hardware RNE conversion (K2: two per cvt.rn.bf16x2), not round_bf16's
        # "+ 0x7FFF" (the recipe compiles to "add.s32 ..., 32767;").
        assert re.search(r"cvt\.rn\.bf16x2\.f32" if fmt == "mxfp4" else r"cvt\.rn\.bf16(x2)?\.f32", ptx)
        assert not re.search(r", 32767;", ptx)
        # K1's e4m3: the hardware conversion, and no magic add of round_e4m3 (its 2**20 binade
        # offset, 167772160 = 20 << 23). K2 has no e4m3 at all.
        assert (E4M3_CVT in ptx) == (fmt == "fp8")
        assert "167772160" not in ptx
        # K2's E2M1 needs fp32 subnormal products (v * 2^-126): nothing may flush them.
        assert ".ftz" not in ptx


def test_only_the_interpreter_takes_the_integer_recipes() -> None:
    for fmt, cls in CLASSES.items():
        assert cls.params["HW_CVT"] == Const(True)
        k = cls(cpu_platform())
        key = k.get_warmup_keys(IndexerQConfig(indexer_cache_dtype=fmt))[0]
        assert k.interpreted_constexprs(key) == {"HW_CVT": False, "ROWS": INTERPRETER_ROWS}


# --------------------------------------------------------------------------- K2, every bf16 pattern

#: Block exponents relative to the binade of the block's values: v lands in [2^d, 2^(d+1)).
OFFSETS = (2, 1, 0, -1, -2, -3, -9, -40)


def every_pattern_case() -> tuple[torch.Tensor, ...]:
    """K2 inputs whose 32-dim blocks hold all finite bf16 patterns (both signs, +-0, subnormals),
    31 values of one bf16 exponent field per block plus one 6 * 2^k setting the block exponent
    (``OFFSETS`` per field, k clamped to finite bf16), in nope and rope dims alike. cos = 1, sin =
    0 leave the rope values as they are (up to the sign of a zero)."""
    h = torch.arange(2**16, dtype=torch.int32)
    field = (h >> 7) & 0xFF
    blocks = []
    for f in range(255):                                    # 255: inf / NaN
        vals = h[field == f].to(torch.int16).view(torch.bfloat16).float()
        binade = max(f, 1) - 127
        for d in OFFSETS:
            k = min(binade - d, 125)                         # 6 * 2^125 is the largest finite setter
            padded = torch.cat([vals, vals[: (-len(vals)) % 31]]).reshape(-1, 31)
            setter = torch.full((padded.shape[0], 1), 6.0 * 2.0**k)
            setter[1::2] *= -1
            blocks.append(torch.cat([padded, setter], dim=1))
    z = torch.cat(blocks)
    z = z[torch.randperm(len(z), generator=torch.Generator().manual_seed(0))]
    # Move each block's setter to a varying slot (even and odd dims).
    n = torch.arange(len(z))
    z[n, 31], z[n, n % 32] = z[n, n % 32], z[:, 31].clone()
    rows = -(-len(z) // 4)
    t = -(-rows // 64)
    z = torch.cat([z, torch.zeros(t * 64 * 4 - len(z), 32)]).reshape(t, 64, 128)
    cs = torch.cat([torch.ones(1, 32), torch.zeros(1, 32)], dim=1)
    weights = torch.randn(t, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    return torch.zeros(t, dtype=torch.int64), z.to(torch.bfloat16), cs, weights


def test_k2_is_bit_exact_on_every_bf16_pattern() -> None:
    args = every_pattern_case()
    got = IndexerQMxfp4Triton(cpu_platform())(*args)
    want = indexer_q_mxfp4_reference(*args)
    for g, w in zip(got, want, strict=True):       # q_packed, q_scale, weights_out: as bits
        assert g.dtype == w.dtype and g.shape == w.shape
        diff = g.view(torch.uint8) != w.view(torch.uint8)
        assert not diff.any(), f"{int(diff.sum())} of {diff.numel()} bytes differ, first {diff.nonzero()[0]}"
    # The blocks reach both ends of the scale bytes and every code in both nibbles.
    scale_bytes = want[1].view(torch.uint8)
    assert int(scale_bytes.min()) == 1 and int(scale_bytes.max()) >= 252
    assert set((want[0] & 15).unique().tolist()) == set((want[0] >> 4).unique().tolist()) == set(range(16))
