"""A whole DSv4 attention step of torch ops under ``torch.compile(fullgraph=True)`` (issue 37, CPU).

The step is every op call the model stack makes on every layer of a 3-layer DSv4-Flash model (SWA,
C4, C128; fp8_ds_mla cache) for a chunked-prefill step: K4, K5, K9, K1, K3, K7, K8a (every family
the model uses with this cache), built by ``benchmarks/torch_ops_gpu.py``'s helpers from a warmed
:class:`~dsv4kit.model.pipeline.Pipeline`. Compiled with ``aot_eager`` (functionalized, kernels
under the Triton interpreter): zero graph breaks, results and every byte written equal to the
eager step, no kernel compiled after warmup (``JitMonitor("error")``). The same script runs on CPU
end to end (``--cpu-smoke``: decode steps of three sizes through one dynamic graph).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

from dsv4kit.model.drills import build
from dsv4kit.model.pipeline import Pipeline, Request, request_trace
from dsv4kit.model.presets import DSV4_FLASH
from dsv4kit.model.stack import FAMILIES
from dsv4kit.platform import use_platform

TINY3 = dataclasses.replace(
    DSV4_FLASH, name="tiny3", num_layers=3, compress_ratios=(0, 4, 128),
    compress_rope=dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096),
)
LIMITS = dict(block_size=16, max_num_batched_tokens=24, max_num_seqs=4, max_model_len=300)


@pytest.fixture(scope="module")
def script():
    return load_benchmark("torch_ops_gpu")


def test_compiled_attention_step_has_no_graph_break_and_eager_bytes(script) -> None:
    stack, _ = build(TINY3, **LIMITS)
    pipe = Pipeline(stack, seed=3)
    first = next(iter(request_trace(stack, (Request(30, 4), Request(20, 4, context=116)))))
    step, args = script.step_calls(pipe, first)
    registered = {name for layer in stack.layers for name in layer.kernels}  # every family the model calls
    assert registered == {"save_partial_states", "c4_compress_ds_mla", "indexer_compress", "indexer_q",
                          "dequant_gather", "c128_compress", "c128_norm_rope_store_ds_mla"}
    assert {op.__name__ for op in step.ops} == {f.op_name for f in FAMILIES if f.name in registered}
    snap = script.Snapshot(script.tensors(args))
    with use_platform(stack.platform), pipe.monitor:
        want = (script._clone(step(args)), script.Snapshot(snap.ts))
        explained = torch._dynamo.explain(step.__call__)(args)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        torch._dynamo.reset()
        compiled = torch.compile(step.__call__, fullgraph=True, backend="aot_eager")
        assert script.run_checked(lambda: compiled(args), snap, want)
    assert pipe.monitor.events == []


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
