"""``benchmarks/ncu_profile.py``, ``c4_tuning.py`` and ``shape_tuning.py`` off the GPU: ncu's raw CSV
parsed, labelled in launch order and tabled; no GPU means exit 2 for each (they run only on the H200)."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark

ncu = load_benchmark("ncu_profile")

RAW = """==PROF== Connected to process 1
"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum",\
"sm__warps_active.avg.pct_of_peak_sustained_active","smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct"
"","","nsecond","byte","Mbyte","%","%"
"0","copy_kernel","250,000","1,073,741,824","1,073,741,824","90.5","12.0"
"1","c4_compress_kernel","100,000","300000000","20","40.0","55.5"
"""
LABELS = [
    {"plan": "copy", "kernel": "copy_", "config": "1 GiB", "backend": "torch", "size": 1,
     "model_bytes": 1 << 31},
    {"plan": "c4_compress", "kernel": "K5", "config": "fp8_ds_mla", "backend": "triton", "size": 65536,
     "model_bytes": 310000000},
]


def test_raw_csv_is_labelled_in_launch_order() -> None:
    recs = ncu.summarize(ncu.parse_raw(RAW), LABELS)
    assert [r["kernel"] for r in recs] == ["copy_", "K5"]
    assert recs[1]["ncu_kernel_name"] == "c4_compress_kernel"
    assert recs[0]["dram_read_B"] == 1 << 30                       # thousands separators read
    assert recs[0]["duration_us"] == 250.0 and recs[1]["dram_write_B"] == 20e6  # units converted
    assert recs[1]["dram_GBps"] == pytest.approx(320e6 / 100e3)   # bytes / (us * 1e3) = GB/s
    assert recs[1]["dram_B_over_model"] == pytest.approx(320 / 310)
    assert recs[1]["stalls_pct"] == {"long_scoreboard": 55.5}
    assert recs[1]["achieved_occupancy_pct"] == 40.0 and recs[1]["registers"] is None
    md = ncu.markdown(recs, {"date": "d", "commit": "c" * 12, "device": "H200", "ncu_version": "v"}, 8590.0)
    row = next(ln for ln in md.splitlines() if ln.startswith("| c4_compress"))
    assert "| 3200 |" in row and "long_scoreboard 56" in row and "37.3 %" in row  # 3200 / 8590 GB/s
    assert "8590 GB/s" in md


def test_a_shifted_label_count_is_reported(capsys) -> None:
    ncu.summarize(ncu.parse_raw(RAW), LABELS[:1])
    assert "labels may be shifted" in capsys.readouterr().out


def test_no_gpu_exits_2(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["ncu_profile.py", "--out", str(tmp_path)])
    assert ncu.main() == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("script, args", [("c4_tuning", ["--shapes", "8x2048"]), ("shape_tuning", ["k3"]),
                                          ("shape_tuning", ["store", "--shapes", "E1:2x2x4"]),
                                          ("shape_tuning", ["store-cute"]), ("shape_tuning", ["k3-cute"])])
def test_tuning_without_a_gpu_exits_2(tmp_path, monkeypatch, capsys, script, args) -> None:
    """The grid and shape sweeps say they need a GPU instead of failing deep inside."""
    tuning = load_benchmark(script)
    monkeypatch.setattr("sys.argv", [f"{script}.py", *args, "--out", str(tmp_path)])
    assert tuning.main() == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not any(tmp_path.iterdir())
