"""dsv4kit.viz.c128: each figure / table function runs and shows what it claims (Agg backend).

The cases come from ``dsv4kit.kernels.c128_compress.cases``; "kernel" outputs here are the
reference's own (fast), perturbed where a test needs a known difference.
"""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from viz_helpers import figure_text, figure_texts, patch_xs, reference_run  # noqa: E402

from dsv4kit.formats.ds_mla import ds_page_regions  # noqa: E402
from dsv4kit.formats.state_cache import allocate_state_cache, window_rows  # noqa: E402
from dsv4kit.kernels.c128_compress import SPECS, C128CompressConfig  # noqa: E402
from dsv4kit.kernels.c128_compress.cases import (  # noqa: E402
    judge_k7,
    make_chain_case,
    make_k7_case,
    make_k8_case,
)
from dsv4kit.platform import cpu_platform  # noqa: E402
from dsv4kit.results import Recorded  # noqa: E402
from dsv4kit.testing.compressor_rule import FP32_RULE  # noqa: E402
from dsv4kit.viz import c128 as vc  # noqa: E402

K7, K8A, K8B = vc.OPS


def _reference(case):
    """The reference's output for ``case`` (a fresh copy)."""
    return reference_run(SPECS, case).output


@pytest.fixture(scope="module")
def k7_case():
    # Request 0: positions 0..129 (boundary 127); request 1: 1001..1140 (boundary 1023, window from 896).
    return make_k7_case(lens=(130, 140), starts=(0, 1001), padding=False, seed=3)


# --------------------------------------------------------------------------- data flow


def test_dataflow_names_every_stage_and_the_windows() -> None:
    fig = vc.plot_c128_dataflow(48)
    text = figure_text(fig, "kv_score", "K4 save_partial_states", "state cache", "K7 c128_compress",
                       "compressed_kv", "K8a", "K8b", "compressed KV", "K3", "p % 128 == 127",
                       "(p // 128) * 128")
    assert fig.boundaries == [127, 255, 383]
    assert fig.windows == [(127, 0, 15, 0), (255, 16, 31, 128), (383, 32, 47, 256)]
    assert [t for t in figure_texts(fig) if t.startswith("p = ")] == ["p = 127", "p = 255", "p = 383"]
    red = patch_xs(fig.axes[1], "#c62828", -0.75)
    assert red == [15, 31, 47]  # the boundary mark sits on the last block of each window
    assert len(fig.windows) == 3 and "window of p = 255: positions 128..255 = blocks 16..31" in text
    for bad in (10, 40, 0):
        with pytest.raises(ValueError, match="blocks"):
            vc.plot_c128_dataflow(bad)


# --------------------------------------------------------------------------- the window


