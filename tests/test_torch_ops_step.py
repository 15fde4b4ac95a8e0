"""A whole DSv4 attention step of torch ops under ``torch.compile(fullgraph=True)`` (issue 37, CPU).

The step is every op call the model stack makes on every layer of a 3-layer DSv4-Flash model (SWA,
C4, C128; fp8_ds_mla cache) for a chunked-prefill step: K4, K5, K9, K1, K3, K7, K8a (every family
the model uses with this cache), built by :mod:`dsv4kit.model.compiled_step` from a warmed
:class:`~dsv4kit.model.pipeline.Pipeline`. Compiled with ``aot_eager`` (functionalized, kernels
under the Triton interpreter): zero graph breaks, results and every byte written equal to the
eager step, no kernel compiled after warmup (``JitMonitor("error")``). The same script runs on CPU
end to end (``--cpu-smoke``: decode steps of three sizes through one dynamic graph).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

from dsv4kit.model.compiled_step import Snapshot, check_compiled, small_prefill, tensors
from dsv4kit.model.stack import FAMILIES


@pytest.fixture(scope="module")
def script():
    return load_benchmark("torch_ops_gpu")


def test_compiled_attention_step_has_no_graph_break_and_eager_bytes() -> None:
    pipe, step, args = small_prefill()
    registered = {name for layer in pipe.stack.layers for name in layer.kernels}  # what the model calls
    assert registered == {"save_partial_states", "c4_compress_ds_mla", "indexer_compress", "indexer_q",
                          "dequant_gather", "c128_compress", "c128_norm_rope_store_ds_mla"}
    assert {op.__name__ for op in step.ops} == {f.op_name for f in FAMILIES if f.name in registered}
    check = check_compiled(pipe, step, args)
    assert (check.graph_count, check.graph_break_count) == (1, 0)
    assert check.equal and check.compiles == () and check.ok
    assert pipe.monitor.events == []


def test_the_byte_check_sees_a_changed_byte() -> None:
    """The comparison :func:`check_compiled` relies on fails when one written byte differs."""
    t = torch.zeros(4, dtype=torch.uint8)
    snap = Snapshot(tensors([{"cache": t}]))
    assert snap.same_as_now()
    t[2] = 1
    assert not snap.same_as_now()
    snap.restore()
    assert snap.same_as_now() and int(t[2]) == 0


def test_the_gpu_script_runs_on_cpu(script, tmp_path: Path) -> None:
    """``--cpu-smoke``: every CPU stage of the GPU script, its JSON and its verdicts."""
    assert script.main(["--cpu-smoke", "--iters", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "torch_ops_gpu.json").read_text())
    assert report["ok"] and {"date", "commit", "torch"} <= set(report["provenance"])
    (res,) = report["results"]
    assert res["triton_runtime_compiles"] == 0 and res["monitor_events"] == []
    rows = res["per_size"]
    assert [r["size"] for r in rows] == list(script.SMOKE_SIZES)
    assert all(r["compiled"]["equal"] and r["eager"]["us"] > 0 for r in rows)
    assert rows[0]["compiled"]["graph_breaks"] == 0
    # One graph for size 1 (specialized), one dynamic graph for every later size.
    assert rows[-1]["compiled"]["unique_graphs"] - rows[1]["compiled"]["unique_graphs"] == 0
