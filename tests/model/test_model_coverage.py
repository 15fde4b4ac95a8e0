"""Coverage over the supported configurations: zero misses, every warmed key reachable, and the
reason of every dead key pinned down."""

from __future__ import annotations

import itertools

import pytest
from model_helpers import build, warm, warm_and_replay

from dsv4kit.jit import KeyLedger
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.model.stack import DSv4AttentionStack, gpu_platform
from dsv4kit.model.trace import (
    SeqChunk,
    ServingTrace,
    Step,
    TraceLimits,
    coverage_report,
    make_trace,
    replay,
)

IQ = IndexerQBase.CompileKey
K3 = DequantGatherBase.CompileKey

CONFIGS = list(itertools.product(("flash", "pro"), ("sm_90a", "sm_100a"), ("fp8_ds_mla", "bf16", "fp8"),
                                 ("fp8", "mxfp4"), (256, 64)))
TRAP_1 = ("cos_sin bfloat16 never requested: this runtime's RoPE cache is float32 (the other dtype is "
          "warmed for a model-dtype cast, trap 1)")


@pytest.mark.parametrize("preset,arch,cache,indexer,b", CONFIGS)
def test_zero_misses_and_every_warmed_key_reachable(preset, arch, cache, indexer, b) -> None:
    """Per configuration: the 'all' trace misses nothing, and the union of the decode, prefill and
    mixed traces under both runtime RoPE-cache dtypes requests every warmed key (no dead key)."""
    settings = dict(cache_dtype=cache, indexer_cache_dtype=indexer, block_size=b)
    stack, registry = build(preset, arch, **settings)
    ledger = warm(stack, registry)
    warmed = {k: set(v) for k, v in ledger.warmed.items()}
    assert warmed == {k: set(v) for k, v in registry.keys().items()}
    # K4, K5 or K6, K9, K7, K8a or K8b, K1 or K2, and K3 where used (fp8_ds_mla caches)
    assert len(warmed) == (7 if cache == "fp8_ds_mla" else 6)
    for rope, kind in itertools.product(("float32", "bfloat16"), ("decode", "prefill", "mixed")):
        runtime = stack if rope == "float32" else DSv4AttentionStack(preset, arch, rope_cache_dtype=rope,
                                                                      **settings)
        result = replay(runtime, make_trace(kind, runtime, steps=8, seed=11), ledger=ledger)
        assert result.ok, [str(e) for e in result.misses[:3]]
    assert ledger.missed() == {}
    assert ledger.dead() == {}


@pytest.mark.parametrize("b", [0, 1, 2, 128, 1024])
def test_odd_block_sizes(b) -> None:
    cov = warm_and_replay(*build(block_size=b), steps=10)
    assert cov.ok and not cov.missed
    assert {d.reason for d in cov.dead} == {TRAP_1}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_gpu_platform_cutedsl_warmup_covers_the_trace(arch) -> None:
    """What an H200 / B200 process registers (CuTeDSL), compiled here for its arch: zero misses."""
    stack, registry = build(platform=gpu_platform(arch))
    assert {r.kernel.backend for r in registry.registrations.values()} == {"cutedsl"}
    cov = warm_and_replay(stack, registry, steps=10)
    assert cov.ok and not cov.missed
    assert {d.reason for d in cov.dead} == {TRAP_1}


# --------------------------------------------------------------------------- dead-key reasons


def test_default_flash_run_dead_keys(flash_sm90) -> None:
    """`make run`'s configuration: the bf16 cos_sin keys are dead (trap 1), nothing else."""
    stack, registry, ledger = flash_sm90
    led = KeyLedger(warmed={k: dict(v) for k, v in ledger.warmed.items()})
    result = replay(stack, make_trace("all", stack, steps=16), ledger=led)
    cov = coverage_report(stack, led, result)
    assert cov.ok
    assert cov.dead_reasons() == {("IndexerQFp8Triton", IQ(cos_sin_dtype="bfloat16", coarsen=c)): TRAP_1
                                  for c in (1, 4)}


def test_decode_only_trace_dead_keys(flash_sm90) -> None:
    stack, _, ledger = flash_sm90
    led = KeyLedger(warmed={k: dict(v) for k, v in ledger.warmed.items()})
    result = replay(stack, make_trace("decode", stack, steps=16), ledger=led)
    reasons = coverage_report(stack, led, result).dead_reasons()
    assert reasons[("IndexerQFp8Triton", IQ(cos_sin_dtype="float32", coarsen=4))] == (
        "coarsen-4 never requested by this trace (largest batch 256 tokens < 512)")
    assert reasons[("IndexerQFp8Triton", IQ(cos_sin_dtype="bfloat16", coarsen=1))] == TRAP_1
    for key in (K3(256, True), K3(64, False), K3(2, False)):
        assert reasons[("DequantGatherTriton", key)] == (
            "no prefill in this trace: K3 gathers only on the sparse-MLA prefill path")
    assert len(reasons) == 6


