"""K1/K2 in a DSv4 layer: C4 layers (they have the indexer), every step, all T tokens; the
variant (FP8 or MXFP4) is the runtime's indexer cache format."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.formats.cache_dtypes import ROPE_CACHE_DTYPES
from dsv4kit.kernels.indexer_q.spec import COARSEN_AT, IndexerQBase, IndexerQConfig
from dsv4kit.model.hooks.base import ModelHooks, Site

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = ["HOOKS"]


def _config(stack: DSv4AttentionStack, layer: AttentionLayer) -> IndexerQConfig | None:
    """C4 layers only (they have the indexer); every step, all T tokens."""
    if layer.compress_ratio != 4:
        return None
    return IndexerQConfig(max_num_batched_tokens=stack.max_num_batched_tokens,
                          cos_sin_dtypes=tuple(ROPE_CACHE_DTYPES[d] for d in stack.warmup_cos_sin_dtypes),
                          indexer_cache_dtype=stack.indexer_cache_dtype)


def _call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
    t, p = step.padded_tokens, stack.preset
    return [Site("indexer_q", {
        "positions": TensorSpec((t,), torch.int64, values=step.positions),
        "index_q": TensorSpec((t, p.index_n_heads, p.index_head_dim), torch.bfloat16, pool="index_q"),
        "cos_sin_cache": TensorSpec((p.compress_rope.max_pos, p.compress_rope.rope_dim),
                                    ROPE_CACHE_DTYPES[stack.rope_cache_dtype],
                                    pool=f"cos_sin:{stack.rope_cache_dtype}"),
        "index_weights": TensorSpec((t, p.index_n_heads), torch.bfloat16, pool="index_weights"),
        "cache_format": stack.indexer_cache_dtype,
        "softmax_scale": p.indexer_softmax_scale,
        "head_scale": p.indexer_head_scale,
    })]


def _explain_dead(stack: DSv4AttentionStack, key: IndexerQBase.CompileKey, stats: ReplayStats) -> str | None:
    if key.cos_sin_dtype != stack.rope_cache_dtype:
        return (f"cos_sin {key.cos_sin_dtype} never requested: this runtime's RoPE cache is "
                f"{stack.rope_cache_dtype} (the other dtype is warmed for a model-dtype cast, trap 1)")
    if not stats.tokens:
        return "no step in this trace"
    if key.coarsen > 1 and max(stats.tokens) < COARSEN_AT:
        return (f"coarsen-{key.coarsen} never requested by this trace (largest batch "
                f"{max(stats.tokens)} tokens < {COARSEN_AT})")
    if key.coarsen == 1 and min(stats.tokens) >= COARSEN_AT:
        return (f"coarsen-1 never requested by this trace (smallest batch {min(stats.tokens)} tokens "
                f">= {COARSEN_AT})")
    return None


HOOKS: dict[str, ModelHooks] = {"indexer_q": ModelHooks(
    config=_config, call_sites=_call_sites,
    variant=lambda stack: stack.indexer_cache_dtype,
    variant_reason=lambda stack: f"this runtime's indexer cache is {stack.indexer_cache_dtype}",
    explain_dead=_explain_dead,
)}
