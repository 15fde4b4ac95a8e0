#!/usr/bin/env python3
"""K3 dequantize-and-gather on a GPU: both backends bit for bit vs the CPU reference, zero compiles.

    python3 benchmarks/dequant_gather_gpu_check.py --out DIR [--cases 60]
    python3 benchmarks/dequant_gather_gpu_check.py --out DIR --cpu-smoke   # this script's paths, on CPU

Writes to DIR:

* ``numerics.json``   both backends vs the PyTorch reference computed on the CPU over the
                      exhaustive scale-byte table case and ``--cases`` random cases (>= 50; block
                      sizes 1 / 2 / 64 / 256, padded page strides, gather_lens or not, offsets):
                      BIT-EXACT, and every row the call must not write still holds the 0xA5
                      sentinel; a failure names where the outputs differ;
* ``coverage.json``   per backend: warmup of the DSv4-Flash keys, then a replayed prefill trace
                      under the JIT monitor in ``error`` mode, compiles counted by Triton's and
                      CuTeDSL's hooks (expected: zero), the keys the trace missed;
* ``provenance.json`` device, versions, date, commit, kernel source hash;
* ``summary.json``    whether the numerics are exact and nothing compiled after warmup, seconds.

Bandwidth is ``dsv4kit bench --family dequant_gather`` (the one sweep, bytes model and results
schema of :mod:`dsv4kit.bench`; its CUDA-graph harness is the fixed one of NOTES.md, and
``benchmarks/k3_fault_probe.py`` reproduces the old harness's fault on purpose).

The CuTeDSL part runs only where its kernel is available. Exit code 0 iff both checks pass; 2
without a CUDA device, unless ``--cpu-smoke`` (Triton interpreter, a few cases and a short
trace: tests the script; its results mean nothing for the GPU).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

FAMILY = "dequant_gather"


def log(msg: str) -> None:
    print(msg, flush=True)


def diff_report(got: torch.Tensor, want: torch.Tensor, written: torch.Tensor) -> str:
    """Where two outputs differ (for debugging a kernel remotely): counts and the first few elements."""
    g, w = got.view(torch.int16), want.view(torch.int16)
    bad = (g != w).nonzero()
    rows_bad = (g != w).any(-1)
    parts = [f"{len(bad)} elements differ in {int(rows_bad.sum())} rows "
             f"({int((rows_bad & ~written).sum())} of them rows that must stay untouched); "
             f"nope dims {int((bad[:, 2] < 448).sum())}, rope dims {int((bad[:, 2] >= 448).sum())}"]
    for b, r, d in bad[:6].tolist():
        gv, wv = int(g[b, r, d]) & 0xFFFF, int(w[b, r, d]) & 0xFFFF
        parts.append(f"[{b},{r},{d}] got {gv:#06x} want {wv:#06x}")
    return "; ".join(parts)


def section_numerics(ks: dict, device: str, n_cases: int) -> dict:
    from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as ref
    from dsv4kit.kernels.dequant_gather.cases import SENTINEL, make_case, same_bits, table_case

    rnd = random.Random(1234)
    results = {name: {"cases": 0, "exact": 0, "failures": []} for name in ks}
    for i in [None, *range(n_cases)]:
        if i is None:
            case = table_case()
        else:
            bs = rnd.choice([1, 2, 64, 256])
            nreq = rnd.randint(1, 6)
            seq = [rnd.choice([0, 1, rnd.randint(1, 4 * bs + 9)]) for _ in range(nreq)]
            gl = [rnd.randint(0, n) for n in seq] if rnd.random() < 0.5 else None
            stride = None if rnd.random() < 0.5 else (-(-bs * 584 // 576) + rnd.randint(0, 3)) * 576
            case = make_case(seq, gl, offset=rnd.randint(0, 9), block_size=bs, page_stride=stride,
                             content=rnd.choice(["encoded", "bytes"]), seed=i)
        want = ref(*case.args(case.fresh_out()))
        dev_case = case.to(device)
        for name, k in ks.items():
            got = dev_case.fresh_out()
            why = ""
            try:
                k(*dev_case.args(got), debug_checks=True)
                got = got.cpu()
                untouched = got.view(torch.uint8)[~case.written_mask()]
                ok = same_bits(got, want) and bool((untouched == SENTINEL).all())
                if not ok:
                    why = diff_report(got, want, case.written_mask())
            except Exception as exc:
                ok = False
                why = f"{type(exc).__name__}: {exc}"
            results[name]["cases"] += 1
            results[name]["exact"] += int(ok)
            if not ok and len(results[name]["failures"]) < 10:
                results[name]["failures"].append(f"{case.label}: {why}")
    for name, r in results.items():
        log(f"numerics {name:8s}: {r['exact']}/{r['cases']} cases bit-exact")
    return results


def section_coverage(ks: dict, platform, trace: dict) -> dict:
    from dsv4kit.jit import JitMonitor, KeyLedger, WarmupRegistry
    from dsv4kit.kernels.dequant_gather import SPEC, DequantGatherConfig
    from dsv4kit.kernels.dequant_gather.cases import prefill_trace
    from dsv4kit.model.presets import DSV4_FLASH

    report: dict = {}
    for name, k in ks.items():
        k.clear_cache()
        reg = WarmupRegistry()
        with reg.activate():
            for ratio in DSV4_FLASH.compress_ratios:
                SPEC.register(DequantGatherConfig.for_layer(DSV4_FLASH, ratio), platform=platform,
                              backend=name)
        ledger = KeyLedger()
        with ledger:
            t0 = time.perf_counter()
            warm = reg.warmup(progress=False)
            warm_s = time.perf_counter() - t0
            if name == "triton":
                from dsv4kit.backends.triton import count_triton_compiles as counter
            else:
                from dsv4kit.backends.cutedsl import count_cute_compiles as counter
            calls, error = 0, None
            with counter() as cnt, JitMonitor("error") as mon:
                try:
                    for call in prefill_trace(DSV4_FLASH, seed=3, **trace):
                        c = call.case.to(platform.device)
                        k(*c.args())
                        calls += 1
                    if platform.is_cuda:
                        torch.cuda.synchronize()
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
        report[name] = {
            "warmed_keys": [str(kk) for kk in reg.keys().get(k.name, [])],
            "warmup_seconds": warm_s,
            "per_key": [{"key": str(r.key), "seconds": r.seconds, "registers": r.info.get("registers"),
                         "spills": r.info.get("spills"), "error": r.error}
                        for kr in warm.kernels for r in kr.keys],
            "trace_calls": calls,
            "compiles_after_warmup": cnt.runtime_count,
            "monitor_events": [str(e) for e in mon.events],
            "missed": {kk: [str(x) for x in v] for kk, v in ledger.missed().items()},
            "error": error,
        }
        log(f"coverage {name:8s}: {calls} trace calls, {cnt.runtime_count} compiles after warmup, "
            f"missed {report[name]['missed'] or 'none'}, error {error}")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for the result files")
    ap.add_argument("--cases", type=int, default=60, help="random numerics cases (>= 50)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny run under the Triton interpreter")
    a = ap.parse_args(argv)

    from dsv4kit.bench import backend_kernels, no_cuda_for, provenance
    from dsv4kit.kernels import family
    from dsv4kit.platform import cpu_platform, current_platform
    from dsv4kit.results import kernel_source_files, kernel_source_provenance

    if not a.cpu_smoke and no_cuda_for("dequant_gather_gpu_check"):
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    platform = cpu_platform() if a.cpu_smoke else current_platform()
    device = "cpu" if a.cpu_smoke else "cuda"
    prov = provenance({"kernel": "dequantize_and_gather_k_cache (K3)", **kernel_source_provenance([FAMILY]),
                       "kernel_source_files": kernel_source_files(FAMILY), "arch": platform.arch,
                       "script": "benchmarks/dequant_gather_gpu_check.py", "live": True,
                       "cpu_smoke": a.cpu_smoke})
    (a.out / "provenance.json").write_text(json.dumps(prov, indent=1))
    log(json.dumps(prov))
    t0 = time.perf_counter()
    ks = backend_kernels(family(FAMILY), platform, log=log)
    if a.cpu_smoke:
        ks.pop("cutedsl", None)  # CuTeDSL kernels run only on a GPU
    trace = (dict(steps=1, max_len=300, max_requests=2) if a.cpu_smoke
             else dict(steps=6, max_len=3000, max_requests=4))
    n_cases = min(a.cases, 4) if a.cpu_smoke else a.cases
    status = 0
    summary: dict = {}
    for name, fn in (("numerics", lambda: section_numerics(ks, device, n_cases)),
                     ("coverage", lambda: section_coverage(ks, platform, trace))):
        try:
            summary[name] = fn()
        except Exception:
            summary[name] = {"error": traceback.format_exc()}
            log(summary[name]["error"])
            status = 1
        (a.out / f"{name}.json").write_text(json.dumps(summary[name], indent=1, default=str))
    ok_num = bool(ks) and all(isinstance(r, dict) and r.get("exact") == r.get("cases")
                              for r in summary["numerics"].values())
    ok_cov = bool(ks) and all(isinstance(r, dict) and r.get("compiles_after_warmup") == 0
                              and not r.get("error") and not r.get("missed")
                              for r in summary["coverage"].values())
    total_s = time.perf_counter() - t0
    (a.out / "summary.json").write_text(json.dumps({
        "numerics_exact": ok_num, "zero_compiles_after_warmup": ok_cov, "backends": list(ks),
        "seconds": total_s}, indent=1))
    log(f"\nnumerics exact: {ok_num}; zero compiles after warmup: {ok_cov}; total {total_s:.0f}s; "
        f"results in {a.out}")
    log("bandwidth: python3 -m dsv4kit bench --family dequant_gather")
    return status if (ok_num and ok_cov) else 1


if __name__ == "__main__":
    sys.exit(main())
