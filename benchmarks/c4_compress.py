#!/usr/bin/env python3
"""K5 / K6 / K9, the C4 compressors, on a GPU: bandwidth against the copy ceiling, zero compiles.

    python3 benchmarks/c4_compress.py --out DIR [--quick]

Numerics live in ``benchmarks/c4_compress_gpu_check.py`` (the rule over >= 50 random cases per
op and backend); this script times. It warms every key of the three ops (both backends; CuTeDSL
where ``import cutlass`` works) and, at T in {4096, 16384, 65536} (``--quick``: 4096, 16384)
prefill tokens of 4 requests, times each backend's kernel (CUDA-graph replays), each backend's
whole op call, the eager reference (validated) and ``torch.compile`` of its core, against the
device-to-device copy bandwidth measured in this run (``triton.testing.do_bench``). Monitor in
``error`` mode and both compile counters armed around every kernel row.

Bytes model per call (issue 12): every state row read once (each row's half A by the next
window, half B by its own: ``T * 4 D`` fp32), every written cache byte once (``T / 4`` entries
of 584 (E1), 1024 (E2), 512 (E3), 132 (E4) or 68 (E5) bytes), and the per-token arrays
(positions, slots, kv slots: int64; token_to_req: int32).

Writes ``c4_compress.json``, ``c4_compress.csv``, ``c4_compress.md`` and ``provenance.json``
under ``--out``. Exits 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402
from save_partial_states import Counters, cutlass_status, log  # noqa: E402

FAMILY = "c4_compress"
#: (op, format) rows timed: K5 (E1), K6 bf16 (E2) and e4m3 (E3), K9 FP8 (E4) and MXFP4 (E5).
POINTS = (
    ("c4_compress_ds_mla", {}),
    ("c4_compress_plain", {}),
    ("c4_compress_plain", {"fp8_scale": 0.5}),
    ("indexer_compress", {"use_fp4": False}),
    ("indexer_compress", {"use_fp4": True}),
)
ENTRY_BYTES = {"c4_compress_ds_mla": 584, "c4_compress_plain": 1024, "indexer_compress": 132}
#: Seconds torch.compile may spend in total (default; ``--compile-budget``) before it is skipped.
COMPILE_BUDGET_S = 300.0
DEVICE = "cuda"


def kernels(platform) -> dict:
    from dsv4kit.bench import backend_kernels
    from dsv4kit.kernels import family

    return {op: backend_kernels(family(op), platform, log=log) for op in dict(POINTS)}


def warm_all(ks: dict) -> dict:
    """Warm the keys the timed points dispatch to (their formats, bf16 norm weights)."""
    from dsv4kit.kernels.c4_compress import SPECS

    need: dict[str, list] = {}
    for op, fmt in POINTS:
        case, _ = bench_case(op, fmt, 64)
        params = SPECS[op].contract._dispatch_program.params
        need.setdefault(op, []).append({n: case.args[n] for n in params})
    out = {}
    for op, by_backend in ks.items():
        for name, k in by_backend.items():
            k.clear_cache()
            keys = list(dict.fromkeys(k.dispatch(**a) for a in need[op]))
            t0 = time.perf_counter()
            reports = k.warmup(keys=keys)
            out[f"{op} {name}"] = {
                "seconds": time.perf_counter() - t0,
                "keys": [{"key": str(r.key), "registers": r.info.get("registers"),
                          "spills": r.info.get("spills"), "error": r.error} for r in reports],
            }
            log(f"warmup {op} {name}: {len(reports)} keys, registers "
                f"{[r.info.get('registers') for r in reports]}, "
                f"errors {[r.error for r in reports if r.error]}")
    return out


def bench_case(op: str, fmt: dict, t: int):
    """A prefill of ``t`` tokens over 4 requests (positions 0..), all live, on the GPU; its bytes."""
    from dsv4kit.kernels.c4_compress.cases import make_case

    nreq = 4
    lens = tuple([t // nreq] * (nreq - 1) + [t - (nreq - 1) * (t // nreq)])
    kv_bs = 64
    case = make_case(op, lens=lens, kv_bs=kv_bs, padding=False, seed=t, **fmt).fresh(DEVICE)
    st = case.args["state_cache"]
    head = st.shape[2] // 4
    entries = int(((case.args["positions"] + 1) % 4 == 0).sum())
    entry = ENTRY_BYTES[op]
    if op == "c4_compress_plain" and "fp8_scale" in fmt:
        entry = 512
    if op == "indexer_compress" and fmt.get("use_fp4"):
        entry = 68
    nbytes = 4 * t * 4 * head + entries * entry + t * (3 * 8 + 4)
    return case, nbytes


def compress_core(op: str, a: dict, idx: torch.Tensor, slots: torch.Tensor) -> None:
    """The reference's computation for already-selected tokens, without its checks (what
    ``torch.compile`` gets): window gather, pool, norm, rope, encode, store."""
    from dsv4kit.formats.ds_mla import enc_ds, write_ds_entries
    from dsv4kit.formats.indexer_cache import write_indexer_rows
    from dsv4kit.formats.plain_row import write_plain_rows
    from dsv4kit.formats.rope import compressed_position, rope_rotate
    from dsv4kit.formats.state_cache import pool_windows, rmsnorm, window_rows

    head = a["state_cache"].shape[2] // 4
    p = a["positions"][idx]
    k, s, _ = window_rows(a["state_cache"], a["block_table"], a["token_to_req"][idx].long(), p, 4, True, head)
    n = rmsnorm(pool_windows(k, s), a["rms_norm_weight"], a["rms_norm_eps"])
    y = rope_rotate(n, a["cos_sin_cache"][compressed_position(p, 4)])
    if op == "c4_compress_ds_mla":
        write_ds_entries(a["k_cache"], slots, enc_ds(y))
    elif op == "c4_compress_plain":
        write_plain_rows(a["kv_cache"], slots, y, a["fp8_scale"])
    else:
        write_indexer_rows(a["k_cache"], slots, y, a["use_fp4_cache"])


def timings(ks: dict, sizes: list[int], copy_gbs: float, quick: bool,
            compile_budget: float = COMPILE_BUDGET_S) -> tuple[list[dict], dict]:
    from dsv4kit.bench import bench_median_ms
    from dsv4kit.kernels.c4_compress import SPECS

    rows: list[dict] = []
    rep = 60 if quick else 200
    compile_spent = 0.0
    compiled_ok = True
    kernel_compiles: dict = {}
    for op, fmt in POINTS:
        for t in sizes:
            case, nbytes = bench_case(op, fmt, t)
            a = case.args
            variants = {}
            for name, k in ks[op].items():
                sel = {n: a[n] for n in SPECS[op].contract._dispatch_program.params}
                key = k.dispatch(**sel)
                exe = k._get_or_compile(key)
                launch = _launch_args(k, op, a)
                variants[name] = (lambda exe=exe, launch=launch: exe(*launch), True)
                variants[f"{name} (op)"] = (lambda k=k, a=a: k(**a), False)
            variants["torch eager (reference, validated)"] = (
                lambda a=a, op=op: SPECS[op].variants["default"].reference(**a),
                False,
            )
            sel = (a["slot_mapping"] >= 0) & (a["kv_slot_mapping"] >= 0) & ((a["positions"] + 1) % 4 == 0)
            idx = torch.nonzero(sel).flatten()
            slots = a["kv_slot_mapping"][idx]
            variants["torch eager (core)"] = (
                lambda a=a, op=op, i=idx, s=slots: compress_core(op, a, i, s),
                False,
            )
            if compiled_ok and compile_spent < compile_budget:
                t_c = time.perf_counter()
                try:
                    fn = torch.compile(compress_core, dynamic=False)
                    fn(op, a, idx, slots)
                    variants["torch.compile (core)"] = (
                        lambda a=a, op=op, i=idx, s=slots, f=fn: f(op, a, i, s),
                        False,
                    )
                except Exception as exc:
                    log(f"torch.compile(core) failed: {type(exc).__name__}: {str(exc)[:300]}")
                    compiled_ok = False
                compile_spent += time.perf_counter() - t_c
            fmt_name = op + "".join(f" {k}={v}" for k, v in fmt.items())
            for name, (fn, is_kernel) in variants.items():
                counted = name in ks[op] or "(op)" in name
                counters = Counters("cutedsl" in ks[op]) if counted else None
                err = ""
                try:
                    ms = bench_median_ms(fn, graph=is_kernel, rep_ms=rep)
                except Exception as exc:
                    ms = float("nan")
                    err = f"{type(exc).__name__}: {str(exc)[:200]}"
                finally:
                    if counters is not None:
                        kernel_compiles[f"{name} {fmt_name} T={t}"] = counters.close()
                gbs = nbytes / (ms * 1e-3) / 1e9 if ms == ms else float("nan")
                rows.append(
                    {
                        "op": op,
                        "format": fmt_name,
                        "T": t,
                        "impl": name,
                        "bytes": nbytes,
                        "median_us": ms * 1e3,
                        "GBps": gbs,
                        "pct_of_copy": 100 * gbs / copy_gbs,
                        "timing": "cuda-graph replay" if is_kernel else "events (do_bench)",
                        "error": err,
                    }
                )
                log(
                    f"{fmt_name:42s} T={t:6d} {name:36s} {ms * 1e3:9.1f} us {gbs:7.0f} GB/s "
                    f"{100 * gbs / copy_gbs:5.1f}%{'  ' + err if err else ''}"
                )
            del case, a, variants
            torch.cuda.empty_cache()
    total = {
        "triton_compiles": sum(c["triton_compiles"] for c in kernel_compiles.values()),
        "cute_compiles": sum(c["cute_compiles"] or 0 for c in kernel_compiles.values()),
        "monitor_events": sum(len(c["monitor_events"]) for c in kernel_compiles.values()),
    }
    log(f"timing compiles after warmup (kernel and op rows): {total}")
    return rows, total


def _launch_args(k, op: str, a: dict) -> tuple:
    """The executor's arguments of one call, as the op builds them (after its checks)."""
    from dsv4kit.kernels.c4_compress.reference import check_c4_inputs
    from dsv4kit.kernels.c4_compress.spec import compress_operands

    cache = a["kv_cache" if op == "c4_compress_plain" else "k_cache"]
    t, eps = check_c4_inputs(
        k.name,
        op,
        a["state_cache"],
        a["token_to_req"],
        a["positions"],
        a["slot_mapping"],
        a["block_table"],
        a["state_block_size"],
        a["rms_norm_weight"],
        a["rms_norm_eps"],
        a["cos_sin_cache"],
        cache,
        a["kv_slot_mapping"],
        a.get("fp8_scale"),
        a.get("use_fp4_cache"),
    )
    sel = {n: a[n] for n in type(k)._dispatch_program.params}
    ops = compress_operands(k.name, a["state_cache"], a["block_table"], cache, a.get("fp8_scale"), eps, t)
    return k.launch_args(
        k.dispatch(**sel),
        a["token_to_req"],
        a["positions"],
        a["slot_mapping"],
        a["block_table"],
        a["rms_norm_weight"],
        a["cos_sin_cache"],
        a["kv_slot_mapping"],
        ops,
        t,
    )


