"""K7, K8a, K8b in a DSv4 layer: C128 layers, every step, every token; K7 after K4 wrote the
step's state rows, K8 after K7 (through one pooled compressed-row workspace). K8a stores into an
fp8_ds_mla cache, K8b into a plain-row one; each op class's ``applies`` decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.family.calls import LAUNCH_POOL_PAGES
from dsv4kit.formats.cache_dtypes import NORM_WEIGHT_DTYPES
from dsv4kit.formats.ds_mla import DS_ENTRY_BYTES, DS_HEAD_DIM, allocate_ds_cache, ds_min_page_stride
from dsv4kit.formats.plain_row import allocate_plain_cache
from dsv4kit.kernels.c128_compress.reference import RATIO, STATE_BLOCK_SIZE
from dsv4kit.kernels.c128_compress.spec import (
    C128CompressBase,
    C128CompressConfig,
    C128StoreBase,
    C128StoreDsMlaBase,
    C128StorePlainBase,
)
from dsv4kit.model.hooks._compressor import block_table_spec, kv_slots_spec, request_rows, state_spec
from dsv4kit.model.hooks.base import ModelHooks, Site

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = ["HOOKS"]

Gate = Callable[["DSv4AttentionStack", "AttentionLayer"], C128CompressConfig | None]
Contract = type[C128CompressBase] | type[C128StoreBase]
CallSites = Callable[["DSv4AttentionStack", "AttentionLayer", "Step"], list[Site]]


def _config(stack: DSv4AttentionStack, layer: AttentionLayer) -> C128CompressConfig | None:
    if layer.compress_ratio != RATIO:
        return None
    return C128CompressConfig(stack.block_size, (RATIO,), stack.cache_dtype, stack.norm_weight_dtype,
                              state_block_size=stack.preset.c128.state_block_size)


def _gated(contract: Contract) -> Gate:
    """The registration gate of ``contract``: the layer's config where the runtime calls the op."""

    def config(stack: DSv4AttentionStack, layer: AttentionLayer) -> C128CompressConfig | None:
        cfg = _config(stack, layer)
        return cfg if cfg is not None and contract.applies(cfg) else None

    return config


def _compressed_kv(t: int) -> TensorSpec:
    # K7 writes it, K8 reads it: one pooled workspace per runtime (K8 sees what K7 pooled).
    return TensorSpec((t, DS_HEAD_DIM), torch.float32, pool="c128_compressed_kv")


def _compress_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
    """K7: every step, every token (padding: slot -1), after K4 wrote the step's state rows."""
    t = step.padded_tokens
    req = request_rows(step)
    args = {
        "state_cache": state_spec(t, DS_HEAD_DIM, STATE_BLOCK_SIZE),
        "token_to_req": TensorSpec((t,), torch.int32, values=lambda: torch.tensor(req, dtype=torch.int32)),
        "positions": TensorSpec((t,), torch.int64, values=step.positions),
        "slot_mapping": TensorSpec((t,), torch.int64, values=step.slot_mapping),
        "block_table": block_table_spec(stack, STATE_BLOCK_SIZE),
        "out": _compressed_kv(t),
    }
    return [Site("compress_main", args)]


