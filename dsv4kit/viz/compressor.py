"""Figures and tables of the C4 compressors (K5, K6, K9) for notebook 03 (matplotlib only, Agg-safe).

* :func:`plot_c4_dataflow`: where the compressors sit in a C4 layer, and which tokens are boundaries;
* :func:`window_layout` / :func:`window_markdown` / :func:`plot_window`: the 8-row window of one
  boundary token, read from the real state rows of a case (state block, row, which half);
* :func:`step_differences` / :func:`step_histogram_counts` / :func:`plot_step_histogram`: per element
  ``|kernel - reference|`` of the decoded outputs, in units of the compressor rule's step;
* :func:`numerics_table_markdown`: judged cases, grouped per op and format, with bit-identical counts;
* :func:`d1_scale_byte` / :func:`deployed_scale_byte` / :func:`plot_scale_floor`: the D1 scale floor
  against the deployed CuTe floor (spec "Known deployment differences");
* :func:`bandwidth_markdown` / :func:`below_target`: rows of a recorded ``c4_compress.json``.

The deployed floor is implemented here only to draw the difference; no encoder of the kit uses it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.formats.bits import bytes_to_f32, clog2, e4m3_decode, ue8m0_decode
from dsv4kit.formats.ds_mla import decode_ds_entries, read_ds_entries
from dsv4kit.formats.fp8 import Q8_AMAX_FLOOR, q8_exponent
from dsv4kit.formats.indexer_cache import read_indexer_entries
from dsv4kit.formats.mxfp4 import q4_dequantize, unpack_nibbles
from dsv4kit.formats.plain_row import read_plain_rows
from dsv4kit.jit import KeyLedger
from dsv4kit.kernels.c4_compress.reference import HEAD_DIM, RATIO, check_c4_values
from dsv4kit.testing.compressor_rule import bf16_ulp, e2m1_step, e4m3_step

__all__ = [
    "DEPLOYED_MIN_BYTE",
    "D1_MIN_BYTE",
    "STEP_BINS",
    "WindowRow",
    "artifact_table_markdown",
    "bandwidth_markdown",
    "below_target",
    "binned_counts",
    "check_summary_markdown",
    "d1_scale_byte",
    "deployed_scale_byte",
    "draw_arrow",
    "draw_box",
    "entry_step_units",
    "format_label",
    "merged_ledger",
    "numerics_table_markdown",
    "plot_binned_bars",
    "plot_binned_histogram",
    "plot_c4_dataflow",
    "plot_scale_floor",
    "plot_step_histogram",
    "plot_window",
    "ptx_facts",
    "request_of",
    "step_differences",
    "step_histogram_counts",
    "step_units",
    "tally_table_markdown",
    "window_layout",
    "window_markdown",
]

#: Smallest ue8m0 byte of the D1 floor (``clog2(1e-4 / 448) = -22``) and of the deployed floor
#: (``clog2(1e-4) = -13``).
D1_MIN_BYTE = 105
DEPLOYED_MIN_BYTE = 114

_HALF_COLORS = {"A": "#1565c0", "B": "#ef6c00"}
_EXCLUDED = "#bdbdbd"


# --------------------------------------------------------------------------- the data flow


def draw_box(
    ax: Any, x: float, y: float, w: float, h: float, text: str, color: str, fontsize: float = 7.5
) -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=color,
            edgecolor="#424242",
            linewidth=0.8,
        )
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def draw_arrow(ax: Any, xy0: tuple[float, float], xy1: tuple[float, float], text: str = "") -> None:
    ax.annotate("", xy=xy1, xytext=xy0, arrowprops=dict(arrowstyle="-|>", color="#424242", lw=1.0))
    if text:
        ax.text(
            (xy0[0] + xy1[0]) / 2,
            (xy0[1] + xy1[1]) / 2 + 0.12,
            text,
            ha="center",
            fontsize=6.5,
            color="#424242",
        )


def plot_c4_dataflow(positions: int = 16) -> Any:
    """The C4 layer's compressor path, and a strip of ``positions`` tokens marking the boundaries.

    Top: ``kv_score`` -> K4 (every token, state rows) -> the state caches -> at boundary tokens K5
    (fp8_ds_mla cache) or K6 (plain-row cache) for the main KV, K9 for the indexer K -> caches ->
    their consumers. Bottom: token positions ``0 .. positions-1``; boundary tokens ``(p + 1) % 4 == 0``
    highlighted, each with its rope row ``(p // 4) * 4``, and the window of the second boundary
    (half A of the previous block, half B of the current one). Returns the Figure.
    """
    import matplotlib.pyplot as plt

    if positions < 2 * RATIO or positions % RATIO:
        raise ValueError(f"positions: expected a multiple of {RATIO} >= {2 * RATIO}, got {positions}")
    fig, (ax, strip) = plt.subplots(2, 1, figsize=(12.5, 6.2), gridspec_kw={"height_ratios": [3.2, 1.3]})
    ax.set_xlim(0, 12.6)
    ax.set_ylim(0, 5.2)
    ax.axis("off")
    draw_box(
        ax,
        0.1,
        2.2,
        2.0,
        1.1,
        "kv_score (fp32 GEMM)\nmain [T, 2048]\nindexer [T, 512]\n= [kv | score]",
        "#eceff1",
    )
    draw_box(
        ax, 2.6, 2.2, 1.9, 1.1, "K4 save_partial_states\nevery token:\nscore + ape, store row", "#c8e6c9"
    )
    draw_box(
        ax,
        5.0,
        2.2,
        2.0,
        1.1,
        "state cache (fp32)\n[nsb, sbs=4, 2*SW]\nmain SW 1024\nindexer SW 256",
        "#fff9c4",
    )
    draw_box(ax, 7.6, 4.0, 2.2, 1.0, "K5: pool 8 rows, RMSNorm,\nRoPE, E1 (fp8_ds_mla)", "#bbdefb")
    draw_box(ax, 7.6, 2.6, 2.2, 1.0, "K6: same row, E2 (bf16)\nor E3 (e4m3 x fp8_scale)", "#bbdefb")
    draw_box(
        ax, 7.6, 0.6, 2.2, 1.2, "K9 (head 128): pool, RMSNorm,\nRoPE, E4 (FP8)\nor E5 (MXFP4)", "#ffe0b2"
    )
    draw_box(
        ax,
        10.3,
        3.3,
        2.2,
        1.2,
        "compressed KV cache\n(fp8_ds_mla: 584 B/entry,\nor plain rows)\n-> K3 gather, sparse attn",
        "#e1bee7",
    )
    draw_box(
        ax,
        10.3,
        0.6,
        2.2,
        1.2,
        "indexer K cache\n(FP8 or MXFP4)\n-> logits / top-k\n(with K1 / K2 query)",
        "#e1bee7",
    )
    draw_arrow(ax, (2.1, 2.75), (2.6, 2.75))
    draw_arrow(ax, (4.5, 2.75), (5.0, 2.75))
    draw_arrow(ax, (7.0, 3.1), (7.6, 4.4), "main")
    draw_arrow(ax, (7.0, 2.8), (7.6, 3.1))
    draw_arrow(ax, (7.0, 2.4), (7.6, 1.2), "indexer")
    draw_arrow(ax, (9.8, 4.5), (10.3, 4.1))
    draw_arrow(ax, (9.8, 3.1), (10.3, 3.6))
    draw_arrow(ax, (9.8, 1.2), (10.3, 1.2))
    ax.text(8.7, 3.75, "one of K5 / K6 (the KV cache dtype)", ha="center", fontsize=6.5, style="italic")
    ax.text(8.7, 0.3, "boundary tokens only: (p + 1) % 4 == 0", ha="center", fontsize=7, color="#c62828")
    ax.set_title("C4 layer: where the compressors sit (spec §1 data flow)")

    strip.set_xlim(-0.5, positions - 0.5)
    strip.set_ylim(-1.5, 1.5)
    strip.axis("off")
    for p in range(positions):
        boundary = (p + 1) % RATIO == 0
        face = "#c62828" if boundary else "#eceff1"
        strip.add_patch(plt.Rectangle((p - 0.45, 0.0), 0.9, 0.8, facecolor=face, edgecolor="#616161"))
        strip.text(
            p, 0.4, str(p), ha="center", va="center", fontsize=7, color="white" if boundary else "black"
        )
        if boundary:
            strip.text(p, 1.0, f"rope row {(p // RATIO) * RATIO}", ha="center", fontsize=6, color="#c62828")
    # The windows of the first two boundaries: each state row serves twice, as half B of its own
    # block's boundary and as half A of the next one.
    for band, p in enumerate((RATIO - 1, 2 * RATIO - 1)):
        y = -0.5 - 0.5 * band
        for q in range(max(0, p - 2 * RATIO + 1), p + 1):
            half = "A" if q <= p - RATIO else "B"
            strip.add_patch(plt.Rectangle((q - 0.45, y), 0.9, 0.35, facecolor=_HALF_COLORS[half]))
            strip.text(q, y + 0.17, half, ha="center", va="center", fontsize=6.5, color="white")
        what = (
            f"window of p = {p} (first boundary): rows 0..{p}, half B only (rows q < 0 do not exist)"
            if band == 0
            else f"window of p = {p}: half A of rows 0..3 (previous block), half B of rows 4..7 (current)"
        )
        strip.text(2 * RATIO - 0.3, y + 0.17, what, va="center", fontsize=7)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- the window


@dataclass(frozen=True)
class WindowRow:
    """Row ``j`` of the window of a boundary token at position ``p``: position ``q = p - 7 + j``.

    ``block`` / ``row``: where the state row is (``block_table[r, q // sbs]``, ``q % sbs``); None for
    an excluded row (q < 0). ``half``: ``"A"`` (j < 4, the row serves as the previous block) or
    ``"B"`` (j >= 4, the current block); ``kv_cols`` / ``score_cols``: the half's columns in the state
    row. ``weight``: the row's softmax weight averaged over the D columns (0 when excluded).
    """

    j: int
    position: int
    included: bool
    block: int | None
    row: int | None
    half: str
    kv_cols: tuple[int, int]
    score_cols: tuple[int, int]
    weight: float

    @property
    def role(self) -> str:
        return "previous block" if self.half == "A" else "current block"


def _window(case: Any, position: int, request: int) -> tuple[list[WindowRow], torch.Tensor, torch.Tensor]:
    """The window rows of (request, position), their kv half and softmax weights ``[8, D]`` (float64)."""
    a = case.args
    head = HEAD_DIM[case.op]
    if (position + 1) % RATIO:
        raise ValueError(f"position: expected a boundary token ((p + 1) % {RATIO} == 0), got {position}")
    state, bt = a["state_cache"], a["block_table"]
    if not 0 <= request < bt.shape[0]:
        raise ValueError(f"request: expected a row of the block table (< {bt.shape[0]}), got {request}")
    sbs, sw = state.shape[1], state.shape[2] // 2
    w = 2 * RATIO
    kv = torch.zeros(w, head, dtype=torch.float64)
    score = torch.full((w, head), -math.inf, dtype=torch.float64)
    rows = []
    for j in range(w):
        q = position - w + 1 + j
        h = int(j >= RATIO)
        kv_cols, score_cols = (h * head, h * head + head), (sw + h * head, sw + h * head + head)
        block = row = None
        if q >= 0:
            if q // sbs >= bt.shape[1] or int(bt[request, q // sbs]) < 0:
                raise ValueError(
                    f"position {position}: window row q = {q} has no state block in request {request}"
                )
            block, row = int(bt[request, q // sbs]), q % sbs
            r = state[block, row].to(torch.float64)
            kv[j], score[j] = r[kv_cols[0] : kv_cols[1]], r[score_cols[0] : score_cols[1]]
        rows.append((j, q, block, row, "AB"[h], kv_cols, score_cols))
    weights = torch.softmax(score, dim=0)
    out = [
        WindowRow(j, q, block is not None, block, row, half, kc, sc, float(weights[j].mean()))
        for j, q, block, row, half, kc, sc in rows
    ]
    return out, kv, weights


def request_of(case: Any, position: int) -> int:
    """The request row of the case's first token at ``position`` (the C4 and C128 windows)."""
    a = case.args
    hits = torch.nonzero(a["positions"] == position).flatten()
    if hits.numel() == 0:
        raise ValueError(f"position {position}: no token of the case has it (pass request=)")
    return int(a["token_to_req"][hits[0]])


def window_layout(case: Any, position: int, request: int | None = None) -> list[WindowRow]:
    """The 8 rows of the window of the boundary token at ``position`` of ``request`` in ``case``
    (a :class:`~dsv4kit.kernels.c4_compress.cases.C4Case`), read from its real state rows.

    ``request`` defaults to the request of the first token of the case at ``position``.
    """
    req = request_of(case, position) if request is None else request
    return _window(case, position, req)[0]


def window_markdown(rows: Sequence[WindowRow]) -> str:
    """A Markdown table of :func:`window_layout` rows."""
    lines = [
        "| j | q | state block, row | half | role | kv cols | score cols | mean weight |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        where = f"{r.block}, {r.row}" if r.included else "excluded (q < 0)"
        lines.append(
            f"| {r.j} | {r.position} | {where} | {r.half} | {r.role} | [{r.kv_cols[0]}, {r.kv_cols[1]}) "
            f"| [{r.score_cols[0]}, {r.score_cols[1]}) | {r.weight:.3f} |"
        )
    return "\n".join(lines)


def plot_window(
    case: Any, positions: Sequence[int] = (3, 11), request: int | None = None, columns: int = 48
) -> Any:
    """One panel per boundary position: the softmax weights ``w_j[d]`` of the window's 8 rows over
    the first ``columns`` dims, computed (float64) from the case's real state rows.

    Each row is labelled with its position, state block and row, and the half it contributes
    (A: previous block, blue; B: current block, orange); excluded rows (q < 0) are grey. Returns
    the Figure; ``fig.windows`` holds the :class:`WindowRow` lists, one per panel.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    fig, axes = plt.subplots(1, len(positions), figsize=(6.2 * len(positions), 3.6), squeeze=False)
    fig.windows = []
    for ax, p in zip(axes[0], positions, strict=True):
        req = request_of(case, p) if request is None else request
        rows, _, weights = _window(case, p, req)
        fig.windows.append(rows)
        cols = min(columns, weights.shape[1])
        img = weights[:, :cols].numpy()
        im = ax.imshow(
            img,
            aspect="auto",
            cmap="viridis",
            vmin=0.0,
            vmax=1.0,
            interpolation="nearest",
            extent=(-0.5, cols - 0.5, len(rows) - 0.5, -0.5),
        )
        for r in rows:
            if not r.included:
                ax.add_patch(
                    Rectangle(
                        (-0.5, r.j - 0.5), cols, 1.0, facecolor=_EXCLUDED, hatch="//", edgecolor="white"
                    )
                )
                ax.text(cols / 2, r.j, "excluded: q < 0", ha="center", va="center", fontsize=6.5)
            ax.add_patch(
                Rectangle((-2.6, r.j - 0.45), 1.6, 0.9, facecolor=_HALF_COLORS[r.half], clip_on=False)
            )
            ax.text(-1.8, r.j, r.half, ha="center", va="center", fontsize=7, color="white")
        ax.set_xlim(-3.0, cols - 0.5)
        labels = [
            f"j={r.j} q={r.position} " + (f"blk {r.block} row {r.row}" if r.included else "(none)")
            for r in rows
        ]
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set_xlabel(f"dim d (first {cols} of {weights.shape[1]})")
        n_in = sum(r.included for r in rows)
        first = "first boundary: " if p == RATIO - 1 else ""
        ax.set_title(
            f"request {req}, p = {p} ({first}{n_in} rows), rope row {(p // RATIO) * RATIO}", fontsize=9
        )
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label="softmax weight $w_j[d]$")
    axes[0][-1].legend(
        handles=[
            Patch(color=_HALF_COLORS["A"], label="half A: previous block"),
            Patch(color=_HALF_COLORS["B"], label="half B: current block"),
            Patch(color=_EXCLUDED, label="excluded row"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.25, 1.0),
        fontsize=7,
    )
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- differences in steps


def _written(case: Any) -> tuple[torch.Tensor, torch.Tensor]:
    a = case.args
    idx = check_c4_values(case.op, case.ops)
    return idx, a["kv_slot_mapping"][idx]


def step_units(
    a: torch.Tensor,
    b: torch.Tensor,
    step: Any,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
) -> torch.Tensor:
    """``|a - b| / step`` per element (the rule's step: coarser scale, binade of max(|a|, |b|))."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    scale = torch.ones_like(a64) if scale_a is None else torch.maximum(scale_a.double(), scale_b.double())
    s = step(torch.maximum(a64.abs(), b64.abs()) / scale).to(torch.float64) * scale
    return ((a64 - b64).abs() / s).flatten()


def step_differences(case: Any, got: torch.Tensor, want: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per written element, ``|kernel - reference|`` of the decoded values in units of the step of
    the compressor rule (§2.12), per output tensor (the names :func:`~dsv4kit.kernels.c4_compress.
    cases.judge` uses: ``nope``/``rope``, ``rows``, ``fp8``, ``mxfp4``); float64, flattened.

    ``got`` / ``want``: the kernel's and the reference's cache after running ``case``. 0 means
    bit-identical values (+0 and -0 equal); 1 is one grid step. The fp32 allowance of the rule is
    not subtracted: these are raw distances.
    """
    _, slots = _written(case)
    kind = {"c4_compress_ds_mla": "ds", "c4_compress_plain": "plain"}.get(case.op, "indexer")
    return entry_step_units(
        kind,
        got,
        want,
        slots,
        fp8_scale=case.args.get("fp8_scale"),
        use_fp4=bool(case.args.get("use_fp4_cache", False)),
    )


def entry_step_units(
    kind: str,
    got: torch.Tensor,
    want: torch.Tensor,
    slots: torch.Tensor,
    *,
    fp8_scale: torch.Tensor | None = None,
    use_fp4: bool = False,
) -> dict[str, torch.Tensor]:
    """The step distances of :func:`step_differences` for the entries at ``slots`` of two caches of
    ``kind`` (``ds``, ``plain``, ``indexer``; see :mod:`dsv4kit.testing.cache_judge`), on any device
    (strided GPU caches are copied with their layout)."""
    from dsv4kit.testing.cache_judge import cpu_copy

    got, want, slots = cpu_copy(got), cpu_copy(want), slots.cpu()
    if slots.numel() == 0:
        return {}
    if kind == "ds":
        (ea, _), (eb, _) = read_ds_entries(got, slots), read_ds_entries(want, slots)
        da, db = decode_ds_entries(ea), decode_ds_entries(eb)
        sa = ue8m0_decode(ea.scales).repeat_interleave(64, dim=1)
        sb = ue8m0_decode(eb.scales).repeat_interleave(64, dim=1)
        return {
            "nope": step_units(da[:, :448], db[:, :448], e4m3_step, sa, sb),
            "rope": step_units(da[:, 448:], db[:, 448:], bf16_ulp),
        }
    if kind == "plain":
        scale = None if fp8_scale is None else fp8_scale.cpu()
        va, vb = read_plain_rows(got, slots, scale), read_plain_rows(want, slots, scale)
        if scale is None:
            return {"rows": step_units(va, vb, bf16_ulp)}
        s = torch.full_like(va, float(scale[0]))
        return {"rows": step_units(va, vb, e4m3_step, s, s)}
    (xa, ba), (xb, bb) = read_indexer_entries(got, slots, use_fp4), read_indexer_entries(want, slots, use_fp4)
    n = slots.numel()
    if use_fp4:
        va, vb = q4_dequantize(unpack_nibbles(xa), ba), q4_dequantize(unpack_nibbles(xb), bb)
        sa = ue8m0_decode(ba).repeat_interleave(32, dim=1)
        sb = ue8m0_decode(bb).repeat_interleave(32, dim=1)
        return {"mxfp4": step_units(va, vb, e2m1_step, sa, sb)}
    fa, fb = bytes_to_f32(ba).reshape(n, 1), bytes_to_f32(bb).reshape(n, 1)
    va, vb = e4m3_decode(xa) * fa, e4m3_decode(xb) * fb
    return {"fp8": step_units(va, vb, e4m3_step, fa.expand(n, 128), fb.expand(n, 128))}


#: Histogram bins of :func:`step_histogram_counts`: (label, low exclusive, high inclusive); the
#: first bin is exactly 0.
STEP_BINS: tuple[tuple[str, float, float], ...] = (
    ("0 (bit-identical)", -1.0, 0.0),
    ("(0, 1/2]", 0.0, 0.5),
    ("(1/2, 1]", 0.5, 1.0),
    ("(1, 2]", 1.0, 2.0),
    ("> 2", 2.0, math.inf),
)


def binned_counts(
    values: torch.Tensor | Iterable[torch.Tensor], bins: Sequence[tuple[str, float, float]]
) -> dict[str, int]:
    """Counts of ``values`` per ``(label, lo, hi]`` bin, plus ``"NaN"`` (always reported)."""
    u = (
        values
        if isinstance(values, torch.Tensor)
        else torch.cat([x.flatten() for x in values] or [torch.zeros(0, dtype=torch.float64)])
    )
    u = u.to(torch.float64).flatten()
    counts = {label: int(((u > lo) & (u <= hi)).sum()) for label, lo, hi in bins}
    counts["NaN"] = int(torch.isnan(u).sum())
    return counts


def plot_binned_bars(counts: Mapping[str, Mapping[str, int]], labels: Sequence[str], xlabel: str) -> Any:
    """Grouped bars on a log count axis, one group per bin label, one bar per series of ``counts``
    (bar heights annotated; empty bins drawn as gaps). Returns ``(fig, ax)``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.6))
    width = 0.8 / max(1, len(counts))
    for i, (name, c) in enumerate(counts.items()):
        xs = [k + (i - (len(counts) - 1) / 2) * width for k in range(len(labels))]
        vals = [c[lab] for lab in labels]
        bars = ax.bar(xs, [v if v else float("nan") for v in vals], width, label=name)
        for x, v, bar in zip(xs, vals, bars, strict=True):
            if v:
                ax.text(x, v * 1.15, str(v), ha="center", va="bottom", fontsize=6, color=bar.get_facecolor())
    ax.set_yscale("log")
    top = max((v for c in counts.values() for v in c.values()), default=1)
    ax.set_ylim(0.5, max(10, top) * 4)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("elements")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    return fig, ax


def plot_binned_histogram(
    values_by_name: Mapping[str, torch.Tensor | Iterable[torch.Tensor]],
    bins: Sequence[tuple[str, float, float]],
    xlabel: str,
) -> tuple[Any, Any, int, int]:
    """:func:`plot_binned_bars` of the :func:`binned_counts` of each series of ``values_by_name``
    (``fig.counts``). Returns ``(fig, ax, zeros, total)``: the elements of the first bin (the
    bit-identical ones) and of every bin (NaN left out), over all series."""
    counts = {name: binned_counts(u, bins) for name, u in values_by_name.items()}
    labels = [b[0] for b in bins]
    fig, ax = plot_binned_bars(counts, labels, xlabel)
    fig.counts = counts
    total = sum(sum(v for k, v in c.items() if k != "NaN") for c in counts.values())
    zeros = sum(c[labels[0]] for c in counts.values())
    return fig, ax, zeros, total


def step_histogram_counts(units: torch.Tensor | Iterable[torch.Tensor]) -> dict[str, int]:
    """Counts of ``units`` (distances in steps, see :func:`step_differences`) per :data:`STEP_BINS`
    bin, plus ``"NaN"`` (always reported, a NaN never passes the rule)."""
    return binned_counts(units, STEP_BINS)


def plot_step_histogram(units_by_output: Mapping[str, torch.Tensor | Iterable[torch.Tensor]]) -> Any:
    """Grouped bars (log count axis): for each output (e.g. ``"K5 nope"``), how many elements lie
    0, (0, 1/2], (1/2, 1], (1, 2] or > 2 steps from the reference. Returns the Figure;
    ``fig.counts`` holds :func:`step_histogram_counts` per output."""
    fig, ax, zeros, total = plot_binned_histogram(
        units_by_output, STEP_BINS,
        "|kernel - reference| in units of the step (grid spacing of the stored format)"
    )
    ax.set_title(
        f"{zeros}/{total} elements bit-identical ({(zeros / total if total else 1):.4%})", fontsize=10
    )
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- numerics table


def format_label(case: Any) -> str:
    """``"K5 fp8_ds_mla"``, ``"K6 bf16"``, ``"K6 e4m3"``, ``"K9 FP8"`` or ``"K9 MXFP4"`` for a case."""
    a = case.args
    if case.op == "c4_compress_ds_mla":
        return "K5 fp8_ds_mla"
    if case.op == "c4_compress_plain":
        return "K6 e4m3" if a.get("fp8_scale") is not None else "K6 bf16"
    return "K9 MXFP4" if a.get("use_fp4_cache") else "K9 FP8"


def tally_table_markdown(
    verdicts: Iterable[tuple[str, Any]],
    columns: Sequence[str],
    tally: Callable[[Any], Mapping[str, float]],
    row: Callable[[str, Mapping[str, float]], str],
    fields: Sequence[str],
    largest: Sequence[str] = (),
) -> str:
    """A Markdown table of ``(label, verdict)`` pairs: one row per label and an ``**all**`` row.
    ``tally(v)`` gives a verdict's counts of ``fields``, added up per label and over all (the
    fields in ``largest``: their maximum); ``row(label, counts)`` writes a row under the header
    ``columns``."""
    rows: dict[str, dict[str, float]] = {}
    for label, v in verdicts:
        r = rows.setdefault(label, dict.fromkeys(fields, 0))
        for k, x in tally(v).items():
            r[k] = max(r[k], x) if k in largest else r[k] + x
    tot = dict.fromkeys(fields, 0)
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for label, r in rows.items():
        for k in tot:
            tot[k] = max(tot[k], r[k]) if k in largest else tot[k] + r[k]
        lines.append(row(label, r))
    lines.append(row("**all**", tot))
    return "\n".join(lines)


#: The columns of :func:`numerics_table_markdown`.
NUMERICS_COLUMNS = ("op / format", "cases", "conform", "entries", "elements", "bit-identical",
                    "cases all identical", "used the step", "violations", "other bytes differ")


def numerics_table_markdown(verdicts: Iterable[tuple[str, Any]]) -> str:
    """One row per label of ``(label, Verdict)`` pairs (a :class:`~dsv4kit.kernels.c4_compress.
    cases.Verdict` each): cases, cases that conform, entries written, elements, bit-identical
    elements, elements that used the step, violations, and the bytes outside the rule."""
    return tally_table_markdown(verdicts, NUMERICS_COLUMNS, _numerics_tally, _numerics_row,
                                fields=_NUMERICS_FIELDS)


_NUMERICS_FIELDS = ("cases", "ok", "entries", "n", "same", "step", "bad", "other", "identical_cases")


def _numerics_tally(v: Any) -> dict[str, int]:
    return dict(cases=1, ok=int(bool(v.ok)), entries=v.written, n=v.elements, same=v.bit_identical,
                step=sum(x.used_step for x in v.reports.values()),
                bad=sum(x.violations + x.scale_mismatches for x in v.reports.values()),
                other=int(not v.other_bytes_equal), identical_cases=int(v.bit_identical == v.elements))


def _numerics_row(label: str, r: Mapping[str, int]) -> str:
    frac = r["same"] / r["n"] if r["n"] else 1.0
    return (
        f"| {label} | {r['cases']} | {r['ok']} | {r['entries']} | {r['n']} | {r['same']} ({frac:.3%}) "
        f"| {r['identical_cases']} | {r['step']} | {r['bad']} | {r['other']} |"
    )


# --------------------------------------------------------------------------- the scale floor


def d1_scale_byte(amax: torch.Tensor) -> torch.Tensor:
    """ue8m0 byte of a Q8 block under D1: ``clog2(fl(max(amax, 1e-4) / 448)) + 127`` (int32)."""
    return q8_exponent(amax.to(torch.float32)) + 127


def deployed_scale_byte(amax: torch.Tensor) -> torch.Tensor:
    """ue8m0 byte under the deployed CuTe floor: ``clog2(max(fl(amax / 448), 1e-4)) + 127`` (int32).

    A known deployment difference (spec §0): shown for comparison, used by no encoder of the kit.
    """
    a = amax.to(torch.float32)
    scale = torch.maximum(a / torch.full_like(a, 448.0), torch.full_like(a, Q8_AMAX_FLOOR))
    return clog2(scale) + 127


def plot_scale_floor(
    amax_range: tuple[float, float] = (1e-6, 1.0), marks: Sequence[float] = (0.01,), points: int = 1200
) -> Any:
    """Two panels against the block amax (log axis): the stored scale byte under D1 and under the
    deployed floor, and the finest grid spacing of the block's values ``2^(byte - 127 - 9)`` (the
    e4m3 subnormal step times the scale), with the ratio ``2^(deployed - D1)`` annotated at each of
    ``marks``. Returns the Figure; ``fig.marks`` holds ``(amax, D1 byte, deployed byte)`` per mark.
    """
    import matplotlib.pyplot as plt

    lo, hi = amax_range
    amax = torch.logspace(math.log10(lo), math.log10(hi), points, dtype=torch.float64).to(torch.float32)
    d1, dep = d1_scale_byte(amax), deployed_scale_byte(amax)
    x = amax.double().numpy()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12.5, 3.8))
    ax0.step(x, d1.numpy(), where="post", label="D1: clog2(max(amax, 1e-4) / 448)", color="#2e7d32")
    ax0.step(
        x, dep.numpy(), where="post", label="deployed: clog2(max(amax / 448, 1e-4))", color="#c62828", ls="--"
    )
    spacing_d1 = torch.exp2((d1 - 127 - 9).double()).numpy()
    spacing_dep = torch.exp2((dep - 127 - 9).double()).numpy()
    ax1.step(x, spacing_d1, where="post", label="D1", color="#2e7d32")
    ax1.step(x, spacing_dep, where="post", label="deployed floor", color="#c62828", ls="--")
    for v, label in (
        (Q8_AMAX_FLOOR, "1e-4 (D1 floor)"),
        (448 * 2.0**-14, "448·2⁻¹⁴ ≈ 0.0273"),
        (448 * Q8_AMAX_FLOOR, "0.0448"),
    ):
        for ax in (ax0, ax1):
            ax.axvline(v, color="#9e9e9e", lw=0.7, ls=":")
        ax0.text(v, 104.3, label, rotation=90, fontsize=6, va="bottom", ha="right", color="#616161")
    fig.marks = []
    for m in marks:
        t = torch.tensor([m], dtype=torch.float32)
        b1, b2 = int(d1_scale_byte(t)), int(deployed_scale_byte(t))
        fig.marks.append((m, b1, b2))
        ax0.plot([m, m], [b1, b2], "o", color="black", ms=3)
        ax0.annotate(
            f"amax {m:g}: {b1} vs {b2}", (m, b2), xytext=(8, 8), textcoords="offset points", fontsize=7
        )
        ax1.plot([m, m], [2.0 ** (b1 - 136), 2.0 ** (b2 - 136)], "o-", color="black", ms=3, lw=0.8)
        ax1.annotate(
            f"{2 ** (b2 - b1)}× coarser at amax {m:g}",
            (m, 2.0 ** (b1 - 136)),
            xytext=(6, -10),
            textcoords="offset points",
            fontsize=7,
        )
    worst = 2 ** (DEPLOYED_MIN_BYTE - D1_MIN_BYTE)
    ax1.annotate(
        f"{worst}× coarser (amax ≤ ~1.07e-4)",
        (lo * 3, 2.0 ** (DEPLOYED_MIN_BYTE - 136)),
        xytext=(0, 8),
        textcoords="offset points",
        fontsize=7,
    )
    ax0.set_xscale("log")
    ax0.set_ylim(103.5, max(int(d1.max()), int(dep.max())) + 1.5)
    ax0.set_xlabel("block amax (after bf16 rounding)")
    ax0.set_ylabel("ue8m0 scale byte")
    ax0.set_title("stored scale byte", fontsize=10)
    ax0.legend(fontsize=7, loc="upper left")
    ax1.set_xscale("log")
    ax1.set_yscale("log", base=2)
    ax1.set_xlabel("block amax")
    ax1.set_ylabel("finest grid spacing of the block")
    ax1.set_title("grid near zero: 2^(byte − 127 − 9) (e4m3 subnormal step × scale)", fontsize=10)
    ax1.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- recorded bandwidth


def bandwidth_markdown(rows: Iterable[Mapping[str, Any]], tokens: int) -> str:
    """The rows of a ``c4_compress.json`` ``timings`` list at ``tokens``: one line per format, one
    column per implementation, percent of the copy bandwidth of that run."""
    at = [r for r in rows if int(r["T"]) == tokens]
    impls = list(dict.fromkeys(r["impl"] for r in at))
    formats = list(dict.fromkeys(r["format"] for r in at))
    pct = {(r["format"], r["impl"]): r for r in at}
    lines = [f"| T = {tokens} | " + " | ".join(impls) + " |", "|---" * (len(impls) + 1) + "|"]
    for f in formats:
        cells = []
        for i in impls:
            r = pct.get((f, i))
            cells.append(
                "-" if r is None else ("error" if r.get("error") else f"{float(r['pct_of_copy']):.1f}%")
            )
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def below_target(
    rows: Iterable[Mapping[str, Any]],
    tokens: int,
    kernels: Sequence[str] = ("triton", "cutedsl"),
    target: float = 80.0,
) -> list[tuple[str, str, float]]:
    """``(format, impl, percent)`` of the kernel rows (impl in ``kernels``, timed alone) at ``tokens``
    below ``target`` percent of the copy bandwidth, or with an error (percent NaN)."""
    out = []
    for r in rows:
        if int(r["T"]) == tokens and r["impl"] in kernels:
            p = float(r["pct_of_copy"]) if not r.get("error") else float("nan")
            if not p >= target:
                out.append((r["format"], r["impl"], p))
    return out


# --------------------------------------------------------------------------- compiles and coverage


def ptx_facts(ptx: str) -> dict[str, int]:
    """Counts of the PTX instructions the compressor contract cares about: ``fma`` (must be 0,
    §2.1 rule 1), IEEE ``sqrt.rn.f32`` / ``div.rn.f32`` (the norm and the softmax), ``ex2``
    (exp), 16-byte global loads and stores (``ld.global...v4`` / ``st.global...v4``)."""
    return {
        "fma": len(re.findall(r"\bfma\.", ptx)),
        "sqrt.rn.f32": ptx.count("sqrt.rn.f32"),
        "div.rn.f32": ptx.count("div.rn.f32"),
        "ex2": len(re.findall(r"\bex2\.", ptx)),
        "ld.global.v4": len(re.findall(r"ld\.global[.\w]*\.v4", ptx)),
        "st.global.v4": len(re.findall(r"st\.global[.\w]*\.v4", ptx)),
    }


def _short_key(key: Any) -> str:
    """The fields of a CompileKey that are not fixed (the ones that select code)."""
    free = [f for f in dataclasses.fields(key) if not f.metadata.get("fixed")]
    return "(" + ", ".join(f"{f.name}={getattr(key, f.name)}" for f in free) + ")"


def artifact_table_markdown(entries: Iterable[tuple[Any, Any]]) -> str:
    """One row per ``(kernel, key)`` with a compile artifact: backend, target, the key's free
    fields, compile seconds, registers, spills, and :func:`ptx_facts` where the artifact has PTX."""
    head = [
        "kernel",
        "backend",
        "target",
        "key",
        "compile s",
        "registers",
        "spills",
        "fma",
        "sqrt.rn / div.rn",
        "ld / st .v4",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for kernel, key in entries:
        art = kernel.artifact(key)
        if art is None:
            lines.append(
                f"| {kernel.name} | {kernel.backend} | - | {_short_key(key)} | not compiled |"
                + " |" * (len(head) - 5)
            )
            continue
        ptx = art.text.get("ptx")
        f = ptx_facts(ptx) if ptx else None
        cells = [
            kernel.name,
            art.backend,
            art.target,
            _short_key(key),
            f"{art.seconds:.2f}",
            str(art.info.get("registers", "-")),
            str(art.info.get("spills", "-")),
            str(f["fma"]) if f else "-",
            f"{f['sqrt.rn.f32']} / {f['div.rn.f32']}" if f else "-",
            f"{f['ld.global.v4']} / {f['st.global.v4']}" if f else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def merged_ledger(ledgers: Iterable[KeyLedger], keep: Callable[[str], bool] = lambda name: True) -> KeyLedger:
    """One :class:`~dsv4kit.jit.KeyLedger` with the warmed keys and request counts of ``ledgers``
    (e.g. several runtime configurations), for the kernels whose name ``keep`` accepts."""
    out = KeyLedger()
    for led in ledgers:
        for name, keys in led.warmed.items():
            if keep(name):
                out.add_warmed(name, keys)
        for name, counts in led.requested.items():
            if keep(name):
                out.requested.setdefault(name, Counter()).update(counts)
    return out


_CHECK_COLUMNS = (
    ("op", "op"),
    ("backend", "backend"),
    ("reference", "vs reference"),
    ("set", "cases from"),
    ("cases", "cases"),
    ("conforming", "conform"),
    ("violations", "violations"),
    ("scale_mismatches", "scale mismatches"),
    ("used_step", "used the step"),
    ("errors", "errors"),
)


def check_summary_markdown(rows: Iterable[Mapping[str, Any]]) -> str:
    """The ``summary`` rows of a recorded GPU check of the compressor rule (one per op, backend,
    reference and case set), with the bit-identical fraction; missing fields show as ``-``."""
    head = [label for _, label in _CHECK_COLUMNS] + ["bit-identical"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        cells = [str(r.get(k, "-")) for k, _ in _CHECK_COLUMNS]
        n, same = r.get("elements"), r.get("bit_identical")
        cells.append(f"{same}/{n} ({same / n:.4%})" if n and same is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
