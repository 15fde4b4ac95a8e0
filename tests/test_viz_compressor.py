"""dsv4kit.viz.compressor: each figure / table function runs and shows what it claims (Agg backend).

The cases come from ``dsv4kit.kernels.c4_compress.cases``; "kernel" outputs here are the reference's
own (fast), perturbed where a test needs a known difference.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from viz_helpers import figure_text, figure_texts, patch_xs, reference_run  # noqa: E402

from dsv4kit.formats.state_cache import window_rows  # noqa: E402
from dsv4kit.jit import CompileArtifact, KeyLedger  # noqa: E402
from dsv4kit.kernels.c4_compress import SPECS  # noqa: E402
from dsv4kit.kernels.c4_compress.cases import judge, make_case  # noqa: E402
from dsv4kit.viz import compressor as vc  # noqa: E402


def _reference(case):
    """The reference's cache for ``case`` (a fresh copy)."""
    return reference_run(SPECS, case).cache


# --------------------------------------------------------------------------- data flow


def test_dataflow_names_every_stage_and_the_boundaries() -> None:
    fig = vc.plot_c4_dataflow(16)
    text = figure_text(fig, "kv_score", "K4 save_partial_states", "state cache", "K5", "K6", "K9",
                       "indexer K cache", "compressed KV cache", "(p + 1) % 4 == 0")
    rope_rows = [t for t in figure_texts(fig) if t.startswith("rope row")]
    assert rope_rows == [f"rope row {r}" for r in (0, 4, 8, 12)]
    red = patch_xs(fig.axes[1], "#c62828", 0.45)
    assert red == [3, 7, 11, 15]
    assert "window of p = 3 (first boundary)" in text and "window of p = 7" in text
    with pytest.raises(ValueError, match="positions"):
        vc.plot_c4_dataflow(10)


# --------------------------------------------------------------------------- the window


@pytest.mark.parametrize(("op", "head"), [("c4_compress_ds_mla", 512), ("indexer_compress", 128)])
def test_window_of_the_first_boundary_is_rows_4_to_7_half_b(op: str, head: int) -> None:
    case = make_case(op, lens=(16,), padding=False)
    bt = case.args["block_table"]
    rows = vc.window_layout(case, 3)
    assert [r.j for r in rows] == list(range(8)) and [r.position for r in rows] == list(range(-4, 4))
    assert [r.included for r in rows] == [False] * 4 + [True] * 4
    assert [r.half for r in rows] == ["A"] * 4 + ["B"] * 4
    assert all(r.block is None and r.row is None and r.weight == 0 for r in rows[:4])
    assert [(r.block, r.row) for r in rows[4:]] == [(int(bt[0, 0]), q) for q in range(4)]
    assert {r.kv_cols for r in rows[4:]} == {(head, 2 * head)}
    assert {r.score_cols for r in rows[4:]} == {(3 * head, 4 * head)}
    assert math.isclose(sum(r.weight for r in rows), 1.0, rel_tol=1e-9)
    assert [r.role for r in (rows[0], rows[7])] == ["previous block", "current block"]