def markdown(result: dict) -> str:
    prov = result["provenance"]
    lines = [
        f"# C4 compressors (K5, K6, K9) on {prov.get('device')}",
        "",
        f"date {prov.get('date')}, commit `{str(prov.get('commit'))[:12]}`, torch {prov.get('torch')}, "
        f"triton {prov.get('triton')}, nvidia-cutlass-dsl {prov.get('nvidia-cutlass-dsl')}, "
        f"kernel source hash `{str(prov.get('kernel_source_hash', ''))[:16]}`",
        "",
        f"Device-to-device copy: **{result['copy_GBps']:.0f} GB/s** (read + write, `do_bench`).",
        "",
        f"Compiles after warmup during the timings: {result.get('timing_compiles')}.",
        "",
        "| format | T | impl | us | GB/s | % of copy |",
        "|---|---|---|---|---|---|",
    ]
    for r in result.get("timings", []):
        lines.append(
            f"| {r['format']} | {r['T']} | {r['impl']} | {r['median_us']:.1f} | {r['GBps']:.0f} "
            f"| {r['pct_of_copy']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for the result files")
    ap.add_argument("--quick", action="store_true", help="a shorter run (T up to 16384, shorter timing)")
    ap.add_argument("--compile-budget", type=float, default=COMPILE_BUDGET_S,
                    help="seconds torch.compile may spend in total")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("c4_compress benchmark: needs a CUDA device (none is visible)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)

    from dsv4kit.bench import copy_bandwidth_gbs, provenance, write_csv, write_json
    from dsv4kit.platform import current_platform
    from dsv4kit.results import kernel_source_files, kernel_source_hash

    platform = current_platform()
    ok, cutlass_version = cutlass_status()
    prov = provenance(
        {
            "kernel": "C4 compressors (K5, K6, K9)",
            "family": FAMILY,
            "arch": platform.arch,
            "cutlass": cutlass_version if ok else None,
            "kernel_source_hash": kernel_source_hash(FAMILY),
            "kernel_source_files": kernel_source_files(FAMILY),
            "quick": a.quick,
        }
    )
    write_json(a.out / "provenance.json", prov)
    log(json.dumps(prov))
    result: dict = {"provenance": prov}
    status = 0
    t0 = time.perf_counter()
    ks = kernels(platform)
    result["copy_GBps"] = copy_gbs = copy_bandwidth_gbs((512 << 20) if a.quick else (2 << 30))
    log(f"device-to-device copy: {copy_gbs:.0f} GB/s")
    try:
        result["warmup"] = warm_all(ks)
        sizes = [4096, 16384] if a.quick else [4096, 16384, 65536]
        result["timings"], result["timing_compiles"] = timings(ks, sizes, copy_gbs, a.quick, a.compile_budget)
    except Exception:
        result["error"] = traceback.format_exc()
        log(result["error"])
        status = 1
    result["seconds"] = time.perf_counter() - t0
    write_json(a.out / "c4_compress.json", result)
    write_csv(a.out / "c4_compress.csv", result.get("timings", []))
    (a.out / "c4_compress.md").write_text(markdown(result) if "timings" in result else "incomplete\n")
    tc = result.get("timing_compiles", {})
    zero = tc.get("triton_compiles") == 0 and not tc.get("cute_compiles") and not tc.get("monitor_events")
    log(f"\nzero compiles after warmup: {zero}; total {result['seconds']:.0f}s; results in {a.out}")
    return status if zero else 1


if __name__ == "__main__":
    sys.exit(main())
