#!/usr/bin/env python3
"""A DSv4 attention step of torch ops on a GPU: eager vs torch.compile (Inductor) vs CUDA graphs.

    python3 benchmarks/torch_ops_gpu.py --out DIR [--backends triton,cutedsl] [--sizes 1,2,4,...]
        [--layers N] [--iters 200] [--cpu-smoke]

A step is every op call the model stack makes on every layer for one decode step (DSv4-Flash,
fp8_ds_mla cache: K4, K5, K9, K7, K8a, K1, ... in call order), as one function of the calls'
arguments (:class:`AttentionStep`); the arguments come from a :class:`~dsv4kit.model.pipeline.
Pipeline` that ran the step eagerly (warmed first). For each backend (forced through the stack's
``backend``) and each decode size the script

1. times the eager step (the public ops, no dispatcher);
2. compiles it with Inductor, ``fullgraph=True``, T and the batch marked dynamic: graph breaks
   (``torch._dynamo.explain``), Dynamo graphs over all sizes, bytes written and returned vs eager,
   step time;
3. compiles it with ``mode="reduce-overhead"`` (Inductor + CUDA graph trees): bytes, replay time;
4. captures the eager step in a plain ``torch.cuda.CUDAGraph``: bytes, replay time.

Every stage runs under ``JitMonitor("error")`` and Triton's compile counter (expected: zero kernel
compiles after warmup), in its own try/except: a failure is recorded with its traceback and the
other stages still run. Times are medians over ``--iters`` runs (CUDA-synchronized). Writes
``DIR/torch_ops_gpu.json`` (provenance: device, versions, date, commit). Exit code 0 iff every
stage ran, matched eager byte for byte and compiled no kernel; 2 without a CUDA device unless
``--cpu-smoke`` (3 layers, tiny sizes, ``aot_eager`` for Inductor, no CUDA graphs: it tests the
script, not the GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import dsv4kit.ops  # noqa: E402, F401  (defines the torch ops)
from dsv4kit.bench import provenance  # noqa: E402
from dsv4kit.model.compiled_step import (  # noqa: E402
    AttentionStep,
    Snapshot,
    clone_results,
    run_checked,
    same_bytes,
    step_calls,
    tensors,
)
from dsv4kit.model.pipeline import Pipeline  # noqa: E402
from dsv4kit.model.trace import SeqChunk, Step  # noqa: E402

SCRIPT = "benchmarks/torch_ops_gpu.py"
SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
SMOKE_SIZES = (1, 3, 2)
#: Context of each decode sequence when first met (adopted: its history is prefilled first).
CONTEXT = 200


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- the step


def decode_step(index: int, size: int, lengths: dict[int, int]) -> Step:
    """A decode step of sequences ``0 .. size-1``, one token each, after what ``lengths`` holds
    (updated); unseen sequences start at :data:`CONTEXT` tokens."""
    seqs = []
    for sid in range(size):
        ctx = lengths.get(sid, CONTEXT + 7 * sid)
        seqs.append(SeqChunk(sid, ctx, 1, False))
        lengths[sid] = ctx + 1
    return Step(index, "decode", tuple(seqs), size)


def mark_dynamic(args: list[dict[str, Any]]) -> None:
    """T and the batch dynamic: dim 0 of every argument but the caches (pools of fixed size)."""
    for a in args:
        for name, v in a.items():
            if isinstance(v, torch.Tensor) and v.dim() and not name.endswith("cache"):
                torch._dynamo.maybe_mark_dynamic(v, 0)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_us(fn: Callable[[], Any], iters: int) -> float:
    """Median wall time of ``fn`` in microseconds, synchronized per call."""
    for _ in range(3):
        fn()
    _sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e6, 2)


@contextlib.contextmanager
def stage(rec: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """Record one stage: its fields, or its error and traceback (the run goes on)."""
    out: dict[str, Any] = rec.setdefault(name, {})
    t0 = time.perf_counter()
    try:
        yield out
    except Exception as exc:  # one stage's failure must not lose the others
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out["traceback"] = traceback.format_exc()[-4000:]
        log(f"  {name}: FAILED {out['error'][:300]}")
    out["seconds"] = round(time.perf_counter() - t0, 3)


# --------------------------------------------------------------------------- one backend


def build_pipeline(backend: str, sizes: Sequence[int], smoke: bool, layers: int | None) -> Pipeline:
    from dsv4kit.model.presets import DSV4_FLASH
    from dsv4kit.model.stack import DSv4AttentionStack
    from dsv4kit.platform import cpu_platform, detect_platform

    preset = DSV4_FLASH
    if smoke or layers:
        n = 3 if smoke else layers
        ratios = tuple(DSV4_FLASH.ratio_of_layer(i) for i in range(n)) if not smoke else (0, 4, 128)
        rope = dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096)
        preset = dataclasses.replace(DSV4_FLASH, name=f"flash{n}", num_layers=n, compress_ratios=ratios,
                                     compress_rope=rope)
    seqs = max(sizes)
    stack = DSv4AttentionStack(preset, cpu_platform("sm_90a") if smoke else detect_platform(),
                               backend=backend, block_size=16 if smoke else None, max_num_seqs=seqs,
                               max_num_batched_tokens=max(seqs, 256 if smoke else 2048),
                               max_model_len=400 if smoke else 4096)
    return Pipeline(stack, seed=0)


def run_backend(backend: str, sizes: Sequence[int], iters: int, smoke: bool,
                layers: int | None) -> dict[str, Any]:
    """Every stage for one backend (see the module docstring)."""
    from dsv4kit.backends.triton import count_triton_compiles
    from dsv4kit.platform import use_platform

    rec: dict[str, Any] = {"backend": backend, "sizes": list(sizes)}
    with stage(rec, "warmup") as st:
        pipe = build_pipeline(backend, sizes, smoke, layers)
        st["ok"] = bool(pipe.report.warmup and pipe.report.warmup.ok)
        st["describe"] = pipe.stack.describe()
    if "error" in rec["warmup"]:
        return rec
    compiler = "aot_eager" if smoke else "inductor"
    counters = torch._dynamo.utils.counters
    lengths: dict[int, int] = {}
    torch._dynamo.reset()
    inductor: Any = None
    first: AttentionStep | None = None
    per_size = rec["per_size"] = []
    with use_platform(pipe.stack.platform), count_triton_compiles() as tri:
        for i, size in enumerate(sizes):
            row: dict[str, Any] = {"size": size}
            per_size.append(row)
            log(f"{backend}: decode size {size}")
            with stage(row, "eager") as st:
                step, args = step_calls(pipe, decode_step(i, size, lengths))
                st["calls"] = len(args)
                st["families"] = sorted({op.__name__ for op in step.ops})
                snap = Snapshot(tensors(args))
                with pipe.monitor:
                    results = clone_results(step(args))
                    _sync()
                    want = (results, Snapshot(snap.ts))
                    st["us"] = median_us(functools.partial(step, args), iters)
            if "error" in row["eager"]:
                continue
            with stage(row, "compiled") as st, pipe.monitor:
                if first is None or first.ops != step.ops:  # one compiled step per call sequence
                    st["graph_breaks"] = torch._dynamo.explain(step.__call__)(args).graph_break_count
                    torch._dynamo.reset()
                    first = step
                    inductor = torch.compile(step.__call__, fullgraph=True, backend=compiler)
                mark_dynamic(args)
                st["equal"] = run_checked(functools.partial(inductor, args), snap, want)
                st["us"] = median_us(functools.partial(inductor, args), iters)
                st["unique_graphs"] = counters["stats"]["unique_graphs"]
            if smoke:
                continue  # CUDA graphs need a GPU
            with stage(row, "reduce_overhead") as st, pipe.monitor:
                graphed = torch.compile(step.__call__, fullgraph=True, mode="reduce-overhead", dynamic=False)
                st["equal"] = run_checked(functools.partial(graphed, args), snap, want)
                st["us"] = median_us(functools.partial(graphed, args), iters)
                # Inductor skips CUDA graphs for graphs it cannot capture (e.g. mutated inputs): say so.
                st["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
            with stage(row, "cuda_graph") as st, pipe.monitor:
                st["equal"], st["us"] = _cuda_graph(step, args, snap, want, iters)
            snap.restore()
    rec["triton_runtime_compiles"] = tri.runtime_count
    rec["monitor_events"] = [f"{e.kernel} {e.key} ({e.source})" for e in pipe.monitor.events]
    rec["ok"] = _backend_ok(rec, smoke)
    return rec


def _cuda_graph(step: AttentionStep, args: list[dict[str, Any]], snap: Snapshot,
                want: tuple[Any, Snapshot], iters: int) -> tuple[bool, float]:
    """Capture the eager step in a plain CUDAGraph: (bytes equal to eager, median replay time)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm the allocator and every host path before capture
            step(args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(args)
    snap.restore()
    graph.replay()
    _sync()
    results, after = want
    equal = same_bytes(results, clone_results(captured)) and after.same_as_now()
    return equal, median_us(graph.replay, iters)


def _backend_ok(rec: dict[str, Any], smoke: bool) -> bool:
    stages = ("eager", "compiled") if smoke else ("eager", "compiled", "reduce_overhead", "cuda_graph")
    rows = rec.get("per_size", [])
    good = bool(rows) and all("error" not in r.get(s, {"error": "missing"}) for r in rows for s in stages)
    good = good and all(r[s].get("equal", True) for r in rows for s in stages)
    good = good and all(r["compiled"].get("graph_breaks", 0) == 0 for r in rows)
    return good and rec.get("triton_runtime_compiles") == 0 and not rec.get("monitor_events")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(SCRIPT, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for torch_ops_gpu.json")
    ap.add_argument("--backends", default="triton,cutedsl")
    ap.add_argument("--sizes", default=None, help="decode batch sizes (default 1..128, powers of 2)")
    ap.add_argument("--layers", type=int, default=None, help="first N layers of DSv4-Flash (default all)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--cpu-smoke", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        log(f"{SCRIPT}: needs a CUDA device; --cpu-smoke runs the script's paths on CPU")
        return 2
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else (
        SMOKE_SIZES if args.cpu_smoke else SIZES)
    backends = ["triton"] if args.cpu_smoke else args.backends.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"script": SCRIPT, "argv": sys.argv[1:] if argv is None else argv,
                              "smoke": args.cpu_smoke, "iters": args.iters, "results": []}
    try:
        report["provenance"] = provenance()
    except Exception as exc:  # provenance must not cost the run
        report["provenance"] = {"error": repr(exc)}
    path = out / "torch_ops_gpu.json"
    for backend in backends:
        try:
            report["results"].append(run_backend(backend, sizes, args.iters, args.cpu_smoke, args.layers))
        except Exception as exc:
            report["results"].append({"backend": backend, "ok": False, "error": repr(exc),
                                      "traceback": traceback.format_exc()[-4000:]})
        path.write_text(json.dumps(report, indent=1, default=str))  # after each backend: keep what ran
    ok = all(r.get("ok") for r in report["results"])
    report["ok"] = ok
    path.write_text(json.dumps(report, indent=1, default=str))
    log(f"{'OK' if ok else 'FAILED'}: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
