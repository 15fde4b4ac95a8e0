"""K3 in a DSv4 layer: the fp8_ds_mla sparse-MLA prefill path, every layer of a paged fp8_ds_mla
runtime (the window of B entries; C4 / C128 layers also their compressed entries)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.family.calls import LAUNCH_POOL_PAGES
from dsv4kit.formats.ds_mla import DS_ENTRY_BYTES, allocate_ds_cache, ds_min_page_stride
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase, DequantGatherConfig
from dsv4kit.model.hooks.base import ModelHooks, Site

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = ["HOOKS"]


def _unused(stack: DSv4AttentionStack) -> str | None:
    if stack.kv_cache_dtype == "fp8_ds_mla" and stack.block_size > 0:
        return None
    why = "B = 0 (no paged cache)" if stack.block_size == 0 else f"the KV cache is {stack.cache_dtype}"
    return f"K3 not used by this runtime: {why}; K3 is the fp8_ds_mla sparse-MLA prefill path"


def _config(stack: DSv4AttentionStack, layer: AttentionLayer) -> DequantGatherConfig | None:
    """Every layer of an fp8_ds_mla paged runtime: its window (B), and its compressed entries."""
    if _unused(stack) is not None:
        return None  # dense (plain-row) path, or no paged cache
    return DequantGatherConfig.for_layer(DequantGatherConfig(stack.block_size, (), stack.kv_cache_dtype),
                                         layer.compress_ratio)


def _ds_cache(bs: int) -> TensorSpec:
    stride = ds_min_page_stride(bs)
    return TensorSpec((LAUNCH_POOL_PAGES, bs, DS_ENTRY_BYTES), torch.uint8, (stride, DS_ENTRY_BYTES, 1),
                      pool=f"ds_cache:{bs}",
                      make=lambda device: allocate_ds_cache(LAUNCH_POOL_PAGES, bs, device=device))


def _lens(values: list[int]) -> TensorSpec:
    return TensorSpec((len(values),), torch.int32, values=lambda: torch.tensor(values, dtype=torch.int32))


def _block_table(nreq: int, blocks: int) -> TensorSpec:
    # Page ids alias a small pool: K3 only reads pages, so real layouts are not needed.
    return TensorSpec((nreq, blocks), torch.int32, values=lambda: (
        torch.arange(nreq * blocks, dtype=torch.int32) % LAUNCH_POOL_PAGES).view(nreq, blocks))


def _call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
    """Prefill steps only: the compressed entries (ratio R > 1) at offset 0, then the window."""
    prefill = step.prefill_chunks
    if not prefill:
        return []  # K3 is the prefill path
    b, r, window = stack.block_size, layer.compress_ratio, stack.preset.sliding_window
    nreq = len(prefill)
    seq_lens = [c.context_len + c.num_tokens for c in prefill]   # entries in the cache after the store
    gather = [min(n, c.num_tokens + window - 1) for n, c in zip(seq_lens, prefill, strict=True)]
    comp_lens = [n // r for n in seq_lens] if r > 1 else []
    width = max(comp_lens, default=0)                           # N: the compressed region of a row
    rows = width + max(gather)                                  # M = N + G_max > offset: always dispatched
    out = TensorSpec((nreq, rows, stack.preset.head_dim), torch.bfloat16, pool="k3_workspace")
    sites = []
    if r > 1:
        bs = max(1, b // r)
        sites.append(Site(f"gather_compressed_c{r}", {
            "out": out, "k_cache": _ds_cache(bs), "seq_lens": _lens(comp_lens), "gather_lens": None,
            "block_table": _block_table(nreq, max(1, -(-width // bs))), "block_size": bs, "offset": 0}))
    sites.append(Site("gather_window", {
        "out": out, "k_cache": _ds_cache(b), "seq_lens": _lens(seq_lens), "gather_lens": _lens(gather),
        "block_table": _block_table(nreq, -(-max(seq_lens) // b)), "block_size": b, "offset": width}))
    return sites


def _explain_dead(stack: DSv4AttentionStack, key: DequantGatherBase.CompileKey,
                  stats: ReplayStats) -> str | None:
    if stats.prefill_steps == 0:
        return "no prefill in this trace: K3 gathers only on the sparse-MLA prefill path"
    return None


HOOKS: dict[str, ModelHooks] = {"dequant_gather": ModelHooks(
    config=_config, call_sites=_call_sites, unused=_unused, explain_dead=_explain_dead)}