def test_full_window_reads_half_a_of_the_previous_block_and_half_b_of_the_current() -> None:
    case = make_case("c4_compress_ds_mla", lens=(13, 9), starts=(0, 6), sbs=4, padding=False)
    a = case.args
    req = vc.request_of(case, 11)
    rows = vc.window_layout(case, 11, request=req)
    bt = a["block_table"][req]
    assert [r.position for r in rows] == list(range(4, 12)) and all(r.included for r in rows)
    assert [(r.block, r.row, r.half) for r in rows] == [
        (int(bt[q // 4]), q % 4, "A" if q < 8 else "B") for q in range(4, 12)
    ]
    assert {r.kv_cols for r in rows[:4]} == {(0, 512)} and {r.kv_cols for r in rows[4:]} == {(512, 1024)}
    # The rows are the state rows the reference pools (window_rows of the formats module).
    k, s, inc = window_rows(
        a["state_cache"], a["block_table"], torch.tensor([req]), torch.tensor([11]), 4, True, 512
    )
    assert bool(inc.all())
    for r in rows:
        st = a["state_cache"][r.block, r.row]
        assert torch.equal(k[0, r.j], st[r.kv_cols[0] : r.kv_cols[1]])
        assert torch.equal(s[0, r.j], st[r.score_cols[0] : r.score_cols[1]])
    assert math.isclose(sum(r.weight for r in rows), 1.0, rel_tol=1e-9)


@pytest.mark.parametrize("position, req, match", [
    (4, None, "boundary"), (99, None, "no token"), (99, 0, "no state block"), (3, 5, "request"),
])
def test_window_rejects_non_boundary_positions_and_missing_rows(position, req, match) -> None:
    case = make_case("indexer_compress", lens=(9,), sbs=16, padding=False)
    with pytest.raises(ValueError, match=match):
        vc.window_layout(case, position, request=req)


def test_window_markdown_and_figure() -> None:
    case = make_case("c4_compress_ds_mla", lens=(16,), padding=False, sbs=16)
    table = vc.window_markdown(vc.window_layout(case, 3))
    lines = table.splitlines()
    assert len(lines) == 2 + 8 and table.count("excluded (q < 0)") == 4 and table.count("current block") == 4
    fig = vc.plot_window(case, (3, 7), columns=16)
    assert [len(w) for w in fig.windows] == [8, 8]
    assert [sum(r.included for r in w) for w in fig.windows] == [4, 8]
    panels = [ax for ax in fig.axes if ax.get_title().startswith("request")]
    assert len(panels) == 2 and "first boundary: 4 rows" in panels[0].get_title()
    assert "rope row 4" in panels[1].get_title()
    labels = [t.get_text() for t in panels[0].get_yticklabels()]
    assert labels[0] == "j=0 q=-4 (none)" and labels[4].startswith("j=4 q=0 blk ")
    assert panels[0].images[0].get_array().shape == (8, 16)
    assert "excluded: q < 0" in figure_texts(fig)


# --------------------------------------------------------------------------- step differences


FORMATS = [
    ("c4_compress_ds_mla", {}, {"nope": 448, "rope": 64}),
    ("c4_compress_plain", {}, {"rows": 512}),
    ("c4_compress_plain", {"fp8_scale": 0.37}, {"rows": 512}),
    ("indexer_compress", {"use_fp4": False}, {"fp8": 128}),
    ("indexer_compress", {"use_fp4": True}, {"mxfp4": 128}),
]


@pytest.mark.parametrize(("op", "fmt", "sizes"), FORMATS, ids=lambda v: str(v))
def test_step_differences_of_identical_caches_are_zero(op: str, fmt: dict, sizes: dict) -> None:
    case = make_case(op, lens=(12, 5), **fmt)
    want = _reference(case)
    units = vc.step_differences(case, _reference(case), want)
    entries = judge(case, want, want).written
    assert entries > 0
    assert {k: v.numel() for k, v in units.items()} == {k: entries * n for k, n in sizes.items()}
    assert all(bool((u == 0).all()) for u in units.values())


def test_one_code_up_is_one_step() -> None:
    case = make_case("c4_compress_ds_mla", lens=(8,), padding=False)
    want = _reference(case)
    got = _reference(case)
    slot = int(case.args["kv_slot_mapping"][case.args["kv_slot_mapping"] >= 0][0])
    page, entry = divmod(slot, got.shape[1])
    flat = got.as_strided((got.untyped_storage().nbytes() - got.storage_offset(),), (1,))
    codes = flat[page * got.stride(0) + 576 * entry :][:448]
    i = next(i for i, c in enumerate(codes.tolist()) if (c & 0x78) and (c & 0x7) < 7 and (c & 0x7F) < 0x7E)
    codes[i] += 1  # the next e4m3 value of the same binade: one step away
    units = vc.step_differences(case, got, want)
    assert int((units["nope"] != 0).sum()) == 1 and float(units["nope"].max()) == 1.0
    assert bool((units["rope"] == 0).all())


def test_histogram_counts_and_figure() -> None:
    u = torch.tensor([0.0, 0.0, 0.0, 0.25, 1.0, 1.5, 3.0, float("nan")], dtype=torch.float64)
    counts = vc.step_histogram_counts(u)
    assert counts == {"0 (bit-identical)": 3, "(0, 1/2]": 1, "(1/2, 1]": 1, "(1, 2]": 1, "> 2": 1, "NaN": 1}
    assert vc.step_histogram_counts([u[:3], u[3:5]])["0 (bit-identical)"] == 3
    assert sum(vc.step_histogram_counts([]).values()) == 0
    fig = vc.plot_step_histogram({"K5 nope": [torch.zeros(100, dtype=torch.float64)], "K9 FP8": u[:7]})
    assert fig.counts["K5 nope"]["0 (bit-identical)"] == 100 and fig.counts["K9 FP8"]["> 2"] == 1
    assert fig.axes[0].get_title().startswith("103/107 elements bit-identical")
    assert fig.axes[0].get_yscale() == "log"


# --------------------------------------------------------------------------- numerics table


def test_numerics_table_groups_per_format() -> None:
    verdicts = []
    for op, fmt, _ in FORMATS:
        case = make_case(op, lens=(9,), **fmt)
        want = _reference(case)
        verdicts.append((vc.format_label(case), judge(case, _reference(case), want)))
    assert [label for label, _ in verdicts] == ["K5 fp8_ds_mla", "K6 bf16", "K6 e4m3", "K9 FP8", "K9 MXFP4"]
    table = vc.numerics_table_markdown(verdicts + verdicts[:1])
    lines = table.splitlines()
    assert len(lines) == 2 + 5 + 1
    k5 = next(ln for ln in lines if ln.startswith("| K5 fp8_ds_mla |"))
    n = 2 * verdicts[0][1].elements
    assert k5.startswith(
        f"| K5 fp8_ds_mla | 2 | 2 | {2 * verdicts[0][1].written} | {n} | {n} (100.000%) | 2 |"
    )
    assert lines[-1].startswith("| **all** | 6 | 6 |") and lines[-1].endswith("| 0 | 0 | 0 |")


# --------------------------------------------------------------------------- the scale floor


def test_scale_bytes_d1_and_deployed() -> None:
    a = torch.tensor([0.01, 1e-6, 1e-4, 0.03, 1.0, 448.0 * 2.0**-14, 0.0])
    assert vc.d1_scale_byte(a).tolist() == [112, 105, 105, 114, 119, 113, 105]
    assert vc.deployed_scale_byte(a).tolist() == [114, 114, 114, 114, 119, 114, 114]
    assert vc.DEPLOYED_MIN_BYTE - vc.D1_MIN_BYTE == 9
    grid = torch.logspace(-7, 1, 400)
    d1, dep = vc.d1_scale_byte(grid), vc.deployed_scale_byte(grid)
    assert (
        bool((dep >= d1).all()) and int(d1.min()) == vc.D1_MIN_BYTE and int(dep.min()) == vc.DEPLOYED_MIN_BYTE
    )
    differ = grid[dep != d1]
    assert float(differ.max()) <= 448 * 2.0**-14 * (1 + 1e-6)  # bytes differ only for amax <= ~0.0273


def test_scale_floor_figure() -> None:
    fig = vc.plot_scale_floor(marks=(0.01, 1e-5))
    assert fig.marks == [(0.01, 112, 114), (1e-5, 105, 114)]
    ax0, ax1 = fig.axes
    assert len(ax0.get_lines()) >= 2 and ax1.get_yscale() == "log"
    texts = figure_texts(fig)
    assert "4× coarser at amax 0.01" in texts and "512× coarser at amax 1e-05" in texts
    assert "512× coarser (amax ≤ ~1.07e-4)" in texts


# --------------------------------------------------------------------------- recorded bandwidth


ROWS = [
    {"format": "c4_compress_ds_mla", "T": 4096, "impl": "triton", "pct_of_copy": 50.0},
    {"format": "c4_compress_ds_mla", "T": 65536, "impl": "triton", "pct_of_copy": 85.0},
    {"format": "c4_compress_ds_mla", "T": 65536, "impl": "cutedsl", "pct_of_copy": 79.5},
    {"format": "c4_compress_ds_mla", "T": 65536, "impl": "triton (op)", "pct_of_copy": 60.0},
    {
        "format": "indexer_compress use_fp4=True",
        "T": 65536,
        "impl": "triton",
        "pct_of_copy": 0.0,
        "error": "RuntimeError: x",
    },
]


def test_bandwidth_table_and_targets() -> None:
    table = vc.bandwidth_markdown(ROWS, 65536)
    lines = table.splitlines()
    assert lines[0] == "| T = 65536 | triton | cutedsl | triton (op) |"
    assert lines[2] == "| c4_compress_ds_mla | 85.0% | 79.5% | 60.0% |"
    assert lines[3] == "| indexer_compress use_fp4=True | error | - | - |"
    low = vc.below_target(ROWS, 65536)
    assert [(f, i) for f, i, _ in low] == [
        ("c4_compress_ds_mla", "cutedsl"),
        ("indexer_compress use_fp4=True", "triton"),
    ]
    assert math.isnan(low[1][2]) and vc.below_target(ROWS, 4096, target=40) == []


# --------------------------------------------------------------------------- compiles, coverage, checks


PTX = """
.target sm_90a
    ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];
    ld.global.nc.v4.b32 {%r1, %r2, %r3, %r4}, [%rd2];
    sqrt.rn.f32 %f5, %f6;
    div.rn.f32 %f7, %f8, %f9;
    div.rn.f32 %f7, %f8, %f9;
    ex2.approx.f32 %f10, %f11;
    st.global.v4.b32 [%rd3], {%r1, %r2, %r3, %r4};
    mul.rn.f32 %f12, %f13, %f14;
"""


class _Kernel:
    """A stand-in with what artifact_table_markdown reads: name, backend, artifact(key)."""

    name, backend = "C4CompressDsMlaTriton", "triton"

    def __init__(self, arts):
        self.arts = arts

    def artifact(self, key):
        return self.arts.get(key)


def test_ptx_facts_and_the_artifact_table() -> None:
    facts = vc.ptx_facts(PTX)
    assert facts == {
        "fma": 0,
        "sqrt.rn.f32": 1,
        "div.rn.f32": 2,
        "ex2": 1,
        "ld.global.v4": 2,
        "st.global.v4": 1,
    }
    assert vc.ptx_facts("fma.rn.f32 %f1, %f2, %f3, %f4;")["fma"] == 1
    key = SPECS["c4_compress_ds_mla"].contract.CompileKey(norm_weight_dtype="bfloat16")
    other = SPECS["c4_compress_ds_mla"].contract.CompileKey(norm_weight_dtype="float32")
    art = CompileArtifact("triton", "sm_90a", 0.25, {"registers": 64, "spills": 0}, {"ptx": PTX})
    table = vc.artifact_table_markdown([(_Kernel({key: art}), key), (_Kernel({}), other)])
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[2] == (
        "| C4CompressDsMlaTriton | triton | sm_90a | (norm_weight_dtype=bfloat16) | 0.25 | 64 | 0 "
        "| 0 | 1 / 2 | 2 / 1 |"
    )
    assert "(norm_weight_dtype=float32) | not compiled |" in lines[3] and lines[3].count("|") == lines[
        2
    ].count("|")


def test_merged_ledger_unions_warmed_keys_and_adds_requests() -> None:
    a, b = KeyLedger(), KeyLedger()
    a.add_warmed("C4CompressPlainTriton", ["k1"])
    a.add_request("C4CompressPlainTriton", "k1")
    a.add_warmed("DequantGatherTriton", ["g"])
    b.add_warmed("C4CompressPlainTriton", ["k2", "k1"])
    b.add_request("C4CompressPlainTriton", "k1")
    b.add_request("C4CompressPlainTriton", "k3")
    m = vc.merged_ledger([a, b], keep=lambda n: "Compress" in n)
    assert list(m.warmed) == ["C4CompressPlainTriton"] and list(m.warmed["C4CompressPlainTriton"]) == [
        "k1",
        "k2",
    ]
    assert dict(m.requested["C4CompressPlainTriton"]) == {"k1": 2, "k3": 1}
    assert m.dead() == {"C4CompressPlainTriton": ["k2"]} and m.missed() == {"C4CompressPlainTriton": ["k3"]}
    assert set(vc.merged_ledger([a, b]).warmed) == {"C4CompressPlainTriton", "DequantGatherTriton"}


def test_check_summary_table() -> None:
    rows = [
        {
            "op": "c4_compress_ds_mla",
            "backend": "triton",
            "reference": "cpu",
            "set": "random",
            "cases": 66,
            "conforming": 66,
            "violations": 0,
            "scale_mismatches": 0,
            "used_step": 3,
            "errors": 0,
            "bit_identical": 999,
            "elements": 1000,
        },
        {"op": "indexer_compress", "backend": "cutedsl"},
    ]
    lines = vc.check_summary_markdown(rows).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| op | backend | vs reference |")
    assert (
        lines[2]
        == "| c4_compress_ds_mla | triton | cpu | random | 66 | 66 | 0 | 0 | 3 | 0 | 999/1000 (99.9000%) |"
    )
    assert lines[3] == "| indexer_compress | cutedsl | - | - | - | - | - | - | - | - | - |"


def test_exported_from_the_viz_package_and_loaded_lazily() -> None:
    import subprocess
    import sys

    import dsv4kit.viz as viz

    assert viz.plot_window is vc.plot_window and viz.compressor is vc
    assert set(vc.__all__) <= set(dir(viz))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        viz.nope  # noqa: B018
    code = "import sys, dsv4kit.viz.coverage; print('dsv4kit.viz.compressor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
