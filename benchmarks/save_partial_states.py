#!/usr/bin/env python3
"""K4 save_partial_states on a GPU: numerics, zero compiles after warmup, bandwidth.

    python3 benchmarks/save_partial_states.py --out DIR [--cases 60] [--quick]

1. warms the DSv4-Flash keys ((1024, 4, 4), (512, 128, 8), (256, 4, 4)) of both backends
   (CuTeDSL where ``import cutlass`` works);
2. numerics, with the JIT monitor in ``error`` mode and Triton's and CuTeDSL's compile counters
   armed: the spec's test shapes in every layout, then ``--cases`` (>= 50) seeded random cases
   (``cases.random_case``: all configs, awkward T, slices / separate / unaligned views, pooled
   and odd block strides, -1 slots, every regime), each compared bit for bit with the PyTorch
   reference computed on the CPU, on state caches filled with the 0xA5 sentinel;
3. times, at T in {4096, 16384, 65536} per config (``--quick``: 4096, 16384), each backend's
   kernel alone (CUDA-graph replays), each backend's whole call, the eager reference, the eager
   core scatter and ``torch.compile`` of it (no validation inside the compiled region), against
   the device-to-device copy bandwidth measured in this run (``triton.testing.do_bench``).
   At T = 16384 the kernels are also timed on separate tensors, a pooled cache and unaligned
   views (the 4-byte path).

Bytes model per call: kv and score rows read once (``2 T SW`` fp32), the ``R`` ape rows read
once (they stay in L2), positions and slots read (``16 T``), state rows written once
(``2 T SW`` fp32). Inputs: kv/score as column slices of one ``[T, 2 SW]`` buffer, slots a
block-shuffled injection (paged allocation: rows of a block consecutive), no padding.

Writes ``save_partial_states.json`` (everything), ``save_partial_states.csv`` (timings),
``save_partial_states.md`` (tables) and ``provenance.json`` under ``--out``. Exits 2 without
a CUDA device.
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

import torch  # noqa: E402

FAMILY = "save_partial_states"
CONFIGS = ((1024, 4, 4), (512, 128, 8), (256, 4, 4))
#: Seconds torch.compile may spend in total before the script stops using it.
COMPILE_BUDGET_S = 240.0


def log(msg: str) -> None:
    print(msg, flush=True)


def source_hash() -> tuple[str, list[str]]:
    """The family's kernel source hash and the files it covers (``dsv4kit.results``' definition)."""
    from dsv4kit.results import kernel_source_files, kernel_source_hash

    return kernel_source_hash(FAMILY), list(kernel_source_files(FAMILY))


def cutlass_status() -> tuple[bool, str]:
    try:
        import cutlass

        return True, getattr(cutlass, "__version__", "unknown")
    except Exception as exc:  # ImportError or a broken install
        return False, f"{type(exc).__name__}: {exc}"


def kernels(platform) -> dict:
    from dsv4kit.bench import backend_kernels
    from dsv4kit.kernels import family

    return backend_kernels(family("save_partial_states"), platform, log=log)


class Counters:
    """Triton and (where importable) CuTeDSL compile counters, and the monitor in error mode."""

    def __init__(self, with_cute: bool) -> None:
        import contextlib

        from dsv4kit.backends.triton import count_triton_compiles
        from dsv4kit.jit import JitMonitor

        self.stack = contextlib.ExitStack()
        self.triton = self.stack.enter_context(count_triton_compiles())
        self.cute = None
        if with_cute:
            from dsv4kit.backends.cutedsl import count_cute_compiles

            self.cute = self.stack.enter_context(count_cute_compiles())
        self.monitor = self.stack.enter_context(JitMonitor("error"))

    def close(self) -> dict:
        self.stack.close()
        return {"triton_compiles": self.triton.count,
                "cute_compiles": None if self.cute is None else self.cute.count,
                "monitor_events": [str(e) for e in self.monitor.events]}


# --------------------------------------------------------------------------- sections


def warm(ks: dict) -> dict:
    out = {}
    for name, k in ks.items():
        k.clear_cache()
        t0 = time.perf_counter()
        reports = k.warmup()
        out[name] = {"seconds": time.perf_counter() - t0,
                     "keys": [{"key": str(r.key), "seconds": r.seconds, "registers": r.info.get("registers"),
                               "spills": r.info.get("spills"), "error": r.error} for r in reports]}
        log(f"warmup {name:8s}: {len(reports)} keys in {out[name]['seconds']:.1f}s "
            f"(registers {[r.info.get('registers') for r in reports]})")
    return out


def numerics(ks: dict, n_cases: int) -> dict:
    from dsv4kit.kernels.save_partial_states import cases as k4
    from dsv4kit.kernels.save_partial_states.reference import save_partial_states_reference as ref

    layouts, shapes = k4.LAYOUTS, k4.TEST_SHAPES
    specs = [("shape", i) for i in range(len(shapes) * len(layouts))]
    specs += [("random", i) for i in range(n_cases)]
    res = {name: {"cases": 0, "exact": 0, "failures": []} for name in ks}
    counters = Counters("cutedsl" in ks)
    try:
        for kind, i in specs:
            if kind == "shape":
                cfg, t = shapes[i // len(layouts)]
                case = k4.make_case(cfg, t, layout=layouts[i % len(layouts)], pooled=i % 2 == 1,
                                    regime=k4.REGIMES[i % len(k4.REGIMES)], seed=500 + i)
            else:
                case = k4.random_case(i)
            want = case.fresh_state()
            ref(*case.args(want))
            dev = case.to("cuda")
            for name, k in ks.items():
                why = ""
                try:
                    got = dev.fresh_state()
                    k(*dev.args(got))
                    torch.cuda.synchronize()
                    got = k4.move(got, "cpu")
                    ok = k4.same_bits(got, want) and case.untouched_is_sentinel(got)
                    if not ok:
                        diff = (got.view(torch.int32) != want.view(torch.int32))
                        why = f"{int(diff.sum())} words differ"
                except Exception as exc:
                    ok = False
                    why = f"{type(exc).__name__}: {str(exc)[:300]}"
                r = res[name]
                r["cases"] += 1
                r["exact"] += int(ok)
                if not ok and len(r["failures"]) < 10:
                    r["failures"].append(f"{case.label}: {why}")
    finally:
        compiles = counters.close()
    for name, r in res.items():
        log(f"numerics {name:8s}: {r['exact']}/{r['cases']} cases bit-exact"
            + (f"; first failures {r['failures'][:3]}" if r["failures"] else ""))
    log(f"numerics compiles after warmup: {compiles}")
    return {"per_backend": res, **compiles}


def bench_inputs(cfg: tuple[int, int, int], t: int, layout: str = "slices", pooled: bool = False,
                 seed: int = 0) -> tuple[tuple, int]:
    """GPU inputs of one timing point and its bytes model."""
    from dsv4kit.formats.state_cache import allocate_state_cache

    sw, r, sbs = cfg
    g = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "slices":
        kv_score = torch.randn(t, 2 * sw, device="cuda", generator=g)
        kv, score = kv_score[:, :sw], kv_score[:, sw:]
    elif layout == "separate":
        kv = torch.randn(t, sw, device="cuda", generator=g)
        score = torch.randn(t, sw, device="cuda", generator=g)
    else:  # unaligned: views 1 and 2 elements past a 16-byte boundary, odd row stride
        stride = 2 * sw + 3
        buf = torch.randn(t * stride + 4, device="cuda", generator=g)
        kv = buf[1:].as_strided((t, sw), (stride, 1))
        score = buf[2 + sw:].as_strided((t, sw), (stride, 1))
    ape = torch.randn(r, sw, device="cuda", generator=g)
    positions = torch.arange(t, device="cuda", dtype=torch.int64) + 7
    nsb = -(-t // sbs) + 1
    bstride = sbs * 2 * sw + 12 if pooled else None
    state = allocate_state_cache(nsb, sbs, sw, block_stride=bstride, device="cuda")
    blocks = torch.randperm(nsb, device="cuda", generator=g)
    tok = torch.arange(t, device="cuda")
    slots = (blocks[tok // sbs] * sbs + tok % sbs).to(torch.int64)
    nbytes = 4 * (2 * t * sw + min(r, t) * sw + 2 * t * sw) + 16 * t
    return (kv, score, ape, positions, state, slots, sbs, sw, r), nbytes


def scatter_core(kv, score, ape, positions, state, slots, sbs: int, r: int):
    """The reference's scatter without its checks (what ``torch.compile`` gets)."""
    t = slots.shape[0]
    idx = torch.nonzero(slots >= 0).flatten()
    s = slots[idx]
    rows = torch.cat((kv[:t][idx], score[:t][idx] + ape[positions[:t][idx] % r]), dim=1)
    state[s // sbs, s % sbs] = rows


def timings(ks: dict, sizes: list[int], copy_gbs: float, quick: bool) -> tuple[list[dict], dict]:
    from dsv4kit.bench import bench_median_ms
    from dsv4kit.kernels.save_partial_states.reference import save_partial_states_reference as ref

    rows: list[dict] = []
    rep = 60 if quick else 200
    try:
        import torch._dynamo

        torch._dynamo.config.capture_dynamic_output_shape_ops = True
        compiled = torch.compile(scatter_core, dynamic=True)
    except Exception as exc:
        log(f"torch.compile unavailable: {exc}")
        compiled = None
    compile_spent = 0.0
    points = [(cfg, t, "slices", False) for cfg in CONFIGS for t in sizes]
    points += [(cfg, 16384, layout, pooled) for cfg in CONFIGS
               for layout, pooled in (("separate", False), ("slices", True), ("unaligned", True))]
    kernel_compiles: dict = {}
    for cfg, t, layout, pooled in points:
        args, nbytes = bench_inputs(cfg, t, layout, pooled, seed=t)
        variants = {}
        for name, k in ks.items():
            key = k.dispatch(cfg[0], cfg[1], cfg[2])
            launch = k.launch_args(*args[:6], t)
            exe = k._get_or_compile(key)
            variants[name] = (lambda exe=exe, launch=launch: exe(*launch), True)
            variants[f"{name} (op)"] = (lambda k=k, a=args: k(*a), False)
        main = layout == "slices" and not pooled
        if main:
            variants["torch eager (reference, validated)"] = (lambda a=args: ref(*a), False)
            variants["torch eager (core scatter)"] = (
                lambda a=args: scatter_core(*a[:6], a[6], a[8]), False)
            if compiled is not None and compile_spent < COMPILE_BUDGET_S:
                t_c = time.perf_counter()
                try:
                    compiled(*args[:6], args[6], args[8])     # compile outside the timing
                    variants["torch.compile (core scatter)"] = (
                        lambda a=args, f=compiled: f(*a[:6], a[6], a[8]), False)
                except Exception as exc:
                    log(f"torch.compile(core) failed: {type(exc).__name__}: {str(exc)[:300]}")
                    compiled = None
                compile_spent += time.perf_counter() - t_c
        for name, (fn, is_kernel) in variants.items():
            counters = Counters("cutedsl" in ks) if name in ks or "(op)" in name else None
            err = ""
            try:
                ms = bench_median_ms(fn, graph=is_kernel, rep_ms=rep)
            except Exception as exc:
                ms = float("nan")
                err = f"{type(exc).__name__}: {str(exc)[:200]}"
            finally:
                if counters is not None:
                    c = counters.close()
                    kernel_compiles[f"{name} {cfg} T={t} {layout}{' pooled' if pooled else ''}"] = c
            gbs = nbytes / (ms * 1e-3) / 1e9 if ms == ms else float("nan")
            rows.append({"state_width": cfg[0], "compress_ratio": cfg[1], "state_block_size": cfg[2], "T": t,
                         "layout": layout, "pooled": pooled, "impl": name, "bytes": nbytes,
                         "median_us": ms * 1e3, "GBps": gbs, "pct_of_copy": 100 * gbs / copy_gbs,
                         "timing": "cuda-graph replay" if is_kernel else "events (do_bench)", "error": err})
            log(f"{str(cfg):>14} T={t:6d} {layout:9s}{' pooled' if pooled else '       '} {name:36s} "
                f"{ms * 1e3:9.1f} us {gbs:7.0f} GB/s {100 * gbs / copy_gbs:5.1f}%{'  ' + err if err else ''}")
        del args
        torch.cuda.empty_cache()
    total = {"triton_compiles": sum(c["triton_compiles"] for c in kernel_compiles.values()),
             "cute_compiles": sum(c["cute_compiles"] or 0 for c in kernel_compiles.values()),
             "monitor_events": sum(len(c["monitor_events"]) for c in kernel_compiles.values())}
    log(f"timing compiles after warmup (kernel rows only): {total}")
    return rows, total


def check_compiled_core() -> dict:
    """``torch.compile`` of the core on one random case, against the reference (bit for bit)."""
    from dsv4kit.kernels.save_partial_states.cases import make_case, move, same_bits
    from dsv4kit.kernels.save_partial_states.reference import save_partial_states_reference as ref

    try:
        case = make_case((512, 128, 8), 301, layout="slices", pooled=True, seed=77)
        want = case.fresh_state()
        ref(*case.args(want))
        dev = case.to("cuda")
        got = dev.fresh_state()
        torch.compile(scatter_core, dynamic=True)(dev.kv, dev.score, dev.ape, dev.positions, got,
                                                  dev.slot_mapping, 8, 128)
        return {"bit_exact": bool(same_bits(move(got, "cpu"), want))}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def markdown(result: dict) -> str:
    prov = result["provenance"]
    lines = [f"# K4 save_partial_states on {prov.get('device')}", "",
             f"date {prov.get('date')}, commit `{str(prov.get('commit'))[:12]}`, torch {prov.get('torch')}, "
             f"triton {prov.get('triton')}, nvidia-cutlass-dsl {prov.get('nvidia-cutlass-dsl')}, "
             f"kernel source hash `{prov.get('kernel_source_hash', '')[:16]}`", "",
             f"Device-to-device copy: **{result['copy_GBps']:.0f} GB/s** (read + write, `do_bench`).", "",
             "## Numerics (BIT-EXACT vs the reference, sentinel-filled caches)", "",
             "| backend | cases | bit-exact |", "|---|---|---|"]
    num = result.get("numerics", {})
    for name, r in num.get("per_backend", {}).items():
        lines.append(f"| {name} | {r['cases']} | {r['exact']} |")
    lines += ["", f"Compiles after warmup during numerics: Triton {num.get('triton_compiles')}, "
                  f"CuTeDSL {num.get('cute_compiles')}, monitor events {len(num.get('monitor_events', []))}; "
                  f"during kernel timings: {result.get('timing_compiles')}.", "",
              "## Bandwidth (bytes model in the script's docstring)", "",
              "| (SW, R, sbs) | T | layout | impl | us | GB/s | % of copy |", "|---|---|---|---|---|---|---|"]
    for r in result.get("timings", []):
        lay = r["layout"] + (" pooled" if r["pooled"] else "")
        cfg = (r["state_width"], r["compress_ratio"], r["state_block_size"])
        lines.append(f"| {cfg} | {r['T']} | {lay} | {r['impl']} | {r['median_us']:.1f} | {r['GBps']:.0f} "
                     f"| {r['pct_of_copy']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for the result files")
    ap.add_argument("--cases", type=int, default=60, help="random numerics cases per backend (>= 50)")
    ap.add_argument("--quick", action="store_true", help="a shorter run (T up to 16384, shorter timing)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("save_partial_states benchmark: needs a CUDA device (none is visible)", file=sys.stderr)
        return 2
    if a.cases < 50:
        ap.error("--cases must be >= 50")
    a.out.mkdir(parents=True, exist_ok=True)

    from dsv4kit.bench import copy_bandwidth_gbs, provenance, write_csv, write_json
    from dsv4kit.platform import current_platform

    platform = current_platform()
    digest, files = source_hash()
    ok, cutlass_version = cutlass_status()
    prov = provenance({"kernel": "save_partial_states (K4)", "family": FAMILY, "arch": platform.arch,
                       "cutlass": cutlass_version if ok else None, "kernel_source_hash": digest,
                       "kernel_source_files": files, "quick": a.quick})
    write_json(a.out / "provenance.json", prov)
    log(json.dumps(prov))
    result: dict = {"provenance": prov}
    status = 0
    t0 = time.perf_counter()
    ks = kernels(platform)
    result["copy_GBps"] = copy_gbs = copy_bandwidth_gbs((512 << 20) if a.quick else (2 << 30))
    log(f"device-to-device copy: {copy_gbs:.0f} GB/s")
    try:
        result["warmup"] = warm(ks)
        result["numerics"] = numerics(ks, a.cases)
        result["compiled_core_check"] = check_compiled_core()
        log(f"torch.compile(core) vs reference: {result['compiled_core_check']}")
        sizes = [4096, 16384] if a.quick else [4096, 16384, 65536]
        result["timings"], result["timing_compiles"] = timings(ks, sizes, copy_gbs, a.quick)
    except Exception:
        result["error"] = traceback.format_exc()
        log(result["error"])
        status = 1
    result["seconds"] = time.perf_counter() - t0
    write_json(a.out / "save_partial_states.json", result)
    write_csv(a.out / "save_partial_states.csv", result.get("timings", []))
    (a.out / "save_partial_states.md").write_text(markdown(result) if "timings" in result else "incomplete\n")
    num = result.get("numerics", {})
    exact = all(r["exact"] == r["cases"] for r in num.get("per_backend", {}).values()) and bool(num)
    tc = result.get("timing_compiles", {})
    zero = all(c.get("triton_compiles") == 0 and not c.get("cute_compiles") and not c.get("monitor_events")
               for c in (num, tc))
    log(f"\nnumerics exact: {exact}; zero compiles after warmup: {zero}; total {result['seconds']:.0f}s; "
        f"results in {a.out}")
    return status if (exact and zero) else 1


if __name__ == "__main__":
    sys.exit(main())
