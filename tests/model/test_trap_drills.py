"""The ten warmup/runtime mismatch traps of spec §2.11, one drill each, plus one drill per family.

Each drill makes the misconfiguration and asserts what catches it: the JIT monitor in ``error``
mode (an :class:`UnwarmedKeyError` naming the kernel, the requested key and the differing field,
raised before anything compiles) or the configuration / call checks (a ``KernelInputError``
naming the argument). Some traps are also covered elsewhere (``test_model_trace``,
``test_model_coverage``, ``test_model_stack``, notebook 05); this file is the one place that
lists all ten in one form. Everything runs on CPU: Triton compiled ahead of time for sm_90a,
the replay deriving keys with each kernel's own ``dispatch``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.jit import JitMonitor, Like
from dsv4kit.kernels import c4_compress, c128_compress, dequant_gather
from dsv4kit.kernels.c4_compress.cases import make_case as make_c4_case
from dsv4kit.kernels.c4_compress.spec import C4CompressConfig, IndexerCompressBase
from dsv4kit.kernels.c128_compress.cases import make_k7_case, make_k8_case
from dsv4kit.kernels.c128_compress.spec import C128CompressConfig, C128StoreDsMlaBase
from dsv4kit.kernels.dequant_gather.cases import make_case as make_k3_case
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.save_partial_states.spec import SavePartialStatesBase
from dsv4kit.model.drills import (
    CPU,
    build,
    by_kernel,
    drill,
    field_phrase,
    first_miss,
    runtime,
    warm,
    without,
)
from dsv4kit.model.presets import DSV4_FLASH
from dsv4kit.model.stack import FAMILIES, DSv4AttentionStack, gpu_platform
from dsv4kit.model.trace import coverage_report, make_trace, replay

IQ = IndexerQBase.CompileKey
K3 = DequantGatherBase.CompileKey
K4 = SavePartialStatesBase.CompileKey
K9 = IndexerCompressBase.CompileKey


# --------------------------------------------------------------------------- helpers
# The drill builders live in dsv4kit.model.drills (notebook 05 runs the same drills as cells).


def names_field(err: UnwarmedKeyError, field: str, warmed_value, requested) -> None:
    """The error's diff and its message name ``field`` with both values."""
    assert err.diff[field] == (warmed_value, requested)
    assert field_phrase(field, warmed_value, requested) in str(err)


# --------------------------------------------------------------------------- the ten traps


def test_trap_1_cos_sin_dtype() -> None:
    """A warmup of fp32 cos/sin only; the runtime's RoPE cache was cast to bf16 with the module."""
    warm_stack, registry = build(warmup_cos_sin_dtypes=("float32",))
    assert {k.cos_sin_dtype for k in registry.keys()["IndexerQFp8Triton"]} == {"float32"}
    err = first_miss(runtime(rope_cache_dtype="bfloat16"), registry, warm_stack)
    assert err.kernel == "IndexerQFp8Triton" and err.key == IQ(cos_sin_dtype="bfloat16", coarsen=1)
    names_field(err, "cos_sin_dtype", "float32", "bfloat16")
    # The compressors take the fp32 cache only: a bf16 one raises (loud), it is never a key.
    for op in ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress"):
        args = make_c4_case(op, lens=(5,)).args
        args["cos_sin_cache"] = args["cos_sin_cache"].to(torch.bfloat16)
        with pytest.raises(KernelInputError, match="cos_sin_cache: expected"):
            c4_compress.SPECS[op].op(**args, platform=CPU)
    for op in ("c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain"):
        args = make_k8_case(op, t=4).args
        args["cos_sin_cache"] = args["cos_sin_cache"].to(torch.bfloat16)
        with pytest.raises(KernelInputError, match="cos_sin_cache: expected"):
            c128_compress.SPECS[op].op(**args, platform=CPU)


