#!/usr/bin/env python3
"""DSv4 model-level zero-runtime-JIT check on a GPU: warm every kernel, launch a serving trace.

    python3 benchmarks/replay_gpu.py --out DIR [--steps N] [--quick] [--cpu-smoke]

For each configuration below (DSv4-Flash default, MXFP4 indexer cache, plain-row KV caches,
B = 64, DSv4-Pro, forced Triton backend, a bf16 RoPE cache at runtime) the script

1. builds the :class:`~dsv4kit.model.stack.DSv4AttentionStack` on this device (the backend each
   family selects is the one its op selects: CuTeDSL on an H100/H200/B200 where importable),
   forgets anything compiled before, and warms the registered keys (report: seconds, registers);
2. replays a seeded ``all`` trace (CUDA-graph capture sizes, decode, chunked prefill, mixed
   batches, contexts up to the max model length) by **launching the public ops with real
   tensors** on every layer, with the JIT monitor in ``error`` mode and Triton's and CuTeDSL's
   compile hooks counting every compile;
3. replays the same trace in dispatch mode (keys derived on metadata stand-ins, what the CPU
   CI does) and checks that both ledgers hold the same requests, call for call.

Each configuration runs in its own process (``--only NAME``), so a device fault in one (an
illegal memory access poisons the CUDA context) is recorded with its log tail and the others
still run; ``--blocking`` sets ``CUDA_LAUNCH_BLOCKING=1`` there, so a fault is raised at the call
that caused it (the replay names step, layer, call site and shapes). ``--max-model-len`` bounds
the contexts (default: the preset's 2**20; the K3 workspace of a prefill step grows with it).

Writes to DIR: ``report.json`` (per configuration: warmup rows, calls, misses, compiles after
warmup, ledger agreement, wall time), ``report.md`` (a summary table), ``provenance.json``, and
``config_NAME.json`` / ``config_NAME.log`` per configuration.
Exit code 0 iff every configuration had zero misses, zero compiles after warmup and agreeing
ledgers. Without a GPU the script says so and exits 2, unless ``--cpu-smoke`` is given (a 4-layer
model with small limits, launched under the Triton interpreter: tests the script, not the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from dsv4kit.bench import run_child  # noqa: E402

CONFIGS: list[tuple[str, dict]] = [
    ("flash-default", dict(preset="flash")),
    ("flash-mxfp4", dict(preset="flash", indexer_cache_dtype="mxfp4")),
    ("flash-fp8-plain", dict(preset="flash", cache_dtype="fp8")),
    ("flash-bf16-plain-B64", dict(preset="flash", cache_dtype="bf16", block_size=64)),
    ("flash-B64", dict(preset="flash", block_size=64)),
    ("pro-default", dict(preset="pro")),
    ("flash-triton-forced", dict(preset="flash", backend="triton")),
    ("flash-rope-bf16", dict(preset="flash", rope_cache_dtype="bfloat16")),
]


def log(msg: str) -> None:
    print(msg, flush=True)


def tiny_preset():
    from dsv4kit.model.presets import DSV4_FLASH

    return dataclasses.replace(DSV4_FLASH, name="tiny", num_layers=4, compress_ratios=(0, 4, 128, 4),
                               compress_rope=dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096))


def run_config(name: str, settings: dict, steps: int, seed: int, smoke: bool,
               max_model_len: int | None = None) -> dict:
    from dsv4kit.backends.triton import count_triton_compiles
    from dsv4kit.jit import KeyLedger, WarmupRegistry
    from dsv4kit.model.stack import DSv4AttentionStack
    from dsv4kit.model.trace import coverage_report, make_trace, replay
    from dsv4kit.platform import detect_platform

    settings = dict(settings)
    preset = tiny_preset() if smoke else settings.pop("preset")
    settings.pop("preset", None)
    if smoke:
        settings.update(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=96,
                        block_size=settings.get("block_size", 16))
    elif max_model_len is not None:
        settings["max_model_len"] = max_model_len
    platform = detect_platform()
    registry = WarmupRegistry()
    with registry.activate():
        stack = DSv4AttentionStack(preset, platform, **settings)
    stack.clear_compiled()
    log(f"\n=== {name}\n{stack.describe()}")
    ledger = KeyLedger()
    t0 = time.perf_counter()
    with ledger:
        report = registry.warmup(progress=False, raise_on_failure=False)
    warm_s = time.perf_counter() - t0
    log(report.table())
    out: dict = {"config": name, "settings": {k: str(v) for k, v in settings.items()},
                 "describe": stack.describe(), "warmup": report.rows(), "warmup_seconds": warm_s,
                 "warmup_ok": report.ok}
    if not report.ok:
        out["ok"] = False
        return out
    trace = make_trace("all", stack, steps=steps, seed=seed)
    cute_counter = None
    try:
        from dsv4kit.backends.cutedsl import count_cute_compiles

        cute_ctx = count_cute_compiles()
    except Exception:  # CuTeDSL not importable: nothing of it can compile either
        cute_ctx = None
    t0 = time.perf_counter()
    with count_triton_compiles() as tri:
        if cute_ctx is not None:
            with cute_ctx as cute_counter:
                launched = replay(stack, trace, launch=True, mode="error", ledger=ledger)
        else:
            launched = replay(stack, trace, launch=True, mode="error", ledger=ledger)
    launch_s = time.perf_counter() - t0
    cov = coverage_report(stack, ledger, launched)
    log(cov.summary())
    dispatched_ledger = KeyLedger(warmed={k: dict(v) for k, v in ledger.warmed.items()})
    replay(stack, trace, ledger=dispatched_ledger)
    same = {k: dict(v) for k, v in dispatched_ledger.requested.items()} == {
        k: dict(v) for k, v in ledger.requested.items()}
    out.update({
        "trace": {"steps": len(trace), "phases": dict(trace.phases()),
                  "max_seq_len": launched.stats.max_seq_len,
                  "tokens_min": min(launched.stats.tokens), "tokens_max": max(launched.stats.tokens)},
        "calls": {f"{f}/{s}": n for (f, s), n in launched.stats.calls.items()},
        "launch_seconds": launch_s,
        "missed": [str(m) for m in cov.missed],
        "dead": [str(d) for d in cov.dead],
        "monitor_events": [f"{e.kernel} {e.key} ({e.source})" for e in launched.compile_events],
        "triton_runtime_compiles": tri.runtime_count,
        "cute_runtime_compiles": None if cute_counter is None else cute_counter.runtime_count,
        "requested": {k: {str(key): n for key, n in v.items()} for k, v in ledger.requested.items()},
        "dispatch_replay_matches_launch": same,
    })
    out["ok"] = bool(cov.ok and same and tri.runtime_count == 0
                     and (cute_counter is None or cute_counter.runtime_count == 0))
    log(f"{name}: {'OK' if out['ok'] else 'FAILED'} ({launch_s:.1f} s launched, ledgers agree: {same}, "
        f"runtime compiles triton {tri.runtime_count}, cute {out['cute_runtime_compiles']})")
    return out


def child(args: argparse.Namespace) -> int:
    """Run one configuration (``--only NAME``) and write ``config_NAME.json``."""
    settings = dict(CONFIGS)[args.only]
    result = run_config(args.only, settings, args.steps, args.seed, args.cpu_smoke, args.max_model_len)
    (Path(args.out) / f"config_{args.only}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for report.json, report.md, provenance.json")
    ap.add_argument("--steps", type=int, default=32, help="trace steps per phase (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="only the DSv4-Flash default configuration")
    ap.add_argument("--max-model-len", type=int, default=None, help="bound the contexts (default 2**20)")
    ap.add_argument("--blocking", action="store_true", help="CUDA_LAUNCH_BLOCKING=1 in each configuration")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per configuration (default 900)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: a 4-layer model launched under the Triton interpreter (tests the script)")
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.cpu_smoke:
        log("replay_gpu.py: no CUDA device here; run it on a GPU (or pass --cpu-smoke to test the script)")
        return 2
    if args.cpu_smoke:
        args.steps = min(args.steps, 2)
    if args.only is not None:
        return child(args)
    from dsv4kit.bench import provenance, write_json

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = CONFIGS[:1] if args.quick else CONFIGS
    if args.cpu_smoke and not args.quick:
        configs = [c for c in CONFIGS if c[0] in ("flash-default", "flash-mxfp4", "flash-bf16-plain-B64")]
    from dsv4kit.model.hooks import model_families
    from dsv4kit.results import kernel_source_hash

    prov = provenance({"script": "benchmarks/replay_gpu.py", "steps": args.steps, "seed": args.seed,
                       "max_model_len": args.max_model_len, "blocking": args.blocking,
                       "cpu_smoke": args.cpu_smoke,
                       "kernel_source_hash": {f.name: kernel_source_hash(f.name)
                                              for f in model_families()}})
    write_json(out / "provenance.json", prov)
    env = {**os.environ, **({"CUDA_LAUNCH_BLOCKING": "1"} if args.blocking else {})}
    results = []
    for name, _ in configs:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--only", name,
               "--steps", str(args.steps), "--seed", str(args.seed)]
        cmd += ["--cpu-smoke"] if args.cpu_smoke else []
        cmd += ["--max-model-len", str(args.max_model_len)] if args.max_model_len else []
        log(f"--- {name}")
        t0 = time.perf_counter()
        rc, text = run_child(cmd, env, args.timeout)
        (out / f"config_{name}.log").write_text(text)
        path = out / f"config_{name}.json"
        if rc == 0 and path.exists():
            results.append(json.loads(path.read_text()))
        else:
            results.append({"config": name, "ok": False, "returncode": rc,
                            "error": text.strip().splitlines()[-1] if text.strip() else "no output",
                            "log_tail": text[-4000:]})
        log(f"{name}: {'OK' if results[-1]['ok'] else 'FAILED'} ({time.perf_counter() - t0:.0f} s)"
            + ("" if results[-1]["ok"] else f": {results[-1].get('error', '')}"))
    write_json(out / "report.json", {"provenance": prov, "results": results})
    where = "CPU smoke, interpreter" if args.cpu_smoke else "GPU"
    lines = [f"# DSv4 replay on {prov.get('device')} ({where})",
             "", f"commit `{prov.get('commit')}` · {prov.get('date')} · torch {prov.get('torch')} · "
             f"triton {prov.get('triton')} · cutlass-dsl {prov.get('nvidia-cutlass-dsl')}", "",
             "| config | ok | backends | keys | calls launched | missed | compiles after warmup | "
             "ledgers agree | launch s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        backends = sorted({row["backend"] for row in r.get("warmup", [])})
        lines.append(f"| {r['config']} | {'yes' if r['ok'] else '**NO**'} | {', '.join(backends)} | "
                     f"{len(r.get('warmup', []))} | {sum(r.get('calls', {}).values())} | "
                     f"{len(r.get('missed', []))} | "
                     f"{len(r.get('monitor_events', []))} (triton {r.get('triton_runtime_compiles')}, cute "
                     f"{r.get('cute_runtime_compiles')}) | {r.get('dispatch_replay_matches_launch')} | "
                     f"{r.get('launch_seconds', 0):.1f} |" + (f" {r['error']}" if "error" in r else ""))
    (out / "report.md").write_text("\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
