#!/usr/bin/env python3
"""The DSv4 pipeline replay on real tensors on a GPU: every family, both backends, judged per step.

    python3 benchmarks/pipeline_gpu.py --out DIR [--configs a,b] [--backends cutedsl,triton]
        [--max-model-len 8192] [--max-num-seqs 4] [--timeout 900] [--jobs N] [--deadline S]
        [--cache-dir STORE] [--cpu-smoke]

For each configuration of ``benchmarks/replay_gpu.py`` (DSv4-Flash default, MXFP4 indexer cache,
plain-row e4m3 caches, bf16 plain rows at B = 64, B = 64, DSv4-Pro, forced Triton, a bf16 RoPE
cache) and each backend (``cutedsl``, ``triton``: forced through the stack's ``backend`` setting;
a configuration that already forces one runs only that one) the script

1. builds the :class:`~dsv4kit.model.stack.DSv4AttentionStack` on this device at realistic sizes
   (every layer of the preset, B from the configuration, ``max_model_len`` 8192 and
   ``max_num_seqs`` 4 by default, so the page, state and indexer pools of two pipelines fit), and
   a :class:`~dsv4kit.model.pipeline.Pipeline` of it (which forgets nothing: it warms the stack's
   registry, the warmup report is recorded) plus the reference pipeline of the same seed;
2. runs a seeded :func:`~dsv4kit.model.requests.request_trace` (a fresh prompt past the
   coarsen switch at 512 tokens, requests adopted mid-serving at contexts that put C128
   boundaries in their chunks, a late arrival; chunked prefill, then decode steps padded to
   CUDA-graph sizes) with the JIT monitor in ``error`` mode, inside Triton's and CuTeDSL's own
   compile counters (expected: zero compiles after warmup);
3. compares the kernel pipeline against the reference pipeline after every step
   (:func:`~dsv4kit.model.judge.compare`: state caches, window cache, K1/K2 outputs and K3
   workspaces bit-exact; compressed caches by the compressor rule; K7 rows by the FP32 rule).

Each (configuration, backend) runs in its own process (``--only NAME --backend B``), so a device
fault in one is recorded with its log tail and the others still run; ``--jobs N`` runs N of these
processes at once on the one GPU (each holds its two pipelines' pools: size N by GPU memory).

Writes to DIR: ``report.json`` (``provenance`` and per run: settings, warmup rows, trace, op calls
per family, steps compared / conforming, the first failing verdicts, elements bit-identical per
rule, compile events, Triton and CuTeDSL compiles after warmup, wall time, ``ok``), ``report.md``
(a summary table), ``provenance.json`` (with the ``kernel_source_hash`` of every model family)
and ``run_NAME_BACKEND.json`` / ``.log`` per run. Exit code 0 iff every run conformed at every
step with zero compiles after warmup; 1 otherwise; 2 without a CUDA device, unless
``--cpu-smoke``: a 3-layer model (SWA, C4, C128) with tiny limits, Triton under the interpreter
only (CuTeDSL cannot launch on CPU), two configurations: it tests the script, not the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402
from replay_gpu import CONFIGS  # noqa: E402

from dsv4kit.bench import run_child  # noqa: E402

SCRIPT = "benchmarks/pipeline_gpu.py"
BACKENDS = ("cutedsl", "triton")
#: Configurations of the CPU smoke run (fp8_ds_mla pages with K3; bf16 plain rows at B = 64).
SMOKE_CONFIGS = ("flash-default", "flash-bf16-plain-B64")
#: Verdict strings kept per failing step in the report.
KEEP_FAILURES = 8


def log(msg: str) -> None:
    print(msg, flush=True)


def smoke_preset() -> Any:
    """Three layers (SWA, C4, C128) with DSv4-Flash's kernels and a 4096-row RoPE cache."""
    from dsv4kit.model.presets import DSV4_FLASH

    return dataclasses.replace(DSV4_FLASH, name="tiny3", num_layers=3, compress_ratios=(0, 4, 128),
                               compress_rope=dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096))


