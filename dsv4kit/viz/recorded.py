"""Tables for recorded GPU results (see :mod:`dsv4kit.results`), as Markdown for notebooks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dsv4kit.results import Recorded

__all__ = [
    "best_fraction_of_copy",
    "percent_of_copy",
    "percent_of_copy_markdown",
    "recorded_heading",
    "replay_table_markdown",
]

# Version fields shown in a heading, with their short labels, in this order.
_SHOWN_VERSIONS = {"torch": "torch", "triton": "triton", "nvidia-cutlass-dsl": "cutlass-dsl",
                   "cuda": "CUDA", "python": "Python"}


def recorded_heading(rec: Recorded, family: str | Sequence[str] | None = None) -> str:
    """A Markdown heading that labels ``rec`` as recorded: its status line, device and versions."""
    versions = rec.versions
    shown = " · ".join(f"{label} {versions[k]}" for k, label in _SHOWN_VERSIONS.items() if k in versions)
    return (f"### RECORDED (not live)\n\n**{rec.status(family)}**\n\n"
            f"{rec.device} · {shown} · `{rec.path.name}`")


def replay_table_markdown(results: Iterable[Mapping[str, Any]]) -> str:
    """One row per configuration of a ``benchmarks/replay_gpu.py`` report's ``results``."""
    lines = ["| config | ok | backends | keys | calls launched | missed | compiles after warmup "
             "| monitor events | ledgers agree | launch s |", "|---" * 10 + "|"]
    for r in results:
        backends = ", ".join(sorted({w["backend"] for w in r.get("warmup", [])})) or "-"
        compiles = r.get("triton_runtime_compiles", 0) + r.get("cute_runtime_compiles", 0)
        lines.append(
            f"| {r['config']} | {'yes' if r.get('ok') else 'NO'} | {backends} | {len(r.get('warmup', []))} "
            f"| {sum(r.get('calls', {}).values())} | {len(r.get('missed', []))} | {compiles} "
            f"| {len(r.get('monitor_events', []))} | {r.get('dispatch_replay_matches_launch')} "
            f"| {r.get('launch_seconds', float('nan')):.1f} |")
    return "\n".join(lines)


def percent_of_copy(rows: Iterable[Mapping[str, str]], tokens: int) -> dict[tuple[str, str], float]:
    """``(format, impl) -> percent of the copy bandwidth`` at ``tokens`` (``indexer_q`` CSV rows)."""
    return {(r["format"], r["impl"]): float(r["pct_of_copy"]) for r in rows if int(r["T"]) == tokens}


def percent_of_copy_markdown(pct: Mapping[tuple[str, str], float], copy_gbps: float, tokens: int) -> str:
    """The kernels and the PyTorch baselines at one token count, per cache format."""
    impls = {"triton": "Triton", "cutedsl": "CuTeDSL", "torch eager": "torch eager",
             "torch.compile": "torch.compile"}
    formats = sorted({f for f, _ in pct}, key=lambda f: (f != "fp8", f))
    lines = [f"| T = {tokens} | " + " | ".join(impls.values()) + " |", "|---" * (len(impls) + 1) + "|"]
    for fmt in formats:
        cells = [f"{pct[(fmt, i)]:.1f}%" if (fmt, i) in pct else "-" for i in impls]
        lines.append(f"| {fmt} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n(percent of the {copy_gbps:.0f} GB/s copy measured in that run)"


def best_fraction_of_copy(rows: Iterable[Mapping[str, str]]) -> dict[str, float]:
    """``impl -> largest fraction_of_copy`` over a ``dequant_gather`` bandwidth CSV (empty cells: 0)."""
    best: dict[str, float] = {}
    for r in rows:
        best[r["impl"]] = max(best.get(r["impl"], 0.0), float(r["fraction_of_copy"] or 0))
    return best
