"""The helpers the tutorial notebooks show code and verdicts with (dsv4kit.viz.source, .verify,
.torch_ops), checked without running a notebook: each must fail loudly on what it cannot show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4kit import results
from dsv4kit.verify import Row
from dsv4kit.viz import torch_ops
from dsv4kit.viz.source import excerpt, source_markdown, whole
from dsv4kit.viz.verify import verify_markdown


def _sample(x: int) -> int:
    """A function to cut."""
    y = x + 1
    z = y * 2
    return z


def test_excerpt_cuts_between_markers_and_names_the_lines() -> None:
    part = excerpt(_sample, "y = x + 1", "z = y * 2")
    assert part.lines == ("    y = x + 1", "    z = y * 2")
    assert part.path == "tests/test_notebooks_viz.py"
    first = whole(_sample).first
    assert part.first == first + 2 and part.header.endswith(f"lines {first + 2}-{first + 3}")
    md = source_markdown(part)
    assert md.startswith("```python\n# tests/test_notebooks_viz.py") and "\ny = x + 1\nz = y * 2\n```" in md


@pytest.mark.parametrize(("start", "stop"), [("no such line", None), ("y = x + 1", "no such line")])
def test_excerpt_of_a_vanished_line_raises(start: str, stop: str | None) -> None:
    with pytest.raises(ValueError, match="no such line"):
        excerpt(_sample, start, stop)


def test_excerpt_of_a_triton_kernel_reads_its_python_function() -> None:
    from dsv4kit.kernels.c4_compress import triton as c4_triton

    part = excerpt(c4_triton.pool_window, "return tl.div_rn")
    assert part.path == "dsv4kit/kernels/c4_compress/triton.py"
    assert part.text.strip() == "return tl.div_rn(a, s)"


def test_verify_markdown_marks_a_failure() -> None:
    good = Row("indexer_q", "triton", cases=3, bit_identical=3, passed=3)
    bad = Row("c128_compress", "triton", cases=3, bit_identical=1, passed=2, failures=["case 2: differs"])
    md = verify_markdown([good, bad])
    lines = md.splitlines()
    assert lines[2].startswith("| K1/K2 | `indexer_q_rope_quant` | triton | 3 | 3 | 3 | 0 | pass")
    assert lines[3].startswith("| K7 | `c128_compress` |") and lines[3].endswith("**FAIL** |")
    assert lines[-1] == "* c128_compress (triton): case 2: differs"


def test_torch_ops_record_is_found_and_tabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(results.ENV_VAR, str(tmp_path))
    assert torch_ops.find_record() is None  # nothing recorded: the notebook says pending
    rec = tmp_path / "torch_ops_h200"
    rec.mkdir()
    stage = {"us": 80.0, "equal": True}
    data = {"provenance": {"device": "NVIDIA H200", "date": "2026-12-06", "commit": "abc"}, "ok": False,
            "results": [{"backend": "triton", "per_size": [
                {"size": 1, "eager": {"us": 400.0}, "compiled": {**stage, "graph_breaks": 0},
                 "reduce_overhead": {"us": 30.0, "equal": False}, "cuda_graph": {"error": "boom"}}]}]}
    (rec / "torch_ops_gpu.json").write_text(json.dumps(data))
    found = torch_ops.find_record()
    assert found is not None and found.device == "NVIDIA H200"
    row = torch_ops.record_markdown(found.read_json()).splitlines()[2]
    assert row == "| triton | 1 | 400 µs | 80 µs | 30 µs (bytes differ) | failed | 0 |"
