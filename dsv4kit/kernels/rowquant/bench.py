"""rowquant in ``dsv4kit bench``: the bytes model and the sweep plan (:mod:`dsv4kit.bench`)."""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.bench import Point, SweepPlan

__all__ = ["PLANS", "rowquant_bytes"]


def rowquant_bytes(rows: int, cols: int, block: int = 128) -> int:
    """rowquant: the bf16 matrix read, the e4m3 codes and one fp32 scale per block written."""
    return rows * cols * 2 + rows * cols + rows * (cols // block) * 4


def _points(m: int) -> list[Point]:
    n = 4096

    def make(device: str) -> dict[str, Any]:
        from dsv4kit.kernels.rowquant.cases import regime

        return {"x": regime("normal", m, n, seed=m).to(device=device, dtype=torch.bfloat16)}

    return [Point("rowquant", "rowquant", f"n_cols={n}", m, rowquant_bytes(m, n), make)]


PLANS: tuple[SweepPlan, ...] = (
    SweepPlan("rowquant", ("rowquant",), (1024, 8192, 65536), _points, size_axis="rows (4096 columns)",
              hash_family="rowquant"),
)
