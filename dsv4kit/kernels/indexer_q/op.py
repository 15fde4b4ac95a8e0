"""The public indexer-Q op and its registration, both routed through one backend choice."""

from __future__ import annotations

import functools
from typing import Literal

import torch

from dsv4kit.errors import input_error
from dsv4kit.kernels.indexer_q.common import IndexerQBase, IndexerQConfig, Variant
from dsv4kit.kernels.indexer_q.reference import DEFAULT_HEAD_SCALE, DEFAULT_SOFTMAX_SCALE
from dsv4kit.platform import Platform, current_platform

__all__ = ["indexer_q_kernel", "indexer_q_rope_quant", "register_indexer_q"]

Backend = Literal["triton", "cutedsl"]


def _kernel_class(cache_format: Variant, backend: Backend) -> type[IndexerQBase]:
    if cache_format not in ("fp8", "mxfp4"):
        raise input_error("indexer_q_rope_quant", "cache_format", "'fp8' or 'mxfp4'", repr(cache_format))
    if backend == "triton":
        from dsv4kit.kernels.indexer_q.triton import IndexerQFp8Triton, IndexerQMxfp4Triton

        return IndexerQFp8Triton if cache_format == "fp8" else IndexerQMxfp4Triton
    from dsv4kit.kernels.indexer_q.cutedsl import IndexerQFp8CuTeDSL, IndexerQMxfp4CuTeDSL

    return IndexerQFp8CuTeDSL if cache_format == "fp8" else IndexerQMxfp4CuTeDSL


@functools.cache
def _instance(cls: type[IndexerQBase], platform: Platform) -> IndexerQBase:
    return cls(platform)  # type: ignore[call-arg]


def indexer_q_kernel(cache_format: Variant = "fp8", device: torch.device | str | None = None,
                     backend: Backend | None = None, platform: Platform | None = None) -> IndexerQBase:
    """The kernel object the op would use for ``device`` (default: the platform's device)."""
    p = platform or current_platform()
    chosen = p.select_backend(device or p.device, backend, what="indexer_q_rope_quant")
    return _instance(_kernel_class(cache_format, chosen), p)


def indexer_q_rope_quant(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    index_weights: torch.Tensor,
    *,
    cache_format: Variant = "fp8",
    softmax_scale: float = DEFAULT_SOFTMAX_SCALE,
    head_scale: float = DEFAULT_HEAD_SCALE,
    backend: Backend | None = None,
    debug_checks: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Indexer query RoPE + quantization (spec K1 / K2).

    ``cache_format="fp8"`` (K1) returns ``(q_fp8 [T, 64, 128] e4m3fn, weights_out [T, 64] fp32)``
    with the q scale folded into the weights; ``"mxfp4"`` (K2) returns ``(q_packed [T, 64, 64]
    uint8, q_scale [T, 64] int32, weights_out [T, 64] fp32)``. Inputs are validated before any
    launch; ``backend`` forces "triton" or "cutedsl" (default: CuTeDSL on CUDA when available,
    Triton otherwise, the Triton interpreter on CPU). ``debug_checks`` also reads positions
    back to check them against the cache length.
    """
    if not isinstance(index_q, torch.Tensor):
        raise input_error("indexer_q_rope_quant", "index_q", "a torch.Tensor", type(index_q).__name__)
    kernel = indexer_q_kernel(cache_format, index_q.device, backend)
    return kernel(positions, index_q, cos_sin_cache, index_weights, softmax_scale, head_scale,
                  debug_checks=debug_checks)


def register_indexer_q(config: IndexerQConfig, backend: Backend | None = None,
                       platform: Platform | None = None) -> IndexerQBase:
    """Register the one indexer-Q kernel the runtime would call for ``config`` (and return it).

    The kernel is chosen exactly as :func:`indexer_q_rope_quant` chooses it (format from the
    indexer cache dtype, backend from the platform), so warmup and runtime cannot disagree.
    """
    kernel = indexer_q_kernel(config.indexer_cache_dtype, None, backend, platform)
    kernel.register_warmup(config)
    return kernel