def _cache(stack: DSv4AttentionStack, op: str) -> tuple[str, TensorSpec, int]:
    """The cache argument of ``op`` in launch mode: (name, spec, capacity in entries)."""
    kv_bs = max(1, stack.block_size // RATIO)
    n = LAUNCH_POOL_PAGES
    if op == "c128_norm_rope_store_ds_mla":
        stride = ds_min_page_stride(kv_bs)
        spec = TensorSpec(
            (n, kv_bs, DS_ENTRY_BYTES),
            torch.uint8,
            (stride, DS_ENTRY_BYTES, 1),
            pool=f"ds_cache:{kv_bs}",
            make=lambda device: allocate_ds_cache(n, kv_bs, device=device),
        )
        return "k_cache", spec, n * kv_bs
    dtype = torch.float8_e4m3fn if stack.kv_cache_dtype == "fp8" else torch.bfloat16
    spec = TensorSpec(
        (n, kv_bs, DS_HEAD_DIM),
        dtype,
        pool=f"plain_cache:{kv_bs}:{dtype}",
        make=lambda device: allocate_plain_cache(n, kv_bs, dtype, device=device),
    )
    return "kv_cache", spec, n * kv_bs


def _store_sites(op: str) -> CallSites:
    def call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
        """K8: every step, every token, after K7 (boundary rows only are read and stored)."""
        p, t = stack.preset, step.padded_tokens
        cache_arg, cache, capacity = _cache(stack, op)
        args: dict[str, Any] = {
            "compressed_kv": _compressed_kv(t),
            "positions": TensorSpec((t,), torch.int64, values=step.positions),
            "slot_mapping": TensorSpec((t,), torch.int64, values=step.slot_mapping),
            "kv_slot_mapping": kv_slots_spec(step, RATIO, capacity),
            "rms_norm_weight": TensorSpec(
                (DS_HEAD_DIM,),
                NORM_WEIGHT_DTYPES[stack.norm_weight_dtype],
                pool=f"norm_weight:{DS_HEAD_DIM}:{stack.norm_weight_dtype}",
            ),
            "rms_norm_eps": p.rms_norm_eps,
            "cos_sin_cache": TensorSpec(
                (p.compress_rope.max_pos, p.compress_rope.rope_dim), torch.float32, pool="cos_sin:float32"
            ),
            cache_arg: cache,
        }
        if op == "c128_norm_rope_store_plain":
            args["fp8_scale"] = (
                TensorSpec((1,), torch.float32, values=lambda: torch.ones(1))
                if stack.kv_cache_dtype == "fp8"
                else None
            )
        return [Site("store_main", args)]

    return call_sites


def _unused_ds(stack: DSv4AttentionStack) -> str | None:
    if stack.kv_cache_dtype == "fp8_ds_mla":
        return None
    return f"K8a not used by this runtime: the KV cache is {stack.cache_dtype} (K8b stores it)"


def _unused_plain(stack: DSv4AttentionStack) -> str | None:
    if stack.kv_cache_dtype != "fp8_ds_mla":
        return None
    return "K8b not used by this runtime: the KV cache is fp8_ds_mla (K8a stores it)"


def _explain_dead(stack: DSv4AttentionStack, key: Any, stats: ReplayStats) -> str | None:
    """Why a warmed C128 key was never requested: another runtime's weights, format or pages."""
    dtype = getattr(key, "norm_weight_dtype", None)
    if dtype is not None and dtype != stack.norm_weight_dtype:
        return (
            f"norm weights {dtype} never requested: this runtime keeps them in "
            f"{stack.norm_weight_dtype} (trap 9)"
        )
    full = getattr(key, "store_full_fp8", None)
    if full is not None and full != (stack.kv_cache_dtype == "fp8"):
        return (
            f"{'e4m3' if full else 'bf16'} plain rows never requested: this runtime's KV cache is "
            f"{stack.cache_dtype}"
        )
    return "no step in this trace" if not stats.tokens else None


def _hooks(contract: Contract, call_sites: CallSites,
           unused: Callable[[DSv4AttentionStack], str | None] | None = None) -> ModelHooks:
    return ModelHooks(config=_gated(contract), call_sites=call_sites, explain_dead=_explain_dead,
                      **({"unused": unused} if unused else {}))


HOOKS: dict[str, ModelHooks] = {
    C128CompressBase.op_name: _hooks(C128CompressBase, _compress_sites),
    C128StoreDsMlaBase.op_name: _hooks(C128StoreDsMlaBase, _store_sites(C128StoreDsMlaBase.op_name),
                                       _unused_ds),
    C128StorePlainBase.op_name: _hooks(C128StorePlainBase, _store_sites(C128StorePlainBase.op_name),
                                       _unused_plain),
}
