"""Indexer-Q (K1 FP8, K2 MXFP4): Triton bit-exact under the interpreter, keys, warmup, bad input."""

import re

import pytest
import torch

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.jit import JitMonitor, KeyLedger, WarmupRegistry
from dsv4kit.kernels.indexer_q import (
    SPEC,
    IndexerQConfig,
    indexer_q_fp8_reference,
    indexer_q_mxfp4_reference,
    indexer_q_rope_quant,
)
from dsv4kit.kernels.indexer_q.cases import REGIMES, make_case
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.indexer_q.triton import IndexerQFp8Triton, IndexerQMxfp4Triton
from dsv4kit.platform import cpu_platform

FLASH_KEYS = [(cs, c) for cs in ("float32", "bfloat16") for c in (1, 4)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_bit_exact(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        diff = (_bits(g) != _bits(w))
        assert not diff.any(), f"{int(diff.sum())} of {diff.numel()} differ, first at {diff.nonzero()[0]}"


REFERENCE = {"fp8": indexer_q_fp8_reference, "mxfp4": indexer_q_mxfp4_reference}


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("cs_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 7, 32, 257, 511, 512, 513])
def test_triton_bit_exact_on_spec_shapes(fmt, cs_dtype, t):
    case = make_case(t, cs_dtype, "normal", seed=t)
    got = indexer_q_rope_quant(*case.args(), cache_format=fmt)
    assert_bit_exact(got, REFERENCE[fmt](*case.args()))


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
@pytest.mark.parametrize("regime", [r for r in REGIMES if r != "normal"])
def test_triton_bit_exact_on_edge_regimes(fmt, regime):
    case = make_case(9, torch.float32 if regime != "crafted" else torch.bfloat16, regime, seed=3)
    got = indexer_q_rope_quant(*case.args(), cache_format=fmt, softmax_scale=0.37, head_scale=3.0)
    assert_bit_exact(got, REFERENCE[fmt](*case.args(), softmax_scale=0.37, head_scale=3.0))


def test_zero_heads_encode_to_zero_bytes_and_floor_scale():
    case = make_case(2, regime="normal")
    case.index_q[0, 0] = 0.0
    case.index_q[0, 1] = -0.0
    q, w = indexer_q_rope_quant(*case.args())
    assert (q[0, 0, :64].view(torch.uint8) == 0).all()
    assert (q[0, 1, :64].view(torch.uint8) == 0x80).all()  # -0 keeps its sign (nope dims untouched by RoPE)
    # Rotated zeros are +-0 by the sign rules of fl(0*c) -/+ fl(0*s): bytes 0x00 or 0x80 only.
    assert set(q[0, :2, 64:].view(torch.uint8).unique().tolist()) <= {0, 0x80}
    ss, hs = torch.tensor(128**-0.5), torch.tensor(64**-0.5)
    want = ((case.index_weights[0, 0].float() * 2.0**-22) * ss) * hs  # D1 floor: e = -22
    assert w[0, 0].item() == want.item()


@pytest.mark.parametrize("cls", [IndexerQFp8Triton, IndexerQMxfp4Triton])
def test_kernel_rows_per_program_does_not_change_bytes(cls, monkeypatch):
    """The interpreter's 256-row programs and the GPU's one-token programs write the same bytes."""
    case = make_case(3, regime="crafted", seed=11)
    kernel = cls(cpu_platform())
    fast = kernel(*case.args())
    for rows in (1, 8, 32, 64):  # the GPU launch shapes (64: one token per program); 256 spans tokens
        monkeypatch.setattr(cls, "rows_per_program", lambda self, key, rows=rows: rows)
        monkeypatch.setattr(cls, "interpreter_constexprs",
                            lambda self, key, rows=rows: {"ROWS": rows})
        assert_bit_exact(kernel(*case.args()), fast)


def test_flash_warmup_keys_follow_the_spec():
    fp8 = IndexerQFp8Triton(cpu_platform())
    keys = fp8.get_warmup_keys(IndexerQConfig())
    assert [(k.cos_sin_dtype, k.coarsen) for k in keys] == FLASH_KEYS
    assert all((k.head_dim, k.rope_dim, k.num_heads) == (128, 64, 64) for k in keys)
    # The MXFP4 kernel has no keys for an FP8 indexer cache, and vice versa.
    assert IndexerQMxfp4Triton(cpu_platform()).get_warmup_keys(IndexerQConfig()) == []
    assert fp8.get_warmup_keys(IndexerQConfig(indexer_cache_dtype="mxfp4")) == []
    mx = IndexerQMxfp4Triton(cpu_platform()).get_warmup_keys(IndexerQConfig(indexer_cache_dtype="mxfp4"))
    assert [(k.cos_sin_dtype, k.coarsen) for k in mx] == FLASH_KEYS


def test_small_batch_warmup_misses_coarsen_4():
    """Spec trap 2: tracing only batches below 512 tokens never produces the coarsen-4 keys."""
    keys = IndexerQFp8Triton(cpu_platform()).get_warmup_keys(IndexerQConfig(max_num_batched_tokens=511))
    assert {k.coarsen for k in keys} == {1}


def test_registration_picks_one_kernel_and_dedups_layers():
    reg = WarmupRegistry()
    with reg.activate():
        for _ in range(21):  # the C4 layers of DSv4-Flash
            SPEC.register(IndexerQConfig(), variant="fp8", platform=cpu_platform())
    assert list(reg.registrations) == ["IndexerQFp8Triton"]
    assert reg.registrations["IndexerQFp8Triton"].count == 21 and len(reg) == 4


def test_zero_compiles_after_warmup_and_the_cos_sin_trap():
    IndexerQFp8Triton.clear_cache()
    kernel = IndexerQFp8Triton(cpu_platform())
    # Warm only the fp32 cache keys: what a warmup that forgot trap 1 would do.
    only_fp32 = [k for k in kernel.get_warmup_keys(IndexerQConfig()) if k.cos_sin_dtype == "float32"]
    with KeyLedger() as ledger:
        kernel.warmup(keys=only_fp32)
        with JitMonitor("error") as mon:
            for t in (1, 600):
                kernel(*make_case(t, torch.float32, seed=t).args())
            assert mon.events == []
            with pytest.raises(UnwarmedKeyError) as exc:
                kernel(*make_case(2, torch.bfloat16).args())
    assert exc.value.diff == {"cos_sin_dtype": ("float32", "bfloat16")}
    assert "cos_sin_dtype: warmed float32, requested bfloat16" in str(exc.value)
    assert ledger.missed() == {"IndexerQFp8Triton": [exc.value.key]}
    IndexerQFp8Triton.clear_cache()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_every_triton_key_compiles_ahead_of_time(arch):
    for cls, fmt in ((IndexerQFp8Triton, "fp8"), (IndexerQMxfp4Triton, "mxfp4")):
        kernel = cls(cpu_platform(arch))
        for key in kernel.get_warmup_keys(IndexerQConfig(indexer_cache_dtype=fmt)):
            art = kernel.compile_for(key, arch)
            assert art.target == arch and f".target {arch}" in art.text["ptx"]
            assert art.info["registers"] > 0 and art.info["spills"] == 0
            assert "fma" not in art.text["ptx"]  # spec §2.1 rule 1


# PTX facts of each CuTeDSL key's thread/lane mapping (dsv4kit/kernels/indexer_q/cutedsl.py),
# per thread: one layout, slots of 4 rows; coarsen 1 (decode) one slot a warp, coarsen 4 (prefill)
# four. Per slot a lane loads 8 nope and 8 rope dims (two 16-byte loads), rotates 4 pairs and stores
# two 8-byte (K1) or 4-byte (K2) code words; K1 butterflies two slots' amaxes in one word (3 shuffles
# a pair, or for a lone slot), K2 both block maxima of a slot (2 shuffles) plus one shuffle for the
# scale words; one weight store per thread.
CUTE_PTX = {
    1: {"ld.global.v4.b32": 2, "add.rn.f32": 4, "cvt.rn.bf16x2.f32": 4,
        "fp8": {"shfl.sync.bfly": 3, "cvt.rn.satfinite.e4m3x2.f32": 8, "st.global.b32": 1,
                "st.global.v2": 2},
        "mxfp4": {"shfl.sync.bfly": 3, "fma.rn.bf16x2": 8, "mul.rn.bf16x2": 8, "st.global.b32": 4,
                  "st.global.b16": 0, "st.global.b8": 0}},
    4: {"ld.global.v4.b32": 8, "add.rn.f32": 16, "cvt.rn.bf16x2.f32": 16,
        "fp8": {"shfl.sync.bfly": 6, "cvt.rn.satfinite.e4m3x2.f32": 32, "st.global.b32": 1,
                "st.global.v2": 8},
        "mxfp4": {"shfl.sync.bfly": 9, "fma.rn.bf16x2": 32, "mul.rn.bf16x2": 32, "st.global.b32": 10,
                  "st.global.b16": 0, "st.global.b8": 0}},
}


def test_cutedsl_launch_shape_per_key():
    """Decode: one slot of 4 rows a warp; the prefill key's CTA is one whole token (4 warps of 16 rows)."""
    from dsv4kit.kernels.indexer_q import cutedsl as m

    assert (m.rows_per_warp(1), m.rows_per_cta(1)) == (4, 16)
    assert (m.rows_per_warp(4), m.rows_per_cta(4)) == (16, 64)


def test_every_cutedsl_key_compiles_for_sm90a():
    from dsv4kit.kernels.indexer_q.cutedsl import IndexerQFp8CuTeDSL, IndexerQMxfp4CuTeDSL

    for cls, fmt in ((IndexerQFp8CuTeDSL, "fp8"), (IndexerQMxfp4CuTeDSL, "mxfp4")):
        kernel = cls(cpu_platform("sm_90a"))
        keys = kernel.get_warmup_keys(IndexerQConfig(indexer_cache_dtype=fmt))
        assert len(keys) == 4
        for key in keys:
            art = kernel.compile_for(key, "sm_90a")
            ptx = art.text["ptx"]
            assert ".target sm_90a" in ptx
            assert art.info["registers"] > 0 and art.info["spills"] == 0
            assert art.info["registers"] <= 48, (key, art.info)   # theoretical occupancy >= 0.62
            # spec §2.1 rule 1: no fp32 FMA (PTX indents with tabs; the bf16x2 fma is the E2M1 recipe)
            assert re.search(r"\bfma\.\S*f32\b", ptx) is None and "mul.rn.f32" in ptx
            facts = CUTE_PTX[key.coarsen]
            want = {k: v for k, v in facts.items() if not isinstance(v, dict)} | facts[fmt]
            got = {k: ptx.count(k) for k in want}
            assert got == want, key


def test_cutedsl_refuses_row_offsets_past_int32():
    """The CuTeDSL kernels index rows by int32 words: 2^20 tokens is a clear error before any
    launch, 2^20 - 1 is accepted (meta tensors: only shapes are read)."""
    from dsv4kit.kernels.indexer_q.cutedsl import IndexerQFp8CuTeDSL, IndexerQMxfp4CuTeDSL

    def args(t: int, fmt: str):
        meta = dict(device="meta")
        q = torch.empty(t, 64, 128, dtype=torch.bfloat16, **meta)
        ins = (torch.empty(t, dtype=torch.int64, **meta), q, torch.empty(16, 64, **meta),
               torch.empty(t, 64, dtype=torch.bfloat16, **meta))
        w = torch.empty(t, 64, **meta)
        if fmt == "fp8":
            outs = (torch.empty(t, 64, 128, dtype=torch.float8_e4m3fn, **meta), w)
        else:
            outs = (torch.empty(t, 64, 64, dtype=torch.uint8, **meta),
                    torch.empty(t, 64, dtype=torch.int32, **meta), w)
        return (*ins, outs, 0.1, 0.1)

    for cls, fmt in ((IndexerQFp8CuTeDSL, "fp8"), (IndexerQMxfp4CuTeDSL, "mxfp4")):
        kernel = cls(cpu_platform("sm_90a"))
        assert kernel.launch_args(*args(2**20 - 1, fmt))[-3] == (2**20 - 1) * 64
        want = r"index_q: expected fewer than 1048576 tokens.*got 1048576 tokens"
        with pytest.raises(KernelInputError, match=want):
            kernel.launch_args(*args(2**20, fmt))


# --------------------------------------------------------------------------- bad input

def _bad(**changes):
    case = make_case(3)
    args = dict(positions=case.positions, index_q=case.index_q, cos_sin_cache=case.cos_sin_cache,
                index_weights=case.index_weights)
    args.update(changes)
    return args


@pytest.mark.parametrize(
    "changes, arg, expected",
    [
        (dict(index_q=torch.zeros(3, 64, 128)), "index_q", "bfloat16"),
        (dict(index_q=torch.zeros(3, 32, 128, dtype=torch.bfloat16)), "index_q", "shape"),
        (dict(index_q=torch.zeros(3, 64, 96, dtype=torch.bfloat16)), "index_q", "shape"),
        (dict(index_q=torch.zeros(3, 128, 64, dtype=torch.bfloat16).transpose(1, 2)), "index_q",
         "contiguous"),
        (dict(positions=torch.zeros(3, dtype=torch.int32)), "positions", "int64"),
        (dict(positions=torch.zeros(4, dtype=torch.int64)), "positions", "3"),
        (dict(cos_sin_cache=torch.zeros(16, 64, dtype=torch.float16)), "cos_sin_cache", "float32"),
        (dict(cos_sin_cache=torch.zeros(16, 32)), "cos_sin_cache", "64"),
        (dict(index_weights=torch.zeros(3, 64)), "index_weights", "bfloat16"),
        (dict(index_weights=torch.zeros(3, 32, dtype=torch.bfloat16)), "index_weights", "shape"),
    ],
)
def test_bad_input_is_rejected_before_launch(changes, arg, expected):
    with pytest.raises(KernelInputError) as exc:
        indexer_q_rope_quant(**_bad(**changes))
    msg = str(exc.value)
    # The op's argument table names the op (a wrong dtype); the kernel's own checks name the kernel.
    assert msg.startswith(("indexer_q_rope_quant: ", "IndexerQFp8Triton: ")), msg
    assert f": {arg}: expected" in msg and expected in msg, msg


def test_positions_out_of_range_with_debug_checks():
    args = _bad(positions=torch.tensor([0, 5, 8192]))
    with pytest.raises(KernelInputError, match=r"positions: expected .*8192"):
        indexer_q_rope_quant(**args, debug_checks=True)


def test_cuda_backend_refuses_cpu_tensors():
    with pytest.raises(KernelInputError,
                       match=r"indexer_q_rope_quant: backend: .*run only on a GPU.* positions on cpu"):
        indexer_q_rope_quant(**_bad(), backend="cutedsl")


def test_unknown_cache_format_and_backend():
    with pytest.raises(KernelInputError, match="cache_format: expected one of 'fp8', 'mxfp4', got 'fp4'"):
        indexer_q_rope_quant(**_bad(), cache_format="fp4")
    with pytest.raises(KernelInputError, match="backend: expected one of cutedsl, triton or None"):
        indexer_q_rope_quant(**_bad(), backend="cuda")


def test_empty_batch_returns_empty_outputs_without_dispatch():
    case = make_case(0)
    with JitMonitor("error"):
        q, s, w = indexer_q_rope_quant(*case.args(), cache_format="mxfp4")
    assert q.shape == (0, 64, 64) and s.shape == (0, 64) and w.shape == (0, 64)


def test_key_is_shared_by_both_variants_and_backends():
    from dsv4kit.kernels.indexer_q.cutedsl import IndexerQFp8CuTeDSL

    assert IndexerQFp8Triton.CompileKey is IndexerQBase.CompileKey is IndexerQFp8CuTeDSL.CompileKey
