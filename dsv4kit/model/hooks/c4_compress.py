"""K5, K6, K9 in a DSv4 layer: C4 layers, every step, every token, after K4 wrote the step's state
rows. Gates (spec §2.11): K5 iff B > 0 and an fp8_ds_mla cache, K6 iff a plain-row cache, K9
always (FP8 or MXFP4 from the indexer cache dtype); each op class's ``applies`` decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.family.calls import LAUNCH_POOL_PAGES
from dsv4kit.formats.cache_dtypes import NORM_WEIGHT_DTYPES
from dsv4kit.formats.ds_mla import DS_ENTRY_BYTES, DS_HEAD_DIM, allocate_ds_cache, ds_min_page_stride
from dsv4kit.formats.indexer_cache import IDX_ENTRY_BYTES, IDX_HEAD_DIM, allocate_indexer_cache
from dsv4kit.formats.plain_row import allocate_plain_cache
from dsv4kit.kernels.c4_compress.reference import RATIO
from dsv4kit.kernels.c4_compress.spec import (
    C4CompressBase,
    C4CompressConfig,
    C4CompressDsMlaBase,
    C4CompressPlainBase,
    IndexerCompressBase,
)
from dsv4kit.model.hooks._compressor import block_table_spec, kv_slots_spec, request_rows, state_spec
from dsv4kit.model.hooks.base import ModelHooks, Site

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = ["HOOKS"]

Gate = Callable[["DSv4AttentionStack", "AttentionLayer"], C4CompressConfig | None]
CallSites = Callable[["DSv4AttentionStack", "AttentionLayer", "Step"], list[Site]]


def _config(stack: DSv4AttentionStack, layer: AttentionLayer) -> C4CompressConfig | None:
    if layer.compress_ratio != RATIO:
        return None
    return C4CompressConfig(
        stack.block_size, (RATIO,), stack.cache_dtype, stack.indexer_cache_dtype, stack.norm_weight_dtype
    )


def _gated(contract: type[C4CompressBase]) -> Gate:
    """The registration gate of ``contract``: the layer's config where the runtime calls the op."""

    def config(stack: DSv4AttentionStack, layer: AttentionLayer) -> C4CompressConfig | None:
        cfg = _config(stack, layer)
        return cfg if cfg is not None and contract.applies(cfg) else None

    return config


def _cache(stack: DSv4AttentionStack, op: str) -> tuple[str, TensorSpec, int]:
    """The cache argument of ``op`` in launch mode: (name, spec, capacity in entries)."""
    bs = max(1, stack.block_size // RATIO)
    n = LAUNCH_POOL_PAGES
    if op == "c4_compress_ds_mla":
        stride = ds_min_page_stride(bs)
        return (
            "k_cache",
            TensorSpec(
                (n, bs, DS_ENTRY_BYTES),
                torch.uint8,
                (stride, DS_ENTRY_BYTES, 1),
                pool=f"ds_cache:{bs}",
                make=lambda device: allocate_ds_cache(n, bs, device=device),
            ),
            n * bs,
        )
    if op == "c4_compress_plain":
        dtype = torch.float8_e4m3fn if stack.kv_cache_dtype == "fp8" else torch.bfloat16
        return (
            "kv_cache",
            TensorSpec(
                (n, bs, DS_HEAD_DIM),
                dtype,
                pool=f"plain_cache:{bs}:{dtype}",
                make=lambda device: allocate_plain_cache(n, bs, dtype, device=device),
            ),
            n * bs,
        )
    return (
        "k_cache",
        TensorSpec(
            (n, bs, IDX_ENTRY_BYTES),
            torch.uint8,
            pool=f"indexer_cache:{bs}",
            make=lambda device: allocate_indexer_cache(n, bs, device=device),
        ),
        n * bs,
    )


def _sites(op: str, head: int, site: str) -> CallSites:
    def call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
        """Every step, every token (padding: slot -1), after K4 wrote the step's state rows."""
        p, t = stack.preset, step.padded_tokens
        comp = p.indexer if head == IDX_HEAD_DIM else p.c4
        sbs = comp.state_block_size
        req = request_rows(step)
        state = state_spec(t, 2 * head, sbs)
        cache_arg, cache, capacity = _cache(stack, op)
        args = {
            "state_cache": state,
            "token_to_req": TensorSpec(
                (t,), torch.int32, values=lambda: torch.tensor(req, dtype=torch.int32)
            ),
            "positions": TensorSpec((t,), torch.int64, values=step.positions),
            "slot_mapping": TensorSpec((t,), torch.int64, values=step.slot_mapping),
            "block_table": block_table_spec(stack, sbs),
            "state_block_size": sbs,
            "rms_norm_weight": TensorSpec(
                (head,),
                NORM_WEIGHT_DTYPES[stack.norm_weight_dtype],
                pool=f"norm_weight:{head}:{stack.norm_weight_dtype}",
            ),
            "rms_norm_eps": p.rms_norm_eps,
            # The compressors read the layer's fp32 compress RoPE cache (a bf16 one raises: trap 1).
            "cos_sin_cache": TensorSpec(
                (p.compress_rope.max_pos, p.compress_rope.rope_dim), torch.float32, pool="cos_sin:float32"
            ),
            cache_arg: cache,
            "kv_slot_mapping": kv_slots_spec(step, RATIO, capacity),
        }
        if op == "c4_compress_plain":
            args["fp8_scale"] = (
                TensorSpec((1,), torch.float32, values=lambda: torch.ones(1))
                if stack.kv_cache_dtype == "fp8"
                else None
            )
        if op == "indexer_compress":
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


def _unused_plain(stack: DSv4AttentionStack) -> str | None:
    if stack.kv_cache_dtype != "fp8_ds_mla":
        return None
    return "K6 not used by this runtime: the KV cache is fp8_ds_mla (K5 stores it)"


def _explain_dead(stack: DSv4AttentionStack, key: Any, stats: ReplayStats) -> str | None:
    """Why a warmed compressor key was never requested: another runtime's format or weights."""
    if key.norm_weight_dtype != stack.norm_weight_dtype:
        return (f"norm weights {key.norm_weight_dtype} never requested: this runtime keeps them in "
                f"{stack.norm_weight_dtype} (trap 9)")
    fp4 = getattr(key, "use_fp4_cache", None)
    if fp4 is not None and fp4 != (stack.indexer_cache_dtype == "mxfp4"):
        return (f"{'MXFP4' if fp4 else 'FP8'} indexer pages never requested: this runtime's indexer cache is "
                f"{stack.indexer_cache_dtype}")
    full = getattr(key, "store_full_fp8", None)
    if full is not None and full != (stack.kv_cache_dtype == "fp8"):
        return (f"{'e4m3' if full else 'bf16'} plain rows never requested: this runtime's KV cache is "
                f"{stack.cache_dtype}")
    return "no step in this trace" if not stats.tokens else None


def _hooks(contract: type[C4CompressBase], site: str,
           unused: Callable[[DSv4AttentionStack], str | None] | None = None) -> ModelHooks:
    return ModelHooks(config=_gated(contract), call_sites=_sites(contract.op_name, contract.head, site),
                      explain_dead=_explain_dead, **({"unused": unused} if unused else {}))


HOOKS: dict[str, ModelHooks] = {
    C4CompressDsMlaBase.op_name: _hooks(C4CompressDsMlaBase, "compress_main", _unused_ds),
    C4CompressPlainBase.op_name: _hooks(C4CompressPlainBase, "compress_main", _unused_plain),
    IndexerCompressBase.op_name: _hooks(IndexerCompressBase, "compress_indexer"),
}
