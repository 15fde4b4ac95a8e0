#!/usr/bin/env python3
"""K5, K6, K9 (the C4 compressors) on a GPU: both backends judged against the reference (numerics only).

    python3 benchmarks/c4_compress_gpu_check.py --out DIR_OR_FILE.json [--cases 60] [--large 16384,65536]
        [--no-cpu-reference]
    python3 benchmarks/c4_compress_gpu_check.py --out DIR_OR_FILE.json --cpu-smoke    # its paths, on CPU

Bandwidth is not measured here: ``python3 -m dsv4kit bench --family c4_compress`` times K5 / K6 / K9
(kernel alone, op, eager reference, ``torch.compile``) against the copy bandwidth of its run, with
the bytes model :func:`dsv4kit.kernels.c4_compress.bench.c4_compress_bytes`.

1. Warms every key of the three ops on both backends (triton, cutedsl): all the configs of
   ``C4CompressConfig`` (cache fp8_ds_mla / fp8 / bfloat16, indexer FP8 / MXFP4, norm weights
   bf16 / fp32); Triton's and CuTeDSL's compile counters then run over everything below
   (expected: zero compiles).
2. Numerics, per op: the random cases ``cases.random_case(op, i)`` for ``i < --cases`` (T, requests,
   positions incl. 3, 7 and 1 048 575, sbs 4 / 16, kv_bs 64 / 2 / 1, pooled strides, padding, every
   score and kv regime, both weight dtypes, every format), every 10th one also with a state block
   stride that is not a multiple of 4 (the kernels' element-load path), every 2nd one also padded
   to T = 4200 with padding tokens (past the CuTeDSL decode kernel: its prefill kernel sees the
   awkward cases too; the odd-stride copy where there is one), plus large-T cases in the
   production layout (``--large``; one and four requests from position 0, tokens in order, sbs 4,
   kv_bs 64, no padding; every format). Each case runs on sentinel-filled (0xA5) copies of its
   buffers: the reference on GPU tensors, and (unless ``--no-cpu-reference``) on CPU tensors too;
   each backend on GPU tensors. :func:`~dsv4kit.kernels.c4_compress.cases.judge` applies the
   compressor rule of §2.12 (decoded values, term-magnitude allowance, step budget, scale bytes;
   every other byte of the cache BIT-EXACT) and counts bit-identical elements. The CUDA reference
   is also judged against the CPU one (how far two conforming references are apart).

Prints, per op / backend / reference: cases conforming, violations, bit-identical elements /
total; writes everything as JSON to ``--out`` (a ``.json`` file, or a directory that gets
``c4_compress_gpu_check.json``). Exit code 0 iff every case conforms for both backends and nothing
compiled after warmup; 1 otherwise; 2 without a CUDA device (unless ``--cpu-smoke``: the same flow
on CPU, Triton under the interpreter (``cpu_platform("sm_90a")``) only, 2 random cases per op (the
first also at an odd block stride) and one small production-layout case per op (T = 64, four
requests from position 0, in order; set "large"), judged against the CPU reference by the same
judge. Skipped there, and said so in the log and in the JSON's ``skipped``: the CuTeDSL backend, the
CUDA reference and its judgement against the CPU one, and CuTeDSL's compile counter. Triton's
counter still runs but counts nothing under the interpreter).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.bench import no_cuda_for, provenance, write_json  # noqa: E402
from dsv4kit.kernels.c4_compress import SPECS, C4CompressConfig  # noqa: E402
from dsv4kit.kernels.c4_compress.cases import OPS, C4Case, cpu_copy, judge, make_case, random_case  # noqa: E402
from dsv4kit.testing.cache_judge import VerdictSummary  # noqa: E402
from dsv4kit.testing.compressor_data import odd_block_stride  # noqa: E402

BACKENDS = ("triton", "cutedsl")
CONFIGS = [C4CompressConfig(cache_dtype=d, indexer_cache_dtype=i, norm_weight_dtype=w)
           for d in ("fp8_ds_mla", "fp8", "bfloat16") for i in ("fp8", "mxfp4")
           for w in ("bfloat16", "float32")]
#: Formats of the large-T cases: (op, make_case keywords, label).
FORMATS = (("c4_compress_ds_mla", {}, "E1 fp8_ds_mla"), ("c4_compress_plain", {}, "E2 bf16 rows"),
           ("c4_compress_plain", {"fp8_scale": 0.37}, "E3 e4m3 rows"),
           ("indexer_compress", {"use_fp4": False}, "E4 indexer FP8"),
           ("indexer_compress", {"use_fp4": True}, "E5 indexer MXFP4"))

#: ``--cpu-smoke``: the interpreter's arch, the T of the production-layout case and its formats
#: (one per op: E1, E2, E4).
SMOKE_ARCH = "sm_90a"
SMOKE_LARGE_T = 64
SMOKE_FORMATS = tuple(next(f for f in FORMATS if f[0] == op) for op in OPS)
SMOKE_SKIPPED = (
    "cutedsl backend: CuTeDSL kernels run only on a GPU",
    "CUDA reference: no CUDA device (every case is judged against the CPU reference only)",
    "CuTeDSL compile counter: no CuTeDSL backend runs (compiles_after_warmup.cutedsl is null); "
    "Triton's counter runs but the interpreter never compiles (it counts 0 by construction)",
)

_LINES: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)
    _LINES.append(msg)


# ------------------------------------------------------------------------ cases


def odd_stride(case: C4Case, extra: int = 3) -> C4Case:
    """``case`` with its state re-laid at block stride ``stride + extra`` (not a multiple of 4 for
    extra = 1..3; the base stays 16-byte aligned, §2.8 allows any stride >= sbs * 2SW)."""
    odd = odd_block_stride(case.args["state_cache"], extra)
    label = f"{case.label} block_stride={odd.stride(0)}"
    return replace(case, args=dict(case.args, state_cache=odd), label=label)


def in_order(case: C4Case) -> C4Case:
    """``case`` with its tokens sorted by (request, position): the production layout (make_case
    interleaves requests); each token's entry is the same, only the token order changes."""
    a = case.args
    key = a["token_to_req"].long() * (1 << 40) + a["positions"]
    order = torch.argsort(key)
    args = dict(a)
    for n in ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping"):
        args[n] = a[n][order].contiguous()
    return replace(case, args=args, label=case.label + " in order")


