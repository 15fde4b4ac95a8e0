#!/usr/bin/env python3
"""K3 dequantize-and-gather on a GPU: numerics, zero post-warmup compiles, bandwidth.

    python3 benchmarks/dequant_gather.py --out DIR [--quick] [--graph-harness dsv4kit|triton]

Writes to DIR:

* ``numerics.json``   both backends vs the PyTorch reference over >= 50 random cases (BIT-EXACT,
                      untouched rows checked against the 0xA5 sentinel);
* ``coverage.json``   warmup of the DSv4-Flash keys, then a replayed prefill trace under the JIT
                      monitor in ``error`` mode: compiles counted by Triton's and CuTeDSL's hooks;
* ``bandwidth.csv``   a sweep of keys x requests x rows per request: median time of CUDA-graph
                      replays (``dsv4kit.bench``; no launch gaps) and of CUDA events with the L2
                      flushed before each run (``do_bench``), GB/s from the bytes model below (of
                      the graph median), and the fraction of the device-to-device copy bandwidth
                      measured in the same run; also the PyTorch reference and ``torch.compile``
                      of it (events, no graphs: they synchronize) where they are affordable;
* ``bandwidth.png``   GB/s against rows gathered, per backend and key;
* ``provenance.json`` device, versions, date, commit, kernel source hash, timing harness;
* ``summary.json``    copy ceiling, the largest point per implementation, status and seconds.

Timing harness: ``dsv4kit.bench.bench_median_ms``, whose graph replays wait for the work queued
on the current stream (the inputs of a point are created there just before it is timed).
``--graph-harness triton`` times with ``triton.testing.do_bench_cudagraph`` instead, the harness
before the fix, whose side stream does not wait: that is the full-sweep fault of NOTES.md, kept
selectable only to reproduce it.

Bytes model per gathered row: reads 448 code bytes + 128 rope bytes + 7 scale bytes, writes
1024 bytes (512 bf16); plus one 4-byte block-table entry per page touched. (The kernels load the
pad byte with the scales; it is not counted, nor are the per-request length reads.)

The CuTeDSL part runs only if ``import cutlass`` works. Without a GPU the script says so and
exits 2, unless ``--cpu-smoke`` is given (tiny sizes under the Triton interpreter, to test the
script itself; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

READ_BYTES_PER_ROW = 448 + 128 + 7
WRITE_BYTES_PER_ROW = 1024
SENTINEL = 0xA5
#: Seconds torch.compile of the reference may take in total before the script stops using it.
COMPILE_BUDGET_S = 120.0


# --------------------------------------------------------------------------- helpers


#: Log each sweep point before timing it (set DSV4KIT_BENCH_TRACE=1 to find a faulting launch).
TRACE = os.environ.get("DSV4KIT_BENCH_TRACE") == "1"


def log(msg: str) -> None:
    print(msg, flush=True)


def cutlass_available() -> tuple[bool, str]:
    try:
        import cutlass  # noqa: F401

        return True, getattr(cutlass, "__version__", "unknown")
    except Exception as exc:  # ImportError or a broken install
        return False, f"{type(exc).__name__}: {exc}"


#: Which CUDA-graph timing ``bench_ms`` uses ("dsv4kit", or "triton" to reproduce the fault).
GRAPH_HARNESS = "dsv4kit"


def bench_ms(fn, device: str, quick: bool, graph: bool = True) -> float:
    """Median milliseconds of ``fn``: on a GPU the harness's CUDA-graph replay (no launch gaps)
    when ``graph``, else CUDA events with the L2 flushed before every run; wall clock on CPU."""
    if device == "cuda":
        if graph and GRAPH_HARNESS == "triton":
            import triton.testing

            return float(triton.testing.do_bench_cudagraph(fn, rep=50 if quick else 200,
                                                           return_mode="median"))
        if graph:
            from dsv4kit.bench import bench_median_ms

            return bench_median_ms(fn, graph=True, rep_ms=50 if quick else 200)
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100,
                                             return_mode="median"))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[1]


def copy_bandwidth(device: str, quick: bool) -> float:
    """Device-to-device copy GB/s (read + write counted), measured in this run."""
    if device == "cuda":
        from dsv4kit.bench import copy_bandwidth_gbs

        return copy_bandwidth_gbs((512 << 20) if quick else (2 << 30))
    src = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), device, quick)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def random_cache(num_pages: int, bs: int, device: str, gen: torch.Generator, stride: int | None = None):
    """A cache whose every entry holds random bytes: non-NaN codes, scale bytes 105..254, pad 0."""
    from dsv4kit.formats.ds_mla import allocate_ds_cache, ds_page_regions

    cache = allocate_ds_cache(num_pages, bs, page_stride=stride, fill=SENTINEL, device=device)
    data, scales = ds_page_regions(cache)
    codes = torch.randint(0, 0x7F, (num_pages, bs, 448), generator=gen, device=device, dtype=torch.int32)
    sign = torch.randint(0, 2, (num_pages, bs, 448), generator=gen, device=device, dtype=torch.int32) << 7
    data[:, :, :448] = (codes | sign).to(torch.uint8)
    data[:, :, 448:] = torch.randint(0, 256, (num_pages, bs, 128), generator=gen, device=device,
                                     dtype=torch.int32).to(torch.uint8)
    scales[:, :, :7] = torch.randint(105, 255, (num_pages, bs, 7), generator=gen, device=device,
                                     dtype=torch.int32).to(torch.uint8)
    scales[:, :, 7] = 0
    return cache


def bench_inputs(nreq: int, rows: int, bs: int, with_g: bool, device: str, seed: int):
    """Inputs of one sweep point: ``rows`` rows per request; a window call reads the last
    ``rows`` of ``rows + 1000`` entries at offset 64, a compressed call all ``rows`` at offset 0."""
    gen = torch.Generator(device=device).manual_seed(seed)
    length = rows + 1000 if with_g else rows
    blocks = -(-length // bs)
    num_pages = nreq * blocks + 1
    cache = random_cache(num_pages, bs, device, gen)
    perm = torch.randperm(num_pages, generator=gen, device=device)[: nreq * blocks]
    bt = perm.view(nreq, blocks).to(torch.int32).contiguous()
    seq = torch.full((nreq,), length, dtype=torch.int32, device=device)
    g = torch.full((nreq,), rows, dtype=torch.int32, device=device) if with_g else None
    offset = 64 if with_g else 0
    out = torch.empty((nreq, offset + rows, 512), dtype=torch.bfloat16, device=device)
    pages_touched = nreq * (-(-rows // bs) + (1 if with_g else 0))
    nbytes = nreq * rows * (READ_BYTES_PER_ROW + WRITE_BYTES_PER_ROW) + 4 * pages_touched
    return (out, cache, seq, g, bt, bs, offset), nbytes


# --------------------------------------------------------------------------- sections


def kernels(platform) -> dict:
    from dsv4kit.bench import backend_kernels
    from dsv4kit.kernels import family

    return backend_kernels(family("dequant_gather"), platform, log=log)


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


def section_numerics(ks, device: str, n_cases: int) -> dict:
    from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as ref
    from dsv4kit.kernels.dequant_gather.cases import SENTINEL as S
    from dsv4kit.kernels.dequant_gather.cases import make_case, same_bits, table_case

    rnd = random.Random(1234)
    results = {name: {"cases": 0, "exact": 0, "failures": []} for name in ks}
    specs = [("table", None)] + [("random", i) for i in range(n_cases)]
    for kind, i in specs:
        if kind == "table":
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
                ok = same_bits(got, want) and bool((got.view(torch.uint8)[~case.written_mask()] == S).all())
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


def section_coverage(ks, platform) -> dict:
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
                    for call in prefill_trace(DSV4_FLASH, steps=6, max_len=3000, max_requests=4, seed=3):
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


def section_bandwidth(ks, device: str, quick: bool, out_dir: Path) -> tuple[list[dict], float]:
    from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as ref

    copy_gbps = copy_bandwidth(device, quick)
    log(f"device-to-device copy: {copy_gbps:.0f} GB/s")
    keys = [(256, True), (64, False), (2, False)]
    if device == "cuda":
        nreqs, rows_list = (1, 16, 64), (128, 2048, 16384)
        if not quick:
            nreqs, rows_list = (1, 4, 16, 64), (128, 1024, 4096, 16384)
    else:
        nreqs, rows_list = (1, 2), (8, 24)
    compiled_ref = None
    if device == "cuda":
        try:
            compiled_ref = torch.compile(ref, dynamic=True)
        except Exception as exc:
            log(f"torch.compile unavailable: {exc}")
    rows_out = []
    compile_spent = 0.0
    for bs, with_g in keys:
        for nreq in nreqs:
            for rows in rows_list:
                args, nbytes = bench_inputs(nreq, rows, bs, with_g, device, seed=nreq * 7 + rows)
                total = nreq * rows
                entries = {}
                for name, k in ks.items():
                    key = k.dispatch(args[1], args[3])
                    launch = k.launch_args(key, *args[:5], args[6])
                    exe = k._get_or_compile(key)
                    entries[name] = lambda exe=exe, launch=launch: exe(*launch)
                small = total <= (1 << 15)
                if small:
                    entries["reference"] = lambda args=args: ref(*args)
                    if compiled_ref is not None and total <= (1 << 13) and compile_spent < COMPILE_BUDGET_S:
                        t_c = time.perf_counter()
                        try:
                            compiled_ref(*args)   # compile (and recompile per shape) outside the timing
                            entries["torch.compile(reference)"] = lambda args=args, f=compiled_ref: f(*args)
                        except Exception as exc:
                            log(f"torch.compile(reference) failed: {type(exc).__name__}: {str(exc)[:200]}")
                            compiled_ref = None
                        compile_spent += time.perf_counter() - t_c
                for name, fn in entries.items():
                    is_kernel = name in ks
                    err = ""
                    if TRACE:
                        log(f"  timing bs={bs} gather={with_g} nreq={nreq} rows={rows} {name}")
                    try:
                        ms = bench_ms(fn, device, quick, graph=is_kernel)
                        cold = bench_ms(fn, device, quick, graph=False) if is_kernel else ms
                    except Exception as exc:
                        ms = cold = float("nan")
                        err = f"{type(exc).__name__}: {str(exc)[:120]}"
                    gbps = nbytes / (ms * 1e-3) / 1e9 if ms == ms else float("nan")
                    rows_out.append({"block_size": bs, "has_gather_lens": with_g, "nreq": nreq,
                                     "rows_per_request": rows, "rows": total, "bytes": nbytes, "impl": name,
                                     "median_us": ms * 1e3, "GBps": gbps,
                                     "fraction_of_copy": gbps / copy_gbps,
                                     "median_us_events_l2_flushed": cold * 1e3,
                                     "timing": f"cuda-graph replay ({GRAPH_HARNESS})"
                                     if is_kernel and device == "cuda"
                                     else ("events" if device == "cuda" else "cpu wall clock"),
                                     "error": err})
                del args
    with open(out_dir / "bandwidth.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_out[0]))
        w.writeheader()
        w.writerows(rows_out)
    return rows_out, copy_gbps


def figure(rows: list[dict], copy_gbps: float, out_dir: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        log(f"no figure: matplotlib unavailable ({exc})")
        return
    keys = sorted({(r["block_size"], r["has_gather_lens"]) for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), sharey=True)
    axes = list(axes) if len(keys) > 1 else [axes]
    for ax, (bs, g) in zip(axes, keys, strict=True):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = sorted((r["rows"], r["GBps"]) for r in rows
                         if r["impl"] == impl and r["block_size"] == bs and r["has_gather_lens"] == g)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=impl, ms=3)
        ax.axhline(copy_gbps, color="k", ls="--", lw=1, label="D2D copy")
        ax.set_xscale("log")
        ax.set_title(f"key (block_size={bs}, has_gather_lens={g})")
        ax.set_xlabel("rows gathered (all requests)")
    axes[0].set_ylabel("GB/s (bytes model)")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "bandwidth.png", dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--quick", action="store_true", help="a smaller sweep")
    ap.add_argument("--cases", type=int, default=60, help="random numerics cases (>= 50)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny run under the Triton interpreter")
    ap.add_argument("--graph-harness", choices=["dsv4kit", "triton"], default="dsv4kit",
                    help="CUDA-graph timing: dsv4kit.bench (default) or triton's do_bench_cudagraph "
                         "(the harness before the fix; only to reproduce the full-sweep fault)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    global GRAPH_HARNESS
    GRAPH_HARNESS = a.graph_harness

    from dsv4kit.platform import current_platform

    platform = current_platform()
    if not platform.is_cuda and not a.cpu_smoke:
        log("no CUDA device: this benchmark needs a GPU (use --cpu-smoke to test the script)")
        return 2
    device = "cuda" if platform.is_cuda else "cpu"
    ok, _ = cutlass_available()
    from dsv4kit.bench import provenance
    from dsv4kit.results import kernel_source_files, kernel_source_hash

    prov = provenance({"kernel": "dequantize_and_gather_k_cache (K3)", "family": "dequant_gather",
                       "kernel_source_hash": kernel_source_hash("dequant_gather"),
                       "kernel_source_files": kernel_source_files("dequant_gather"),
                       "arch": platform.arch, "cutlass_importable": ok, "live": True,
                       "cpu_smoke": a.cpu_smoke, "quick": a.quick,
                       "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING", "0"),
                       "graph_harness": ("dsv4kit.bench.bench_median_ms" if a.graph_harness == "dsv4kit"
                                         else "triton.testing.do_bench_cudagraph"),
                       "copy_ceiling": "dsv4kit.bench.copy_bandwidth_gbs: triton.testing.do_bench "
                                       "median of dst.copy_(src), read + write bytes"})
    (a.out / "provenance.json").write_text(json.dumps(prov, indent=1))
    log(json.dumps(prov))
    t0 = time.perf_counter()
    ks = kernels(platform)
    if device == "cpu":
        ks.pop("cutedsl", None)  # CuTeDSL kernels run only on a GPU

    status = 0
    summary: dict = {}
    rows: list[dict] = []
    copy_gbps = float("nan")
    bandwidth_error = None
    for name, fn in (("numerics", lambda: section_numerics(ks, device, a.cases if device == "cuda" else 6)),
                     ("coverage", lambda: section_coverage(ks, platform))):
        try:
            summary[name] = fn()
        except Exception:
            summary[name] = {"error": traceback.format_exc()}
            log(summary[name]["error"])
            status = 1
        (a.out / f"{name}.json").write_text(json.dumps(summary[name], indent=1, default=str))
    try:
        rows, copy_gbps = section_bandwidth(ks, device, a.quick or a.cpu_smoke, a.out)
        figure(rows, copy_gbps, a.out, f"K3 dequant-gather on {platform.device_name}, {prov['date']}, "
                                       f"commit {prov['commit'][:10]}")
        log(f"\n{'key':>12} {'nreq':>5} {'rows/req':>8} {'impl':>26} {'us':>9} {'GB/s':>7} {'of copy':>7}")
        for r in rows:
            key = str((r["block_size"], r["has_gather_lens"]))
            log(f"{key:>12} {r['nreq']:>5} {r['rows_per_request']:>8} {r['impl']:>26} {r['median_us']:>9.1f} "
                f"{r['GBps']:>7.0f} {r['fraction_of_copy']:>7.2f}")
    except Exception:
        bandwidth_error = traceback.format_exc()
        log(bandwidth_error)
        status = 1
    ok_num = all(r.get("exact") == r.get("cases") for r in summary.get("numerics", {}).values()
                 if isinstance(r, dict))
    ok_cov = all(isinstance(r, dict) and r.get("compiles_after_warmup") == 0 and not r.get("error")
                 and not r.get("missed") for r in summary.get("coverage", {}).values())
    total_s = time.perf_counter() - t0
    if any(r["error"] for r in rows):
        status = 1   # a point that raised while timing is not a completed sweep
    largest: dict = {}
    for r in rows:
        if r["impl"] in ks and (r["impl"] not in largest or r["rows"] > largest[r["impl"]]["rows"]
                                or (r["rows"] == largest[r["impl"]]["rows"]
                                    and r["GBps"] > largest[r["impl"]]["GBps"])):
            largest[r["impl"]] = r
    (a.out / "summary.json").write_text(json.dumps({
        "copy_GBps": copy_gbps, "sweep_points": len(rows),
        "timing_errors": [r for r in rows if r["error"]],
        "largest_point_best_key": {k: {f: r[f] for f in ("block_size", "has_gather_lens", "nreq",
                                                         "rows_per_request", "GBps", "fraction_of_copy",
                                                         "median_us")} for k, r in largest.items()},
        "numerics_exact": ok_num, "zero_compiles_after_warmup": ok_cov,
        "sweep_complete": bandwidth_error is None and not any(r["error"] for r in rows),
        "bandwidth_error": bandwidth_error, "seconds": total_s, "graph_harness": a.graph_harness,
    }, indent=1, default=str))
    complete = bandwidth_error is None and not any(r["error"] for r in rows)
    log(f"\nnumerics exact: {ok_num}; zero compiles after warmup: {ok_cov}; sweep complete: {complete}; "
        f"total {total_s:.0f}s; results in {a.out}")
    return status if (ok_num and ok_cov) else 1


if __name__ == "__main__":
    sys.exit(main())
