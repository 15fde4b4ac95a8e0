"""K7 and K8a / K8b in ``dsv4kit bench``: the bytes models and the two sweep plans
(:mod:`dsv4kit.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4kit.bench import DECODE_SIZES, ENTRY_BYTES, Point, SweepPlan, in_request_order, request_batch

__all__ = ["K8_POINTS", "PLANS", "c128_compress_bytes", "c128_store_bytes"]

#: K8 sweep points: (op, case keywords, config, entry format).
K8_POINTS = (
    ("c128_norm_rope_store_ds_mla", {}, "", "fp8_ds_mla"),
    ("c128_norm_rope_store_plain", {}, "bf16", "bf16"),
    ("c128_norm_rope_store_plain", {"fp8_scale": 0.5}, "fp8_scale=0.5", "e4m3"),
)


def c128_compress_bytes(tokens: int, boundaries: int) -> int:
    """K7: 128 state rows of 1024 fp32 per boundary token, the per-token arrays (token_to_req,
    positions, slots), 512 fp32 written per boundary row."""
    return boundaries * 128 * 1024 * 4 + tokens * (4 + 8 + 8) + boundaries * 512 * 4


def c128_store_bytes(tokens: int, entries: int, entry_bytes: int, norm_weight_bytes: int) -> int:
    """K8a / K8b: the per-token arrays (positions, slots, kv slots: 24 B), 512 fp32 read per
    written row, the norm weight once, every written entry."""
    return tokens * 24 + entries * 512 * 4 + norm_weight_bytes + entries * entry_bytes


def _c128_points(t: int) -> list[Point]:
    lens, starts, boundaries = request_batch(t, 128)

    def make(device: str) -> dict[str, Any]:
        from dsv4kit.kernels.c128_compress.cases import make_k7_case

        case = make_k7_case(lens=lens, starts=starts, padding=False, seed=t)
        return in_request_order(case.fresh(device).args)

    nbytes = c128_compress_bytes(t, boundaries)
    return [Point("c128_compress", "c128_compress", "", t, nbytes, make)]


def _k8_points(t: int) -> list[Point]:
    boundaries = max(1, t // 128)   # one token in 128 closes a window

    def build(op: str, kw: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.c128_compress.cases import make_k8_case

            case = make_k8_case(op, t=t, boundaries=boundaries, kv_bs=64, padding=False, seed=t, **kw)
            return dict(case.fresh(device).args)

        return make

    out = []
    for op, kw, cfg, fmt in K8_POINTS:
        make = build(op, kw)
        a = make("cpu")             # the written entries and the norm weight's bytes, from the case
        entries = int(((a["slot_mapping"] >= 0) & ((a["positions"] + 1) % 128 == 0)
                       & (a["kv_slot_mapping"] >= 0)).sum())
        w = a["rms_norm_weight"]
        nbytes = c128_store_bytes(t, entries, ENTRY_BYTES[fmt], w.numel() * w.element_size())
        out.append(Point(op, op, cfg, t, nbytes, make))
    return out


#: ``c128_store``: K8a / K8b, the norm-RoPE store ops of this folder.
PLANS: tuple[SweepPlan, ...] = (
    SweepPlan("c128_compress", ("c128_compress",), (4096, 16384, 65536), _c128_points, DECODE_SIZES,
              hash_family="c128_compress"),
    SweepPlan("c128_store", ("c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain"),
              (4096, 16384, 65536), _k8_points, DECODE_SIZES, hash_family="c128_compress",
              in_l2_why="one 128-token block in, one cache row out: 2 MB at T = 65536; latency-bound at "
                        "every T a step sees"),
)
