"""What every indexer-Q backend shares: CompileKey, dispatch, warmup space, validation, the call.

K1 (FP8 with the weight fold) and K2 (MXFP4) are separate kernels with separate key sets but
one key *definition* (spec K1/K2): ``(head_dim, rope_dim, num_heads, cos_sin_dtype, coarsen)``.
``coarsen`` (heads per program / thread group) switches from 1 to 4 at 512 tokens, so a
warmup that only traces small batches misses the coarsen-4 keys (spec trap 2); the cos_sin
dtype is warmed both ways because a module-wide cast turns the fp32 cache into bf16 (trap 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from dsv4kit.errors import input_error
from dsv4kit.jit import Immediate, JitKernel, Like, WarmupChoices, WarmupIntRange, fixed, kernel_launcher
from dsv4kit.kernels.indexer_q.reference import (
    DEFAULT_HEAD_SCALE,
    DEFAULT_SOFTMAX_SCALE,
    INDEXER_HEAD_DIM,
    INDEXER_NUM_HEADS,
    check_indexer_q_inputs,
    indexer_q_outputs,
)

__all__ = ["COARSEN_AT", "IndexerQBase", "IndexerQConfig", "Variant"]

#: From this many tokens on, a program handles 4 heads instead of 1 (spec K1 CompileKey).
COARSEN_AT = 512

Variant = Literal["fp8", "mxfp4"]


@dataclass(frozen=True)
class IndexerQConfig:
    """What the model tells the indexer-Q kernels at registration.

    ``max_num_batched_tokens``: the largest T the runtime can pass (the trace covers 1..max).
    ``cos_sin_dtypes``: the cache dtypes the runtime may hand over (both, by default: trap 1).
    ``indexer_cache_dtype``: ``"fp8"`` registers K1 only, ``"mxfp4"`` K2 only.
    """

    max_num_batched_tokens: int = 8192
    cos_sin_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    indexer_cache_dtype: Literal["fp8", "mxfp4"] = "fp8"

    def __post_init__(self) -> None:
        if self.indexer_cache_dtype not in ("fp8", "mxfp4"):
            raise input_error("IndexerQConfig", "indexer_cache_dtype", "'fp8' or 'mxfp4'",
                              repr(self.indexer_cache_dtype))
        if self.max_num_batched_tokens < 1:
            raise input_error("IndexerQConfig", "max_num_batched_tokens", "a positive int",
                              self.max_num_batched_tokens)


class IndexerQBase(JitKernel["IndexerQBase.CompileKey"]):
    """Contract half of K1/K2; a backend class adds the kernel, device rule and launch args."""

    #: "fp8" (K1) or "mxfp4" (K2): the indexer cache format this kernel serves.
    cache_format: ClassVar[Variant]

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_dim: int = fixed(INDEXER_HEAD_DIM)
        rope_dim: int = fixed(64)
        num_heads: int = fixed(INDEXER_NUM_HEADS)
        cos_sin_dtype: str
        coarsen: int

    def dispatch(self, index_q, cos_sin_cache, num_tokens):
        return self.CompileKey(
            head_dim=index_q.shape[2],
            rope_dim=cos_sin_cache.shape[1],
            num_heads=index_q.shape[1],
            cos_sin_dtype=str(cos_sin_cache.dtype).removeprefix("torch."),
            coarsen=1 if num_tokens < COARSEN_AT else 4,
        )

    def get_warmup_keys(self, config: IndexerQConfig | None = None) -> list[CompileKey]:
        cfg = config or IndexerQConfig()
        if cfg.indexer_cache_dtype != self.cache_format:
            return []
        return self.trace(
            index_q=Like(shape=(1, INDEXER_NUM_HEADS, INDEXER_HEAD_DIM)),
            cos_sin_cache=Like(shape=(1, 64), dtype=WarmupChoices(*cfg.cos_sin_dtypes)),
            num_tokens=WarmupIntRange(1, cfg.max_num_batched_tokens + 1),
        )

    # ------------------------------------------------------------------ per backend
    def check_device(self, index_q: torch.Tensor) -> None:
        """The backend's device rule (spec §2.10)."""
        raise NotImplementedError

    def outputs(self, t: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Fresh outputs of the variant (what the op returns)."""
        return indexer_q_outputs(self.cache_format, t, device)

    def launch_args(self, positions: torch.Tensor, index_q: torch.Tensor, cos_sin_cache: torch.Tensor,
                    index_weights: torch.Tensor, outs: tuple[torch.Tensor, ...], ss: float,
                    hs: float) -> tuple[Any, ...]:
        """The executor's arguments for one call."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the call
    @kernel_launcher
    def __call__(
        self,
        positions: torch.Tensor,
        index_q: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        index_weights: torch.Tensor,
        softmax_scale: float = DEFAULT_SOFTMAX_SCALE,
        head_scale: float = DEFAULT_HEAD_SCALE,
        debug_checks: bool = False,
    ) -> Any:
        """K1: ``(q_fp8, weights_out)``; K2: ``(q_packed, q_scale, weights_out)`` (spec K1/K2)."""
        t = check_indexer_q_inputs(self.name, positions, index_q, cos_sin_cache, index_weights,
                                   debug_checks=debug_checks)
        self.check_device(index_q)
        outs = self.outputs(t, index_q.device)
        if t == 0:
            return Immediate(outs)
        key = self.dispatch(index_q, cos_sin_cache, t)
        args = self.launch_args(positions, index_q, cos_sin_cache, index_weights, outs,
                                float(softmax_scale), float(head_scale))
        return key, args, outs
