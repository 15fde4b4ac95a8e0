"""Figures and tables for key spaces and coverage (matplotlib only, no seaborn/pandas)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dsv4kit.errors import format_key
from dsv4kit.jit.coverage import KeyLedger

__all__ = ["STATUS_COLORS", "key_labels", "key_table_markdown", "plot_coverage"]

#: used = warmed and requested; dead = warmed, never requested; missed = requested, not warmed.
STATUS_COLORS = {"used": "#2e7d32", "dead": "#9e9e9e", "missed": "#c62828"}


def key_table_markdown(keys: Sequence[Any]) -> str:
    """A Markdown table with one row per key and one column per CompileKey field."""
    if not keys:
        return "*(no keys)*"
    names = [f.name for f in dataclasses.fields(keys[0])]
    lines = ["| # | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, k in enumerate(keys):
        cells = [str(getattr(k, n)).removeprefix("torch.") for n in names]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def key_labels(keys: Sequence[Any]) -> list[str]:
    """Short cell labels: the fields that differ among a kernel's keys (one key: its last two)."""
    if not keys:
        return []
    if not dataclasses.is_dataclass(keys[0]):
        return [format_key(k) for k in keys]
    names = [f.name for f in dataclasses.fields(keys[0])]
    vary = [n for n in names if len({str(getattr(k, n)) for k in keys}) > 1] or names[-2:]
    return ["\n".join(f"{n}={str(getattr(k, n)).removeprefix('torch.')}" for n in vary) for k in keys]


def plot_coverage(ledger: KeyLedger, ax: Any = None, title: str = "warmup coverage") -> Any:
    """One row per kernel, one cell per key, coloured used / dead / missed; returns the Figure.

    Cell labels are the fields that differ among the kernel's keys (:func:`key_labels`), and each
    cell shows its request count.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    kernels = ledger.kernels
    statuses = {k: ledger.status(k) for k in kernels}
    width = max((len(s) for s in statuses.values()), default=1)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(2.2 * width + 3, 18), 0.9 * len(kernels) + 1.4))
    for row, kernel in enumerate(kernels):
        labels = key_labels(list(statuses[kernel]))
        for col, ((key, status), label) in enumerate(zip(statuses[kernel].items(), labels, strict=True)):
            ax.add_patch(Rectangle((col, row), 0.95, 0.9, color=STATUS_COLORS[status]))
            calls = ledger.requested.get(kernel, {}).get(key, 0)
            ax.text(col + 0.47, row + 0.45, f"{label}\ncalls={calls}", ha="center", va="center",
                    fontsize=6, color="white")
    ax.set_xlim(0, width)
    ax.set_ylim(len(kernels), 0)
    ax.set_yticks([r + 0.45 for r in range(len(kernels))], kernels)
    ax.set_xticks([])
    ax.set_title(title)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in STATUS_COLORS.items()],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.figure.tight_layout()
    return ax.figure
