"""Figures and tables of benchmark results in the one schema (:mod:`dsv4kit.bench_schema`).

Recorded runs (:func:`dsv4kit.bench_schema.recorded_runs`) and a live ``dsv4kit bench`` run are
drawn by the same functions; every figure says in its title which it is (``RECORDED`` with the
device and commit, or ``LIVE``). matplotlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from dsv4kit.bench_schema import (
    KERNEL,
    BenchRow,
    HostOverhead,
    LaunchPlanCheck,
    NcuKernel,
    RecordedRun,
    SassMix,
    WarmupKey,
)

__all__ = [
    "DecodePathFit",
    "DecodePoint",
    "best_by_size",
    "decode_markdown",
    "decode_path_fit",
    "decode_path_markdown",
    "headline_markdown",
    "host_overhead_markdown",
    "launch_plans_markdown",
    "measured_fraction",
    "ncu_markdown",
    "largest_point",
    "plot_bandwidth",
    "plot_recorded_bandwidth",
    "plot_roofline",
    "plot_warmup_keys",
    "run_title",
    "sass_mix_markdown",
    "status_markdown",
]

_STYLE = {"triton": ("tab:blue", "o"), "cutedsl": ("tab:orange", "s"), "torch": ("tab:gray", "^")}


def run_title(run: RecordedRun) -> str:
    """``RECORDED on <device>, commit <c>`` plus the kernel-source status of the run."""
    status = run.status()
    suffix = status.split(", ")[-1] if "kernel source" in status else "kernel source unchanged since"
    return f"{run.name}: RECORDED on {run.record.device}, commit {run.record.commit[:7]} ({suffix})"


def best_by_size(rows: Iterable[BenchRow], variants: Sequence[str] = (KERNEL,)
                 ) -> dict[tuple[str, str, str], list[tuple[int, float]]]:
    """``(kernel, backend, variant) -> [(size, best GBps over configs)]``, sorted by size."""
    best: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in rows:
        if r.variant in variants and r.GBps is not None and not r.error:
            d = best.setdefault((r.kernel, r.backend, r.variant), {})
            d[r.size] = max(d.get(r.size, 0.0), r.GBps)
    return {k: sorted(v.items()) for k, v in best.items()}


def _bandwidth_axes(ax: Any, rows: Sequence[BenchRow], copy: float | None, title: str,
                    variants: Sequence[str]) -> None:
    series = best_by_size(rows, variants)
    kernels = list(dict.fromkeys(k for k, _, _ in series))
    styles = ["-", "--", ":", "-."]
    for (kernel, backend, variant), pts in series.items():
        color, marker = _STYLE.get(backend, ("k", "x"))
        ls = styles[kernels.index(kernel) % len(styles)]
        lbl = f"{kernel} {backend}" + ("" if variant == KERNEL else f" {variant}")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=color, marker=marker, ms=3, lw=1.2,
                label=lbl)
    if copy:
        ax.axhline(copy, color="k", lw=1, ls="--", label=f"copy ceiling {copy:.0f} GB/s")
        ax.axhline(0.9 * copy, color="k", lw=0.6, ls=":", label="90 % of copy")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left")


def plot_bandwidth(rows: Sequence[BenchRow], *, copy_gbps: float | None = None, title: str = "",
                   variants: Sequence[str] = (KERNEL,)) -> Any:
    """GB/s against size per family (best over configs), the copy ceiling as a line."""
    fams = list(dict.fromkeys(r.family for r in rows))
    fig, axes = plt.subplots(1, max(1, len(fams)), figsize=(5.5 * max(1, len(fams)), 4), squeeze=False)
    for ax, fam in zip(axes[0], fams, strict=False):
        sub = [r for r in rows if r.family == fam]
        copy = copy_gbps or next((r.copy_GBps for r in sub if r.copy_GBps), None)
        _bandwidth_axes(ax, sub, copy, fam, variants)
        ax.set_xlabel("size")
    axes[0][0].set_ylabel("GB/s (bytes model)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_recorded_bandwidth(runs: Sequence[RecordedRun], ncols: int = 3) -> Any:
    """One panel per recorded run with rows: GB/s of each kernel (best config) vs size, its copy."""
    runs = [r for r in runs if r.rows]
    nrows = -(-len(runs) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4.2 * nrows), squeeze=False)
    for ax, run in zip(axes.flat, runs, strict=False):
        _bandwidth_axes(ax, list(run.rows), run.copy_GBps, run_title(run), (KERNEL,))
        ax.set_xlabel("size (tokens; K3: rows gathered; rowquant: rows)")
        ax.set_ylabel("GB/s")
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def largest_point(rows: Iterable[BenchRow], worst: bool = False) -> dict[tuple[str, str], BenchRow]:
    """``(kernel, backend) -> the kernel row of the largest size``: the best config there, or with
    ``worst`` the slowest one (what a target "every config" must hold for)."""
    out: dict[tuple[str, str], BenchRow] = {}
    sign = -1 if worst else 1
    for r in rows:
        if r.variant != KERNEL or r.GBps is None or r.error or not r.bytes:
            continue
        k = (r.kernel, r.backend)
        cur = out.get(k)
        if cur is None or (r.size, sign * r.GBps) > (cur.size, sign * cur.GBps):
            out[k] = r
    return out


def plot_roofline(runs: Sequence[RecordedRun], title: str = "") -> Any:
    """Bytes moved per element (per token / row) vs achieved GB/s at each kernel's largest point,
    against each run's copy ceiling (a memory-bound kernel at the ceiling sits on the line)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    copies = []
    for run in runs:
        for (kernel, backend), r in largest_point(run.rows).items():
            color, marker = _STYLE.get(backend, ("k", "x"))
            per = r.bytes / r.size  # type: ignore[operator]
            ax.scatter(per, r.GBps, color=color, marker=marker, s=30)
            ax.annotate(f"{kernel} ({r.size})", (per, r.GBps), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")
        if run.copy_GBps:
            copies.append(run.copy_GBps)
    if copies:
        ax.axhspan(min(copies), max(copies), color="k", alpha=0.15, label="copy ceilings of the runs")
        ax.axhline(0.9 * min(copies), color="k", ls=":", lw=0.8, label="90 % of copy")
    for b, (color, marker) in _STYLE.items():
        if b != "torch":
            ax.scatter([], [], color=color, marker=marker, label=b)
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per element (bytes model / size)")
    ax.set_ylabel("achieved GB/s at the largest size")
    ax.set_title(title or "RECORDED: every kernel at its largest recorded size", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_warmup_keys(keys: Sequence[WarmupKey], title: str = "") -> Any:
    """Per warmed key: compile seconds (left) and registers with spills (right), both backends."""
    keys = list(keys)
    labels = [f"{k.family} {k.backend} #{i}" for i, k in enumerate(keys)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.16 * len(keys))), sharey=True)
    y = list(range(len(keys)))
    colors = [_STYLE.get(k.backend, ("k", "x"))[0] for k in keys]
    a.barh(y, [k.seconds or 0.0 for k in keys], color=colors)
    a.set_xscale("symlog", linthresh=0.01)
    a.set_xlabel("compile seconds (recorded warmup)")
    b.barh(y, [k.registers or 0 for k in keys], color=colors)
    for i, k in enumerate(keys):
        if k.spills:
            b.annotate(f"{k.spills} spills", (k.registers or 0, i), fontsize=6, color="red")
    b.axvline(255, color="r", ls=":", lw=0.8)
    b.set_xlabel("registers per thread (255: the hardware limit)")
    a.set_yticks(y, labels, fontsize=5)
    a.invert_yaxis()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def status_markdown(runs: Sequence[RecordedRun]) -> str:
    """One row per recorded run: family, device, commit, date, copy ceiling, rows, status."""
    lines = ["| run | family | device | commit | date | copy GB/s | rows | kernel source |",
             "|---" * 8 + "|"]
    for r in runs:
        st = r.status()
        src = st.split(", ")[-1] if "kernel source" in st else "**current** (hash equal)"
        copy = f"{r.copy_GBps:.0f}" if r.copy_GBps else "-"
        lines.append(f"| `{r.name}` | {r.family} | {r.record.device} | `{r.record.commit[:7]}` | "
                     f"{r.record.date[:10]} | {copy} | {len(r.rows)} | {src} |")
    return "\n".join(lines)


