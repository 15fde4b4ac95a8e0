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


def _rowquant_record(script, out: Path, only: str) -> dict:
    """``host_overhead.py`` on rowquant alone, few calls, one of its parts; the record it wrote."""
    argv = ["--out", str(out), "--families", "rowquant", "--calls", "3", "--repeats", "1", "--only", only]
    assert script.main(argv) == 0
    return json.loads((out / "host_overhead.json").read_text())


def test_host_overhead_times_four_paths_and_leaves_no_noop_executor(script, tmp_path: Path) -> None:
    result = _rowquant_record(script, tmp_path, "paths")
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

    record = _rowquant_record(script, tmp_path, "regimes")
    (row,) = record["regimes"]
    assert row["op"] == "rowquant" and all(row[f"{r} us"] > 0 for r in ("fixed", "cycle", "new shape"))
    prov = record["provenance"]
    assert prov["family"] == ["rowquant"]
    assert prov["kernel_source_hash"] == {"rowquant": kernel_source_hash("rowquant")}
