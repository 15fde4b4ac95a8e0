"""Test inputs for indexer-Q: the spec's regimes (§2.12) at any token count.

Shared by the tests, the notebook and the GPU verification script, so every place checks
the same awkward values. Each case is fresh random data from its seed; the regime decides
what is planted into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4kit.kernels.indexer_q.reference import INDEXER_HEAD_DIM, INDEXER_NUM_HEADS

__all__ = ["REGIMES", "IndexerQCase", "make_case"]

REGIMES = ("normal", "zero", "tiny", "large", "saturating", "outlier", "crafted")


@dataclass
class IndexerQCase:
    """One set of K1/K2 inputs (CPU tensors; move them with :meth:`to`)."""

    positions: torch.Tensor
    index_q: torch.Tensor
    cos_sin_cache: torch.Tensor
    index_weights: torch.Tensor
    regime: str

    def to(self, device: torch.device | str) -> IndexerQCase:
        return IndexerQCase(self.positions.to(device), self.index_q.to(device), self.cos_sin_cache.to(device),
                            self.index_weights.to(device), self.regime)

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.positions, self.index_q, self.cos_sin_cache, self.index_weights


def _cos_sin(max_pos: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    # A real-looking table (unit pairs at random angles); values are data to the kernels.
    ang = torch.rand(max_pos, 32, generator=g, dtype=torch.float64) * 6.283185307179586
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(torch.float32).to(dtype)


def _plant(q: torch.Tensor, regime: str, g: torch.Generator) -> None:
    """Overwrite some heads of ``q`` (fp32 [T, 64, 128], before the bf16 cast) with the regime."""
    t = q.shape[0]
    heads = q.view(t * INDEXER_NUM_HEADS, INDEXER_HEAD_DIM)
    n = heads.shape[0]
    pick = torch.randperm(n, generator=g)[: max(1, n // 4)]
    if regime == "zero":
        heads[pick] = 0.0
        heads[pick[::2]] = -0.0
    elif regime == "tiny":
        mag = torch.exp2(-50.0 - 10.0 * torch.rand(len(pick), INDEXER_HEAD_DIM, generator=g))
        heads[pick] = mag * torch.sign(torch.randn(len(pick), INDEXER_HEAD_DIM, generator=g))
        # D1 demo blocks: amax in (0, 0.0273], so the 1e-4 floor decides the scale.
        heads[pick[1::3]] *= 0.0
        heads[pick[1::3]] += 0.01 * torch.rand(len(pick[1::3]), INDEXER_HEAD_DIM, generator=g)
    elif regime == "large":
        heads[pick] *= torch.exp2(torch.randint(60, 101, (len(pick), 1), generator=g).float())
    elif regime == "saturating":
        # amax exactly 448 * 2^k (nope dims, so it survives RoPE untouched) -> byte 0x7E.
        k = torch.randint(-20, 20, (len(pick), 1), generator=g).float()
        heads[pick, :64] = heads[pick, :64].clamp(-1, 1) * torch.exp2(k) * 400
        heads[pick, 5] = 448.0 * torch.exp2(k[:, 0])
        heads[pick[::2], 7] = -448.0 * torch.exp2(k[::2, 0]) * (1 + 2.0**-7)  # next bf16 above: e + 1
    elif regime == "outlier":
        heads[pick, 3] = heads[pick].abs().amax(dim=1) * 1e4
    elif regime == "crafted":
        # e4m3 ties and carries after the scale: 17*2^e -> 16, 19*2^e -> 20, 15.9*2^e -> 16;
        # small negatives that round to -0; the amax element fixes 2^e = 2^k.
        k = torch.randint(-10, 10, (len(pick), 1), generator=g).float()
        s = torch.exp2(k)
        vals = torch.tensor(
            [448.0, 17.0 / 64, 19.0 / 64, 15.9 / 64, -(2.0**-12), 0.5 + 2.0**-5, 1.0 + 3 * 2.0**-8]
        )
        heads[pick, : len(vals)] = vals * s
    elif regime != "normal":
        raise ValueError(f"make_case: regime: expected one of {REGIMES}, got {regime!r}")


def make_case(num_tokens: int, cos_sin_dtype: torch.dtype = torch.float32, regime: str = "normal",
              seed: int = 0, max_pos: int = 8192) -> IndexerQCase:
    """Random K1/K2 inputs with ``regime`` planted; positions include 0 and ``max_pos - 1``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, INDEXER_NUM_HEADS, INDEXER_HEAD_DIM, generator=g)
    _plant(q, regime, g)
    w = torch.randn(num_tokens, INDEXER_NUM_HEADS, generator=g)
    if regime in ("zero", "large", "crafted") and num_tokens:
        w[0, :4] = torch.tensor([0.0, -0.0, 2.0**20, -(2.0**20)])
    pos = torch.randint(0, max_pos, (num_tokens,), generator=g)
    if num_tokens >= 2:
        pos[0], pos[-1] = 0, max_pos - 1
    cs = _cos_sin(max_pos, torch.float32, g)
    if regime == "crafted":
        # RoPE outputs on bf16 ties: c = 1 + 3*2^-8, s = 0 at these positions (x = 1 dims).
        cs[pos[: max(1, num_tokens // 2)], :32] = 1.0 + 3 * 2.0**-8
        cs[pos[: max(1, num_tokens // 2)], 32:] = 0.0
        q[: max(1, num_tokens // 2), :, 64:] = 1.0
    return IndexerQCase(pos, q.to(torch.bfloat16), cs.to(cos_sin_dtype), w.to(torch.bfloat16), regime)
