"""K4 in ``dsv4kit bench``: the bytes model, the sweep's inputs and plan (:mod:`dsv4kit.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsv4kit.bench import DECODE_SIZES, Point, SweepPlan

__all__ = ["K4_CONFIGS", "PLANS", "save_partial_states_bytes", "save_partial_states_inputs"]

#: The DSv4-Flash K4 configs: (state width, compress ratio, state block size).
K4_CONFIGS = ((1024, 4, 4), (512, 128, 8), (256, 4, 4))


def save_partial_states_bytes(state_width: int, compress_ratio: int, tokens: int) -> int:
    """K4: kv and score rows read, ``min(R, T)`` ape rows, positions and slots; state rows written."""
    t, sw = tokens, state_width
    return 4 * (2 * t * sw + min(compress_ratio, t) * sw + 2 * t * sw) + 16 * t


def save_partial_states_inputs(cfg: tuple[int, int, int], t: int, device: str, seed: int = 0
                               ) -> dict[str, Any]:
    """K4 arguments of one point: kv / score column slices of one ``[T, 2 SW]`` buffer, a state
    cache with one spare block, block-shuffled slots (the inputs of the recorded K4 sweeps)."""
    from dsv4kit.formats.state_cache import allocate_state_cache

    sw, r, sbs = cfg
    g = torch.Generator(device=device).manual_seed(seed)
    kv_score = torch.randn(t, 2 * sw, device=device, generator=g)
    nsb = -(-t // sbs) + 1
    blocks = torch.randperm(nsb, device=device, generator=g)
    tok = torch.arange(t, device=device)
    return {"kv": kv_score[:, :sw], "score": kv_score[:, sw:],
            "ape": torch.randn(r, sw, device=device, generator=g),
            "positions": torch.arange(t, device=device, dtype=torch.int64) + 7,
            "state_cache": allocate_state_cache(nsb, sbs, sw, device=device),
            "slot_mapping": (blocks[tok // sbs] * sbs + tok % sbs).to(torch.int64),
            "state_block_size": sbs, "state_width": sw, "compress_ratio": r}


def _points(t: int) -> list[Point]:
    def build(cfg: tuple[int, int, int]) -> Callable[[str], dict[str, Any]]:
        return lambda device: save_partial_states_inputs(cfg, t, device, seed=t)

    return [Point("save_partial_states", "save_partial_states", f"SW={sw} R={r} sbs={sbs} layout=slices", t,
                  save_partial_states_bytes(sw, r, t), build((sw, r, sbs))) for sw, r, sbs in K4_CONFIGS]


PLANS: tuple[SweepPlan, ...] = (
    SweepPlan("save_partial_states", ("save_partial_states",), (4096, 16384, 65536), _points, DECODE_SIZES,
              hash_family="save_partial_states"),
)