def test_trap_2_coarsen_switch_at_512() -> None:
    """A warmup that only traced batches below 512 tokens misses coarsen 4 (K1/K2)."""
    warm_stack, registry = build(max_num_batched_tokens=511)
    assert {k.coarsen for k in registry.keys()["IndexerQFp8Triton"]} == {1}
    err = first_miss(runtime(), registry, warm_stack)            # the prefill trace launches T = 8192
    assert err.kernel == "IndexerQFp8Triton" and err.key.coarsen == 4
    names_field(err, "coarsen", 1, 4)


def test_trap_3_kv_cache_dtype_strings() -> None:
    """``fp8_e5m2`` is rejected at configuration; warmup and runtime share one dtype-string map."""
    for make in (lambda: runtime(cache_dtype="fp8_e5m2"),
                 lambda: C4CompressConfig(cache_dtype="fp8_e5m2"),
                 lambda: C128CompressConfig(cache_dtype="fp8_e5m2")):
        with pytest.raises(KernelInputError, match=r"cache_dtype: expected .*got 'fp8_e5m2'"):
            make()
    with pytest.raises(KernelInputError, match="cache_dtype"):
        dequant_gather.get_warmup_keys(dequant_gather.DequantGatherConfig(cache_dtype="fp8_e5m2"))
    # Spellings of one cache are one key set: warmed as "fp8_e4m3", run as "fp8": nothing missed.
    warm_stack, registry = build(cache_dtype="fp8_e4m3")
    result, _ = drill(runtime(cache_dtype="fp8"), registry, warm_stack)
    assert result.ok
    # Another cache is another key: warmed for bf16 rows, run with e4m3 rows (store_full_fp8).
    warm_stack, registry = build(cache_dtype="bf16")
    result, _ = drill(runtime(cache_dtype="fp8"), registry, warm_stack)
    assert set(by_kernel(result.misses)) == {"C4CompressPlainTriton", "C128StorePlainTriton"}
    for err in result.misses:
        names_field(err, "store_full_fp8", False, True)


def test_trap_4_packed_c128_page_stride() -> None:
    """A packed pool (39 168-byte pages) is another K8a key: a guard hit, never a silent mis-store."""
    stack, registry = build()
    warm(stack, registry)
    kernel = stack.kernels()["C128StoreDsMlaTriton"]
    (warmed_key,) = kernel.compiled_keys()
    assert (warmed_key.kv_cache_block_size, warmed_key.kv_block_stride) == (2, 1728)   # B // 128, allocator
    args = make_k8_case("c128_norm_rope_store_ds_mla", t=8, kv_bs=2, page_stride=39168).args
    assert args["k_cache"].stride(0) == 39168
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError) as info:
        c128_compress.SPECS["c128_norm_rope_store_ds_mla"].op(**args, platform=CPU)
    err = info.value
    assert err.kernel == "C128StoreDsMlaTriton" and err.diff == {"kv_block_stride": (1728, 39168)}
    names_field(err, "kv_block_stride", 1728, 39168)
    # Warmup that reads the bound cache tensor registers the runtime's key.
    cfg = C128CompressConfig().with_cache(args["k_cache"])
    assert kernel.get_warmup_keys(cfg) == [dataclasses.replace(warmed_key, kv_block_stride=39168)]
    assert kernel.get_warmup_keys(cfg) == [C128StoreDsMlaBase.dispatch(kernel, **{
        n: args[n] for n in ("rms_norm_weight", "cos_sin_cache", "k_cache")})]


def test_trap_5_c128_state_block_size_must_be_8() -> None:
    """A C128 state cache of 16-row blocks raises at the call; a key implying it is rejected too."""
    args = make_k7_case(lens=(9,)).args
    nsb, _, row = args["state_cache"].shape
    args["state_cache"] = torch.zeros((nsb, 16, row), dtype=torch.float32)
    with pytest.raises(KernelInputError, match=r"state_cache: expected shape\[1\] \(state block size\) == 8"):
        c128_compress.SPECS["c128_compress"].op(**args, platform=CPU)
    kernel = c128_compress.SPECS["c128_compress"].kernel(platform=CPU)
    key = kernel.dispatch(state_cache=Like(shape=(nsb, 16, row)))
    with pytest.raises(KernelInputError, match=r"state_block_size: expected 8 \(fixed\), got 16"):
        kernel.check_key(key)


