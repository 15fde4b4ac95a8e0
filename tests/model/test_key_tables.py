"""Pinned warmup key tables (spec §2.11), key by key, per backend and runtime configuration.

Every table is written out here as CompileKey values with *every* field spelled (fixed fields
too), so a change of a fixed default, of a gate or of a derived geometry shows up as a diff
against this file, not as a silently recomputed expectation. A row with no keys means the
kernel is not registered at all by that configuration.

Backends: Triton on ``cpu_platform("sm_90a")``; CuTeDSL via ``gpu_platform("sm_90a")`` (what an
H100/H200 process registers; it registers, and compiles ahead of time, without a GPU).
"""

from __future__ import annotations

import dataclasses

import pytest
from model_helpers import build, warm

from dsv4kit.kernels.c4_compress.spec import C4CompressDsMlaBase, C4CompressPlainBase, IndexerCompressBase
from dsv4kit.kernels.c128_compress.spec import C128CompressBase, C128StoreDsMlaBase, C128StorePlainBase
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.save_partial_states.spec import SavePartialStatesBase
from dsv4kit.model.presets import DSV4_FLASH, DSV4_PRO
from dsv4kit.model.stack import gpu_platform
from dsv4kit.platform import cpu_platform

IQ = IndexerQBase.CompileKey              # K1 and K2: one key definition
K3 = DequantGatherBase.CompileKey
K4 = SavePartialStatesBase.CompileKey
K5 = C4CompressDsMlaBase.CompileKey
K6 = C4CompressPlainBase.CompileKey
K7 = C128CompressBase.CompileKey
K8A = C128StoreDsMlaBase.CompileKey
K8B = C128StorePlainBase.CompileKey
K9 = IndexerCompressBase.CompileKey

# --------------------------------------------------------------------------- the key classes

#: The fields of every key class, in order: a new field (even one with a default) is a new key
#: dimension and must show up in the tables below.
KEY_FIELDS = {
    IQ: ("head_dim", "rope_dim", "num_heads", "cos_sin_dtype", "coarsen"),
    K3: ("block_size", "has_gather_lens"),
    K4: ("state_width", "compress_ratio", "state_block_size"),
    K5: ("head_size", "state_width", "rope_head_dim", "fp8_max", "quant_block", "token_stride", "scale_dim",
         "compress_ratio", "overlap", "norm_weight_dtype"),
    K6: ("head_size", "state_width", "rope_head_dim", "fp8_max", "quant_block", "compress_ratio", "overlap",
         "store_full_fp8", "norm_weight_dtype"),
    K7: ("head_size", "state_width", "state_block_size"),
    K8A: ("head_size", "rope_head_dim", "fp8_max", "quant_block", "token_stride", "scale_dim",
          "compress_ratio", "norm_weight_dtype", "kv_cache_block_size", "kv_block_stride"),
    K8B: ("head_size", "rope_head_dim", "fp8_max", "quant_block", "compress_ratio", "store_full_fp8",
          "norm_weight_dtype"),
    K9: ("use_fp4_cache", "norm_weight_dtype", "head_size", "state_width", "compress_ratio", "overlap",
         "rope_head_dim", "quant_block", "token_stride", "scale_dim"),
}

# --------------------------------------------------------------------------- the keys, spelled out

IQ_KEYS = (   # K1 (FP8 indexer cache) or K2 (MXFP4): both cos/sin dtypes (trap 1) x coarsen 1, 4 (trap 2)
    IQ(head_dim=128, rope_dim=64, num_heads=64, cos_sin_dtype="float32", coarsen=1),
    IQ(head_dim=128, rope_dim=64, num_heads=64, cos_sin_dtype="float32", coarsen=4),
    IQ(head_dim=128, rope_dim=64, num_heads=64, cos_sin_dtype="bfloat16", coarsen=1),
    IQ(head_dim=128, rope_dim=64, num_heads=64, cos_sin_dtype="bfloat16", coarsen=4),
)
K4_KEYS = (   # main C4 state, main C128 state, indexer state (trap 7)
    K4(state_width=1024, compress_ratio=4, state_block_size=4),
    K4(state_width=512, compress_ratio=128, state_block_size=8),
    K4(state_width=256, compress_ratio=4, state_block_size=4),
)
K5_BF16 = K5(head_size=512, state_width=1024, rope_head_dim=64, fp8_max=448.0, quant_block=64,
             token_stride=576, scale_dim=8, compress_ratio=4, overlap=True, norm_weight_dtype="bfloat16")
K6_BF16_ROWS = K6(head_size=512, state_width=1024, rope_head_dim=64, fp8_max=448.0, quant_block=64,
                  compress_ratio=4, overlap=True, store_full_fp8=False, norm_weight_dtype="bfloat16")
