"""benchmarks/host_overhead.py on CPU: every path timed, a profile kept, the no-op executors gone after;
the three serving regimes timed and the record's provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from dsv4kit.kernels import families


@pytest.fixture(scope="module")
def script():
    return load_benchmark("host_overhead")


def test_host_overhead_times_four_paths_and_leaves_no_noop_executor(script, tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--families", "rowquant", "--calls", "5", "--repeats", "1",
            "--only", "paths"]
    assert script.main(argv) == 0
    result = json.loads((tmp_path / "host_overhead.json").read_text())
    (row,) = result["rows"]
    assert row["op"] == "rowquant" and row["executor"] == "noop" and row["backend"] == "triton"
    assert all(row[f"{p} us"] > 0 for p in ("op full", "op planned", "kernel full", "kernel planned"))
    assert row["launch plan"] is True, "the kernel planned its signature (value checks off)"
    assert row["profile (op planned)"][0].lstrip().startswith("ncalls")
    assert result["provenance"]["device"] == "cpu"
    # The no-op executors were dropped: the next real call compiles (or loads) the key again and runs it.
    spec = next(s for s in families() if s.name == "rowquant")
    kernel = spec.kernel()
    assert kernel.compiled_keys() == []


def test_a_real_executor_needs_a_gpu(script, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        script.main(["--out", str(tmp_path), "--executor", "real"])
    assert exc.value.code == 2


def test_the_record_carries_the_kernel_source_hash_of_what_it_timed(script, tmp_path: Path) -> None:
    from dsv4kit.results import kernel_source_hash

    argv = ["--out", str(tmp_path), "--families", "rowquant", "--calls", "2", "--repeats", "1",
            "--only", "regimes"]
    assert script.main(argv) == 0
    record = json.loads((tmp_path / "host_overhead.json").read_text())
    (row,) = record["regimes"]
    assert row["op"] == "rowquant" and all(row[f"{r} us"] > 0 for r in ("fixed", "cycle", "new shape"))
    prov = record["provenance"]
    assert prov["family"] == ["rowquant"]
    assert prov["kernel_source_hash"] == {"rowquant": kernel_source_hash("rowquant")}
