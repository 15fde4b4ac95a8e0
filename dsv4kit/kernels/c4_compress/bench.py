"""K5 / K6 / K9 in ``dsv4kit bench``: the bytes model and the sweep plan (:mod:`dsv4kit.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4kit.bench import DECODE_SIZES, ENTRY_BYTES, Point, SweepPlan, in_request_order, request_batch

__all__ = ["C4_POINTS", "PLANS", "c4_compress_bytes"]

#: C4 points: (op, make_case keywords, config label, head size, entry bytes).
C4_POINTS = (
    ("c4_compress_ds_mla", {}, "", 512, ENTRY_BYTES["fp8_ds_mla"]),
    ("c4_compress_plain", {}, "", 512, ENTRY_BYTES["bf16"]),
    ("c4_compress_plain", {"fp8_scale": 0.5}, "fp8_scale=0.5", 512, ENTRY_BYTES["e4m3"]),
    ("indexer_compress", {"use_fp4": False}, "use_fp4=False", 128, ENTRY_BYTES["fp8"]),
    ("indexer_compress", {"use_fp4": True}, "use_fp4=True", 128, ENTRY_BYTES["mxfp4"]),
)


def c4_compress_bytes(head_size: int, tokens: int, entries: int, entry_bytes: int) -> int:
    """K5 / K6 / K9: every state row read once (``T * 4 * head`` fp32), every written entry, and
    the per-token arrays (positions, slots, kv slots int64; token_to_req int32)."""
    return 4 * tokens * 4 * head_size + entries * entry_bytes + tokens * (3 * 8 + 4)


def _points(t: int) -> list[Point]:
    lens, starts, entries = request_batch(t, 4)

    def build(op: str, kw: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.c4_compress.cases import make_case

            case = make_case(op, lens=lens, starts=starts, kv_bs=64, padding=False, seed=t, **kw)
            return in_request_order(case.fresh(device).args)

        return make

    return [Point(op, op, cfg, t, c4_compress_bytes(head, t, entries, eb), build(op, kw))
            for op, kw, cfg, head, eb in C4_POINTS]


PLANS: tuple[SweepPlan, ...] = (
    SweepPlan("c4_compress", ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress"),
              (4096, 16384, 65536, 262144), _points, DECODE_SIZES, hash_family="c4_compress"),
)