K6_E4M3_ROWS = K6(head_size=512, state_width=1024, rope_head_dim=64, fp8_max=448.0, quant_block=64,
                  compress_ratio=4, overlap=True, store_full_fp8=True, norm_weight_dtype="bfloat16")
K7_KEY = K7(head_size=512, state_width=512, state_block_size=8)
K8A_B256 = K8A(head_size=512, rope_head_dim=64, fp8_max=448.0, quant_block=64, token_stride=576, scale_dim=8,
               compress_ratio=128, norm_weight_dtype="bfloat16", kv_cache_block_size=2, kv_block_stride=1728)
K8A_B64 = K8A(head_size=512, rope_head_dim=64, fp8_max=448.0, quant_block=64, token_stride=576, scale_dim=8,
              compress_ratio=128, norm_weight_dtype="bfloat16", kv_cache_block_size=1, kv_block_stride=1152)
K8B_BF16_ROWS = K8B(head_size=512, rope_head_dim=64, fp8_max=448.0, quant_block=64, compress_ratio=128,
                    store_full_fp8=False, norm_weight_dtype="bfloat16")
K8B_E4M3_ROWS = K8B(head_size=512, rope_head_dim=64, fp8_max=448.0, quant_block=64, compress_ratio=128,
                    store_full_fp8=True, norm_weight_dtype="bfloat16")
K9_FP8 = K9(use_fp4_cache=False, norm_weight_dtype="bfloat16", head_size=128, state_width=256,
            compress_ratio=4, overlap=True, rope_head_dim=64, quant_block=128, token_stride=128, scale_dim=4)
K9_MXFP4 = K9(use_fp4_cache=True, norm_weight_dtype="bfloat16", head_size=128, state_width=256,
              compress_ratio=4, overlap=True, rope_head_dim=64, quant_block=32, token_stride=64, scale_dim=4)

#: spec id -> kernel name without its backend suffix
KERNELS = {
    "K1": "IndexerQFp8", "K2": "IndexerQMxfp4", "K3": "DequantGather", "K4": "SavePartialStates",
    "K5": "C4CompressDsMla", "K6": "C4CompressPlain", "K7": "C128Compress", "K8a": "C128StoreDsMla",
    "K8b": "C128StorePlain", "K9": "IndexerCompress",
}

# --------------------------------------------------------------------------- the tables

#: Spec §2.11, DSv4-Flash (B = 256, cache fp8_ds_mla, indexer FP8, bf16), row by row.
FLASH = {
    "K1": IQ_KEYS,
    "K2": (),
    "K3": (K3(block_size=256, has_gather_lens=True), K3(block_size=64, has_gather_lens=False),
           K3(block_size=2, has_gather_lens=False)),
    "K4": K4_KEYS,
    "K5": (K5_BF16,),
    "K6": (),
    "K7": (K7_KEY,),
    "K8a": (K8A_B256,),
    "K8b": (),
    "K9": (K9_FP8,),
}

#: DSv4-Pro: the spec states index_topk = 1024 only, which no key holds: the Flash table.
PRO = FLASH

#: MXFP4 indexer cache: K2 takes K1's four keys, K9 stores E5 pages (quant block 32, 64 bytes).
MXFP4 = {**FLASH, "K1": (), "K2": IQ_KEYS, "K9": (K9_MXFP4,)}

#: bf16 plain-row KV cache: no K3 (dense path), K6 / K8b instead of K5 / K8a, store_full_fp8 False.
PLAIN_BF16 = {**FLASH, "K3": (), "K5": (), "K6": (K6_BF16_ROWS,), "K8a": (), "K8b": (K8B_BF16_ROWS,)}

#: e4m3 plain-row KV cache ("fp8" / "fp8_e4m3"): as bf16 with store_full_fp8 True (trap 3).
PLAIN_FP8 = {**PLAIN_BF16, "K6": (K6_E4M3_ROWS,), "K8b": (K8B_E4M3_ROWS,)}

#: B = 64: K3 pages 64 (window), 64 // 4 = 16 (C4), max(1, 64 // 128) = 1 (C128, trap 10); K8a one
#: entry per page, stride round_up(584, 576) = 1152 (trap 4). Nothing else depends on B (trap 8).
B64 = {
    **FLASH,
    "K3": (K3(block_size=64, has_gather_lens=True), K3(block_size=16, has_gather_lens=False),
           K3(block_size=1, has_gather_lens=False)),
    "K8a": (K8A_B64,),
}