def test_window_blocks_are_the_block_table_entries(k7_case) -> None:
    a = k7_case.args
    bt, state = a["block_table"], a["state_cache"]
    blocks = vc.c128_window_layout(k7_case, 1023)
    assert [b.k for b in blocks] == list(range(16))
    assert [b.column for b in blocks] == list(range(112, 128))
    assert [b.block for b in blocks] == [int(bt[1, (1023 - 127) // 8 + k]) for k in range(16)]
    assert [b.positions[0] for b in blocks] == list(range(896, 1024, 8))
    assert all(b.rows == tuple(range(8)) and len(b.positions) == 8 for b in blocks)
    assert [b.offset for b in blocks] == [b.block * state.stride(0) for b in blocks]
    assert {b.kv_cols for b in blocks} == {(0, 512)} and {b.score_cols for b in blocks} == {(512, 1024)}
    assert math.isclose(sum(b.weight for b in blocks), 1.0, rel_tol=1e-9)
    # The rows it names are the ones the reference pools.
    k, s, _ = window_rows(state, bt, torch.tensor([1]), torch.tensor([1023]), 128, False, 512)
    for b in blocks:
        for row in b.rows:
            assert torch.equal(k[0, 8 * b.k + row], state[b.block, row, :512])
            assert torch.equal(s[0, 8 * b.k + row], state[b.block, row, 512:])
    first = vc.c128_window_layout(k7_case, 127)
    assert [b.block for b in first] == bt[0, :16].tolist() and first[0].positions == tuple(range(8))


def test_window_follows_a_changed_block_table(k7_case) -> None:
    a = dict(k7_case.args)
    bt = a["block_table"].clone()
    bt[1, 112], bt[1, 127] = int(bt[1, 127]), int(bt[1, 112])  # swap the window's first and last blocks
    swapped = type(k7_case)(k7_case.op, {**a, "block_table": bt}, k7_case.label)
    before = [b.block for b in vc.c128_window_layout(k7_case, 1023)]
    after = [b.block for b in vc.c128_window_layout(swapped, 1023)]
    assert after == [before[15], *before[1:15], before[0]] and after != before


@pytest.mark.parametrize("position, req, match", [
    (1022, None, "boundary"), (4, None, "boundary"), (255, None, "no token"), (127, 2, "request"),
    (4095, 0, "no column"),
    (255, 0, "not all state blocks"),  # columns 16..31 of request 0 are mostly -1
])
def test_window_rejects_bad_positions_and_requests(k7_case, position, req, match) -> None:
    with pytest.raises(ValueError, match=match):
        vc.c128_window_layout(k7_case, position, request=req)


def test_window_rejects_bad_block_sizes(k7_case) -> None:
    bad = type(k7_case)(k7_case.op, {**k7_case.args, "state_cache": allocate_state_cache(64, 4, 512)})
    with pytest.raises(ValueError, match="state block size 8"):
        vc.c128_window_layout(bad, 127, request=0)


def test_window_markdown_and_figure(k7_case) -> None:
    blocks = vc.c128_window_layout(k7_case, 1023)
    table = vc.c128_window_markdown(blocks)
    lines = table.splitlines()
    assert len(lines) == 2 + 16 and lines[2].startswith(f"| 0 | 112 | {blocks[0].block} | 896..903 |")
    fig = vc.plot_c128_window(k7_case, 1023, columns=24)
    assert fig.window == blocks and fig.request == 1
    assert tuple(fig.weights.shape) == (128, 512)
    assert torch.allclose(fig.weights.sum(dim=0), torch.ones(512, dtype=torch.float64))
    ax_map, ax_row, ax_w = fig.axes[:3]
    assert ax_w.images[0].get_array().shape == (128, 24)
    labels = [t.get_text() for t in ax_w.get_yticklabels()]
    assert len(labels) == 16 and labels[0] == f"k=0 blk {blocks[0].block} q 896..903"
    texts = [t.get_text() for t in ax_map.texts]
    assert [t for t in texts if t.startswith("k=")] == [
        f"k={b.k}\ncol {b.column}\n-> {b.block}" for b in blocks
    ]
    assert any("49 physical blocks" in t for t in texts)
    assert any("kv" in t.get_text() for t in ax_row.texts) and any(
        "score" in t.get_text() for t in ax_row.texts
    )
    assert "rope row 896" in ax_map.get_title()


# --------------------------------------------------------------------------- keys


def test_spec_keys_and_the_key_space_table() -> None:
    cpu = cpu_platform("sm_90a")
    configs = [
        C128CompressConfig(cache_block_size=b, cache_dtype=d)
        for b in (64, 256)
        for d in ("fp8_ds_mla", "bfloat16")
    ]
    rows = vc.key_space(configs, cpu)
    assert [(r["B"], r["cache_dtype"], r["geometry"]) for r in rows] == [
        (64, "fp8_ds_mla", (1, 1152)),
        (64, "bfloat16", None),
        (256, "fp8_ds_mla", (2, 1728)),
        (256, "bfloat16", None),
    ]
    assert [vc.spec_key(k) for k in rows[2]["keys"][K7]] == [(512, 512, 8)]
    assert [vc.spec_key(k) for k in rows[2]["keys"][K8A]] == [(2, 1728, "bfloat16")]
    assert [vc.spec_key(k) for k in rows[3]["keys"][K8B]] == [(False, "bfloat16")]
    table = vc.key_space_markdown(rows).splitlines()
    assert len(table) == 2 + 4
    assert table[4] == (
        "| 256 | fp8_ds_mla | bfloat16 | kv_bs 2, 1728 B/page | (512, 512, 8) | (2, 1728, bfloat16) | none |"
    )
    assert table[5].endswith("| - | (512, 512, 8) | none | (False, bfloat16) |")
    with pytest.raises(ValueError, match="C128 CompileKey"):
        vc.spec_key(object())


# --------------------------------------------------------------------------- numerics


def test_labels() -> None:
    assert vc.c128_label(make_k7_case(lens=(3,), seed=0)) == "K7 fp32"
    assert vc.c128_label(make_k8_case(K8A, t=4, boundaries=1)) == "K8a fp8_ds_mla"
    assert vc.c128_label(make_k8_case(K8B, t=4, boundaries=1)) == "K8b bf16"
    assert vc.c128_label(make_k8_case(K8B, t=4, boundaries=1, fp8_scale=0.5)) == "K8b e4m3"
    assert vc.c128_label(make_chain_case(K8B, lens=(3,), fp8_scale=0.5)) == "K7 -> K8b e4m3"


def test_k7_fractions_measure_in_fp32_bounds(k7_case) -> None:
    want = _reference(k7_case)
    assert torch.equal(vc.k7_fractions(k7_case, want, want), torch.zeros(2 * 512, dtype=torch.float64))
    a = k7_case.args
    idx = torch.nonzero((a["positions"] + 1) % 128 == 0).flatten()
    k, _, _ = window_rows(
        a["state_cache"],
        a["block_table"],
        a["token_to_req"][idx].long(),
        a["positions"][idx],
        128,
        False,
        512,
    )
    bound = FP32_RULE * k.abs().amax(dim=1)
    got = want.clone()
    got[idx[0], 5] += 0.5 * float(bound[0, 5])
    got[idx[1], 7] += 3.0 * float(bound[1, 7])
    u = vc.k7_fractions(k7_case, got, want)
    assert u.numel() == 1024 and int((u != 0).sum()) == 2
    assert math.isclose(float(u[5]), 0.5, rel_tol=1e-3) and math.isclose(float(u[512 + 7]), 3.0, rel_tol=1e-3)
    counts = vc.fp32_histogram_counts(u)
    assert counts["0 (bit-identical)"] == 1022 and counts["(0.1, 1]"] == 1 and counts["> 1 (violation)"] == 1
    fig = vc.plot_k7_fractions({"a": [u], "b": u[:512]})
    assert fig.counts["b"]["> 1 (violation)"] == 0 and fig.counts["a"] == counts
    assert "farthest bin > 1 (violation)" in fig.axes[0].get_title()
    # The table agrees with the judge.
    verdicts = [("K7 fp32", judge_k7(k7_case, got, want)), ("K7 fp32", judge_k7(k7_case, want, want))]
    assert not verdicts[0][1].ok and verdicts[1][1].ok
    table = vc.k7_table_markdown(verdicts).splitlines()
    assert len(table) == 4 and table[2].startswith("| K7 fp32 | 2 | 1 | 4 | 2048 | 2046 (99.90%) | 3 |")
    assert table[3].split("|")[8].strip() == "1"  # one violation in all


def test_store_step_differences_count_steps() -> None:
    case = make_k8_case(K8A, t=12, boundaries=3, padding=False, seed=1)
    want = _reference(case)
    d = vc.store_step_differences(case, want, want)
    assert set(d) == {"nope", "rope"} and d["nope"].numel() == 3 * 448 and d["rope"].numel() == 3 * 64
    assert all(bool((u == 0).all()) for u in d.values())
    got = _reference(case)  # the same bytes, in a cache with the case's page stride
    slot = int(case.args["kv_slot_mapping"][case.args["kv_slot_mapping"] >= 0][0])
    data, _ = ds_page_regions(got)
    page, entry = divmod(slot, got.shape[1])
    codes = data[page, entry, :448]
    i = int(torch.nonzero(((codes & 0x7F) > 0) & ((codes & 0x7F) < 0x70) & ((codes & 7) != 7))[0])
    data[page, entry, i] += 1  # one e4m3 grid step, inside the binade
    d = vc.store_step_differences(case, got, want)
    assert int((d["nope"] != 0).sum()) == 1 and float(d["nope"].max()) == 1.0 and bool((d["rope"] == 0).all())

    for scale in (None, 0.37):
        plain = make_k8_case(K8B, t=12, boundaries=3, padding=False, fp8_scale=scale, seed=2)
        want = _reference(plain)
        d = vc.store_step_differences(plain, want, want)
        assert set(d) == {"rows"} and d["rows"].numel() == 3 * 512 and bool((d["rows"] == 0).all())
    none = make_k8_case(K8A, t=6, boundaries=0, seed=3)
    assert vc.store_step_differences(none, _reference(none), _reference(none)) == {}


# --------------------------------------------------------------------------- recorded runs


def _record(tmp_path, check=None, csv_text=None, md=None, smoke=False):
    d = tmp_path / "c128_compress_h200"
    d.mkdir()
    prov = {
        "date": "2027-01-01",
        "commit": "0123456789abcdef",
        "device": "NVIDIA H200",
        "family": "c128_compress",
        "kernel_source_hash": "x" * 64,
        "cpu_smoke": smoke,
    }
    (d / "provenance.json").write_text(json.dumps(prov))
    if check is not None:
        (d / "check.json").write_text(
            check if isinstance(check, str) else json.dumps({"provenance": prov, **check})
        )
    if csv_text is not None:
        (d / "c128_compress.csv").write_text(csv_text)
    if md is not None:
        (d / "c128_compress.md").write_text(md)
    return Recorded.from_path(d / "provenance.json")


CHECK = {
    "pass": True,
    "numerics_compiles": {"triton_compiles": 0, "cute_compiles": 0, "monitor_events": []},
    "timing_compiles": {"triton_compiles": 0, "cute_compiles": 0, "monitor_events": 0},
    "summary": [
        {
            "op": K7,
            "backend": "triton",
            "reference": "cpu",
            "set": "random",
            "cases": 60,
            "conforming": 60,
            "violations": 0,
            "scale_mismatches": 0,
            "used_step": 0,
            "errors": 0,
            "bit_identical": 10,
            "elements": 20,
        }
    ],
    "timing": [
        {
            "kernel": K7,
            "backend": "triton",
            "variant": "kernel",
            "size": 65536,
            "bytes": 100,
            "median_us": 12.5,
            "GBps": 3000.0,
            "fraction_of_copy": 0.71,
            "error": "",
        },
        {
            "kernel": K7,
            "backend": "cutedsl",
            "variant": "kernel",
            "size": 16384,
            "bytes": 100,
            "median_us": 4.0,
            "GBps": 2000.0,
            "fraction_of_copy": 0.5,
            "error": "",
        },
        {
            "kernel": K7,
            "backend": "triton",
            "variant": "decode",
            "size": 1,
            "bytes": 0,
            "median_us": 3.0,
            "GBps": 0,
            "fraction_of_copy": "",
            "error": "",
        },
    ],
}


def test_a_recorded_check_is_read_and_tabled(tmp_path) -> None:
    r = vc.read_c128_record(_record(tmp_path, CHECK, md="# report\n"))
    assert r.files == ["provenance.json", "check.json", "c128_compress.md"] and r.problems == []
    assert r.passed is True and not r.cpu_smoke and not r.compiled_after_warmup
    assert set(r.compiles) == {"numerics_compiles", "timing_compiles"}
    assert r.largest_t == 65536 and len(r.timing_rows) == 2  # the decode row is left out
    text = vc.record_markdown(r)
    assert (
        "**GPU check** (`check.json`): PASS" in text
        and "| c128_compress | triton | cpu | random | 60 | 60 |" in text
    )
    assert "10/20 (50.0000%)" in text and "**Bandwidth at T = 65536**" in text
    assert "| c128_compress | triton | kernel | 12.5 | 3000 | 71.0% |" in text and "cutedsl" not in text
    assert "# report" not in text  # the check's tables, not the report


def test_a_failing_or_compiling_record_says_so(tmp_path) -> None:
    bad = {
        **CHECK,
        "pass": False,
        "failures": ["1 kernel records do not conform"],
        "numerics_compiles": {"triton_compiles": 2, "cute_compiles": None, "monitor_events": []},
    }
    r = vc.read_c128_record(_record(tmp_path, bad))
    assert r.passed is False and r.compiled_after_warmup
    text = vc.record_markdown(r)
    assert "FAIL" in text and "1 kernel records do not conform" in text and "'triton_compiles': 2" in text


def test_records_without_a_check_or_with_broken_files(tmp_path) -> None:
    csv_text = (
        "family,kernel,backend,variant,size,bytes,median_us,GBps,copy_GBps,fraction_of_copy,timing,error\n"
        f"c128_compress,{K8A},triton,kernel,4096,50,2.0,1500,4000,0.375,graph,\n"
    )
    r = vc.read_c128_record(_record(tmp_path, None, csv_text=csv_text, md="# report\n", smoke=True))
    assert r.check is None and r.passed is None and r.cpu_smoke and r.compiles == {}
    text = vc.record_markdown(r)
    assert (
        "--cpu-smoke" in text
        and "| c128_norm_rope_store_ds_mla | triton | kernel | 2.0 | 1500 | 37.5% |" in text
    )
    assert "# report" in text  # no check: the report as written
    broken = tmp_path / "other"
    broken.mkdir()
    r = vc.read_c128_record(_record(broken, "{not json"))
    assert r.check is None and r.problems and r.problems[0].startswith("check.json:")
    assert "**Unreadable files:** check.json" in vc.record_markdown(r)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        vc.record_markdown(vc.read_c128_record(_record(empty)))
        == "*(the record holds no check and no timings)*"
    )
