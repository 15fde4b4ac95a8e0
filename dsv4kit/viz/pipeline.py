"""Figures and tables for the model-level proof (notebook 05): the pipeline replay on real tensors
(:class:`~dsv4kit.model.pipeline.PipelineReport`, :class:`~dsv4kit.model.judge.StepComparison`),
warmup coverage over every kernel family at once, the §2.11 trap drills, and the recorded GPU
pipeline run (``benchmarks/pipeline_gpu.py``). Matplotlib only; tables are Markdown strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dsv4kit.jit.coverage import KeyLedger
from dsv4kit.viz.coverage import STATUS_COLORS, key_labels

if TYPE_CHECKING:
    from dsv4kit.family import FamilySpec
    from dsv4kit.model.drills import Caught
    from dsv4kit.model.judge import StepComparison
    from dsv4kit.model.pipeline import PipelineReport

__all__ = [
    "CACHE_LABELS",
    "RULE_GROUPS",
    "comparison_rows",
    "comparison_table_markdown",
    "drill_table_markdown",
    "family_coverage_rows",
    "family_of_kernel",
    "pipeline_gpu_table_markdown",
    "plot_family_coverage",
    "plot_pipeline",
]

#: Cache name in a PipelineReport -> what the figure calls it.
CACHE_LABELS = {"window": "window pages", "main": "compressed cache", "indexer": "indexer K cache",
                "state:main": "state rows (main)", "state:indexer": "state rows (indexer)"}
#: Verdict rule -> the table column it counts in: ``bit-exact`` (the spec says bit-identical) or
#: ``rule`` (conformant to the compressor rule / the FP32 rule; bit-identity counted, not required).
RULE_GROUPS = {"bit-exact": "bit-exact", "bit-exact outside compressed rows": "bit-exact",
               "compressor": "rule", "fp32": "rule"}


# --------------------------------------------------------------------------- the pipeline replay


def _occupancy_lines(report: PipelineReport, kinds: Mapping[int, str] | None
                     ) -> list[tuple[str, list[int], int, bool]]:
    """(label, entries per step, capacity, is a state cache) per distinct series: caches whose
    series and capacity coincide (every layer's window pages, the state rows) share one line."""
    groups: dict[tuple[tuple[int, ...], int], dict[str, list[str]]] = {}
    for (layer, cache), series in report.occupancy_series().items():
        where = f"L{layer}" + (f" {kinds[layer]}" if kinds and layer in kinds else "")
        group = groups.setdefault((tuple(series), report.capacity[(layer, cache)]), {})
        group.setdefault(cache, []).append(where)
    out = []
    for (series, cap), caches in groups.items():
        label = "\n".join(f"{CACHE_LABELS.get(c, c)} ({', '.join(w)})" for c, w in caches.items())
        out.append((label, list(series), cap, all(c.startswith("state:") for c in caches)))
    return out


def plot_pipeline(report: PipelineReport, kinds: Mapping[int, str] | None = None,
                  title: str = "pipeline replay") -> Any:
    """Two panels per step of ``report``: cache occupancy (entries the live sequences hold, as a
    share of each cache's capacity: window pages, compressed and indexer caches, state rows) and
    the op calls per family (stacked). Caches whose occupancy coincides share a line. ``kinds``:
    layer index -> ``SWA`` / ``C4`` / ``C128`` for the labels. Returns the Figure."""
    import matplotlib.pyplot as plt

    steps = [s.index for s in report.steps]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    for label, series, cap, state in _occupancy_lines(report, kinds):
        pct = [100.0 * n / cap for n in series]
        ax1.plot(steps, pct, "--" if state else "-", marker="o", ms=3,
                 label=f"{series[-1] if series else 0}/{cap}: {label}")
    ax1.set_ylabel("entries held, % of capacity")
    ax1.set_title("cache occupancy after each step")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.28),
               title="held / capacity (last step)", title_fontsize=7)
    bottom = [0] * len(steps)
    cmap = plt.get_cmap("tab10")
    for i, (fam, series) in enumerate(report.family_call_series().items()):
        ax2.bar(steps, series, bottom=bottom, color=cmap(i % 10), label=fam)
        bottom = [b + n for b, n in zip(bottom, series, strict=True)]
    ax2.set_ylabel("op calls")
    ax2.set_title("op calls per family and step (all layers)")
    ax2.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3)
    labels = [f"{s.index}\n{s.phase}\nT={s.padded_tokens}" for s in report.steps]
    for ax in (ax1, ax2):
        ax.set_xticks(steps, labels, fontsize=6.5)
        ax.set_xlabel("step")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def comparison_rows(comparisons: Sequence[StepComparison], report: PipelineReport) -> list[dict[str, Any]]:
    """One row per step: phase, tokens, and per rule group (:data:`RULE_GROUPS`) the tensors judged,
    those that passed, and their elements (all and bit-identical)."""
    by_index = {s.index: s for s in report.steps}
    rows = []
    for c in comparisons:
        s = by_index.get(c.step)
        row: dict[str, Any] = {"step": c.step, "phase": s.phase if s else "?",
                               "tokens": s.tokens if s else 0, "padded_tokens": s.padded_tokens if s else 0,
                               "ok": c.ok}
        for group in ("bit-exact", "rule"):
            vs = [v for v in c.verdicts if RULE_GROUPS.get(v.rule, "rule") == group]
            row[f"{group}_tensors"] = len(vs)
            row[f"{group}_ok"] = sum(v.ok for v in vs)
            row[f"{group}_elements"] = sum(v.elements for v in vs)
            row[f"{group}_bit_identical"] = sum(v.bit_identical for v in vs)
        rows.append(row)
    return rows


