"""What every compressor's model hooks share: the launch-mode stand-ins of one serving step.

The state cache is the very pool K4 writes (same name, same shape); the block table is one
pooled all-zero table per runtime (launch mode checks keys and launches, not values); request
rows and compressed-cache slots follow the step's sequences.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dsv4kit.family import TensorSpec
from dsv4kit.formats.state_cache import allocate_state_cache

if TYPE_CHECKING:
    from dsv4kit.model.stack import DSv4AttentionStack
    from dsv4kit.model.trace import Step

__all__ = ["block_table_spec", "kv_slots_spec", "request_rows", "state_spec"]


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
