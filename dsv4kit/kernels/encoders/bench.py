"""E1-E5 (the store hooks) in ``dsv4kit bench``: the bytes model and the sweep plan
(:mod:`dsv4kit.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4kit.bench import DECODE_SIZES, ENTRY_BYTES, Point, SweepPlan

__all__ = ["PLANS", "STORE_POINTS", "store_rows_bytes"]

#: Store-hook sweep points: (op, case keywords, config, head size, entry format).
STORE_POINTS = (
    ("store_rows_ds", {}, "", 512, "fp8_ds_mla"),
    ("store_rows_plain", {}, "bf16", 512, "bf16"),
    ("store_rows_plain", {"fp8_scale": 0.5}, "fp8_scale=0.5", 512, "e4m3"),
    ("store_rows_indexer", {"use_fp4": False}, "use_fp4=False", 128, "fp8"),
    ("store_rows_indexer", {"use_fp4": True}, "use_fp4=True", 128, "mxfp4"),
)


def store_rows_bytes(tokens: int, entries: int, head_size: int, entry_bytes: int) -> int:
    """E1-E5: the slots (int64 per row), an fp32 row read and an entry written per live slot."""
    return tokens * 8 + entries * (head_size * 4 + entry_bytes)


def _points(t: int) -> list[Point]:
    def build(op: str, kw: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.encoders.cases import make_case

            return dict(make_case(op, t, kv_bs=64, seed=t, **kw).fresh(device).args)

        return make

    from dsv4kit.kernels.encoders.cases import written_rows

    return [Point(op, op, cfg, t, store_rows_bytes(t, written_rows(t), head, ENTRY_BYTES[fmt]), build(op, kw))
            for op, kw, cfg, head, fmt in STORE_POINTS]


#: ``store_rows``: E1-E5, the three store ops of this folder.
PLANS: tuple[SweepPlan, ...] = (
    SweepPlan("store_rows", ("store_rows_ds", "store_rows_plain", "store_rows_indexer"),
              (16384, 65536, 524288), _points, DECODE_SIZES, hash_family="encoders"),
)