def requests(smoke: bool, max_model_len: int) -> tuple[Any, ...]:
    """The serving requests: a fresh prompt past the coarsen switch (512 tokens), two requests adopted
    at contexts whose chunks cross C128 boundaries, a late short one. Smoke: a few tokens each."""
    from dsv4kit.model.requests import Request

    if smoke:
        return (Request(6, 1), Request(5, 2, context=124))
    top = max_model_len - 64
    return (Request(1500, 4), Request(700, 6, context=min(3000, top - 706)),
            Request(300, 8, context=min(6000, top - 308)), Request(40, 6, arrival=2))


def limits(settings: dict[str, Any], smoke: bool, max_model_len: int, max_num_seqs: int) -> dict[str, Any]:
    """The stack's runtime limits: realistic on a GPU (2048-token steps), tiny for the smoke run."""
    if smoke:
        return dict(max_num_batched_tokens=16, max_num_seqs=2, max_model_len=160,
                    block_size=settings.get("block_size", 16))
    return dict(max_num_batched_tokens=2048, max_num_seqs=max_num_seqs, max_model_len=max_model_len)


def run_one(name: str, backend: str, smoke: bool, max_model_len: int, max_num_seqs: int, seed: int,
            cache_dir: str | None = None) -> dict[str, Any]:
    """One configuration on one backend: warm (from the artifact store ``cache_dir`` if given), run
    the trace against the reference pipeline."""
    from dsv4kit.backends.triton import count_triton_compiles
    from dsv4kit.jit import ArtifactStore
    from dsv4kit.model.judge import compare
    from dsv4kit.model.pipeline import Pipeline
    from dsv4kit.model.requests import request_trace
    from dsv4kit.model.stack import DSv4AttentionStack
    from dsv4kit.platform import cpu_platform, detect_platform

    settings = dict(dict(CONFIGS)[name])
    preset = smoke_preset() if smoke else settings["preset"]
    settings.pop("preset")
    settings["backend"] = settings.get("backend", backend)
    settings.update(limits(settings, smoke, max_model_len, max_num_seqs))
    platform = cpu_platform("sm_90a") if smoke else detect_platform()
    stack = DSv4AttentionStack(preset, platform, **settings)
    stack.clear_compiled()
    log(f"\n=== {name} / {backend}\n{stack.describe()}")
    out: dict[str, Any] = {"config": name, "backend": backend, "ok": False,
                           "settings": {k: str(v) for k, v in settings.items()}, "describe": stack.describe()}
    t0 = time.perf_counter()
    kernels = Pipeline(stack, seed=seed, store=None if cache_dir is None else ArtifactStore(cache_dir))
    refs = Pipeline(stack, seed=seed, backend="reference")
    warmup = kernels.report.warmup
    origins = Counter(r.get("origin") for r in warmup.rows()) if warmup else Counter()
    out.update(warmup=warmup.rows() if warmup else [], warmup_seconds=time.perf_counter() - t0,
               warmup_ok=bool(warmup and warmup.ok), store_hits=origins["hit"],
               store_compiled=origins["compiled"] if cache_dir else None)
    log(warmup.table() if warmup else "no warmup")
    trace = request_trace(stack, requests(smoke, stack.max_model_len), seed=seed)
    out["trace"] = {"steps": len(trace), "phases": dict(Counter(s.phase for s in trace)),
                    "tokens": [s.padded_tokens for s in trace],
                    "cuda_graph_steps": sum(s.cuda_graph for s in trace)}
    comparisons = []
    t0 = time.perf_counter()
    with count_triton_compiles() as tri, _cute_counter(smoke) as cute_counter:
        for step in trace:
            kernels.step(step)
            refs.step(step)
            comparisons.append(compare(kernels, refs))
            log(comparisons[-1].summary().splitlines()[0])
    out["seconds"] = time.perf_counter() - t0
    failures = [str(v) for c in comparisons for v in c.failures()]
    rules: dict[str, list[int]] = {}
    for c in comparisons:
        for rule, (same, n) in c.by_rule().items():
            tot = rules.setdefault(rule, [0, 0])
            tot[0] += same
            tot[1] += n
    report = kernels.report
    out.update({
        "steps_run": len(report.steps),
        "op_calls": sum(report.calls().values()),
        "calls": {f"{f}/{s}": n for (f, s), n in sorted(report.calls().items())},
        "family_calls": {f: sum(v) for f, v in report.family_call_series().items()},
        "history_tokens": sum(s.history_tokens for s in report.steps),
        "written": {f"{layer}/{cache}": n for (layer, cache), n in sorted(report.written().items())},
        "steps_compared": len(comparisons),
        "steps_ok": sum(c.ok for c in comparisons),
        "failures": failures[:KEEP_FAILURES],
        "rules": {rule: {"bit_identical": s, "elements": n} for rule, (s, n) in rules.items()},
        "monitor_events": [f"{e.kernel} {e.key} ({e.source})" for e in report.compile_events],
        "triton_runtime_compiles": tri.runtime_count,
        "cute_runtime_compiles": None if cute_counter is None else cute_counter.runtime_count,
        "step_seconds": [round(s.seconds, 4) for s in report.steps],
    })
    out["ok"] = bool(out["warmup_ok"] and comparisons and out["steps_ok"] == len(comparisons)
                     and report.ok and tri.runtime_count == 0
                     and (cute_counter is None or cute_counter.runtime_count == 0))
    log(f"{name} / {backend}: {'OK' if out['ok'] else 'FAILED'} ({out['seconds']:.1f} s, "
        f"{out['steps_ok']}/{len(comparisons)} steps conform, compiles after warmup: triton "
        f"{tri.runtime_count}, cute {out['cute_runtime_compiles']})")
    return out


