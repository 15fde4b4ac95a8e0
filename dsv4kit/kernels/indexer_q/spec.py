"""K1/K2 indexer-Q: the contract every backend shares (CompileKey, dispatch, warmup space, the
call) and the family spec (its place in a DSv4 layer: :mod:`dsv4kit.model.hooks.indexer_q`).

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
from dsv4kit.family import FamilySpec, Variant, backend_modules
from dsv4kit.family.operands import kernel_call
from dsv4kit.formats.checks import check_values_in_range
from dsv4kit.jit import Immediate, JitKernel, Like, WarmupChoices, WarmupIntRange, fixed
from dsv4kit.kernels.indexer_q.reference import (
    ARGS,
    INDEXER_HEAD_DIM,
    INDEXER_NUM_HEADS,
    IndexerQOperands,
    check_indexer_q_inputs,
    indexer_q_fp8_reference,
    indexer_q_mxfp4_reference,
    indexer_q_outputs,
)

__all__ = ["COARSEN_AT", "SPEC", "CacheFormat", "IndexerQBase", "IndexerQConfig"]

#: From this many tokens on, a program handles 4 heads instead of 1 (spec K1 CompileKey).
COARSEN_AT = 512

CacheFormat = Literal["fp8", "mxfp4"]


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
    cache_format: ClassVar[CacheFormat]

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_dim: int = fixed(INDEXER_HEAD_DIM)
        rope_dim: int = fixed(64)
        num_heads: int = fixed(INDEXER_NUM_HEADS)
        cos_sin_dtype: str
        coarsen: int

    def dispatch(self, index_q, cos_sin_cache):
        return self.CompileKey(
            head_dim=index_q.shape[2],
            rope_dim=cos_sin_cache.shape[1],
            num_heads=index_q.shape[1],
            cos_sin_dtype=str(cos_sin_cache.dtype).removeprefix("torch."),
            coarsen=1 if index_q.shape[0] < COARSEN_AT else 4,
        )

    def get_warmup_keys(self, config: IndexerQConfig | None = None) -> list[CompileKey]:
        cfg = config or IndexerQConfig()
        if cfg.indexer_cache_dtype != self.cache_format:
            return []
        tokens = WarmupIntRange(1, cfg.max_num_batched_tokens + 1)
        keys = self.trace(
            index_q=Like(shape=(tokens, INDEXER_NUM_HEADS, INDEXER_HEAD_DIM)),
            cos_sin_cache=Like(shape=(1, 64), dtype=WarmupChoices(*cfg.cos_sin_dtypes)),
        )
        # The spec table's order: per cos_sin dtype (as configured), coarsen 1 then 4.
        order = [str(d).removeprefix("torch.") for d in cfg.cos_sin_dtypes]
        return sorted(keys, key=lambda k: (order.index(k.cos_sin_dtype), k.coarsen))

    # ------------------------------------------------------------------ per backend
    def outputs(self, t: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Fresh outputs of the variant (what the op returns)."""
        return indexer_q_outputs(self.cache_format, t, device)

    def launch_args(self, positions: torch.Tensor, index_q: torch.Tensor, cos_sin_cache: torch.Tensor,
                    index_weights: torch.Tensor, outs: tuple[torch.Tensor, ...], ss: float,
                    hs: float) -> tuple[Any, ...]:
        """The executor's arguments for one call."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the call
    __call__ = kernel_call(
        IndexerQOperands,
        """K1: ``(q_fp8, weights_out)``; K2: ``(q_packed, q_scale, weights_out)`` (spec K1/K2).

        ``debug_checks`` (reads positions back: ``0 <= p < max_pos``) defaults to on under the
        CPU interpreter, where an out-of-range position would read outside the cache.
        """)

    def launch_operands(self, ops: Any, debug_checks: bool | None) -> Any:
        """The launch spec of one bound call (``ops``, an :data:`IndexerQOperands`)."""
        debug = (not self.platform.is_cuda) if debug_checks is None else debug_checks
        t = check_indexer_q_inputs(self.name, ops, debug_checks=False)
        positions, index_q, cos_sin_cache, index_weights, softmax_scale, head_scale = ops
        self.check_device("index_q", index_q)
        if debug:  # the reference's value check, after the device rule (no read of a meta tensor)
            check_values_in_range(self.name, "positions", positions, 0, cos_sin_cache.shape[0])
        outs = self.outputs(t, index_q.device)
        if t == 0:
            return Immediate(outs)
        key = self.dispatch(index_q, cos_sin_cache)
        args = self.launch_args(positions, index_q, cos_sin_cache, index_weights, outs,
                                float(softmax_scale), float(head_scale))
        return key, args, outs


_triton, _cutedsl = backend_modules(__package__)  # each imported on first use


SPEC = FamilySpec(
    name="indexer_q", spec_id="K1/K2",
    summary="indexer-Q RoPE + FP8 (K1) or MXFP4 (K2) quant; C4 layers, every step, all T tokens",
    op_name="indexer_q_rope_quant",
    args=ARGS,
    contract=IndexerQBase,
    variants={"fp8": Variant(indexer_q_fp8_reference, lambda: _triton().IndexerQFp8Triton,
                            lambda: _cutedsl().IndexerQFp8CuTeDSL),
              "mxfp4": Variant(indexer_q_mxfp4_reference, lambda: _triton().IndexerQMxfp4Triton,
                               lambda: _cutedsl().IndexerQMxfp4CuTeDSL)},
    variant_arg="cache_format",
    returns="K1 (fp8): (q_fp8 e4m3fn [T, 64, 128], weights_out fp32 [T, 64]) with the q scale folded into "
            "the weights; K2 (mxfp4): (q_packed uint8 [T, 64, 64], q_scale int32 [T, 64], weights_out fp32 "
            "[T, 64])",
    config_type=IndexerQConfig,
    outputs=lambda a: indexer_q_outputs(a["cache_format"], a["index_q"].shape[0], a["index_q"].device),
)
