"""K4 in a DSv4 layer: C4 layers write the main and the indexer state (trap 7), C128 layers the
main state, sliding-window layers nothing; every step, every token (padding: slot -1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.formats.state_cache import allocate_state_cache
from dsv4kit.kernels.save_partial_states.spec import SavePartialStatesConfig
from dsv4kit.model.hooks.base import ModelHooks, Site

if TYPE_CHECKING:
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import Step

__all__ = ["HOOKS"]


def _compressors(stack: DSv4AttentionStack, layer: AttentionLayer) -> tuple[tuple[str, Any], ...]:
    """(call site, compressor preset) of each state cache the layer writes: C4 layers write the
    main state and the indexer's (trap 7), C128 layers the main state, SWA layers none."""
    p = stack.preset
    return {4: (("save_main_state", p.c4), ("save_indexer_state", p.indexer)),
            128: (("save_main_state", p.c128),)}.get(layer.compress_ratio, ())


def _config(stack: DSv4AttentionStack, layer: AttentionLayer) -> SavePartialStatesConfig | None:
    comps = _compressors(stack, layer)
    if not comps:
        return None
    return SavePartialStatesConfig(tuple((c.state_width, c.ratio, c.state_block_size) for _, c in comps))


def _column(t: int, sw: int, half: int) -> TensorSpec:
    # kv and score are the two column halves of the compressor's fp32 [T, 2 * SW] GEMM output.
    return TensorSpec((t, sw), torch.float32, (2 * sw, 1),
                      make=lambda device: torch.zeros(t, 2 * sw, device=device)[:, half * sw:(half + 1) * sw])


def _slots(step: Step) -> TensorSpec:
    # One state slot per real token; the padding of a CUDA-graph batch writes nothing (-1).
    def values() -> torch.Tensor:
        out = torch.full((step.padded_tokens,), -1, dtype=torch.int64)
        out[:step.num_tokens] = torch.arange(step.num_tokens)
        return out

    return TensorSpec((step.padded_tokens,), torch.int64, values=values)


def _call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Site]:
    """Every step, every token (padding included: slot -1), once per state cache of the layer."""
    t = step.padded_tokens
    sites = []
    for site, c in _compressors(stack, layer):
        sw, sbs = c.state_width, c.state_block_size
        nsb = max(1, -(-t // sbs))
        sites.append(Site(site, {
            "kv": _column(t, sw, 0), "score": _column(t, sw, 1),
            "ape": TensorSpec(c.ape_shape, torch.float32, pool=f"ape:{c.ratio}:{sw}"),
            "positions": TensorSpec((t,), torch.int64, values=step.positions),
            "state_cache": TensorSpec((nsb, sbs, 2 * sw), torch.float32, pool=f"state:{sw}", make=(
                lambda device, nsb=nsb, sbs=sbs, sw=sw: allocate_state_cache(nsb, sbs, sw, device=device))),
            "slot_mapping": _slots(step),
            "state_block_size": sbs, "state_width": sw, "compress_ratio": c.ratio,
        }))
    return sites


HOOKS: dict[str, ModelHooks] = {"save_partial_states": ModelHooks(config=_config, call_sites=_call_sites)}
