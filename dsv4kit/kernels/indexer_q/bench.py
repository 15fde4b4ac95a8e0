"""K1 / K2 in ``dsv4kit bench``: the bytes model and the sweep plan (:mod:`dsv4kit.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsv4kit.bench import DECODE_SIZES, Point, SweepPlan

__all__ = ["PLANS", "indexer_q_bytes"]


def indexer_q_bytes(cache_format: str, tokens: int, cos_sin_bytes: int = 4) -> int:
    """K1 / K2: q (64 x 128 bf16), weights, position, one cos/sin row read; codes, scales written."""
    t = tokens
    read = t * 64 * 128 * 2 + t * 64 * 2 + t * 8 + t * 64 * cos_sin_bytes
    write = t * 64 * 128 + t * 64 * 4 if cache_format == "fp8" else t * 64 * 64 + t * 64 * 4 + t * 64 * 4
    return read + write


def _points(t: int) -> list[Point]:
    def build(fmt: str) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.indexer_q.cases import make_case

            c = make_case(t, torch.float32, seed=t).to(device)
            names = ("positions", "index_q", "cos_sin_cache", "index_weights")
            return {**dict(zip(names, c.args(), strict=True)), "cache_format": fmt}

        return make

    return [Point("indexer_q", f"indexer_q/{fmt}", "", t, indexer_q_bytes(fmt, t), build(fmt))
            for fmt in ("fp8", "mxfp4")]


PLANS: tuple[SweepPlan, ...] = (
    SweepPlan("indexer_q", ("indexer_q",), (1024, 8192, 65536), _points, DECODE_SIZES,
              hash_family="indexer_q"),
)
