#!/usr/bin/env python3
"""Indexer-Q (K1 FP8, K2 MXFP4) on a GPU: both backends bit for bit vs the CPU reference, zero compiles.

    python3 benchmarks/indexer_q_gpu_check.py --out DIR_OR_FILE.json [--cases 60]
    python3 benchmarks/indexer_q_gpu_check.py --out DIR --cpu-smoke      # this script's paths, on CPU

1. warms every key of both variants in both backends (registry, as a model would);
2. numerics: ``--cases`` random cases per (backend, variant), awkward token counts, every regime
   of spec §2.12, both cos_sin dtypes, plus the real 1 048 576-row YaRN cache; each compared bit
   for bit with the PyTorch reference computed on the CPU;
3. replays a serving trace of token counts with the monitor in ``error`` mode while counting
   Triton and CuTeDSL compiles (expected: zero).

Bandwidth is ``dsv4kit bench --family indexer_q`` (the one sweep, bytes model and results
schema of :mod:`dsv4kit.bench`). Writes ``indexer_q_gpu_check.json`` (``--out`` a directory) or
the ``.json`` file given. Exit code 0 iff every case is bit-exact and nothing compiled after
warmup; 2 without a CUDA device unless ``--cpu-smoke`` (Triton interpreter only, a few small
cases and no YaRN cache: tests the script, not the GPU).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.bench import no_cuda_for, provenance, write_json  # noqa: E402
from dsv4kit.formats.rope import YarnConfig, build_cos_sin_cache  # noqa: E402
from dsv4kit.jit import JitMonitor, KeyLedger, WarmupRegistry  # noqa: E402
from dsv4kit.kernels.indexer_q import SPEC, IndexerQConfig  # noqa: E402
from dsv4kit.kernels.indexer_q.cases import REGIMES, make_case  # noqa: E402
from dsv4kit.kernels.indexer_q.reference import indexer_q_fp8_reference, indexer_q_mxfp4_reference  # noqa: E402

FAMILY = "indexer_q"
BACKENDS = ("triton", "cutedsl")
FORMATS = ("fp8", "mxfp4")
REFERENCE = {"fp8": indexer_q_fp8_reference, "mxfp4": indexer_q_mxfp4_reference}

_LINES: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)
    _LINES.append(msg)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bits(got, want) -> bool:
    return all(torch.equal(_bits(g.cpu()), _bits(w.cpu())) for g, w in zip(got, want, strict=True))


class Run:
    """Device, platform and backends of one run; ``kernel(fmt, backend)`` is the family's object."""

    def __init__(self, device: str, platform: Any, backends: tuple[str, ...]) -> None:
        self.device, self.platform, self.backends = device, platform, backends

    def kernel(self, fmt: str, backend: str):
        return SPEC.kernel(fmt, self.device, backend, self.platform)

    def each(self):
        return ((b, f) for b in self.backends for f in FORMATS)


def warm_all(run: Run, max_tokens: int) -> dict:
    registry = WarmupRegistry()
    with registry.activate():
        for backend, fmt in run.each():
            run.kernel(fmt, backend).register_warmup(
                IndexerQConfig(max_num_batched_tokens=max_tokens, indexer_cache_dtype=fmt))
    t0 = time.perf_counter()
    report = registry.warmup(progress=False)
    log(report.table())
    return {"seconds": time.perf_counter() - t0, "rows": report.rows()}


