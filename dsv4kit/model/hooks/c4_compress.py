"""K5, K6, K9 in a DSv4 layer: C4 layers, every step, every token, after K4 wrote the step's state
rows. Gates (spec §2.11): K5 iff B > 0 and an fp8_ds_mla cache, K6 iff a plain-row cache, K9
always (FP8 or MXFP4 from the indexer cache dtype); each op class's ``applies`` decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dsv4kit.formats.indexer_cache import IDX_HEAD_DIM
from dsv4kit.kernels.c4_compress.reference import RATIO
from dsv4kit.kernels.c4_compress.spec import (
    C4CompressBase,
    C4CompressConfig,
    C4CompressDsMlaBase,
    C4CompressPlainBase,
    IndexerCompressBase,
)
from dsv4kit.model.hooks import _compressor as shared
from dsv4kit.model.hooks.base import ModelHooks, Site

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import Step

__all__ = ["HOOKS"]

CallSites = Callable[["DSv4AttentionStack", "AttentionLayer", "Step"], list[Site]]

#: The cache each op writes.
_CACHE_KIND: dict[str, shared.CacheKind] = {
    C4CompressDsMlaBase.op_name: "ds",
    C4CompressPlainBase.op_name: "plain",
    IndexerCompressBase.op_name: "indexer",
}


def _config(stack: DSv4AttentionStack, layer: AttentionLayer) -> C4CompressConfig | None:
    if layer.compress_ratio != RATIO:
        return None
    return C4CompressConfig(
        stack.block_size, (RATIO,), stack.cache_dtype, stack.indexer_cache_dtype, stack.norm_weight_dtype
    )


def _sites(op: str, head: int, site: str) -> CallSites:
    def call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
        """Every step, every token (padding: slot -1), after K4 wrote the step's state rows."""
        p, t = stack.preset, step.padded_tokens
        comp = p.indexer if head == IDX_HEAD_DIM else p.c4
        sbs = comp.state_block_size
        cache_name, cache, capacity = shared.cache_arg(stack, RATIO, _CACHE_KIND[op])
        args = {
            "state_cache": shared.state_spec(t, 2 * head, sbs),
            "token_to_req": shared.request_spec(step),
            **shared.token_args(step),
            "block_table": shared.block_table_spec(stack, sbs),
            "state_block_size": sbs,
            **shared.norm_rope_args(stack, head),
            cache_name: cache,
            "kv_slot_mapping": shared.kv_slots_spec(step, RATIO, capacity),
        }
        if op == C4CompressPlainBase.op_name:
            args["fp8_scale"] = shared.fp8_scale_spec(stack)
        if op == IndexerCompressBase.op_name:
            args["use_fp4_cache"] = stack.indexer_cache_dtype == "mxfp4"
        return [Site(site, args)]

    return call_sites


def _unused_ds(stack: DSv4AttentionStack) -> str | None:
    if stack.kv_cache_dtype == "fp8_ds_mla" and stack.block_size > 0:
        return None
    why = (
        "B = 0 (no paged cache)"
        if stack.block_size == 0
        else f"the KV cache is {stack.cache_dtype} (K6 stores it)"
    )
    return f"K5 not used by this runtime: {why}"


def _hooks(contract: type[C4CompressBase], site: str,
           unused: Callable[[DSv4AttentionStack], str | None] | None = None) -> ModelHooks:
    return ModelHooks(config=shared.gated(_config, contract.applies),
                      call_sites=_sites(contract.op_name, contract.head, site),
                      explain_dead=shared.explain_dead, **({"unused": unused} if unused else {}))


HOOKS: dict[str, ModelHooks] = {
    C4CompressDsMlaBase.op_name: _hooks(C4CompressDsMlaBase, "compress_main", _unused_ds),
    C4CompressPlainBase.op_name: _hooks(C4CompressPlainBase, "compress_main",
                                        shared.unused_plain("K6", "K5")),
    IndexerCompressBase.op_name: _hooks(IndexerCompressBase, "compress_indexer"),
}
