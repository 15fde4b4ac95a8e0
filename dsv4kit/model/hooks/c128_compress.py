"""K7, K8a, K8b in a DSv4 layer: C128 layers, every step, every token; K7 after K4 wrote the
step's state rows, K8 after K7 (through one pooled compressed-row workspace). K8a stores into an
fp8_ds_mla cache, K8b into a plain-row one; each op class's ``applies`` decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.formats.ds_mla import DS_HEAD_DIM
from dsv4kit.kernels.c128_compress.reference import RATIO, STATE_BLOCK_SIZE
from dsv4kit.kernels.c128_compress.spec import (
    C128CompressBase,
    C128CompressConfig,
    C128StoreBase,
    C128StoreDsMlaBase,
    C128StorePlainBase,
)
from dsv4kit.model.hooks import _compressor as shared
from dsv4kit.model.hooks.base import ModelHooks, Site

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import Step

__all__ = ["HOOKS"]

Contract = type[C128CompressBase] | type[C128StoreBase]
CallSites = Callable[["DSv4AttentionStack", "AttentionLayer", "Step"], list[Site]]


def _config(stack: DSv4AttentionStack, layer: AttentionLayer) -> C128CompressConfig | None:
    if layer.compress_ratio != RATIO:
        return None
    return C128CompressConfig(stack.block_size, (RATIO,), stack.cache_dtype, stack.norm_weight_dtype,
                              state_block_size=stack.preset.c128.state_block_size)


def _compressed_kv(t: int) -> TensorSpec:
    # K7 writes it, K8 reads it: one pooled workspace per runtime (K8 sees what K7 pooled).
    return TensorSpec((t, DS_HEAD_DIM), torch.float32, pool="c128_compressed_kv")


def _compress_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
    """K7: every step, every token (padding: slot -1), after K4 wrote the step's state rows."""
    t = step.padded_tokens
    args = {
        "state_cache": shared.state_spec(t, DS_HEAD_DIM, STATE_BLOCK_SIZE),
        "token_to_req": shared.request_spec(step),
        **shared.token_args(step),
        "block_table": shared.block_table_spec(stack, STATE_BLOCK_SIZE),
        "out": _compressed_kv(t),
    }
    return [Site("compress_main", args)]


def _store_sites(op: str) -> CallSites:
    def call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
        """K8: every step, every token, after K7 (boundary rows only are read and stored)."""
        t = step.padded_tokens
        plain = op == C128StorePlainBase.op_name
        cache_name, cache, capacity = shared.cache_arg(stack, RATIO, "plain" if plain else "ds")
        args: dict[str, Any] = {
            "compressed_kv": _compressed_kv(t),
            **shared.token_args(step),
            "kv_slot_mapping": shared.kv_slots_spec(step, RATIO, capacity),
            **shared.norm_rope_args(stack, DS_HEAD_DIM),
            cache_name: cache,
        }
        if plain:
            args["fp8_scale"] = shared.fp8_scale_spec(stack)
        return [Site("store_main", args)]

    return call_sites


def _unused_ds(stack: DSv4AttentionStack) -> str | None:
    if stack.kv_cache_dtype == "fp8_ds_mla":
        return None
    return f"K8a not used by this runtime: the KV cache is {stack.cache_dtype} (K8b stores it)"


def _hooks(contract: Contract, call_sites: CallSites,
           unused: Callable[[DSv4AttentionStack], str | None] | None = None) -> ModelHooks:
    return ModelHooks(config=shared.gated(_config, contract.applies), call_sites=call_sites,
                      explain_dead=shared.explain_dead, **({"unused": unused} if unused else {}))


HOOKS: dict[str, ModelHooks] = {
    C128CompressBase.op_name: _hooks(C128CompressBase, _compress_sites),
    C128StoreDsMlaBase.op_name: _hooks(C128StoreDsMlaBase, _store_sites(C128StoreDsMlaBase.op_name),
                                       _unused_ds),
    C128StorePlainBase.op_name: _hooks(C128StorePlainBase, _store_sites(C128StorePlainBase.op_name),
                                       shared.unused_plain("K8b", "K8a")),
}