def headline_markdown(runs: Sequence[RecordedRun], worst: bool = False) -> str:
    """Each kernel and backend at its largest recorded size: GB/s and fraction of the copy, of its
    best config (``worst``: its slowest, :func:`largest_point`)."""
    lines = ["| run | kernel | backend | size | config | GB/s | of copy |", "|---" * 7 + "|"]
    for run in runs:
        for (kernel, backend), r in sorted(largest_point(run.rows, worst).items()):
            frac = f"{100 * r.fraction_of_copy:.1f} %" if r.fraction_of_copy is not None else "-"
            lines.append(f"| `{run.name}` | {kernel} | {backend} | {r.size} | {r.config or '-'} | "
                         f"{r.GBps:.0f} | {frac} |")
    return "\n".join(lines)


def decode_markdown(runs: Sequence[RecordedRun], target_us: float = 2.0) -> str:
    """Every decode row of ``runs`` (CUDA-graph replays next to an empty kernel on the same stream),
    marking the ones within ``target_us`` of the empty kernel."""
    lines = ["| kernel | config | backend | T | kernel µs | empty µs | over empty µs | within target |",
             "|---" * 8 + "|"]
    for run in runs:
        for d in run.decode:
            ok = "yes" if d.over_empty_us <= target_us else "**no**"
            lines.append(f"| {d.kernel} | {d.config or '-'} | {d.backend} | {d.size} | {d.kernel_us:.2f} | "
                         f"{d.empty_kernel_us:.2f} | {d.over_empty_us:.2f} | {ok} |")
    return "\n".join(lines)


