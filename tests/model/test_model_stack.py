"""DSv4AttentionStack: registration mirrors runtime gating, settings are checked, families plug in."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_helpers import build

from dsv4kit.errors import KernelInputError
from dsv4kit.family import DEFAULT_VARIANT, Arg, FamilySpec, TensorSpec, Variant
from dsv4kit.jit import KeyLedger, Like, WarmupChoices, WarmupIntRange, WarmupRegistry, kernel_launcher
from dsv4kit.kernels.dequant_gather import SPEC as K3_SPEC
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.indexer_q import SPEC as IQ_SPEC
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.save_partial_states import SPEC as K4_SPEC
from dsv4kit.kernels.save_partial_states.spec import SavePartialStatesBase
from dsv4kit.kernels.toy import ToyConfig, ToyRowScale, toy_reference
from dsv4kit.model.hooks import HOOKS, ModelHooks, Site
from dsv4kit.model.presets import DSV4_FLASH, DSV4_PRO
from dsv4kit.model.stack import (
    FAMILIES,
    DSv4AttentionStack,
    gpu_platform,
    normalize_cache_dtype,
)
from dsv4kit.model.trace import coverage_report, make_trace, replay
from dsv4kit.platform import cpu_platform

IQ = IndexerQBase.CompileKey
K3 = DequantGatherBase.CompileKey
K4 = SavePartialStatesBase.CompileKey


def iq_keys(dtypes=("float32", "bfloat16")):
    return [IQ(cos_sin_dtype=d, coarsen=c) for d in dtypes for c in (1, 4)]


# --------------------------------------------------------------------------- the spec table


def test_flash_registers_the_spec_keys_once_per_kernel() -> None:
    """Spec §2.11 DSv4-Flash table (every row); 43 layers collapse to one entry per kernel."""
    stack, registry = build()
    keys = registry.keys()
    assert set(keys.pop("SavePartialStatesTriton")) == {K4(1024, 4, 4), K4(512, 128, 8), K4(256, 4, 4)}
    (k5,) = keys.pop("C4CompressDsMlaTriton")
    (k9,) = keys.pop("IndexerCompressTriton")
    assert (k5.norm_weight_dtype, k9.use_fp4_cache, k9.norm_weight_dtype) == ("bfloat16", False, "bfloat16")
    (k7,) = keys.pop("C128CompressTriton")
    (k8a,) = keys.pop("C128StoreDsMlaTriton")
    assert (k7.head_size, k7.state_width, k7.state_block_size) == (512, 512, 8)
    assert (k8a.kv_cache_block_size, k8a.kv_block_stride, k8a.norm_weight_dtype) == (2, 1728, "bfloat16")
    assert keys == {"IndexerQFp8Triton": iq_keys(),
                    "DequantGatherTriton": [K3(256, True), K3(64, False), K3(2, False)]}
    regs = registry.registrations
    assert regs["IndexerQFp8Triton"].count == 21       # C4 layers
    assert regs["C4CompressDsMlaTriton"].count == regs["IndexerCompressTriton"].count == 21
    assert regs["C128CompressTriton"].count == regs["C128StoreDsMlaTriton"].count == 20   # C128 layers
    assert regs["SavePartialStatesTriton"].count == 41  # C4 and C128 layers (main + indexer state on C4)
    assert regs["DequantGatherTriton"].count == 43     # every layer gathers its window in prefill
    assert stack.registry.keys() == registry.keys()    # the stack keeps its own copy
    assert [layer.compress_ratio for layer in stack.layers] == list(DSV4_FLASH.compress_ratios)


def test_per_layer_gating() -> None:
    stack, _ = build()
    for layer in stack.layers:
        r = layer.compress_ratio
        assert ("indexer_q" in layer.kernels) == (r == 4)
        want = [K3(256, True)] + ([K3(256 // r, False)] if r > 1 else [])
        assert layer.keys["dequant_gather"] == want
        assert layer.keys.get("indexer_q", []) == (iq_keys() if r == 4 else [])
        assert layer.keys.get("save_partial_states", []) == {
            4: [K4(1024, 4, 4), K4(256, 4, 4)], 128: [K4(512, 128, 8)]}.get(r, [])   # trap 7: indexer state
    assert {layer.kind for layer in stack.layers} == {"SWA", "C4", "C128"}


def test_pro_preset_has_the_flash_keys() -> None:
    """DSv4-Pro differs in index_topk only (its other fields are assumed); no kernel keys on it."""
    _, flash = build(DSV4_FLASH)
    _, pro = build("pro")
    assert pro.keys() == flash.keys()
    assert DSV4_PRO.index_topk == 1024


@pytest.mark.parametrize("indexer,kernel,other", [("fp8", "IndexerQFp8Triton", "IndexerQMxfp4Triton"),
                                                  ("mxfp4", "IndexerQMxfp4Triton", "IndexerQFp8Triton")])
def test_indexer_cache_selects_k1_or_k2(indexer, kernel, other) -> None:
    stack, registry = build(indexer_cache_dtype=indexer)
    assert registry.keys()[kernel] == iq_keys()
    assert other not in registry.keys()
    c4 = next(layer for layer in stack.layers if layer.compress_ratio == 4)
    assert c4.kernels["indexer_q"] is IQ_SPEC.kernel(indexer, None, None, stack.platform)  # the op's


@pytest.mark.parametrize("cache", ["bf16", "bfloat16", "auto", "fp8", "fp8_e4m3"])
def test_plain_row_caches_have_no_k3(cache) -> None:
    stack, registry = build(cache_dtype=cache)
    assert "DequantGatherTriton" not in registry.keys()
    assert all("dequant_gather" not in layer.kernels for layer in stack.layers)
    assert "IndexerQFp8Triton" in registry.keys()
    assert "not used by this configuration" in stack.describe()


@pytest.mark.parametrize("b,want", [
    (0, None),
    (64, [K3(64, True), K3(16, False), K3(1, False)]),
    (4, [K3(4, True), K3(1, False)]),            # both ratios -> page size 1
    (1, [K3(1, True), K3(1, False)]),
    (1024, [K3(1024, True), K3(256, False), K3(8, False)]),
])
def test_k3_keys_follow_block_size(b, want) -> None:
    _, registry = build(block_size=b)
    assert registry.keys().get("DequantGatherTriton") == want


def test_no_active_registry_registers_nowhere_else() -> None:
    outer = WarmupRegistry()
    stack = DSv4AttentionStack(DSV4_FLASH, "sm_90a")     # no registry active
    assert len(outer) == 0
    assert len(stack.registry) == 14


# --------------------------------------------------------------------------- platform gating


def test_platform_gating_selects_what_the_ops_select() -> None:
    """Trap 6: on a GPU platform CuTeDSL is registered, on CPU Triton; always the op's own kernel."""
    for plat, backend in ((cpu_platform("sm_90a"), "triton"), (gpu_platform("sm_100a"), "cutedsl")):
        stack, registry = build(platform=plat)
        assert {r.kernel.backend for r in registry.registrations.values()} == {backend}
        c4 = stack.layers[2]
        assert c4.kernels["indexer_q"] is IQ_SPEC.kernel("fp8", None, None, plat)
        assert c4.kernels["dequant_gather"] is K3_SPEC.kernel(platform=plat)
        assert c4.kernels["save_partial_states"] is K4_SPEC.kernel(platform=plat)
        assert all(r.kernel.target == plat.arch for r in registry.registrations.values())


