"""Figures and tables of the C128 compressor (K7, K8a, K8b) for notebook 04 (matplotlib only, Agg-safe).

* :func:`plot_c128_dataflow`: where K7 and K8 sit in a C128 layer (K4 -> K7 -> K8 -> K3), and
  which state blocks each boundary token's window covers;
* :func:`c128_window_layout` / :func:`c128_window_markdown` / :func:`plot_c128_window`: the
  128-row window of one boundary token as 16 state blocks of 8 rows, read through the case's
  shuffled block table from its real state rows;
* :func:`spec_key` / :func:`key_space` / :func:`key_space_markdown`: the keys warmup compiles per
  configuration, in the spec's notation (``(2, 1728, bfloat16)``);
* :func:`c128_label`, :func:`k7_fractions`, :func:`plot_k7_fractions`, :func:`k7_table_markdown`:
  K7 against the FP32 rule; :func:`store_step_differences`: K8's decoded outputs in units of the
  compressor rule's step (for :func:`~dsv4kit.viz.compressor.plot_step_histogram`);
* :func:`read_c128_record` / :func:`record_markdown` / :func:`timing_markdown`: what a recorded
  GPU run of the C128 family (``benchmarks/c128_compress_gpu_check.py``) holds, and its tables.

Where a C4 helper fits (the boxes and arrows of the data flow, the step units, the check summary;
in the notebook the step histogram, the numerics and artifact tables) it is imported from
:mod:`dsv4kit.viz.compressor`, not copied.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.kernels.c128_compress.reference import (
    RATIO,
    STATE_BLOCK_SIZE,
    check_c128_values,
)
from dsv4kit.kernels.c128_compress.spec import (
    SPECS,
    C128CompressBase,
    C128CompressConfig,
    C128StoreDsMlaBase,
    C128StorePlainBase,
)
from dsv4kit.testing.compressor_rule import FP32_RULE
from dsv4kit.viz.compressor import (
    binned_counts,
    check_summary_markdown,
    draw_arrow,
    draw_box,
    entry_step_units,
    plot_binned_histogram,
    request_of,
    tally_table_markdown,
)

__all__ = [
    "BLOCKS_PER_WINDOW",
    "COMPILE_FIELDS",
    "FP32_BINS",
    "OPS",
    "RECORD_FILES",
    "C128Record",
    "WindowBlock",
    "c128_label",
    "c128_window_layout",
    "c128_window_markdown",
    "fp32_histogram_counts",
    "k7_fractions",
    "k7_table_markdown",
    "key_space",
    "key_space_markdown",
    "plot_c128_dataflow",
    "plot_c128_window",
    "plot_k7_fractions",
    "read_c128_record",
    "record_markdown",
    "spec_key",
    "store_step_differences",
    "timing_markdown",
]

OPS = ("c128_compress", "c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain")
#: A C128 window: 128 rows = 16 whole state blocks of 8 rows (spec K7).
BLOCKS_PER_WINDOW = RATIO // STATE_BLOCK_SIZE
_D = 512
_KV_COLOR, _SCORE_COLOR, _IDLE = "#1565c0", "#ef6c00", "#e0e0e0"


def _block_colors(n: int = BLOCKS_PER_WINDOW) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


# --------------------------------------------------------------------------- the data flow


def plot_c128_dataflow(blocks: int = 48) -> Any:
    """The C128 layer's compressor path, and a strip of ``blocks`` state blocks (8 positions each).

    Top: ``kv_score`` -> K4 (every token, one state row) -> the state cache (block size 8) -> K7
    (boundary tokens: pool 128 rows) -> the fp32 ``compressed_kv`` workspace -> K8a (fp8_ds_mla) or
    K8b (plain rows) -> the compressed KV cache -> K3 (gathers it on prefill) -> sparse attention.
    Bottom: state block columns ``0 .. blocks-1``; the boundary tokens ``p % 128 == 127`` (the last
    row of every 16th block), each window bracketed over its 16 blocks with its rope row
    ``(p // 128) * 128``. Returns the Figure; ``fig.boundaries`` lists the boundary positions and
    ``fig.windows`` ``(p, first block column, last block column, rope row)`` per boundary.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if blocks < BLOCKS_PER_WINDOW or blocks % BLOCKS_PER_WINDOW:
        raise ValueError(
            f"blocks: expected a multiple of {BLOCKS_PER_WINDOW} >= {BLOCKS_PER_WINDOW}, got {blocks}"
        )
    fig, (ax, strip) = plt.subplots(2, 1, figsize=(13.5, 6.4), gridspec_kw={"height_ratios": [3.0, 1.5]})
    ax.set_xlim(0, 14.6)
    ax.set_ylim(0, 5.0)
    ax.axis("off")
    draw_box(ax, 0.1, 2.0, 1.9, 1.2, "kv_score (fp32 GEMM)\n[T, 1024]\n= [kv 512 | score 512]", "#eceff1")
    draw_box(
        ax, 2.4, 2.0, 1.8, 1.2, "K4 save_partial_states\nevery token:\nscore + ape, store row", "#c8e6c9"
    )
    draw_box(ax, 4.6, 2.0, 1.9, 1.2, "state cache (fp32)\n[nsb, sbs = 8, 1024]\nrow [kv | score]", "#fff9c4")
    draw_box(
        ax,
        6.9,
        2.0,
        1.9,
        1.2,
        "K7 c128_compress\npool 128 rows\n= 16 state blocks\n(per-column softmax)",
        "#bbdefb",
    )
    draw_box(ax, 9.2, 2.0, 1.7, 1.2, "compressed_kv\nfp32 [T, 512]\n(workspace,\nboundary rows)", "#fff9c4")
    draw_box(ax, 11.3, 3.3, 1.5, 1.1, "K8a: RMSNorm,\nRoPE, E1\n(fp8_ds_mla)", "#bbdefb")
    draw_box(ax, 11.3, 0.8, 1.5, 1.1, "K8b: RMSNorm,\nRoPE, E2 bf16 /\nE3 e4m3", "#bbdefb")
    draw_box(
        ax,
        13.1,
        2.0,
        1.45,
        1.2,
        "compressed KV\ncache, kv_bs =\nmax(1, B // 128)\n-> K3, sparse attn",
        "#e1bee7",
    )
    draw_arrow(ax, (2.0, 2.6), (2.4, 2.6))
    draw_arrow(ax, (4.2, 2.6), (4.6, 2.6))
    draw_arrow(ax, (6.5, 2.6), (6.9, 2.6))
    draw_arrow(ax, (8.8, 2.6), (9.2, 2.6))
    draw_arrow(ax, (10.9, 2.9), (11.3, 3.8))
    draw_arrow(ax, (10.9, 2.3), (11.3, 1.4))
    draw_arrow(ax, (12.8, 3.8), (13.1, 3.0))
    draw_arrow(ax, (12.8, 1.4), (13.1, 2.2))
    ax.text(
        12.05,
        2.6,
        "one of K8a / K8b\n(the KV cache dtype, trap 3)",
        ha="center",
        va="center",
        fontsize=6.5,
        style="italic",
    )
    ax.text(7.85, 1.6, "boundary tokens only: p % 128 == 127", ha="center", fontsize=7, color="#c62828")
    ax.text(10.05, 1.6, "rope row (p // 128) * 128", ha="center", fontsize=7, color="#c62828")
    ax.set_title("C128 layer: K4 -> K7 -> K8 -> K3 (spec §1 data flow; K7, K8)")

    strip.set_xlim(-0.5, blocks + 0.5)
    strip.set_ylim(-1.9, 1.6)
    strip.axis("off")
    colors = _block_colors()
    for b in range(blocks):
        k = b % BLOCKS_PER_WINDOW
        strip.add_patch(
            Rectangle((b + 0.05, 0.0), 0.9, 0.8, facecolor=colors[k], edgecolor="#616161", lw=0.5)
        )
        strip.text(b + 0.5, 0.4, str(b), ha="center", va="center", fontsize=5.5)
    fig.boundaries, fig.windows = [], []
    for w in range(blocks // BLOCKS_PER_WINDOW):
        first, last = w * BLOCKS_PER_WINDOW, (w + 1) * BLOCKS_PER_WINDOW - 1
        p = (last + 1) * STATE_BLOCK_SIZE - 1
        rope = (p // RATIO) * RATIO
        fig.boundaries.append(p)
        fig.windows.append((p, first, last, rope))
        strip.add_patch(Rectangle((last + 0.75, 0.0), 0.2, 0.8, facecolor="#c62828"))
        strip.text(last + 0.85, 1.0, f"p = {p}", ha="center", fontsize=6.5, color="#c62828")
        y = -0.55
        strip.plot([first + 0.05, last + 0.95], [y, y], color="#424242", lw=1.2)
        strip.plot([first + 0.05] * 2, [y - 0.12, y + 0.12], color="#424242", lw=1.2)
        strip.plot([last + 0.95] * 2, [y - 0.12, y + 0.12], color="#424242", lw=1.2)
        strip.text(
            (first + last + 1) / 2,
            y - 0.45,
            f"window of p = {p}: positions {p - RATIO + 1}..{p} = blocks {first}..{last}, rope row {rope}",
            ha="center",
            fontsize=6.5,
        )
    strip.text(
        -0.4,
        1.35,
        "state block columns (8 positions each); the last row of every 16th block is a boundary",
        fontsize=7,
    )
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- the window


@dataclass(frozen=True)
class WindowBlock:
    """Block ``k`` (0..15) of the window of the boundary token ``p`` of request ``r``.

    ``column``: the block-table column ``(p - 127) // 8 + k``; ``block``: the physical state block
    ``block_table[r, column]``; ``positions``: the 8 positions it holds, rows 0..7 of the block;
    ``offset``: the element offset of its row 0 in the state storage (``block * stride(0)``);
    ``kv_cols`` / ``score_cols``: the halves of each state row that K7 reads (kv ``k_j``, score
    ``s_j``); ``weight``: the share of the window's softmax weight its 8 rows carry, averaged over
    the 512 columns (the 16 shares sum to 1).
    """

    k: int
    column: int
    block: int
    positions: tuple[int, ...]
    offset: int
    kv_cols: tuple[int, int]
    score_cols: tuple[int, int]
    weight: float

    @property
    def rows(self) -> tuple[int, ...]:
        return tuple(q % STATE_BLOCK_SIZE for q in self.positions)


def _window(case: Any, position: int, request: int) -> tuple[list[WindowBlock], torch.Tensor]:
    """The 16 blocks of the window and the softmax weights ``[128, 512]`` (float64) of its rows."""
    a = case.args
    if (position + 1) % RATIO or position < RATIO - 1:
        raise ValueError(f"position: expected a boundary token (p % {RATIO} == {RATIO - 1}), got {position}")
    state, bt = a["state_cache"], a["block_table"]
    if not 0 <= request < bt.shape[0]:
        raise ValueError(f"request: expected a row of the block table (< {bt.shape[0]}), got {request}")
    sbs = state.shape[1]
    if sbs != STATE_BLOCK_SIZE:
        raise ValueError(f"state_cache: expected state block size {STATE_BLOCK_SIZE}, got {sbs}")
    first = position - RATIO + 1
    c0 = first // sbs
    if c0 + BLOCKS_PER_WINDOW > bt.shape[1]:
        raise ValueError(
            f"position {position}: the block table of request {request} has no column "
            f"{c0 + BLOCKS_PER_WINDOW - 1}"
        )
    blocks = [int(bt[request, c0 + k]) for k in range(BLOCKS_PER_WINDOW)]
    if any(not 0 <= b < state.shape[0] for b in blocks):
        raise ValueError(
            f"position {position}: window blocks {blocks} of request {request} are not all "
            f"state blocks (< {state.shape[0]})"
        )
    rows = torch.stack([state[b, r] for b in blocks for r in range(sbs)]).to(torch.float64)  # [128, 1024]
    weights = torch.softmax(rows[:, _D:], dim=0)  # the score half, per column over the 128 rows
    out = []
    for k, b in enumerate(blocks):
        share = float(weights[k * sbs : (k + 1) * sbs].sum(dim=0).mean())
        pos = tuple(range(first + k * sbs, first + (k + 1) * sbs))
        out.append(WindowBlock(k, c0 + k, b, pos, b * state.stride(0), (0, _D), (_D, 2 * _D), share))
    return out, weights


def c128_window_layout(case: Any, position: int, request: int | None = None) -> list[WindowBlock]:
    """The 16 state blocks of the window of the boundary token at ``position`` of ``request`` in
    ``case`` (a K7 :class:`~dsv4kit.kernels.c128_compress.cases.C128Case`), from its real block
    table. ``request`` defaults to the request of the first token of the case at ``position``."""
    req = request_of(case, position) if request is None else request
    return _window(case, position, req)[0]


def c128_window_markdown(blocks: Sequence[WindowBlock]) -> str:
    """A Markdown table of :func:`c128_window_layout` blocks."""
    lines = [
        "| k | block-table column | state block | positions (rows 0..7) | kv cols | score cols "
        "| weight share |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in blocks:
        lines.append(
            f"| {b.k} | {b.column} | {b.block} | {b.positions[0]}..{b.positions[-1]} "
            f"| [{b.kv_cols[0]}, {b.kv_cols[1]}) | [{b.score_cols[0]}, {b.score_cols[1]}) | {b.weight:.4f} |"
        )
    return "\n".join(lines)


def plot_c128_window(case: Any, position: int, request: int | None = None, columns: int = 32) -> Any:
    """The window of one boundary token, drawn from ``case``'s real state rows.

    Top: the 16 block-table entries ``block_table[r, (p - 127) // 8 + k]`` (logical order, k = 0..15)
    and the physical state pool below, each window block coloured by k where the table points (the
    pool is shuffled: the blocks are not contiguous); the other blocks of the pool grey. Middle: one
    state row, its kv half ``[0, 512)`` (the pooled values) and its score half ``[512, 1024)`` (score
    + ape, the softmax logits), the columns the heatmap shows hatched. Bottom: the softmax weights
    ``w_j[d]`` of the 128 rows (j = 8k + row) over the first ``columns`` dims, float64 from the state
    rows, with the 16 blocks separated. Returns the Figure; ``fig.window`` holds the
    :class:`WindowBlock` list, ``fig.weights`` the ``[128, 512]`` weights, ``fig.request`` the request.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    req = request_of(case, position) if request is None else request
    blocks, weights = _window(case, position, req)
    nsb = case.args["state_cache"].shape[0]
    colors = _block_colors()
    fig = plt.figure(figsize=(13.0, 10.0))
    grid = fig.add_gridspec(3, 1, height_ratios=[1.6, 0.55, 4.2], hspace=0.35)
    ax_map, ax_row, ax_w = (fig.add_subplot(grid[i]) for i in range(3))
    fig.window, fig.weights, fig.request = blocks, weights, req

    # The block table row and the physical pool.
    ax_map.set_xlim(0, 1)
    ax_map.set_ylim(-0.3, 1.85)
    ax_map.axis("off")
    used = {b.block: b.k for b in blocks}
    for b in blocks:
        x = b.k / BLOCKS_PER_WINDOW
        ax_map.add_patch(
            Rectangle(
                (x + 0.002, 1.0),
                1 / BLOCKS_PER_WINDOW - 0.004,
                0.45,
                facecolor=colors[b.k],
                edgecolor="#424242",
                lw=0.6,
            )
        )
        ax_map.text(
            x + 0.5 / BLOCKS_PER_WINDOW,
            1.225,
            f"k={b.k}\ncol {b.column}\n-> {b.block}",
            ha="center",
            va="center",
            fontsize=6,
        )
        px = (b.block + 0.5) / nsb
        ax_map.annotate(
            "",
            xy=(px, 0.36),
            xytext=(x + 0.5 / BLOCKS_PER_WINDOW, 0.98),
            arrowprops=dict(arrowstyle="-|>", color=colors[b.k], lw=0.9),
        )
    for s in range(nsb):
        k = used.get(s)
        ax_map.add_patch(
            Rectangle(
                (s / nsb + 0.001, 0.0),
                1 / nsb - 0.002,
                0.34,
                facecolor=_IDLE if k is None else colors[k],
                edgecolor="#616161",
                lw=0.4,
            )
        )
        if nsb <= 64:
            ax_map.text((s + 0.5) / nsb, 0.17, str(s), ha="center", va="center", fontsize=5.5)
    ax_map.text(0.0, 1.55, f"block_table[{req}, ({position} - 127) // 8 + k] (logical, in order)", fontsize=8)
    ax_map.text(
        0.0, -0.22, f"state pool: {nsb} physical blocks of 8 rows (grey: not in this window)", fontsize=8
    )
    ax_map.set_title(
        f"request {req}, boundary p = {position}: window positions {position - RATIO + 1}..{position}, "
        f"16 state blocks, rope row {(position // RATIO) * RATIO}",
        fontsize=10,
    )

    # One state row: which half is kv, which is score.
    cols = min(columns, _D)
    ax_row.set_xlim(0, 2 * _D)
    ax_row.set_ylim(0, 1)
    ax_row.add_patch(Rectangle((0, 0.15), _D, 0.7, facecolor=_KV_COLOR, alpha=0.85))
    ax_row.add_patch(Rectangle((_D, 0.15), _D, 0.7, facecolor=_SCORE_COLOR, alpha=0.85))
    for x0 in (0, _D):
        ax_row.add_patch(Rectangle((x0, 0.15), cols, 0.7, fill=False, hatch="////", edgecolor="white", lw=0))
    ax_row.text(
        _D / 2,
        0.5,
        "kv: k_j[d], cols [0, 512) -> pooled",
        ha="center",
        va="center",
        color="white",
        fontsize=8,
    )
    ax_row.text(
        1.5 * _D,
        0.5,
        "score + ape: s_j[d], cols [512, 1024) -> softmax over j",
        ha="center",
        va="center",
        color="white",
        fontsize=8,
    )
    ax_row.set_yticks([])
    ax_row.set_xticks([0, cols, _D, _D + cols, 2 * _D])
    ax_row.set_title("one state row (fp32, 1024 wide); hatched: the dims drawn below", fontsize=8)

    # The weights.
    img = weights[:, :cols].numpy()
    im = ax_w.imshow(
        img,
        aspect="auto",
        cmap="viridis",
        norm=LogNorm(vmin=1e-4, vmax=1.0),
        interpolation="nearest",
        extent=(-0.5, cols - 0.5, RATIO - 0.5, -0.5),
    )
    for k in range(1, BLOCKS_PER_WINDOW):
        ax_w.axhline(k * STATE_BLOCK_SIZE - 0.5, color="white", lw=0.6)
    for b in blocks:
        ax_w.add_patch(
            Rectangle(
                (-2.4, b.k * STATE_BLOCK_SIZE - 0.5),
                1.6,
                STATE_BLOCK_SIZE,
                facecolor=colors[b.k],
                clip_on=False,
            )
        )
    ax_w.set_xlim(-2.6, cols - 0.5)
    ax_w.set_yticks(
        [b.k * STATE_BLOCK_SIZE + 3.5 for b in blocks],
        [f"k={b.k} blk {b.block} q {b.positions[0]}..{b.positions[-1]}" for b in blocks],
        fontsize=6.5,
    )
    ax_w.set_xlabel(f"dim d (first {cols} of {_D})")
    ax_w.set_ylabel("window row j = 8k + row (rows 0..7 of each block)")
    ax_w.set_title(
        "softmax weights w_j[d] = exp(s_j[d] - max s[d]) / sum: each column sums to 1 over the 128 rows",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax_w, fraction=0.03, pad=0.01, label="w_j[d] (log; below 1e-4 at the floor)")
    return fig


# --------------------------------------------------------------------------- keys


#: The spec's notation of each op's key (§2.11 table): which fields, in which order.
_SPEC_FIELDS = {
    "c128_compress": ("head_size", "state_width", "state_block_size"),
    "c128_norm_rope_store_ds_mla": ("kv_cache_block_size", "kv_block_stride", "norm_weight_dtype"),
    "c128_norm_rope_store_plain": ("store_full_fp8", "norm_weight_dtype"),
}
_KEY_TYPES = {
    C128CompressBase.CompileKey: "c128_compress",
    C128StoreDsMlaBase.CompileKey: "c128_norm_rope_store_ds_mla",
    C128StorePlainBase.CompileKey: "c128_norm_rope_store_plain",
}


def spec_key(key: Any) -> tuple[Any, ...]:
    """A C128 CompileKey in the spec's notation: K7 ``(512, 512, 8)``, K8a ``(kv_bs, stride, dtype)``,
    K8b ``(store_full_fp8, dtype)``."""
    op = _KEY_TYPES.get(type(key))
    if op is None:
        raise ValueError(f"not a C128 CompileKey: {key!r}")
    return tuple(getattr(key, f) for f in _SPEC_FIELDS[op])


def key_space(configs: Iterable[C128CompressConfig], platform: Any) -> list[dict[str, Any]]:
    """Per config: its warmup inputs and the keys of K7, K8a, K8b (``get_warmup_keys`` of the
    kernels ``platform`` selects). Each row: ``B``, ``cache_dtype``, ``norm_weight_dtype``,
    ``geometry`` (K8a's ``page_geometry``, or None where K8a does not apply), ``keys`` op -> list."""
    rows = []
    kernels = {op: SPECS[op].kernel(platform=platform) for op in OPS}
    for cfg in configs:
        keys = {op: kernels[op].get_warmup_keys(cfg) for op in OPS}
        rows.append(
            dict(
                B=cfg.cache_block_size,
                cache_dtype=cfg.cache_dtype,
                norm_weight_dtype=cfg.norm_weight_dtype,
                geometry=cfg.page_geometry if C128StoreDsMlaBase.applies(cfg) else None,
                keys=keys,
            )
        )
    return rows


def _keys_cell(keys: Sequence[Any]) -> str:
    return ", ".join("(" + ", ".join(str(v) for v in spec_key(k)) + ")" for k in keys) or "none"


def key_space_markdown(rows: Iterable[Mapping[str, Any]]) -> str:
    """A Markdown table of :func:`key_space` rows, keys in the spec's notation."""
    lines = [
        "| B | cache dtype | norm weights | K8a page geometry | K7 | K8a (kv_bs, stride, w) "
        "| K8b (full fp8, w) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        geo = "-" if r["geometry"] is None else f"kv_bs {r['geometry'][0]}, {r['geometry'][1]} B/page"
        k = r["keys"]
        lines.append(
            f"| {r['B']} | {r['cache_dtype']} | {r['norm_weight_dtype']} | {geo} | {_keys_cell(k[OPS[0]])} "
            f"| {_keys_cell(k[OPS[1]])} | {_keys_cell(k[OPS[2]])} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- numerics


def c128_label(case: Any) -> str:
    """``"K7 fp32"``, ``"K8a fp8_ds_mla"``, ``"K8b bf16"``, ``"K8b e4m3"`` for a case; a
    :class:`~dsv4kit.kernels.c128_compress.cases.ChainCase` gets ``"K7 -> "`` before its store's label."""
    if hasattr(case, "k7") and hasattr(case, "store"):
        return "K7 -> " + c128_label(case.store)
    if case.op == "c128_compress":
        return "K7 fp32"
    if case.op == "c128_norm_rope_store_ds_mla":
        return "K8a fp8_ds_mla"
    return "K8b e4m3" if case.args.get("fp8_scale") is not None else "K8b bf16"


def k7_fractions(case: Any, got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Per element of K7's written rows, ``|kernel - reference| / (1e-5 max_j |k_j[d]|)``: the
    distance in units of the FP32 rule's bound (0: bit-identical; > 1: a violation), float64."""
    from dsv4kit.formats.state_cache import window_rows

    a = case.args
    got, want = got.cpu(), want.cpu()
    idx = check_c128_values(case.op, case.ops)
    if idx.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    k, _, _ = window_rows(
        a["state_cache"],
        a["block_table"],
        a["token_to_req"][idx].long(),
        a["positions"][idx],
        RATIO,
        False,
        _D,
    )
    bound = FP32_RULE * k.abs().amax(dim=1).to(torch.float64)
    diff = (got[idx].to(torch.float64) - want[idx].to(torch.float64)).abs()
    return torch.where(diff == 0, torch.zeros_like(diff), diff / bound).flatten()


#: Bins of :func:`fp32_histogram_counts`: (label, low exclusive, high inclusive); the first is exactly 0.
FP32_BINS: tuple[tuple[str, float, float], ...] = (
    ("0 (bit-identical)", -1.0, 0.0),
    ("(0, 1e-3]", 0.0, 1e-3),
    ("(1e-3, 1e-2]", 1e-3, 1e-2),
    ("(1e-2, 0.1]", 1e-2, 0.1),
    ("(0.1, 1]", 0.1, 1.0),
    ("> 1 (violation)", 1.0, math.inf),
)


def fp32_histogram_counts(fractions: torch.Tensor | Iterable[torch.Tensor]) -> dict[str, int]:
    """Counts of :func:`k7_fractions` values per :data:`FP32_BINS` bin, plus ``"NaN"``."""
    return binned_counts(fractions, FP32_BINS)


def plot_k7_fractions(fractions_by_label: Mapping[str, torch.Tensor | Iterable[torch.Tensor]]) -> Any:
    """Grouped bars (log count axis): per label (e.g. a score regime), how many elements of K7's rows
    lie 0, (0, 1e-3], ... or > 1 FP32-rule bounds from the reference. Returns the Figure;
    ``fig.counts`` holds :func:`fp32_histogram_counts` per label."""
    fig, ax, zeros, total = plot_binned_histogram(
        fractions_by_label, FP32_BINS,
        "|kernel - reference| in units of the FP32 rule's bound 1e-5 max_j |k_j[d]|"
    )
    labels = [b[0] for b in FP32_BINS]
    worst = max(
        (lab for c in fig.counts.values() for lab in labels if c[lab]), key=labels.index, default=labels[0]
    )
    ax.set_title(
        f"K7: {zeros}/{total} elements bit-identical ({(zeros / total if total else 1):.2%}); "
        f"farthest bin {worst}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


#: The columns of :func:`k7_table_markdown`.
K7_COLUMNS = ("K7 cases", "cases", "conform", "rows", "elements", "bit-identical", "worst (x bound)",
              "violations", "other rows changed")


def k7_table_markdown(verdicts: Iterable[tuple[str, Any]]) -> str:
    """One row per label of ``(label, K7Verdict)`` pairs: cases, cases that conform, boundary rows
    written, elements, bit-identical elements, the worst distance in FP32-rule bounds, violations,
    and cases where another row of ``out`` changed."""
    return tally_table_markdown(verdicts, K7_COLUMNS, _k7_tally, _k7_row, fields=_K7_FIELDS,
                                largest=("worst",))


_K7_FIELDS = ("cases", "ok", "rows", "n", "same", "worst", "bad", "other")


def _k7_tally(v: Any) -> dict[str, float]:
    return dict(cases=1, ok=int(bool(v.ok)), rows=v.rows, n=v.elements, same=v.bit_identical,
                worst=v.report.worst, bad=v.report.violations, other=int(not v.other_rows_equal))


def _k7_row(label: str, r: Mapping[str, Any]) -> str:
    frac = r["same"] / r["n"] if r["n"] else 1.0
    return (
        f"| {label} | {r['cases']} | {r['ok']} | {r['rows']} | {r['n']} | {r['same']} ({frac:.2%}) "
        f"| {r['worst']:.3g} | {r['bad']} | {r['other']} |"
    )


def store_step_differences(case: Any, got: torch.Tensor, want: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per written element of a K8a / K8b case, ``|kernel - reference|`` of the decoded values in
    units of the compressor rule's step (§2.12): ``nope`` / ``rope`` (K8a), ``rows`` (K8b); float64.
    Same units as :func:`~dsv4kit.viz.compressor.step_differences` (0: bit-identical, 1: one step)."""
    a = case.args
    idx = check_c128_values(case.op, case.OPERANDS[case.op](**{**a, case.output_arg: got}))
    kind = "ds" if case.op == "c128_norm_rope_store_ds_mla" else "plain"
    return entry_step_units(kind, got, want, a["kv_slot_mapping"][idx], fp8_scale=a.get("fp8_scale"))


# --------------------------------------------------------------------------- recorded GPU runs


#: The files a recorded C128 GPU run holds (``benchmarks/c128_compress_gpu_check.py --out DIR``).
RECORD_FILES = ("provenance.json", "check.json", "c128_compress.md", "c128_compress.csv", "c128_compress.log")
#: The compile counters of a check (each a dict of ``triton_compiles``, ``cute_compiles``,
#: ``monitor_events``), and the C4-style single one.
COMPILE_FIELDS = ("numerics_compiles", "timing_compiles", "compiles_after_warmup")


@dataclass
class C128Record:
    """What one recorded C128 run holds: ``files`` present (of :data:`RECORD_FILES`), the GPU check
    (``check.json``: summary, verdict, compile counters, timing rows), the CSV timing rows (used when
    the check has none), the Markdown report, ``cpu_smoke`` (a ``--cpu-smoke`` run: the script's
    paths on a CPU, not GPU results) and ``problems``: files that exist but could not be read."""

    files: list[str]
    check: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    report: str | None = None
    cpu_smoke: bool = False
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        """The check's verdict (``pass``), None without a check or a verdict."""
        v = (self.check or {}).get("pass")
        return v if isinstance(v, bool) else None

    @property
    def compiles(self) -> dict[str, Any]:
        """The check's compile counters after warmup, by :data:`COMPILE_FIELDS` name (those present)."""
        c = self.check or {}
        return {f: c[f] for f in COMPILE_FIELDS if isinstance(c.get(f), Mapping)}

    @property
    def compiled_after_warmup(self) -> bool:
        """Whether any counter records a compile (or a monitor event) after warmup."""
        return any(any(v for v in counts.values()) for counts in self.compiles.values())

    @property
    def timing_rows(self) -> list[Mapping[str, Any]]:
        """Bandwidth rows (``kernel``, ``size``, ``backend``, ``variant``, ``fraction_of_copy``, ...):
        the check's, else the CSV's; decode-latency rows and rows without bytes left out."""
        rows = (self.check or {}).get("timing") or self.rows
        need = {"kernel", "size", "backend", "variant", "fraction_of_copy"}
        return [
            r
            for r in rows
            if isinstance(r, Mapping)
            and need <= set(r)
            and "decode" not in str(r["variant"])
            and _num(r.get("bytes")) not in (None, 0.0)
        ]

    @property
    def largest_t(self) -> int | None:
        sizes = [int(v) for v in (_num(r["size"]) for r in self.timing_rows) if v is not None]
        return max(sizes, default=None)


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def read_c128_record(rec: Any) -> C128Record:
    """Read the files of a :class:`~dsv4kit.results.Recorded` C128 run that exist; a file that does
    not parse is listed in ``problems`` (the record is shown, never trusted blindly)."""
    import json

    out = C128Record(
        files=[f for f in RECORD_FILES if rec.file(f).is_file()],
        cpu_smoke=bool(rec.provenance.get("cpu_smoke")),
    )
    if "provenance.json" in out.files:  # all of it (a file record keeps only the known fields)
        try:
            prov = json.loads(rec.file("provenance.json").read_text())
            out.cpu_smoke = out.cpu_smoke or bool(isinstance(prov, Mapping) and prov.get("cpu_smoke"))
        except ValueError as exc:
            out.problems.append(f"provenance.json: {exc}")
    if "check.json" in out.files:
        try:
            data = json.loads(rec.file("check.json").read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            out.check = data
            prov = data.get("provenance")
            out.cpu_smoke = out.cpu_smoke or bool(isinstance(prov, Mapping) and prov.get("cpu_smoke"))
        except ValueError as exc:
            out.problems.append(f"check.json: {exc}")
    if "c128_compress.csv" in out.files:
        try:
            with rec.file("c128_compress.csv").open(newline="") as f:
                out.rows = list(csv.DictReader(f))
        except (OSError, csv.Error, UnicodeDecodeError) as exc:
            out.problems.append(f"c128_compress.csv: {exc}")
    if "c128_compress.md" in out.files:
        out.report = rec.file("c128_compress.md").read_text(errors="replace")
    return out


def timing_markdown(rows: Iterable[Mapping[str, Any]], size: int) -> str:
    """The timing rows at T = ``size``: kernel, backend, variant, microseconds, GB/s, percent of the
    copy bandwidth of that run (``-`` where a value is missing; ``error`` where the row has one)."""
    lines = ["| kernel | backend | variant | us | GB/s | % of copy |", "|---|---|---|---|---|---|"]
    for r in rows:
        if _num(r.get("size")) != size:
            continue
        if r.get("error"):
            lines.append(f"| {r['kernel']} | {r['backend']} | {r['variant']} | error | - | - |")
            continue
        us, gbs, frac = (_num(r.get(k)) for k in ("median_us", "GBps", "fraction_of_copy"))
        cells = [
            "-" if us is None else f"{us:.1f}",
            "-" if gbs is None else f"{gbs:.0f}",
            "-" if frac is None else f"{100 * frac:.1f}%",
        ]
        lines.append(f"| {r['kernel']} | {r['backend']} | {r['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def record_markdown(r: C128Record) -> str:
    """The tables of a :class:`C128Record`: the verdict and compile counters, the GPU check's summary
    (one row per op, backend, reference and case set), and the bandwidth at the largest T; without a
    check, the Markdown report as written."""
    parts = []
    if r.cpu_smoke:
        parts.append(
            "**A `--cpu-smoke` run** (the script's paths on a CPU, Triton interpreter): not GPU results."
        )
    if r.check is not None:
        verdict = {True: "PASS", False: "FAIL", None: "no verdict recorded"}[r.passed]
        counters = "; ".join(f"{k}: {dict(v)}" for k, v in r.compiles.items()) or "not recorded"
        parts.append(f"**GPU check** (`check.json`): {verdict}. Compiles after warmup: {counters}.")
        failures = r.check.get("failures") or []
        if failures:
            parts.append("**Failures recorded:** " + "; ".join(str(f) for f in failures))
        summary = [s for s in r.check.get("summary") or [] if isinstance(s, Mapping)]
        parts.append(check_summary_markdown(summary) if summary else "*(no summary rows)*")
    t = r.largest_t
    if t is not None:
        parts.append(
            f"**Bandwidth at T = {t}** (percent of the copy bandwidth measured in that run)\n\n"
            + timing_markdown(r.timing_rows, t)
        )
    if r.check is None and r.report:
        parts.append(r.report)
    elif r.report:
        parts.append("(the full report, decode latency included: `c128_compress.md`)")
    if r.problems:
        parts.append("**Unreadable files:** " + "; ".join(r.problems))
    return "\n\n".join(parts) if parts else "*(the record holds no check and no timings)*"