def test_trap_6_platform_gating() -> None:
    """Keys registered for the other backend leave the selected one cold, both ways round."""
    # Triton keys warmed (compiled) for a process whose runtime selects CuTeDSL (a GPU sm_90a).
    tri_stack, tri_registry = build(platform=CPU)
    gpu = DSv4AttentionStack(DSV4_FLASH, gpu_platform("sm_90a"))
    if not gpu.platform.cutedsl:
        pytest.skip("nvidia-cutlass-dsl is not importable here")
    result, ledger = drill(gpu, tri_registry, tri_stack)
    cold = set(gpu.kernels())
    assert {k.endswith("CuTeDSL") for k in cold} == {True}
    assert set(by_kernel(result.misses)) == cold                    # every kernel it calls: cold
    assert all("no key of this kernel was warmed" in str(e) for e in result.misses)
    reasons = {d.reason for d in coverage_report(gpu, ledger, result, tri_stack.kernels()).dead}
    assert reasons and all(r.startswith("triton backend not selected") and r.endswith("(trap 6)")
                           for r in reasons)
    # CuTeDSL keys registered for a CPU process (which runs Triton): no Triton kernel registered.
    _, gpu_registry = build(platform=gpu_platform("sm_90a"))
    assert all(name.endswith("CuTeDSL") for name in gpu_registry.keys())
    cpu = runtime()
    cpu.clear_compiled()
    result = replay(cpu, make_trace("prefill", cpu, steps=2, seed=1), mode="error")
    assert set(by_kernel(result.misses)) == set(cpu.kernels())
    assert all(name.endswith("Triton") for name in cpu.kernels())


def test_trap_7_indexer_state_k4_key() -> None:
    """A head-512-only K4 warmup (no SW 256 indexer state) misses the indexer's state save."""
    stack, full = build()
    registry = without(full, lambda name, k: name == "SavePartialStatesTriton" and k.state_width == 256)
    assert registry.keys()["SavePartialStatesTriton"] == [K4(1024, 4, 4), K4(512, 128, 8)]
    err = first_miss(runtime(), registry, stack)
    assert err.kernel == "SavePartialStatesTriton" and err.key == K4(256, 4, 4)
    names_field(err, "state_width", 1024, 256)


def test_trap_8_k9_key_is_format_and_weights_only() -> None:
    """K9 keys on the indexer format and the weight dtype only: no block size, state or cache."""
    assert {f.name for f in dataclasses.fields(K9)}.isdisjoint(
        {"state_block_size", "block_size", "cache_block_size", "kv_cache_block_size", "compress_ratios"})
    kernel = c4_compress.SPECS["indexer_compress"].kernel(platform=CPU)
    keys = {kernel.dispatch(rms_norm_weight=Like(shape=(128,), dtype=torch.bfloat16),
                            state_cache=Like(shape=(9, sbs, 512)), cos_sin_cache=Like(shape=(64, 64)),
                            use_fp4_cache=False) for sbs in (1, 4, 8, 16)}
    assert len(keys) == 1
    # Warmed for B = 64, run at B = 256: K3 and K8a miss (their keys hold B), K9 never does.
    warm_stack, registry = build(block_size=64)
    result, ledger = drill(runtime(), registry, warm_stack)
    assert set(by_kernel(result.misses)) == {"DequantGatherTriton", "C128StoreDsMlaTriton"}
    assert set(ledger.requested["IndexerCompressTriton"]) == set(ledger.warmed["IndexerCompressTriton"])
    # What K9's key does hold is caught: FP8 pages warmed, an MXFP4 indexer cache at runtime.
    warm_stack, registry = build()
    result, _ = drill(runtime(indexer_cache_dtype="mxfp4"), registry, warm_stack)
    k9 = [e for e in result.misses if e.kernel == "IndexerCompressTriton"]
    assert k9 and {e.key.use_fp4_cache for e in k9} == {True}
    names_field(k9[0], "use_fp4_cache", False, True)