def test_forced_backend() -> None:
    _, registry = build(platform=gpu_platform("sm_90a"), backend="triton")
    assert set(registry.keys()) == {"IndexerQFp8Triton", "DequantGatherTriton", "SavePartialStatesTriton",
                                    "C4CompressDsMlaTriton", "IndexerCompressTriton", "C128CompressTriton",
                                    "C128StoreDsMlaTriton"}
    with pytest.raises(KernelInputError, match="CuTeDSL kernels run only on a GPU"):
        build(platform=cpu_platform("sm_90a"), backend="cutedsl")
    with pytest.raises(KernelInputError, match="backend"):
        build(backend="cuda")


def test_arch_string_means_a_cpu_platform() -> None:
    stack, _ = build(platform="sm_100a")
    assert stack.platform == cpu_platform("sm_100a")
    with pytest.raises(KernelInputError, match="arch"):
        build(platform="sm_90")


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("settings,arg", [
    (dict(cache_dtype="fp8_e5m2"), "cache_dtype"),
    (dict(cache_dtype="float16"), "cache_dtype"),
    (dict(indexer_cache_dtype="fp4"), "indexer_cache_dtype"),
    (dict(block_size=3), "block_size"),
    (dict(block_size=-4), "block_size"),
    (dict(block_size=True), "block_size"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(max_num_seqs=300, max_num_batched_tokens=256), "max_num_seqs"),
    (dict(max_model_len=2**20 + 1), "max_model_len"),
    (dict(rope_cache_dtype="float16"), "rope_cache_dtype"),
    (dict(warmup_cos_sin_dtypes=()), "warmup_cos_sin_dtypes"),
    (dict(warmup_cos_sin_dtypes=("float16",)), "warmup_cos_sin_dtypes"),
])
def test_bad_settings_rejected_at_configuration(settings, arg) -> None:
    with pytest.raises(KernelInputError, match=f"DSv4AttentionStack: {arg}: expected"):
        DSv4AttentionStack(DSV4_FLASH, "sm_90a", **settings)