def numerics(run: Run, n_cases: int, sizes: list[int], max_t: int, yarn: bool) -> list[dict]:
    rng = random.Random(0)
    out = []
    for backend, fmt in run.each():
        kernel = run.kernel(fmt, backend)
        ok = 0
        for i in range(n_cases):
            t = sizes[i % len(sizes)] if i < 2 * len(sizes) else rng.randint(1, max_t)
            regime = REGIMES[i % len(REGIMES)]
            cs_dtype = (torch.float32, torch.bfloat16)[(i // len(REGIMES)) % 2]
            case = make_case(t, cs_dtype, regime, seed=1000 + i)
            want = REFERENCE[fmt](*case.args())
            got = kernel(*case.to(run.device).args())
            good = same_bits(got, want)
            ok += good
            if not good:
                log(f"MISMATCH {backend} {fmt} T={t} {regime} {cs_dtype}")
        out.append({"backend": backend, "format": fmt, "cases": n_cases, "bit_exact": ok})
        log(f"{backend:8s} {fmt:6s} bit-exact {ok}/{n_cases}")
    if yarn:  # one case on the real YaRN cache of the compressed layers (1 048 576 rows, fp32)
        case = make_case(300, seed=7, max_pos=1 << 20)
        case.cos_sin_cache = build_cos_sin_cache(1 << 20, 160_000.0, yarn=YarnConfig())
        for backend, fmt in run.each():
            got = run.kernel(fmt, backend)(*case.to(run.device).args())
            good = same_bits(got, REFERENCE[fmt](*case.args()))
            out.append({"backend": backend, "format": fmt, "cases": 1, "bit_exact": int(good),
                        "note": "real 1M-row YaRN cache"})
            log(f"{backend:8s} {fmt:6s} real YaRN cache bit-exact: {good}")
    return out


def replay(run: Run, trace: list[int]) -> dict:
    from dsv4kit.backends.cutedsl import count_cute_compiles
    from dsv4kit.backends.triton import count_triton_compiles

    calls = 0
    with KeyLedger() as ledger, count_triton_compiles() as tc, count_cute_compiles() as cc, \
            JitMonitor("error") as mon:
        for backend, fmt in run.each():
            kernel = run.kernel(fmt, backend)
            ledger.add_warmed(kernel.name, kernel.compiled_keys())
        for i, t in enumerate(trace):
            case = make_case(t, (torch.float32, torch.bfloat16)[i % 2], seed=i).to(run.device)
            for backend, fmt in run.each():
                run.kernel(fmt, backend)(*case.args())
                calls += 1
        if run.device == "cuda":
            torch.cuda.synchronize()
    res = {"calls": calls, "triton_compiles": tc.count, "cute_compiles": cc.count,
           "monitor_events": len(mon.events), "missed": {k: len(v) for k, v in ledger.missed().items()},
           "requested_keys": {k: len(v) for k, v in ledger.requested.items()}}
    log(f"replay: {res}")
    return res


def serving_trace(smoke: bool) -> list[int]:
    rng = random.Random(1)
    if smoke:
        return [1, 7, 40, 512]       # one call at the coarsening threshold (COARSEN_AT)
    decode = [rng.randint(1, 256) for _ in range(60)]
    prefill = [rng.randint(256, 8192) for _ in range(30)]
    return decode + prefill + [511, 512]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a .json file, or a directory for indexer_q_gpu_check.json")
    ap.add_argument("--cases", type=int, default=60, help="random cases per (backend, variant)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="a few small cases on CPU under the Triton interpreter (tests the script)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out = out if out.suffix == ".json" else out / "indexer_q_gpu_check.json"
    if not args.cpu_smoke and no_cuda_for("indexer_q_gpu_check"):
        return 2
    from dsv4kit.platform import cpu_platform, current_platform
    from dsv4kit.results import kernel_source_files, kernel_source_provenance

    _LINES.clear()
    platform = cpu_platform() if args.cpu_smoke else current_platform()
    device = "cpu" if args.cpu_smoke else "cuda"
    backends = ("triton",) if args.cpu_smoke else BACKENDS   # CuTeDSL kernels run only on a GPU
    run = Run(device, platform, backends)
    prov = provenance({"kernel": "indexer_q_rope_quant (K1 FP8, K2 MXFP4)",
                       **kernel_source_provenance([FAMILY]),
                       "kernel_source_files": kernel_source_files(FAMILY), "arch": platform.arch,
                       "script": "benchmarks/indexer_q_gpu_check.py", "cpu_smoke": args.cpu_smoke})
    result: dict = {"provenance": prov, "args": vars(args)}
    log(str(prov))
    n_cases = min(args.cases, 4) if args.cpu_smoke else args.cases
    sizes, max_t = ([1, 7, 33], 80) if args.cpu_smoke else ([1, 7, 32, 257, 511, 512, 513], 3000)
    result["warmup"] = warm_all(run, 1024 if args.cpu_smoke else 65536)
    result["numerics"] = numerics(run, n_cases, sizes, max_t, yarn=not args.cpu_smoke)
    result["replay"] = replay(run, serving_trace(args.cpu_smoke))
    ok = all(r["bit_exact"] == r["cases"] for r in result["numerics"])
    ok &= result["replay"]["triton_compiles"] == 0 and not result["replay"]["cute_compiles"]
    ok &= not result["replay"]["missed"] and not result["replay"]["monitor_events"]
    result["pass"] = ok
    log(f"ALL CHECKS {'PASS' if ok else 'FAIL'}")
    log("bandwidth: python3 -m dsv4kit bench --family indexer_q")
    result["log"] = list(_LINES)
    write_json(out, result)
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