def test_trap_9_fp32_norm_weights() -> None:
    """Norm weights kept in fp32 request keys a bf16 warmup lacks (K5, K9, K8a)."""
    stack, registry = build()
    result, _ = drill(runtime(norm_weight_dtype="float32"), registry, stack)
    assert set(by_kernel(result.misses)) == {"C4CompressDsMlaTriton", "IndexerCompressTriton",
                                             "C128StoreDsMlaTriton"}
    for err in result.misses:
        assert err.diff == {"norm_weight_dtype": ("bfloat16", "float32")}
        names_field(err, "norm_weight_dtype", "bfloat16", "float32")


def test_trap_10_explicit_gather_lens() -> None:
    """An explicit gather_lens on a compressed cache (even equal to seq_lens) is another K3 key."""
    stack, registry = build()
    warm(stack, registry)
    case = make_k3_case([5, 9], [5, 9], block_size=64)           # C4 pages (B // 4), gather_lens = seq_lens
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError) as info:
        dequant_gather.SPEC.op(*case.args(), platform=CPU)
    err = info.value
    assert err.kernel == "DequantGatherTriton" and err.key == K3(block_size=64, has_gather_lens=True)
    assert "has_gather_lens=True" in str(err)
    # Two warmed keys are one field away, (256, True) and (64, False): both are named, the first
    # warmed as the nearest, the other as equally near, so the real cause (has_gather_lens) shows.
    assert err.nearest == K3(256, True)
    names_field(err, "block_size", 256, 64)
    assert err.also_near == [(K3(64, False), {"has_gather_lens": (False, True)})]
    assert "equally near, (block_size=64, has_gather_lens=False) differs in " \
           + field_phrase("has_gather_lens", False, True) in str(err)
    # Without gather_lens the same pages are the warmed (64, False).
    case = make_k3_case([5, 9], None, block_size=64)
    with JitMonitor("error"):
        dequant_gather.SPEC.op(*case.args(), platform=CPU)


# --------------------------------------------------------------------------- one family left out

#: Every model family, and the runtime that calls it (the plain-row ones need a plain-row cache).
FAMILY_RUNTIMES = {
    "save_partial_states": {},
    "c4_compress_ds_mla": {},
    "c4_compress_plain": {"cache_dtype": "bf16"},
    "indexer_compress": {},
    "c128_compress": {},
    "c128_norm_rope_store_ds_mla": {},
    "c128_norm_rope_store_plain": {"cache_dtype": "bf16"},
    "indexer_q": {},
    "dequant_gather": {},
}


def test_every_model_family_has_a_drill() -> None:
    assert [f.name for f in FAMILIES] == list(FAMILY_RUNTIMES)


@pytest.mark.parametrize("family", list(FAMILY_RUNTIMES))
def test_a_warmup_without_one_family_fails_the_replay(family) -> None:
    """Warm the stack's registry minus this family's kernel(s): the replay fails in error mode, and
    every miss names that family's kernel (the others are all warm)."""
    stack, full = build(**FAMILY_RUNTIMES[family])
    left_out = {layer.kernels[family].name for layer in stack.layers if family in layer.kernels}
    assert left_out, f"{family} is not registered by {FAMILY_RUNTIMES[family]}"
    registry = without(full, lambda name, _k: name in left_out)
    assert set(registry.keys()) == set(full.keys()) - left_out
    result, ledger = drill(stack, registry, stack, kind="all", steps=4)
    assert not result.ok
    assert set(by_kernel(result.misses)) == left_out
    assert all(str(e).startswith(f"{e.kernel}: compile after warmup") for e in result.misses)
    assert all("no key of this kernel was warmed" in str(e) for e in result.misses)
    cov = coverage_report(stack, ledger, result)
    assert not cov.ok and {m.kernel for m in cov.missed} == left_out
    assert set(ledger.missed()) == left_out
