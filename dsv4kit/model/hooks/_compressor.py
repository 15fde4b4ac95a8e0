"""What every compressor's model hooks share: the launch-mode stand-ins of one serving step,
the registration gate, and why a runtime leaves a key or an op unused.

The state cache is the very pool K4 writes (same name, same shape); the block table is one
pooled all-zero table per runtime (launch mode checks keys and launches, not values); request
rows and compressed-cache slots follow the step's sequences. The C4 (K5, K6, K9) and C128 (K7,
K8a, K8b) hooks both build their arguments from these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.family.calls import LAUNCH_POOL_PAGES
from dsv4kit.formats.cache_dtypes import NORM_WEIGHT_DTYPES
from dsv4kit.formats.ds_mla import DS_ENTRY_BYTES, DS_HEAD_DIM, allocate_ds_cache, ds_min_page_stride
from dsv4kit.formats.indexer_cache import IDX_ENTRY_BYTES, allocate_indexer_cache
from dsv4kit.formats.plain_row import allocate_plain_cache
from dsv4kit.formats.state_cache import allocate_state_cache

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = [
    "block_table_spec",
    "cache_arg",
    "explain_dead",
    "fp8_scale_spec",
    "gated",
    "kv_slots_spec",
    "norm_rope_args",
    "request_rows",
    "request_spec",
    "state_spec",
    "token_args",
    "unused_plain",
]

C = TypeVar("C")
#: A compressed cache's layout: fp8_ds_mla (E1), plain rows (E2 / E3), indexer K (E4 / E5).
CacheKind = Literal["ds", "plain", "indexer"]


def gated(layer_config: Callable[[DSv4AttentionStack, AttentionLayer], C | None],
          applies: Callable[[C], bool]) -> Callable[[DSv4AttentionStack, AttentionLayer], C | None]:
    """The registration gate of one op: the layer's config (``layer_config``) where the runtime
    calls the op, i.e. where ``applies`` (the op class's) accepts it; else None."""

    def config(stack: DSv4AttentionStack, layer: AttentionLayer) -> C | None:
        cfg = layer_config(stack, layer)
        return cfg if cfg is not None and applies(cfg) else None

    return config


def state_spec(t: int, state_width: int, sbs: int) -> TensorSpec:
    """K4's state pool of width ``state_width`` (``state:<SW>``), sized for ``t`` tokens."""
    nsb = max(1, -(-t // sbs))
    return TensorSpec(
        (nsb, sbs, 2 * state_width),
        torch.float32,
        pool=f"state:{state_width}",
        make=lambda device: allocate_state_cache(nsb, sbs, state_width, device=device),
    )


def request_rows(step: Step) -> list[int]:
    """Request row (chunk index) of each token; padding tokens row 0."""
    req = []
    for i, c in enumerate(step.seqs):
        req += [i] * c.num_tokens
    return req + [0] * (step.padded_tokens - len(req))


def block_table_spec(stack: DSv4AttentionStack, sbs: int) -> TensorSpec:
    """The state block table of launch mode: one row per sequence the runtime may batch, wide
    enough for the longest context, every entry block 0 (a window may read any in-range block).
    One pooled allocation per runtime."""
    shape = (stack.max_num_seqs, max(1, -(-stack.max_model_len // sbs)))
    return TensorSpec(shape, torch.int32, pool=f"state_block_table:{sbs}",
                      make=lambda device: torch.zeros(shape, dtype=torch.int32, device=device))


def kv_slots_spec(step: Step, ratio: int, capacity: int) -> TensorSpec:
    """The k-th boundary token (``(p + 1) % ratio == 0``) of the step writes compressed slot k
    (while the pool has room); every other token -1."""

    def values() -> torch.Tensor:
        pos = step.positions()
        out = torch.full((step.padded_tokens,), -1, dtype=torch.int64)
        live = torch.zeros(step.padded_tokens, dtype=torch.bool)
        live[: step.num_tokens] = True
        sel = torch.nonzero(live & ((pos + 1) % ratio == 0)).flatten()[:capacity]
        out[sel] = torch.arange(sel.numel())
        return out

    return TensorSpec((step.padded_tokens,), torch.int64, values=values)


def request_spec(step: Step) -> TensorSpec:
    """``token_to_req``: the request row of each of the step's (padded) tokens."""
    req = request_rows(step)
    return TensorSpec((step.padded_tokens,), torch.int32, values=lambda: torch.tensor(req, dtype=torch.int32))


def token_args(step: Step) -> dict[str, TensorSpec]:
    """``positions`` and ``slot_mapping`` of the step's (padded) tokens."""
    t = step.padded_tokens
    return {
        "positions": TensorSpec((t,), torch.int64, values=step.positions),
        "slot_mapping": TensorSpec((t,), torch.int64, values=step.slot_mapping),
    }


def norm_rope_args(stack: DSv4AttentionStack, width: int) -> dict[str, Any]:
    """The RMSNorm weight (``width`` wide, the runtime's dtype), its eps, and the layer's fp32
    compress RoPE cache (the compressors refuse a bf16 one: trap 1)."""
    p = stack.preset
    return {
        "rms_norm_weight": TensorSpec(
            (width,),
            NORM_WEIGHT_DTYPES[stack.norm_weight_dtype],
            pool=f"norm_weight:{width}:{stack.norm_weight_dtype}",
        ),
        "rms_norm_eps": p.rms_norm_eps,
        "cos_sin_cache": TensorSpec(
            (p.compress_rope.max_pos, p.compress_rope.rope_dim), torch.float32, pool="cos_sin:float32"
        ),
    }


def fp8_scale_spec(stack: DSv4AttentionStack) -> TensorSpec | None:
    """A plain-row store's ``fp8_scale``: one fp32 for an e4m3 cache (E3), None for bf16 (E2)."""
    if stack.kv_cache_dtype != "fp8":
        return None
    return TensorSpec((1,), torch.float32, values=lambda: torch.ones(1))


def cache_arg(stack: DSv4AttentionStack, ratio: int, kind: CacheKind) -> tuple[str, TensorSpec, int]:
    """A compressed cache argument in launch mode (one pool per layout and page size, of
    ``LAUNCH_POOL_PAGES`` pages of ``B // ratio`` entries): (name, spec, capacity in entries)."""
    bs = max(1, stack.block_size // ratio)
    n = LAUNCH_POOL_PAGES
    if kind == "ds":
        spec = TensorSpec(
            (n, bs, DS_ENTRY_BYTES),
            torch.uint8,
            (ds_min_page_stride(bs), DS_ENTRY_BYTES, 1),
            pool=f"ds_cache:{bs}",
            make=lambda device: allocate_ds_cache(n, bs, device=device),
        )
        return "k_cache", spec, n * bs
    if kind == "plain":
        dtype = torch.float8_e4m3fn if stack.kv_cache_dtype == "fp8" else torch.bfloat16
        spec = TensorSpec(
            (n, bs, DS_HEAD_DIM),
            dtype,
            pool=f"plain_cache:{bs}:{dtype}",
            make=lambda device: allocate_plain_cache(n, bs, dtype, device=device),
        )
        return "kv_cache", spec, n * bs
    spec = TensorSpec(
        (n, bs, IDX_ENTRY_BYTES),
        torch.uint8,
        pool=f"indexer_cache:{bs}",
        make=lambda device: allocate_indexer_cache(n, bs, device=device),
    )
    return "k_cache", spec, n * bs


def unused_plain(plain: str, ds: str) -> Callable[[DSv4AttentionStack], str | None]:
    """The ``unused`` hook of the plain-row store ``plain`` (K6, K8b): a runtime of an fp8_ds_mla
    cache stores with ``ds`` (K5, K8a) instead."""

    def unused(stack: DSv4AttentionStack) -> str | None:
        if stack.kv_cache_dtype != "fp8_ds_mla":
            return None
        return f"{plain} not used by this runtime: the KV cache is fp8_ds_mla ({ds} stores it)"

    return unused


def explain_dead(stack: DSv4AttentionStack, key: Any, stats: ReplayStats) -> str | None:
    """Why a warmed compressor key was never requested: another runtime's weights, format or pages
    (each key field checked where the key has it)."""
    dtype = getattr(key, "norm_weight_dtype", None)
    if dtype is not None and dtype != stack.norm_weight_dtype:
        return (f"norm weights {dtype} never requested: this runtime keeps them in "
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
