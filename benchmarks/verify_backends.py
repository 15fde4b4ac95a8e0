"""GPU verification of the Triton and CuTeDSL backends on the rowquant example kernel.

1. Warm every key of both backends (counting compiles through Triton's post-compile hook and
   the ``cute.compile`` wrapper: these counts are the positive control that the hooks see).
2. With the JIT monitor in ``error`` mode, run a battery of calls over every warmed key
   (random shapes and the edge-value regimes of spec §2.12) and compare each output byte
   with the PyTorch reference: expect zero compiles and zero mismatches.
3. Negative controls: an unwarmed key, a raw Triton launch with an unwarmed specialization and
   a stray ``cute.compile`` must each raise before compiling.
4. A small timing of both backends.

Writes ``backends_<device>.json`` and ``.md`` under ``--out``.
Usage: ``python benchmarks/verify_backends.py --out DIR [--commit HASH] [--triton-only]``
(``--triton-only``: a GPU machine without the CuTeDSL bundle; the CuTeDSL rows are absent and the
report says so).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform as pyplatform
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from dsv4kit.backends.cutedsl import count_cute_compiles, import_cute
from dsv4kit.backends.triton import count_triton_compiles
from dsv4kit.errors import UnwarmedKeyError
from dsv4kit.jit import JitMonitor
from dsv4kit.kernels.rowquant import COARSEN_AT, RowQuantConfig, rowquant_reference
from dsv4kit.kernels.rowquant.cases import REGIMES, regime
from dsv4kit.kernels.rowquant.triton import RowQuantTriton, _rowquant_kernel
from dsv4kit.platform import detect_platform

WIDTHS = (512, 4096)
STRIDED = (512, 520)  # a row-strided view: stride 520 is not a multiple of 16 -> class "other"


def versions() -> dict[str, str]:
    import triton

    out = {"python": pyplatform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda (torch)": str(torch.version.cuda)}
    for name in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:
            out[name] = "missing"
    return out




def rows_for(rows_per_program: int, gen: torch.Generator, smoke: bool = False) -> list[int]:
    if smoke:
        return [3] if rows_per_program == 1 else [COARSEN_AT]
    if rows_per_program == 1:
        return [1, 7, int(torch.randint(2, COARSEN_AT, (1,), generator=gen)), COARSEN_AT - 1]
    return [COARSEN_AT, 777, int(torch.randint(COARSEN_AT, 3000, (1,), generator=gen))]


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="CPU dry run: Triton interpreter only, few cases")
    ap.add_argument("--triton-only", action="store_true", help="GPU run without CuTeDSL (no bundle there)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    plat = detect_platform()
    backends = ["triton"] if args.smoke or args.triton_only else ["triton", "cutedsl"]
    if not args.smoke:
        plat.require_cuda("verify_backends")
    if "cutedsl" in backends:
        plat.require_cutedsl("verify_backends")
        import_cute()
    dev = plat.device
    gen = torch.Generator().manual_seed(args.seed)
    res: dict[str, Any] = {
        "device": plat.device_name, "arch": plat.arch, "versions": versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": args.commit, "seed": args.seed, "tvm_ffi": plat.tvm_ffi,
        "backends": backends,
    }
    tag = plat.device_name.replace("NVIDIA ", "").replace(" ", "_").lower()
    try:
        run(res, plat, dev, gen, args)
    except Exception:
        res["fatal"] = traceback.format_exc()
        res["ok"] = False
        print(res["fatal"])
    (out / f"backends_{tag}.json").write_text(json.dumps(res, indent=1, default=str))
    if "fatal" not in res and not args.smoke:
        (out / f"backends_{tag}.md").write_text(markdown(res))
        print(markdown(res))


def run(res: dict[str, Any], plat: Any, dev: str, gen: torch.Generator, args: Any) -> None:
    kernels: dict[str, Any] = {"triton": RowQuantTriton(plat)}
    if "cutedsl" in res["backends"]:
        from dsv4kit.kernels.rowquant.cutedsl import RowQuantCuTeDSL  # imports cutlass

        kernels["cutedsl"] = RowQuantCuTeDSL(plat)
    any_k = kernels["triton"]
    widths, strided = ((256,), (256, 264)) if args.smoke else (WIDTHS, STRIDED)
    keys = any_k.get_warmup_keys(RowQuantConfig(widths=widths))
    keys += [any_k.dispatch(strided[0], strided[1], m) for m in (1, COARSEN_AT)]
    res["keys"] = [str(k) for k in keys]

    # 1. warmup, counting compiles (positive control of the hooks)
    warm: dict[str, Any] = {}
    for name, k in kernels.items():
        with count_triton_compiles() as tc, count_cute_compiles() as cc:
            t0 = time.perf_counter()
            reports = k.warmup(keys=keys)
            secs = time.perf_counter() - t0
        warm[name] = {"seconds": round(secs, 3), "triton_compiles": tc.count, "cute_compiles": cc.count,
                      "per_key": [{"key": str(r.key), "seconds": round(r.seconds, 3),
                                   "registers": r.info.get("registers"), "spills": r.info.get("spills")}
                                  for r in reports]}
    if dev == "cuda":  # Triton's own register count (driver, after loading) vs the cubin-derived one
        regs = set()
        for ck in _rowquant_kernel.device_caches[torch.cuda.current_device()][0].values():
            ck._init_handles()
            regs.add(ck.n_regs)
        warm["triton"]["n_regs_from_driver"] = sorted(regs)
    res["warmup"] = warm

    # 2. battery under the monitor in error mode
    cases, mismatches, errors = 0, [], []
    per_backend_calls = {n: 0 for n in kernels}
    with count_triton_compiles() as tc, count_cute_compiles() as cc, JitMonitor("error") as mon:
        for key in keys:
            for m in rows_for(key.rows_per_program, gen, args.smoke):
                for reg in REGIMES:
                    n = key.n_cols
                    x_cpu = regime(reg, m, n, gen=gen)
                    q_ref, s_ref = rowquant_reference(x_cpu)
                    if key.x_stride_class == "div16":
                        x = x_cpu.to(dev)
                    else:  # the same values as a row-strided view of a wider buffer
                        wide = torch.zeros(m, strided[1], dtype=torch.bfloat16)
                        wide[:, :n] = x_cpu
                        x = wide.to(dev)[:, :n]
                    assert any_k.dispatch(x.shape[1], x.stride(0), x.shape[0]) == key
                    cases += 1
                    for name, k in kernels.items():
                        try:
                            q, s = k(x)
                            if dev == "cuda":
                                torch.cuda.synchronize()
                            per_backend_calls[name] += 1
                            if not (same_bytes(q, q_ref) and same_bytes(s, s_ref)):
                                bad = int((q.cpu().view(torch.uint8) != q_ref.view(torch.uint8)).sum())
                                mismatches.append({"backend": name, "key": str(key), "m": m, "regime": reg,
                                                   "q_bytes_differing": bad,
                                                   "scales_equal": bool(torch.equal(s.cpu(), s_ref))})
                        except Exception as exc:
                            errors.append({"backend": name, "key": str(key), "m": m, "regime": reg,
                                           "error": "".join(traceback.format_exception_only(exc)).strip()})
        events = [{"kernel": e.kernel, "key": str(e.key), "source": e.source} for e in mon.events]
    res["battery"] = {"cases": cases, "calls": per_backend_calls, "mismatches": mismatches,
                      "errors": errors[:20], "num_errors": len(errors),
                      "triton_compiles_after_warmup": tc.count, "cute_compiles_after_warmup": cc.count,
                      "monitor_events": events}

    res["ok"] = not mismatches and not errors and tc.count == 0 and cc.count == 0 and not events
    if args.smoke:
        return

    # 3. negative controls: each must raise UnwarmedKeyError before anything compiles
    neg: dict[str, Any] = {}
    x_unwarmed = torch.randn(3, 256, device="cuda").bfloat16()  # width 256 was not warmed
    for name, k in kernels.items():
        with count_triton_compiles() as tc, count_cute_compiles() as cc, JitMonitor("error"):
            try:
                k(x_unwarmed)
                neg[f"{name}_unwarmed_key"] = "NOT RAISED"
            except UnwarmedKeyError as exc:
                neg[f"{name}_unwarmed_key"] = {"raised": str(exc), "triton_compiles": tc.count,
                                               "cute_compiles": cc.count}
    # A raw launch of the warmed Triton function whose x pointer is not 16-byte aligned: a new
    # specialization, caught by the pre-compile hook.
    xb = torch.randn(4, 513, device="cuda").bfloat16()[:, 1:]
    q = torch.empty(4, 512, device="cuda", dtype=torch.uint8)
    s = torch.empty(4, 4, device="cuda", dtype=torch.float32)
    with count_triton_compiles() as tc, JitMonitor("error"):
        try:
            _rowquant_kernel[(4, 4)](xb, q, s, 4, xb.stride(0), 512, 1, 1, 128,
                                     num_warps=4, enable_fp_fusion=False)
            neg["triton_raw_unaligned_launch"] = "NOT RAISED"
        except UnwarmedKeyError as exc:
            neg["triton_raw_unaligned_launch"] = {"raised": str(exc), "triton_compiles": tc.count}
    if "cutedsl" in kernels:
        cute = import_cute()
        with count_cute_compiles() as cc, JitMonitor("error"):
            try:
                ck = kernels["cutedsl"]
                cute.compile(type(ck).jit_fn, *ck.warmup_inputs(keys[0]))
                neg["cute_stray_compile"] = "NOT RAISED"
            except UnwarmedKeyError as exc:
                neg["cute_stray_compile"] = {"raised": str(exc), "cute_compiles_started": cc.count}
    res["negative_controls"] = neg

    # 4. timing (median of 50 after 10 warm calls), M=8192, N=4096
    timing = {}
    x = torch.randn(8192, 4096, device="cuda").bfloat16()
    nbytes = x.numel() * 2 + x.numel() + x.numel() // 128 * 4
    for name, k in kernels.items():
        for _ in range(10):
            k(x)
        ts = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            k(x)
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        med = sorted(ts)[len(ts) // 2]
        timing[name] = {"median_ms": round(med, 4), "GB_per_s": round(nbytes / med / 1e6, 1)}
    res["timing_8192x4096"] = timing

    res["ok"] = res["ok"] and all(isinstance(v, dict) for v in neg.values())


def markdown(r: dict[str, Any]) -> str:
    b = r["battery"]
    lines = [
        f"# Backends verification on {r['device']} ({r['arch']})", "",
        f"date {r['date']}, commit `{r['commit']}`, seed {r['seed']}, "
        f"backends {', '.join(r.get('backends', ('triton', 'cutedsl')))}", "",
        "| package | version |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in r["versions"].items()], "",
        f"Warmed keys ({len(r['keys'])}): " + ", ".join(f"`{k}`" for k in r["keys"]), "",
        "| backend | warmup s | Triton compiles | cute.compile calls | registers |", "|---|---|---|---|---|",
    ]
    for name, w in r["warmup"].items():
        regs = sorted({p["registers"] for p in w["per_key"] if p["registers"] is not None})
        lines.append(f"| {name} | {w['seconds']} | {w['triton_compiles']} | {w['cute_compiles']} | {regs} |")
    lines += [
        "", "Triton registers reported by the driver after loading: "
        f"{r['warmup']['triton'].get('n_regs_from_driver')}",
        "", "## Battery (JitMonitor in error mode)", "",
        f"- cases: {b['cases']} (calls per backend: {b['calls']})",
        f"- byte mismatches vs the PyTorch reference: {len(b['mismatches'])}",
        f"- errors: {b['num_errors']}",
        f"- Triton compiles after warmup (post-compile hook): {b['triton_compiles_after_warmup']}",
        f"- cute.compile calls after warmup (wrapper): {b['cute_compiles_after_warmup']}",
        f"- monitor events: {len(b['monitor_events'])}", "",
        "## Negative controls (must raise before compiling)", "",
    ]
    for k, v in r["negative_controls"].items():
        lines.append(f"- {k}: {v if isinstance(v, str) else json.dumps(v)}")
    lines += ["", "## Timing, x bf16 [8192, 4096]", "", "| backend | median ms | GB/s |", "|---|---|---|"]
    for k, v in r["timing_8192x4096"].items():
        lines.append(f"| {k} | {v['median_ms']} | {v['GB_per_s']} |")
    lines += ["", f"**overall: {'PASS' if r['ok'] else 'FAIL'}**", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