def test_large_batches_only_leave_coarsen_1_dead(flash_sm90) -> None:
    stack, _, ledger = flash_sm90
    led = KeyLedger(warmed={k: dict(v) for k, v in ledger.warmed.items()})
    steps = [Step(i, "prefill", (SeqChunk(i, 0, n, True),), n) for i, n in enumerate((512, 4096))]
    trace = ServingTrace(steps, "custom", 0, TraceLimits.of(stack), stack.max_model_len)
    reasons = coverage_report(stack, led, replay(stack, trace, ledger=led)).dead_reasons()
    assert reasons[("IndexerQFp8Triton", IQ(cos_sin_dtype="float32", coarsen=1))] == (
        "coarsen-1 never requested by this trace (smallest batch 512 tokens >= 512)")


def test_mxfp4_variant_not_selected() -> None:
    """Keys warmed for both indexer formats, runtime FP8: the K2 keys are dead, with the reason."""
    fp8, reg_fp8 = build(cache_dtype="bf16")
    mx, reg_mx = build(cache_dtype="bf16", indexer_cache_dtype="mxfp4")
    ledger = warm(fp8, reg_fp8)
    warm(mx, reg_mx, ledger)
    result = replay(fp8, make_trace("all", fp8, steps=8), ledger=ledger)
    cov = coverage_report(fp8, ledger, result, mx.kernels())
    assert cov.ok
    mx_dead = {d.reason for d in cov.dead if d.kernel == "IndexerQMxfp4Triton"}
    assert mx_dead == {"MXFP4 variant not selected: this runtime's indexer cache is fp8"}
    assert len([d for d in cov.dead if d.kernel == "IndexerQMxfp4Triton"]) == 4


def test_backend_not_selected_trap_6() -> None:
    """CuTeDSL keys registered for a GPU platform are dead on a CPU runtime, which runs Triton."""
    gpu, gpu_reg = build(platform=gpu_platform("sm_90a"))
    cpu, cpu_reg = build()
    ledger = warm(cpu, cpu_reg)
    for name, keys in gpu_reg.keys().items():       # as if warmed (no compile needed for the reason)
        ledger.add_warmed(name, keys)
    result = replay(cpu, make_trace("all", cpu, steps=8), ledger=ledger)
    cov = coverage_report(cpu, ledger, result, gpu.kernels())
    reasons = {d.kernel: d.reason for d in cov.dead if d.kernel.endswith("CuTeDSL")}
    assert reasons == {
        "IndexerQFp8CuTeDSL": "cutedsl backend not selected: this runtime's indexer_q runs triton on cpu "
                              "sm_90a (trap 6)",
        "DequantGatherCuTeDSL": "cutedsl backend not selected: this runtime's dequant_gather runs triton on "
                                "cpu sm_90a (trap 6)",
        "SavePartialStatesCuTeDSL": "cutedsl backend not selected: this runtime's save_partial_states runs "
                                    "triton on cpu sm_90a (trap 6)",
        "C4CompressDsMlaCuTeDSL": "cutedsl backend not selected: this runtime's c4_compress_ds_mla runs "
                                  "triton on cpu sm_90a (trap 6)",
        "IndexerCompressCuTeDSL": "cutedsl backend not selected: this runtime's indexer_compress runs "
                                  "triton on cpu sm_90a (trap 6)",
        "C128CompressCuTeDSL": "cutedsl backend not selected: this runtime's c128_compress runs "
                               "triton on cpu sm_90a (trap 6)",
        "C128StoreDsMlaCuTeDSL": "cutedsl backend not selected: this runtime's c128_norm_rope_store_ds_mla "
                                 "runs triton on cpu sm_90a (trap 6)",
    }


def test_k3_not_used_by_a_plain_row_runtime() -> None:
    ds, reg = build()
    plain, plain_reg = build(cache_dtype="bf16")
    ledger = warm(ds, reg)
    warm(plain, plain_reg, ledger)                  # K6 is the plain runtime's own compressor
    result = replay(plain, make_trace("all", plain, steps=8), ledger=ledger)
    cov = coverage_report(plain, ledger, result, ds.kernels())
    assert cov.ok
    assert {d.reason for d in cov.dead if d.kernel == "DequantGatherTriton"} == {
        "K3 not used by this runtime: the KV cache is bf16; K3 is the fp8_ds_mla sparse-MLA prefill path"}