CONFIGS = {
    "flash": (DSV4_FLASH, {}, FLASH),
    "pro": (DSV4_PRO, {}, PRO),
    "mxfp4": (DSV4_FLASH, {"indexer_cache_dtype": "mxfp4"}, MXFP4),
    "plain-bf16": (DSV4_FLASH, {"cache_dtype": "bf16"}, PLAIN_BF16),
    "plain-fp8": (DSV4_FLASH, {"cache_dtype": "fp8"}, PLAIN_FP8),
    "b64": (DSV4_FLASH, {"block_size": 64}, B64),
}

BACKENDS = {
    "triton": (lambda: cpu_platform("sm_90a"), "Triton"),
    "cutedsl": (lambda: gpu_platform("sm_90a"), "CuTeDSL"),
}


def expected(table: dict[str, tuple], suffix: str) -> dict[str, list]:
    """Kernel name -> keys, for the rows of ``table`` that have keys (the others: not registered)."""
    assert set(table) == set(KERNELS)
    return {KERNELS[k] + suffix: list(keys) for k, keys in table.items() if keys}


def assert_same_keys(got: dict[str, list], want: dict[str, list]) -> None:
    """Key by key: every kernel, no duplicate, nothing missing, nothing extra (order-free)."""
    problems = []
    for name in sorted(set(got) | set(want)):
        g, w = got.get(name, []), want.get(name, [])
        if len(set(g)) != len(g):
            problems.append(f"{name}: duplicate keys {g}")
        for key in w:
            if key not in g:
                problems.append(f"{name}: missing {key}")
        for key in g:
            if key not in w:
                problems.append(f"{name}: unexpected {key}")
    assert not problems, "\n".join(problems)


def _platform(backend: str):
    make, suffix = BACKENDS[backend]
    plat = make()
    if backend == "cutedsl" and not plat.cutedsl:
        pytest.skip("nvidia-cutlass-dsl is not importable here")
    return plat, suffix


# --------------------------------------------------------------------------- tests


def test_key_classes_have_the_pinned_fields() -> None:
    for cls, names in KEY_FIELDS.items():
        assert tuple(f.name for f in dataclasses.fields(cls)) == names, cls.__qualname__


def test_the_flash_table_is_the_spec_table() -> None:
    """The rows as §2.11 prints them: tuples in field order (K1: 4 keys ... K9 (False, bf16))."""
    assert [(k.head_dim, k.rope_dim, k.num_heads, k.cos_sin_dtype, k.coarsen) for k in FLASH["K1"]] == [
        (128, 64, 64, "float32", 1), (128, 64, 64, "float32", 4),
        (128, 64, 64, "bfloat16", 1), (128, 64, 64, "bfloat16", 4)]
    assert FLASH["K2"] == FLASH["K6"] == FLASH["K8b"] == ()
    assert [dataclasses.astuple(k) for k in FLASH["K3"]] == [(256, True), (64, False), (2, False)]
    assert [dataclasses.astuple(k) for k in FLASH["K4"]] == [(1024, 4, 4), (512, 128, 8), (256, 4, 4)]
    assert [k.norm_weight_dtype for k in FLASH["K5"]] == ["bfloat16"]
    assert [dataclasses.astuple(k) for k in FLASH["K7"]] == [(512, 512, 8)]
    assert [(k.kv_cache_block_size, k.kv_block_stride, k.norm_weight_dtype) for k in FLASH["K8a"]] == [
        (2, 1728, "bfloat16")]
    assert [(k.use_fp4_cache, k.norm_weight_dtype) for k in FLASH["K9"]] == [(False, "bfloat16")]


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_registered_keys_equal_the_table(backend, config) -> None:
    """What the stack registers (= what its warmup compiles) for each configuration and backend."""
    plat, suffix = _platform(backend)
    preset, settings, table = CONFIGS[config]
    stack, registry = build(preset, plat, **settings)
    assert {r.kernel.backend for r in registry.registrations.values()} == {backend}
    want = expected(table, suffix)
    assert_same_keys(registry.keys(), want)
    assert_same_keys(stack.warmup_keys(), want)              # the stack's own copy agrees


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_flash_warmup_compiles_exactly_the_table(backend) -> None:
    """Warm the DSv4-Flash defaults (AOT for sm_90a): the ledger's warmed keys are the spec table."""
    plat, suffix = _platform(backend)
    stack, registry = build(DSV4_FLASH, plat)
    ledger = warm(stack, registry)
    assert_same_keys({k: list(v) for k, v in ledger.warmed.items()}, expected(FLASH, suffix))
    for name, kernel in stack.kernels().items():              # and each kernel holds an executor per key
        assert set(kernel.compiled_keys()) == set(expected(FLASH, suffix)[name]), name