def host_overhead_markdown(h: HostOverhead) -> str:
    """µs of host time per call on each path (``benchmarks/host_overhead.py``), per op and backend."""
    head = "| op | backend | " + " | ".join(f"{p} µs" for p in h.PATHS) + " | planned / full (kernel) |"
    lines = [head, "|---" * (len(h.PATHS) + 3) + "|"]
    for r in h.rows:
        ratio = r["kernel planned us"] / r["kernel full us"]
        lines.append(f"| {r['op']} | {r['backend']} | " + " | ".join(f"{r[p + ' us']:.1f}" for p in h.PATHS)
                     + f" | {ratio:.2f} |")
    if h.empty_launch_us is not None:
        lines.append(f"\nAn empty `@triton.jit` kernel through `JITFunction.run`: {h.empty_launch_us:.1f} µs "
                     "per launch.")
    return "\n".join(lines)


def launch_plans_markdown(c: LaunchPlanCheck) -> str:
    """Per op and backend: planned, direct launch, eager and graph bytes identical, bad inputs refused."""
    lines = ["| op | backend | planned | direct launch | eager identical | graph identical | "
             "bad inputs refused |", "|---" * 7 + "|"]
    for r in c.rows:
        bad = r.get("bad_inputs_named", {})
        lines.append(f"| {r['op']} | {r['backend']} | {r.get('planned')} | {r.get('direct_launch')} | "
                     f"{r.get('eager_identical')} | {r.get('graph_identical')} | "
                     f"{sum(bad.values())}/{len(bad)} |")
    return "\n".join(lines)


def measured_fraction(runs: Sequence[RecordedRun], kernel: str, backend: str, config: str) -> float | None:
    """The fraction of the copy ``kernel`` reached at its largest size in ``runs`` (the first run that
    has it), for ``config``; None when no run has that point."""
    for run in runs:
        rows = [r for r in run.rows if r.kernel == kernel and r.backend == backend and r.variant == KERNEL
                and r.config == config and r.fraction_of_copy is not None]
        if rows:
            return max(rows, key=lambda r: r.size).fraction_of_copy
    return None


def ncu_markdown(kernels: Sequence[NcuKernel], copy_gbps: float) -> str:
    """Nsight Compute counters per kernel: time, DRAM bytes over the bytes model, DRAM GB/s and its
    fraction of the copy, achieved / theoretical occupancy, issue activity, the top stalls."""
    lines = ["| kernel | config | backend | us | DRAM B / model | DRAM GB/s | of copy | occupancy "
             "achieved / theoretical | issue active | regs | top stalls (% of warp cycles) |",
             "|---" * 11 + "|"]
    for k in kernels:
        stalls = ", ".join(f"{r.replace('_', ' ')} {v:.0f}" for r, v in k.top_stalls())
        lines.append(f"| {k.kernel} | {k.config or '-'} | {k.backend} | {k.duration_us:.1f} | "
                     f"{k.dram_over_model:.3f} | {k.dram_GBps:.0f} | {100 * k.dram_GBps / copy_gbps:.1f} % | "
                     f"{k.achieved_occupancy_pct:.0f} / {k.theoretical_occupancy_pct:.0f} % | "
                     f"{k.issue_active_pct:.0f} % | {k.registers} | {stalls} |")
    return "\n".join(lines)