#: T of the padded copies of the random cases: past the CuTeDSL decode kernel's
#: ``CTA_PER_TOKEN_UP_TO`` (4096), so that its prefill kernel sees every awkward case too.
PAST_DECODE_T = 4200


def past_decode(case: C4Case, t: int = PAST_DECODE_T) -> C4Case:
    """``case`` with padding tokens (slot and kv slot -1, boundary positions) shuffled in up to ``t``
    tokens: the same live tokens and expected cache, at a prefill-size T."""
    a = case.args
    n = a["positions"].shape[0]
    extra = max(0, t - n)
    g = torch.Generator().manual_seed(n)
    order = torch.randperm(n + extra, generator=g)
    args = dict(a)
    pads = {"token_to_req": torch.zeros(extra, dtype=a["token_to_req"].dtype),
            "positions": torch.full((extra,), 7, dtype=a["positions"].dtype),
            "slot_mapping": torch.full((extra,), -1, dtype=a["slot_mapping"].dtype),
            "kv_slot_mapping": torch.full((extra,), -1, dtype=a["kv_slot_mapping"].dtype)}
    for name, pad in pads.items():
        args[name] = torch.cat((a[name], pad))[order].contiguous()
    return replace(case, args=args, label=f"{case.label} padded to T={n + extra}")


