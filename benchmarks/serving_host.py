#!/usr/bin/env python3
"""Host time of a DSv4 serving step, run eagerly through the model stack, against its GPU time.

    python3 benchmarks/serving_host.py --out DIR [--steps 48] [--backends triton,cutedsl] [--cpu-smoke]

For each backend: the DSv4-Flash stack with that backend forced, warmed; a seeded ``all`` trace
(decode batches of varying size, chunked prefill of varying T, mixed batches). Every op call's
tensors are built before timing (the engine owns them; building them is not the kit's host
time). Then each step's calls run through the public ops (:meth:`DSv4AttentionStack.launch`,
value checks off) twice over the trace: ``first pass`` (a step's sizes mostly never seen before:
what serving meets) and ``second pass`` (every size seen). Per step: host µs (the loop of op
calls, nothing synchronized), the number of op calls, and GPU µs (CUDA events around the step,
read after a synchronize). All under ``JitMonitor("warn")``: a compile of any kind after warmup
(a kernel key or host code) is recorded and fails the run (exit 1).

Writes ``serving_host.json`` (per backend and pass: per-step rows and medians) to DIR. Without a
GPU it exits 2, unless ``--cpu-smoke`` (a 4-layer model under the Triton interpreter: tests the
script, not the host).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from dsv4kit.bench import provenance, write_json  # noqa: E402
from dsv4kit.jit import JitMonitor, WarmupRegistry  # noqa: E402
from dsv4kit.jit.store import ArtifactStore  # noqa: E402
from dsv4kit.model.presets import DSV4_FLASH  # noqa: E402
from dsv4kit.model.stack import DSv4AttentionStack  # noqa: E402
from dsv4kit.model.trace import make_trace  # noqa: E402
from dsv4kit.platform import detect_platform, use_platform  # noqa: E402


def _stack(backend: str, smoke: bool, max_model_len: int, cache_dir: str | None) -> DSv4AttentionStack:
    """The warmed Flash stack (a 4-layer one for ``smoke``) with ``backend`` forced; its keys
    loaded from the artifact store at ``cache_dir`` where stored there."""
    preset, settings = DSV4_FLASH, {"max_model_len": max_model_len}
    if smoke:
        rope = dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096)
        preset = dataclasses.replace(DSV4_FLASH, name="tiny", num_layers=4, compress_ratios=(0, 4, 128, 4),
                                     compress_rope=rope)
        settings = dict(block_size=16, max_num_batched_tokens=24, max_num_seqs=4, max_model_len=96)
    registry = WarmupRegistry()
    with registry.activate():
        stack = DSv4AttentionStack(preset, detect_platform(), backend=backend, **settings)
    store = ArtifactStore(cache_dir) if cache_dir else None
    report = registry.warmup(progress=False, raise_on_failure=True, store=store)
    assert report.ok
    return stack


def _step_calls(stack: DSv4AttentionStack, trace: Any, device: torch.device) -> list[list[tuple[Any, dict]]]:
    """Every step's op calls with their real tensors, built ahead of the timed loop."""
    pools: dict[Any, torch.Tensor] = {}
    return [[(call, call.real_args(device, pools))
             for layer in stack.layers for call in stack.calls(layer, step)] for step in trace]


def _pass(stack: DSv4AttentionStack, trace: Any, steps: list[list[tuple[Any, dict]]], cuda: bool
          ) -> list[dict[str, Any]]:
    """One pass over the trace: per step, host µs of the op calls, their count, GPU µs."""
    rows = []
    launch = stack.launch
    for step, calls in zip(trace, steps, strict=True):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for call, args in calls:
            launch(call, args)
        host = (time.perf_counter() - t0) * 1e6
        gpu = None
        if cuda:
            end.record()
            torch.cuda.synchronize()
            gpu = start.elapsed_time(end) * 1e3
        rows.append({"step": step.index, "phase": step.phase, "tokens": step.padded_tokens,
                     "calls": len(calls), "host us": round(host, 1),
                     "host us per call": round(host / max(len(calls), 1), 2),
                     "gpu us": None if gpu is None else round(gpu, 1)})
    return rows


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median
    out = {"steps": len(rows), "calls": sum(r["calls"] for r in rows),
           "median host us per step": round(med(r["host us"] for r in rows), 1),
           "median host us per call": round(med(r["host us per call"] for r in rows), 2)}
    gpu = [r["gpu us"] for r in rows if r["gpu us"] is not None]
    if gpu:
        out["median gpu us per step"] = round(med(gpu), 1)
        out["median host / gpu"] = round(med(r["host us"] / r["gpu us"] for r in rows), 2)
    return out


def run(backend: str, steps: int, seed: int, smoke: bool, max_model_len: int,
        cache_dir: str | None = None) -> dict[str, Any]:
    stack = _stack(backend, smoke, max_model_len, cache_dir)
    device = torch.device(stack.device)
    cuda = device.type == "cuda"
    trace = make_trace("all", stack, steps=steps, seed=seed)
    built = _step_calls(stack, trace, device)
    result: dict[str, Any] = {"backend": backend, "layers": len(stack.layers),
                              "phases": dict(trace.phases()), "tokens": trace.token_counts()}
    with use_platform(stack.platform), JitMonitor("warn") as mon:  # recorded, not raised: every step runs
        for name in ("first pass", "second pass"):
            rows = _pass(stack, trace, built, cuda)
            result[name] = {"summary": _summary(rows), "rows": rows}
    result["compiles after warmup"] = len(mon.events)
    result["compile events"] = sorted({f"{e.kernel} {e.key} ({e.source})" for e in mon.events})
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backends", default="triton,cutedsl")
    p.add_argument("--max-model-len", type=int, default=32768,
                   help="bounds the contexts (and the K3 workspace of a prefill step)")
    p.add_argument("--cache-dir", default=None, help="an artifact store to warm from (others compile)")
    p.add_argument("--cpu-smoke", action="store_true", help="a 4-layer model under the Triton interpreter")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("serving_host: no GPU (use --cpu-smoke to test the script)", file=sys.stderr)
        return 2
    backends = ["triton"] if args.cpu_smoke else [b for b in args.backends.split(",") if b]
    results = []
    for backend in backends:
        try:
            r = run(backend, args.steps, args.seed, args.cpu_smoke, args.max_model_len, args.cache_dir)
        except Exception as exc:  # recorded: the other backend still runs
            r = {"backend": backend, "error": f"{type(exc).__name__}: {exc}", "compiles after warmup": None}
            print(f"{backend:<8} FAILED {r['error']}", flush=True)
        else:
            for name in ("first pass", "second pass"):
                print(f"{backend:<8} {name:<12} {r[name]['summary']}", flush=True)
        results.append(r)
    write_json(Path(args.out) / "serving_host.json", {
        "provenance": provenance({"script": "serving_host", "steps": args.steps, "seed": args.seed,
                                  "max_model_len": args.max_model_len, "smoke": args.cpu_smoke}),
        "method": "host: perf_counter around a step's op calls (no synchronize; tensors built before); "
                  "gpu: CUDA events around the same calls, read after a synchronize",
        "results": results})
    ok = all(r["compiles after warmup"] == 0 for r in results)
    print(f"wrote {Path(args.out) / 'serving_host.json'}; compiles after warmup: "
          f"{[r['compiles after warmup'] for r in results]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