def _cute_counter(smoke: bool) -> Any:
    """CuTeDSL's compile counter, or a context yielding None where CuTeDSL is not importable (nothing
    of it can compile) and in the smoke run (Triton only)."""
    if not smoke:
        try:
            from dsv4kit.backends.cutedsl import count_cute_compiles, import_cute

            import_cute()
            return count_cute_compiles()
        except Exception:
            pass
    return contextlib.nullcontext()


def runs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(configuration, backend) pairs: every requested backend, or only the one a configuration forces."""
    names = [n for n, _ in CONFIGS]
    chosen = args.configs.split(",") if args.configs else list(SMOKE_CONFIGS if args.cpu_smoke else names)
    bad = [n for n in chosen if n not in names]
    if bad:
        raise SystemExit(f"{SCRIPT}: unknown configuration(s) {bad}; known: {names}")
    backends = ["triton"] if args.cpu_smoke else args.backends.split(",")
    out = []
    for n in chosen:
        forced = dict(CONFIGS)[n].get("backend")
        out += [(n, forced)] if forced else [(n, b) for b in backends]
    return out


def child(args: argparse.Namespace) -> int:
    """Run one (``--only NAME``, ``--backend B``) and write ``run_NAME_B.json``."""
    path = Path(args.out) / f"run_{args.only}_{args.backend}.json"
    try:
        result = run_one(args.only, args.backend, args.cpu_smoke, args.max_model_len, args.max_num_seqs,
                         args.seed, args.cache_dir)
    except Exception as exc:  # recorded, not lost: the parent reports it with the log tail
        traceback.print_exc()
        result = {"config": args.only, "backend": args.backend, "ok": False,
                  "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    path.write_text(json.dumps(result, indent=1, default=str))
    return 0


def markdown(prov: dict[str, Any], results: list[dict[str, Any]], smoke: bool) -> str:
    where = "CPU smoke, Triton interpreter" if smoke else "GPU"
    lines = [f"# DSv4 pipeline replay on {prov.get('device')} ({where})", "",
             f"commit `{prov.get('commit')}` · {prov.get('date')} · torch {prov.get('torch')} · "
             f"triton {prov.get('triton')} · cutlass-dsl {prov.get('nvidia-cutlass-dsl')}", "",
             "| config | backend | ok | steps conforming | op calls | history tokens | compiles after warmup "
             "(monitor; triton, cute) | warmup from the store (hits / compiled) | s |", "|---" * 9 + "|"]
    for r in results:
        lines.append(
            f"| {r['config']} | {r['backend']} | {'yes' if r['ok'] else '**NO**'} | "
            f"{r.get('steps_ok', 0)}/{r.get('steps_compared', 0)} | {r.get('op_calls', 0)} | "
            f"{r.get('history_tokens', 0)} | {len(r.get('monitor_events', []))}; "
            f"{r.get('triton_runtime_compiles')}, {r.get('cute_runtime_compiles')} | "
            f"{_store_cell(r)} | {r.get('seconds', 0):.1f} |" + (f" {r['error']}" if r.get("error") else ""))
    return "\n".join(lines) + "\n"


def _store_cell(r: dict[str, Any]) -> str:
    return "-" if r.get("store_compiled") is None else f"{r.get('store_hits')} / {r['store_compiled']}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for report.json, report.md, provenance.json")
    ap.add_argument("--configs", default=None,
                    help="comma-separated replay_gpu.py configurations (default all)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default cutedsl,triton)")
    ap.add_argument("--max-model-len", type=int, default=8192, help="contexts and pool sizes (default 8192)")
    ap.add_argument("--max-num-seqs", type=int, default=4, help="sequences the pools hold (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run (default 900)")
    ap.add_argument("--cache-dir", default=None,
                    help="warm every run from this artifact store (its report counts hits / compiled)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds for the whole script: later runs are not started, the report is written")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once, each its own process on the one GPU (default 1)")
    ap.add_argument("--blocking", action="store_true", help="CUDA_LAUNCH_BLOCKING=1 in each run")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: a 3-layer model under the Triton interpreter (tests the script)")
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backend", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(f"{SCRIPT}: needs a CUDA device (or pass --cpu-smoke to test the script)", file=sys.stderr)
        return 2
    if args.only is not None:
        return child(args)
    from dsv4kit.bench import provenance, write_json
    from dsv4kit.model.hooks import model_families
    from dsv4kit.results import kernel_source_hash

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = runs(args)
    hashes = {f.name: kernel_source_hash(f.name) for f in model_families()}
    prov = provenance({"script": SCRIPT, "seed": args.seed, "jobs": args.jobs, "cache_dir": args.cache_dir,
                       "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
                       "blocking": args.blocking,
                       "cpu_smoke": args.cpu_smoke, "runs": [f"{n}/{b}" for n, b in todo],
                       "kernel_source_hash": hashes})
    write_json(out / "provenance.json", prov)
    env = {**os.environ, **({"CUDA_LAUNCH_BLOCKING": "1"} if args.blocking else {})}
    # --jobs processes share the cores: torch's CPU pool per process sized to its share
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, args.jobs))))
    start = time.perf_counter()

    def one(run: tuple[str, str]) -> dict[str, Any]:
        name, backend = run
        left = args.deadline - (time.perf_counter() - start) if args.deadline else args.timeout
        if left < 30:  # not started: the report is written in time, and says so
            log(f"{name} / {backend}: NOT RUN (deadline)")
            return {"config": name, "backend": backend, "ok": False, "error": "not run: --deadline reached"}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--only", name,
               "--backend", backend, "--seed", str(args.seed), "--max-model-len", str(args.max_model_len),
               "--max-num-seqs", str(args.max_num_seqs)] + (["--cpu-smoke"] if args.cpu_smoke else [])
        cmd += ["--cache-dir", args.cache_dir] if args.cache_dir else []
        log(f"--- {name} / {backend}")
        t0 = time.perf_counter()
        rc, text = run_child(cmd, env, min(args.timeout, left))
        (out / f"run_{name}_{backend}.log").write_text(text)
        path = out / f"run_{name}_{backend}.json"
        if rc == 0 and path.exists():
            result = json.loads(path.read_text())
        else:
            result = {"config": name, "backend": backend, "ok": False, "returncode": rc,
                      "error": text.strip().splitlines()[-1] if text.strip() else "no output"}
        if not result["ok"]:
            result["log_tail"] = text[-4000:]
        result["wall_seconds"] = round(time.perf_counter() - t0, 1)
        log(f"{name} / {backend}: {'OK' if result['ok'] else 'FAILED'} ({result['wall_seconds']:.0f} s)"
            + (f": {result['error']}" if result.get("error") else ""))
        return result

    # Runs are independent processes: --jobs of them share the GPU (the report keeps run order).
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, todo))
    write_json(out / "report.json", {"provenance": prov, "results": results})
    md = markdown(prov, results, args.cpu_smoke)
    (out / "report.md").write_text(md)
    log(md)
    return 0 if results and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