def comparison_table_markdown(comparisons: Sequence[StepComparison], report: PipelineReport) -> str:
    """The per-step comparison of a kernel pipeline against the reference pipeline: tensors judged
    bit-exact and under a rule (compressor / FP32), how many pass, and the elements bit-identical."""
    lines = ["| step | phase | T (padded) | bit-exact tensors ok | elements bit-identical "
             "| rule tensors conformant | elements bit-identical (not required) | step |",
             "|---" * 8 + "|"]
    for r in comparison_rows(comparisons, report):
        lines.append(
            f"| {r['step']} | {r['phase']} | {r['tokens']} ({r['padded_tokens']}) "
            f"| {r['bit-exact_ok']}/{r['bit-exact_tensors']} "
            f"| {r['bit-exact_bit_identical']:,}/{r['bit-exact_elements']:,} "
            f"| {r['rule_ok']}/{r['rule_tensors']} | {r['rule_bit_identical']:,}/{r['rule_elements']:,} "
            f"| {'OK' if r['ok'] else '**FAILED**'} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- coverage, all families


def family_of_kernel(kernel: str, families: Iterable[FamilySpec]) -> FamilySpec | None:
    """The family whose variants have a kernel class named ``kernel`` (any backend), or None."""
    for fam in families:
        for v in fam.variants.values():
            if kernel in (v.class_name("triton"), v.class_name("cutedsl")):
                return fam
    return None


def family_coverage_rows(ledger: KeyLedger, families: Sequence[FamilySpec]) -> list[dict[str, Any]]:
    """One row per (family, kernel of the ledger), families in order; a family with no kernel in
    the ledger gets one row with ``kernel`` None. Counts: keys warmed, requested, missed, dead,
    and calls (requests)."""
    rows = []
    kernels = ledger.kernels
    for fam in families:
        mine = [k for k in kernels if family_of_kernel(k, [fam]) is not None]
        for k in mine or [None]:
            status = ledger.status(k) if k else {}
            req = ledger.requested.get(k, {}) if k else {}
            rows.append({"family": fam.name, "spec_id": fam.spec_id, "kernel": k,
                         "warmed": len(ledger.warmed.get(k, {})) if k else 0, "requested": len(req),
                         "missed": sum(s == "missed" for s in status.values()),
                         "dead": sum(s == "dead" for s in status.values()), "calls": sum(req.values())})
    return rows


def plot_family_coverage(ledger: KeyLedger, families: Sequence[FamilySpec],
                         title: str = "warmup coverage, every family") -> Any:
    """A heatmap over every family of ``families`` at once: one row per kernel (grouped by family;
    a family none of whose kernels is in the ledger shows an empty row), one cell per key (labelled
    with the fields that differ among the kernel's keys) coloured used / dead / missed
    (:data:`~dsv4kit.viz.coverage.STATUS_COLORS`) with its request count, and
    four count columns: keys warmed, requested, missed, dead. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    rows = family_coverage_rows(ledger, families)
    labels_of = {r["kernel"]: key_labels(list(ledger.status(r["kernel"]))) for r in rows if r["kernel"]}
    statuses = [ledger.status(r["kernel"]) if r["kernel"] else {} for r in rows]
    width = max((len(s) for s in statuses), default=1)
    counts = ("warmed", "requested", "missed", "dead")
    x0 = width + 0.4
    fig, ax = plt.subplots(figsize=(min(1.6 * width + 7, 20), 0.62 * len(rows) + 1.6))
    for row, (r, status) in enumerate(zip(rows, statuses, strict=True)):
        if r["kernel"] is None:
            ax.add_patch(Rectangle((0, row), width - 0.05, 0.9, color="#eeeeee"))
            ax.text(width / 2, row + 0.45, "no kernel of this family in these runtimes", ha="center",
                    va="center", fontsize=7, color="#555555")
        for col, (key, st) in enumerate(status.items()):
            ax.add_patch(Rectangle((col, row), 0.95, 0.9, color=STATUS_COLORS[st]))
            calls = ledger.requested.get(r["kernel"], {}).get(key, 0)
            ax.text(col + 0.47, row + 0.45, f"{labels_of[r['kernel']][col]}\ncalls={calls}", ha="center",
                    va="center", fontsize=6, color="white")
        for j, name in enumerate(counts):
            n = r[name]
            color = {"missed": STATUS_COLORS["missed"], "dead": STATUS_COLORS["dead"]}.get(name, "#1565c0")
            ax.add_patch(Rectangle((x0 + j, row), 0.95, 0.9, color=color, alpha=0.15 + 0.85 * bool(n)))
            ax.text(x0 + j + 0.47, row + 0.45, str(n), ha="center", va="center", fontsize=8,
                    color="white" if n else "#333333")
    for j, name in enumerate(counts):
        ax.text(x0 + j + 0.47, -0.15, name, ha="center", va="bottom", fontsize=7)
    ax.set_xlim(0, x0 + len(counts))
    ax.set_ylim(len(rows), -0.6)
    labels = [f"{r['spec_id']} {r['family']}\n{r['kernel'] or '-'}" for r in rows]
    ax.set_yticks([i + 0.45 for i in range(len(rows))], labels, fontsize=7)
    ax.set_xticks([])
    ax.set_title(title)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in STATUS_COLORS.items()],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- drills


def drill_table_markdown(caught: Iterable[Caught]) -> str:
    """One row per trap drill: trap, title, what caught it, the field named, where the message names it."""
    lines = ["| trap | what | caught by | field named | the message, where it names the field |",
             "|---" * 5 + "|"]
    for c in sorted(caught, key=lambda c: c.trap):
        msg = c.excerpt().replace("|", "\\|")
        msg = msg if len(msg) <= 120 else msg[:117] + "..."
        named = "" if c.names_field else " (NOT named)"
        lines.append(f"| {c.trap} | {c.title} | {c.by} | `{c.field}`{named} | {msg} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the recorded GPU run


def pipeline_gpu_table_markdown(results: Iterable[Mapping[str, Any]]) -> str:
    """One row per (configuration, backend) of a ``benchmarks/pipeline_gpu.py`` report's ``results``."""
    lines = ["| config | backend | ok | steps | op calls | steps conforming | compiles after warmup "
             "(triton, cute) | monitor events | wall s |", "|---" * 9 + "|"]
    for r in results:
        steps = r.get("steps_run", 0)
        lines.append(
            f"| {r.get('config')} | {r.get('backend')} | {'yes' if r.get('ok') else '**NO**'} | {steps} "
            f"| {r.get('op_calls', 0)} | {r.get('steps_ok', 0)}/{r.get('steps_compared', 0)} "
            f"| {r.get('triton_runtime_compiles')}, {r.get('cute_runtime_compiles')} "
            f"| {len(r.get('monitor_events', []))} | {r.get('seconds', float('nan')):.1f} |"
            + (f" {r['error']}" if r.get("error") else ""))
    return "\n".join(lines)