def test_cache_dtype_mapping_trap_3() -> None:
    given = ("fp8_ds_mla", "fp8", "fp8_e4m3", "bf16", "bfloat16", "auto")
    assert [normalize_cache_dtype(d) for d in given] == [
        "fp8_ds_mla", "fp8", "fp8", "bfloat16", "bfloat16", "bfloat16"]
    with pytest.raises(KernelInputError, match="fp8_e5m2"):
        normalize_cache_dtype("fp8_e5m2")


def test_unknown_preset() -> None:
    with pytest.raises(KernelInputError, match="preset"):
        DSv4AttentionStack("dsv3")
    assert DSv4AttentionStack("DSv4-Pro", "sm_90a").preset is DSV4_PRO


def test_cuda_graph_sizes() -> None:
    assert build()[0].cuda_graph_sizes()[:5] == (1, 2, 4, 8, 16)
    assert build()[0].cuda_graph_sizes()[-1] == 256                      # max_num_seqs
    assert build(max_num_seqs=1024, max_num_batched_tokens=8192)[0].cuda_graph_sizes()[-1] == 512
    assert build(max_num_seqs=12, max_num_batched_tokens=12)[0].cuda_graph_sizes() == (1, 2, 4, 8, 12)
    assert build(cuda_graphs=False)[0].cuda_graph_sizes() == ()


# --------------------------------------------------------------------------- extensibility


class ToyByName(ToyRowScale):
    """The toy kernel as a family needs it: dispatch reads op arguments only (by name)."""

    def __init__(self, platform=None) -> None:
        self.platform = platform

    def dispatch(self, x):
        return self.CompileKey(dtype=str(x.dtype).removeprefix("torch."), width=x.shape[-1],
                               coarsen=1 if x.shape[0] < 512 else 4)

    def get_warmup_keys(self, config=None):
        cfg = config or ToyConfig()
        return self.trace(x=Like(dtype=WarmupChoices(*cfg.dtypes),
                                 shape=(WarmupIntRange(1, cfg.max_tokens + 1), cfg.width)))

    @kernel_launcher
    def __call__(self, x, *, debug_checks=None):
        return self.dispatch(x), (x,)


def test_a_new_family_plugs_in() -> None:
    """A family spec added to the stack's families, with its model hooks, registers per layer and is
    called by the replay."""
    fam = FamilySpec(
        name="toy", spec_id="T0", summary="toy row scale on sliding-window layers", op_name="toy_row_scale",
        args=(Arg("x", "tensor", (torch.float32, torch.bfloat16), "[T, width]"),),
        contract=ToyByName, variants={DEFAULT_VARIANT: Variant(toy_reference, ToyByName, ToyByName)},
        returns="x scaled per row",
    )
    hooks = ModelHooks(
        config=lambda stack, layer: (ToyConfig(width=512, max_tokens=stack.max_num_batched_tokens)
                                     if layer.compress_ratio == 0 else None),
        call_sites=lambda stack, layer, step: [
            Site("toy", {"x": TensorSpec((step.padded_tokens, 512), torch.float32)})],
        explain_dead=lambda stack, key, stats: ("toy keys in bfloat16 are never requested"
                                                if key.dtype == "bfloat16" else None))
    with pytest.raises(KernelInputError, match=r"model hooks for every family \(none for \['toy'\]\)"):
        build(families=(*FAMILIES, fam))
    stack, registry = build(families=(*FAMILIES, fam), hooks={**HOOKS, "toy": hooks})
    assert registry.registrations["ToyByName"].count == 2
    assert [layer.index for layer in stack.layers if "toy" in layer.kernels] == [0, 1]
    ToyByName.clear_cache()
    ledger = KeyLedger()
    with ledger:
        registry.warmup(progress=False)
    result = replay(stack, make_trace("decode", stack, steps=4), ledger=ledger)
    assert result.ok
    assert result.stats.calls[("toy", "toy")] == 2 * result.steps
    cov = coverage_report(stack, ledger, result)
    reasons = {d.key: d.reason for d in cov.dead if d.kernel == "ToyByName"}
    toy_key = ToyByName.CompileKey
    assert reasons == {toy_key("float32", 512, 4): "never requested by this trace",   # decode T <= 256
                       toy_key("bfloat16", 512, 1): "toy keys in bfloat16 are never requested",
                       toy_key("bfloat16", 512, 4): "toy keys in bfloat16 are never requested"}


def test_describe_and_replaced_preset() -> None:
    small = dataclasses.replace(DSV4_FLASH, num_layers=3, compress_ratios=(0, 4, 128))
    stack, registry = build(small)
    assert registry.registrations["IndexerQFp8Triton"].count == 1
    text = stack.describe()
    assert "3 layers (1 SWA, 1 C4, 1 C128)" in text and "IndexerQFp8Triton (triton) x1 layers, 4 keys" in text
