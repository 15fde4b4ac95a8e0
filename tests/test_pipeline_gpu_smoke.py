"""benchmarks/pipeline_gpu.py: its whole flow on CPU (``--cpu-smoke``, Triton interpreter).

The GPU pipeline replay is a scarce device call; this runs the same code paths here (one process per
configuration, warmup, the request trace against the reference pipeline, the compile counters, the
report files) on a 3-layer model with tiny limits, so a typo in the script costs no device time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def script():
    return load_benchmark("pipeline_gpu")


def test_the_cpu_smoke_run_conforms_and_writes_every_file(script, tmp_path: Path) -> None:
    rc = script.main(["--cpu-smoke", "--jobs", "2", "--out", str(tmp_path)])   # both runs at once
    report = json.loads((tmp_path / "report.json").read_text())
    results = report["results"]
    assert rc == 0, [(r["config"], r.get("error"), r.get("failures")) for r in results]
    assert [(r["config"], r["backend"]) for r in results] == [(n, "triton") for n in script.SMOKE_CONFIGS]
    for r in results:
        assert r["ok"] and r["warmup_ok"] and r["failures"] == []
        assert r["steps_ok"] == r["steps_compared"] == r["steps_run"] == r["trace"]["steps"] >= 2
        assert r["monitor_events"] == [] and r["triton_runtime_compiles"] == 0
        assert r["cute_runtime_compiles"] is None                        # Triton only on CPU
        assert r["history_tokens"] == 124 and r["trace"]["cuda_graph_steps"] >= 1
        assert r["written"]["2/main"] == 1                               # the C128 boundary 127
        assert r["rules"]["bit-exact"]["bit_identical"] == r["rules"]["bit-exact"]["elements"] > 0
        assert r["rules"]["compressor"]["elements"] > 0
    ds, plain = results
    assert set(ds["family_calls"]) == {"save_partial_states", "c4_compress_ds_mla", "indexer_compress",
                                       "c128_compress", "c128_norm_rope_store_ds_mla", "indexer_q",
                                       "dequant_gather"}
    assert set(plain["family_calls"]) == {"save_partial_states", "c4_compress_plain", "indexer_compress",
                                          "c128_compress", "c128_norm_rope_store_plain", "indexer_q"}
    assert plain["settings"]["block_size"] == "64"
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["cpu_smoke"] and prov["script"] == "benchmarks/pipeline_gpu.py" and prov["jobs"] == 2
    assert set(prov["kernel_source_hash"]) >= set(ds["family_calls"]) | set(plain["family_calls"])
    assert report["provenance"] == prov
    md = (tmp_path / "report.md").read_text()
    assert "CPU smoke" in md and "| flash-default | triton | yes | 3/3 |" in md
    assert all(r["store_compiled"] is None for r in results)         # no --cache-dir: no store
    for n in script.SMOKE_CONFIGS:
        assert (tmp_path / f"run_{n}_triton.log").read_text().strip()


def test_every_configuration_runs_on_both_backends_unless_it_forces_one(script) -> None:
    todo = script.runs(script.parse_args(["--out", "x"]))
    names = [n for n, _ in script.CONFIGS]
    assert len(names) == 8 and {n for n, _ in todo} == set(names)
    assert ("flash-triton-forced", "triton") in todo and ("flash-triton-forced", "cutedsl") not in todo
    assert len(todo) == 2 * 8 - 1
    one = script.parse_args(["--out", "x", "--configs", "pro-default", "--backends", "triton"])
    assert script.runs(one) == [("pro-default", "triton")]
    with pytest.raises(SystemExit, match="unknown configuration"):
        script.runs(script.parse_args(["--out", "x", "--configs", "nope"]))


def test_a_run_past_the_deadline_is_not_started_and_the_report_says_so(script, tmp_path: Path) -> None:
    assert script.main(["--cpu-smoke", "--deadline", "1", "--out", str(tmp_path)]) == 1
    results = json.loads((tmp_path / "report.json").read_text())["results"]
    assert [r["config"] for r in results] == list(script.SMOKE_CONFIGS)
    assert all(not r["ok"] and r["error"] == "not run: --deadline reached" for r in results)
    assert not list(tmp_path.glob("run_*.log"))


def test_a_run_warmed_from_a_store_counts_its_hits(script, tmp_path: Path) -> None:
    store = tmp_path / "store"
    for i in (1, 2):       # the first run fills the store, the second loads every key from it
        out = tmp_path / f"run{i}"
        assert script.main(["--cpu-smoke", "--configs", "flash-default", "--cache-dir", str(store),
                            "--out", str(out)]) == 0
        (r,) = json.loads((out / "report.json").read_text())["results"]
        keys = len(r["warmup"])
        assert r["ok"] and keys > 0
        assert (r["store_hits"], r["store_compiled"]) == ((0, keys) if i == 1 else (keys, 0))
    assert f"| {keys} / 0 |" in (out / "report.md").read_text()


def test_without_a_gpu_the_script_says_so(script, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