def sass_mix_markdown(mix: Sequence[SassMix], runs: Sequence[RecordedRun]) -> str:
    """Static analysis next to the measurement: instructions per byte, instruction time over DRAM
    time at the copy rate (the busiest pipe), the ceiling it implies, and the measured fraction."""
    lines = ["| kernel | config | backend | regs | occupancy | instr / B | instr / DRAM time | busiest | "
             "ceiling | measured |", "|---" * 10 + "|"]
    for m in mix:
        got = measured_fraction(runs, m.kernel, m.backend, m.config)
        lines.append(f"| {m.kernel} | {m.config or '-'} | {m.backend} | {m.registers} | {m.occupancy:.2f} | "
                     f"{m.instr_per_byte:.1f} | {m.instr_over_dram:.2f} | {m.busiest} | "
                     f"{100 * m.ceiling_fraction_of_copy:.0f} % | "
                     f"{'-' if got is None else f'{100 * got:.1f} %'} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class DecodePoint:
    """One decode row next to the static path of its kernel (``current``: the row's record was
    made of the kernel source there is now; else the source changed since, e.g. ``backends/``)."""

    kernel: str
    config: str
    backend: str
    load_batches: int
    path_instructions: int
    measured_us: float
    model_us: float
    current: bool


@dataclass(frozen=True)
class DecodePathFit:
    """Least squares of the measured decode time over the static path of one thread.

    ``over_empty_us ≈ per_batch_us * load_batches + per_instruction_ns / 1000 * path_instructions
    + fixed_us`` over every (kernel, config, backend) with a decode row at ``size`` and a static
    record (``benchmarks/sass_mix.py --size decode``); ``r2`` of that model and of each term alone.
    """

    size: int
    per_batch_us: float
    per_instruction_ns: float
    fixed_us: float
    r2: float
    r2_instructions_only: float
    r2_batches_only: float
    points: tuple[DecodePoint, ...]


def _static_of(mix: Sequence[SassMix], kernel: str, config: str, backend: str, exact: bool) -> SassMix | None:
    """The static record of a decode row: the same kernel and config (``exact``), else the only
    record of the kernel on that backend, or one whose config is the row's "family/config" suffix."""
    mine = [m for m in mix if m.backend == backend]
    if exact:
        return next((m for m in mine if m.kernel == kernel and m.config == config), None)
    same = [m for m in mine if m.kernel == kernel]
    return same[0] if len(same) == 1 else next((m for m in mine if f"{m.kernel}/{m.config}" == kernel), None)


def _r2(y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, float]:
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return coef, float(1 - ((y - x @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def decode_path_fit(mix: Sequence[SassMix], runs: Sequence[RecordedRun], size: int = 1) -> DecodePathFit:
    """Fit the decode rows of ``runs`` at ``size`` (µs over the empty kernel) to the static path
    (load batches, instructions) of ``mix`` (:class:`DecodePathFit`)."""
    rows = []
    for run in runs:
        decode = [d for d in run.decode if d.size == size and d.over_empty_us is not None]
        if decode:
            current = run.current()  # hashes the kernel sources: once per run
            rows += [(d, current) for d in decode]
    found, seen = [], set()
    for exact in (True, False):  # a row of the static config first; another run of the kernel after
        for d, current in rows:
            m = _static_of(mix, d.kernel, d.config, d.backend, exact)
            if m is None or m.load_batches is None or m.path_instructions is None:
                continue
            if (m.kernel, m.config, m.backend) not in seen:
                seen.add((m.kernel, m.config, m.backend))
                found.append((d, m, current))
    if len(found) < 4:
        raise ValueError(f"{len(found)} decode rows at size {size} have a static record: too few to fit")
    y = np.array([d.over_empty_us for d, _, _ in found])
    x = np.array([[m.load_batches, m.path_instructions, 1.0] for _, m, _ in found])
    coef, r2 = _r2(y, x)
    points = tuple(DecodePoint(d.kernel, d.config, d.backend, m.load_batches, m.path_instructions,
                               float(d.over_empty_us), float(q), current)
                   for (d, m, current), q in zip(found, x @ coef, strict=True))
    return DecodePathFit(size, float(coef[0]), float(coef[1] * 1e3), float(coef[2]), r2,
                         _r2(y, x[:, 1:])[1], _r2(y, x[:, [0, 2]])[1], points)


def decode_path_markdown(fit: DecodePathFit) -> str:
    """The fit's terms and its points, one row per kernel, config and backend, slowest first."""
    lines = [f"At T = {fit.size}: over empty ≈ {fit.per_batch_us:.3f} µs x load batches + "
             f"{fit.per_instruction_ns:.2f} ns x path instructions + {fit.fixed_us:.2f} µs "
             f"(r² {fit.r2:.2f}; instructions alone {fit.r2_instructions_only:.2f}, batches alone "
             f"{fit.r2_batches_only:.2f}).", "",
             "| kernel | config | backend | load batches | path instructions | measured µs | model µs | "
             "record |", "|---" * 8 + "|"]
    for p in sorted(fit.points, key=lambda p: -p.measured_us):
        lines.append(f"| {p.kernel} | {p.config or '-'} | {p.backend} | {p.load_batches} | "
                     f"{p.path_instructions} | {p.measured_us:.2f} | {p.model_us:.2f} | "
                     f"{'current' if p.current else 'source changed since'} |")
    return "\n".join(lines)
