"""dsv4kit.viz.bench: the benchmark figures and tables draw recorded runs and fake live rows."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dsv4kit.bench_schema import make_row, recorded_runs, recorded_warmup  # noqa: E402
from dsv4kit.results import results_dir  # noqa: E402
from dsv4kit.viz import bench as vb  # noqa: E402

ROOT = results_dir()


def _rows():
    return [make_row("f", "k", b, v, t, 1000 * t, us, 4000.0, config=c)
            for t in (1, 64, 4096) for b in ("triton", "cutedsl") for c, f in (("a", 1.0), ("b", 2.0))
            for v, us in (("kernel (graph replay)", f * (1 + t / 100)), ("op", 40 + t / 50))]


def test_best_by_size_and_largest_point():
    best = vb.best_by_size(_rows())
    assert set(best) == {("k", "triton", "kernel (graph replay)"), ("k", "cutedsl", "kernel (graph replay)")}
    pts = best[("k", "triton", "kernel (graph replay)")]
    assert [s for s, _ in pts] == [1, 64, 4096]
    assert pts[-1][1] == pytest.approx(1000 * 4096 / (1 + 4096 / 100) / 1e3)  # config "a": the faster
    lp = vb.largest_point(_rows())
    assert lp[("k", "triton")].size == 4096 and lp[("k", "triton")].config == "a"


def test_plot_bandwidth_live_rows():
    fig = vb.plot_bandwidth(_rows(), title="LIVE: fake")
    ax = fig.axes[0]
    assert fig._suptitle.get_text() == "LIVE: fake"
    assert any("copy ceiling 4000" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(fig)


@pytest.mark.skipif(ROOT is None, reason="no recorded results")
def test_recorded_figures_and_tables():
    runs = recorded_runs(ROOT)
    fig = vb.plot_recorded_bandwidth(runs)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == sum(1 for r in runs if r.rows)
    assert all(f"RECORDED on NVIDIA {dev}, commit" in t for t in titles for dev in
               (("H100 80GB HBM3",) if "bench_h100/" in t else ("H200",)))
    assert sum("bench_h100/" in t for t in titles) == 8                     # the runs of 2026-12-06
    plt.close(fig)
    fig = vb.plot_roofline(runs)
    assert fig.axes[0].get_xscale() == "log"
    plt.close(fig)
    fig = vb.plot_warmup_keys(recorded_warmup(ROOT), "RECORDED")
    assert len(fig.axes) == 2
    plt.close(fig)
    md = vb.status_markdown(runs)
    assert md.count("\n") == len(runs) + 1 and "`dequant_gather`" in md
    head = vb.headline_markdown(runs)
    assert "indexer_q/fp8" in head and "%" in head


def test_ncu_table_has_a_row_per_kernel():
    from dsv4kit.bench_schema import recorded_ncu

    _, copy, ks = recorded_ncu(ROOT)
    md = vb.ncu_markdown(ks, copy)
    rows = [ln for ln in md.splitlines()[2:] if ln.startswith("| ")]
    assert len(rows) == len(ks)
    k = ks[0]
    assert f"| {k.kernel} |" in rows[0] and f"{100 * k.dram_GBps / copy:.1f} %" in rows[0]
    assert k.top_stalls(1)[0][0].replace("_", " ") in rows[0]