def large_cases(sizes: list[int], formats: tuple = FORMATS, nreqs: tuple[int, ...] = (1, 4)
                ) -> list[C4Case]:
    out = []
    for t in sizes:
        for op, kw, name in formats:
            for nreq in nreqs:
                lens = (t,) if nreq == 1 else tuple([t // 4] * 3 + [t - 3 * (t // 4)])
                c = make_case(op, lens=lens, starts=tuple(0 for _ in lens), sbs=4, kv_bs=64, padding=False,
                              seed=t + nreq, **kw)
                c = in_order(c)
                c.meta.update(format=name, large=True, requests=nreq)
                out.append(c)
    return out


# ------------------------------------------------------------------------ running


def run_reference(case: C4Case, device: str) -> torch.Tensor:
    c = case.fresh(device)
    SPECS[case.op].variants["default"].reference(**c.args)
    if device == "cuda":
        torch.cuda.synchronize()
    return cpu_copy(c.cache)


def run_kernel(case: C4Case, backend: str, device: str = "cuda", platform: Any = None) -> torch.Tensor:
    c = case.fresh(device)
    out = SPECS[case.op].op(**c.args, backend=backend, platform=platform)
    assert out is None
    if device == "cuda":
        torch.cuda.synchronize()
    return cpu_copy(c.cache)


def verdict_record(case: C4Case, got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    v = judge(case, got, want)
    reps = v.reports.values()
    return {"ok": v.ok, "written": v.written, "other_bytes_equal": v.other_bytes_equal,
            "elements": v.elements, "bit_identical": v.bit_identical,
            "violations": sum(r.violations for r in reps),
            "scale_mismatches": sum(r.scale_mismatches for r in reps),
            "used_step": sum(r.used_step for r in reps),
            "summary": v.summary() if not v.ok else ""}


def check_case(case: C4Case, cpu_ref: bool, device: str = "cuda", backends: tuple[str, ...] = BACKENDS,
               platform: Any = None) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """Judge ``backends`` (default both) on ``case``; returns the records and the reference caches.
    On ``device`` "cpu" (``--cpu-smoke``) the CPU reference is the only one."""
    recs: list[dict[str, Any]] = []
    base = {"op": case.op, "case": case.label, "T": int(case.args["positions"].numel()),
            "format": case.meta.get("format", ""), "large": bool(case.meta.get("large", False))}
    wants = {device: run_reference(case, device)}
    if cpu_ref and device != "cpu":
        wants["cpu"] = run_reference(case, "cpu")
        recs.append({**base, "backend": f"reference@{device}", "reference": "cpu",
                     **verdict_record(case, wants[device], wants["cpu"])})
    for backend in backends:
        try:
            got = run_kernel(case, backend, device, platform)
        except Exception as exc:
            for ref in wants:
                recs.append({**base, "backend": backend, "reference": ref, "ok": False,
                             "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc(limit=6)})
            continue
        for ref, want in wants.items():
            recs.append({**base, "backend": backend, "reference": ref, **verdict_record(case, got, want)})
    for r in recs:
        if not r["ok"]:
            log(f"NONCONFORMING {r['backend']:14s} vs {r['reference']}-ref {case.label}: "
                f"{r.get('error') or r['summary']}")
    return recs, wants


# ------------------------------------------------------------------------ main


def _cute_counter(with_cute: bool) -> Any:
    """CuTeDSL's compile counter (imports CuTeDSL), or a block yielding None where no CuTeDSL runs."""
    if not with_cute:
        return contextlib.nullcontext(None)
    from dsv4kit.backends.cutedsl import count_cute_compiles

    return count_cute_compiles()


#: Sums per op, backend, reference and case set (``random`` or ``large``: the records' ``large``).
SUMMARY = VerdictSummary("large", "other_bytes", "other bytes", op_width=20, set_width=6,
                         set_label=lambda large: "large" if large else "random")


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return SUMMARY.rows(records, log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True,
                    help="a .json file, or a directory for c4_compress_gpu_check.json")
    ap.add_argument("--cases", type=int, default=60,
                    help="random cases per op (cases.random_case(op, i), i < N)")
    ap.add_argument("--large", default="16384,65536",
                    help="comma-separated T of the large cases ('' for none)")
    ap.add_argument("--no-cpu-reference", action="store_true", help="judge against the CUDA reference only")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help=f"CPU, Triton interpreter ({SMOKE_ARCH}) only: 2 random cases per op and one "
                         f"production-layout case per op (T={SMOKE_LARGE_T}), CPU reference only; no "
                         "CuTeDSL, no CUDA reference (tests this script)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out = out if out.suffix == ".json" else out / "c4_compress_gpu_check.json"
    if not args.cpu_smoke and no_cuda_for("c4_compress_gpu_check"):
        return 2
    from dsv4kit.backends.triton import count_triton_compiles

    _LINES.clear()
    if args.cpu_smoke:
        from dsv4kit.platform import cpu_platform

        args.cases, args.large = 2, ""
        device, backends, platform = "cpu", ("triton",), cpu_platform(SMOKE_ARCH)
        result: dict[str, Any] = {"provenance": provenance({"cpu_smoke": True, "arch": platform.arch}),
                                  "args": vars(args), "cpu_smoke": True, "skipped": list(SMOKE_SKIPPED)}
        log(str(result["provenance"]))
        for note in SMOKE_SKIPPED:
            log(f"CPU SMOKE: skipped {note}")
    else:
        device, backends, platform = "cuda", BACKENDS, None
        result = {"provenance": provenance(), "args": vars(args)}
        log(str(result["provenance"]))
    sizes = [int(s) for s in args.large.split(",") if s.strip()]

    # 1. warmup
    warm = []
    for backend in backends:
        for op in OPS:
            try:
                k = SPECS[op].kernel(device=device, backend=backend, platform=platform)
                keys = list(dict.fromkeys(key for cfg in CONFIGS for key in k.get_warmup_keys(cfg)))
                t0 = time.perf_counter()
                reports = k.warmup(keys=keys)
                warm.append({"backend": backend, "op": op, "keys": [str(r.key) for r in reports],
                             "registers": [r.info.get("registers") for r in reports],
                             "spills": [r.info.get("spills") for r in reports],
                             "seconds": time.perf_counter() - t0})
                regs = [r.info.get("registers") for r in reports]
                log(f"warmup {backend:8s} {op:20s} {len(keys)} keys, registers {regs}, "
                    f"spills {[r.info.get('spills') for r in reports]}")
            except Exception as exc:
                warm.append({"backend": backend, "op": op, "error": f"{type(exc).__name__}: {exc}"})
                log(f"warmup {backend} {op}: FAILED {type(exc).__name__}: {exc}")
    result["warmup"] = warm

    # 2. numerics
    records: list[dict[str, Any]] = []
    run = {"device": device, "backends": backends, "platform": platform}
    with count_triton_compiles() as tc, _cute_counter("cutedsl" in backends) as cc:
        for op in OPS:
            t0 = time.perf_counter()
            for i in range(args.cases):
                case = random_case(op, i)
                records += check_case(case, not args.no_cpu_reference, **run)[0]
                if i % 10 == 0:
                    case = odd_stride(case)
                    records += check_case(case, not args.no_cpu_reference, **run)[0]
                if i % 2 == 0:
                    records += check_case(past_decode(case), not args.no_cpu_reference, **run)[0]
            log(f"{op}: {args.cases} random cases (+ {(args.cases + 9) // 10} odd block strides, "
                f"{(args.cases + 1) // 2} padded to T = {PAST_DECODE_T}) in {time.perf_counter() - t0:.1f} s")
        for case in (large_cases([SMOKE_LARGE_T], SMOKE_FORMATS, (4,)) if args.cpu_smoke
                     else large_cases(sizes)):
            t0 = time.perf_counter()
            records += check_case(case, not args.no_cpu_reference, **run)[0]
            log(f"{case.label}: judged in {time.perf_counter() - t0:.1f} s")
    cute_count = None if cc is None else cc.count
    result["compiles_after_warmup"] = {"triton": tc.count, "cutedsl": cute_count}
    result["cases"] = records
    result["summary"] = summarize(records)
    log(f"compiles after warmup: triton {tc.count}, cutedsl {cute_count}")
    kernels_ok = all(r["ok"] for r in records if r["backend"] in BACKENDS)
    if not any(r["backend"] in BACKENDS for r in records):  # a check that judged nothing fails
        log("no kernel case ran")
        kernels_ok = False
    ok = kernels_ok and tc.count == 0 and not cute_count
    result["pass"] = ok
    log(f"ALL CHECKS {'PASS' if ok else 'FAIL'}")
    result["log"] = _LINES
    write_json(out, result)
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
