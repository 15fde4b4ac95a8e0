"""Indexer-Q (K1 FP8, K2 MXFP4) on a GPU: numerics, zero compiles after warmup, bandwidth.

    python3 benchmarks/indexer_q.py --out DIR [--cases 60] [--quick]

1. warms every key of both variants in both backends (registry, as a model would);
2. numerics: >= --cases random cases per (backend, variant), awkward token counts, every
   regime of spec §2.12, both cos_sin dtypes, plus the real 1 048 576-row YaRN cache; each
   compared bit for bit with the PyTorch reference computed on the CPU;
3. replays a serving trace of token counts with the monitor in ``error`` mode while counting
   Triton and CuTeDSL compiles (expected: zero);
4. times both backends, the eager PyTorch reference and ``torch.compile`` of it at
   T in {1, 16, 128, 1024, 8192, 65536}, against the copy bandwidth measured in this run.

Writes ``indexer_q.json``, ``indexer_q.csv`` and ``indexer_q.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.bench import bench_median_ms, copy_bandwidth_gbs, provenance, write_csv, write_json  # noqa: E402
from dsv4kit.formats.bits import pow2  # noqa: E402
from dsv4kit.formats.fp8 import q8_quantize  # noqa: E402
from dsv4kit.formats.mxfp4 import pack_nibbles, q4_quantize, scale_bytes_to_int32  # noqa: E402
from dsv4kit.formats.rope import YarnConfig, build_cos_sin_cache  # noqa: E402
from dsv4kit.jit import JitMonitor, KeyLedger, WarmupRegistry  # noqa: E402
from dsv4kit.kernels.indexer_q import SPEC, IndexerQConfig  # noqa: E402
from dsv4kit.kernels.indexer_q.cases import REGIMES, make_case  # noqa: E402
from dsv4kit.kernels.indexer_q.reference import (  # noqa: E402
    indexer_q_fp8_reference,
    indexer_q_mxfp4_reference,
    indexer_q_rope_bf16,
)

BACKENDS = ("triton", "cutedsl")
FORMATS = ("fp8", "mxfp4")
REFERENCE = {"fp8": indexer_q_fp8_reference, "mxfp4": indexer_q_mxfp4_reference}
SS, HS = 128**-0.5, 64**-0.5


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bits(got, want) -> bool:
    return all(torch.equal(_bits(g.cpu()), _bits(w.cpu())) for g, w in zip(got, want, strict=True))


def bytes_moved(fmt: str, t: int, cs_bytes: int = 4) -> int:
    """Bytes model: every input read once, every output written once (cos/sin: one row per token)."""
    read = t * 64 * 128 * 2 + t * 64 * 2 + t * 8 + t * 64 * cs_bytes
    write = t * 64 * 128 + t * 64 * 4 if fmt == "fp8" else t * 64 * 64 + t * 64 * 4 + t * 64 * 4
    return read + write


# ------------------------------------------------------------------------ the reference, compiled

def fp8_core(pos, q, cs, w):
    y = indexer_q_rope_bf16(pos, q, cs)
    codes, e = q8_quantize(y, 128)
    return codes, ((w.float() * pow2(e[..., 0])) * SS) * HS


def mxfp4_core(pos, q, cs, w):
    codes, scale = q4_quantize(indexer_q_rope_bf16(pos, q, cs))
    return pack_nibbles(codes), scale_bytes_to_int32(scale), (w.float() * SS) * HS


CORES = {"fp8": fp8_core, "mxfp4": mxfp4_core}


# ------------------------------------------------------------------------ steps

def warm_all(log) -> dict:
    registry = WarmupRegistry()
    with registry.activate():
        for backend in BACKENDS:
            for fmt in FORMATS:
                SPEC.kernel(fmt, "cuda", backend).register_warmup(
                    IndexerQConfig(max_num_batched_tokens=65536, indexer_cache_dtype=fmt))
    t0 = time.perf_counter()
    report = registry.warmup(progress=False)
    log(report.table())
    return {"seconds": time.perf_counter() - t0, "rows": report.rows()}


def numerics(n_cases: int, log) -> list[dict]:
    rng = random.Random(0)
    sizes = [1, 7, 32, 257, 511, 512, 513]
    out = []
    for backend in BACKENDS:
        for fmt in FORMATS:
            kernel = SPEC.kernel(fmt, "cuda", backend)
            ok = 0
            for i in range(n_cases):
                t = sizes[i % len(sizes)] if i < 2 * len(sizes) else rng.randint(1, 3000)
                regime = REGIMES[i % len(REGIMES)]
                cs_dtype = (torch.float32, torch.bfloat16)[(i // len(REGIMES)) % 2]
                case = make_case(t, cs_dtype, regime, seed=1000 + i)
                want = REFERENCE[fmt](*case.args())
                got = kernel(*case.to("cuda").args())
                good = same_bits(got, want)
                ok += good
                if not good:
                    log(f"MISMATCH {backend} {fmt} T={t} {regime} {cs_dtype}")
            out.append({"backend": backend, "format": fmt, "cases": n_cases, "bit_exact": ok})
            log(f"{backend:8s} {fmt:6s} bit-exact {ok}/{n_cases}")
    # One case on the real YaRN cache of the compressed layers (1 048 576 rows, fp32).
    cache = build_cos_sin_cache(1 << 20, 160_000.0, yarn=YarnConfig())
    case = make_case(300, seed=7, max_pos=1 << 20)
    case.cos_sin_cache = cache
    for backend in BACKENDS:
        for fmt in FORMATS:
            good = same_bits(SPEC.kernel(fmt, "cuda", backend)(*case.to("cuda").args()),
                             REFERENCE[fmt](*case.args()))
            out.append({"backend": backend, "format": fmt, "cases": 1, "bit_exact": int(good),
                        "note": "real 1M-row YaRN cache"})
            log(f"{backend:8s} {fmt:6s} real YaRN cache bit-exact: {good}")
    return out


def replay(log) -> dict:
    from dsv4kit.backends.cutedsl import count_cute_compiles
    from dsv4kit.backends.triton import count_triton_compiles

    rng = random.Random(1)
    decode = [rng.randint(1, 256) for _ in range(60)]
    prefill = [rng.randint(256, 8192) for _ in range(30)]
    trace = decode + prefill + [511, 512]
    calls = 0
    with KeyLedger() as ledger, count_triton_compiles() as tc, count_cute_compiles() as cc, \
            JitMonitor("error") as mon:
        for backend in BACKENDS:
            for fmt in FORMATS:
                kernel = SPEC.kernel(fmt, "cuda", backend)
                ledger.add_warmed(kernel.name, kernel.compiled_keys())
        for i, t in enumerate(trace):
            case = make_case(t, (torch.float32, torch.bfloat16)[i % 2], seed=i).to("cuda")
            for backend in BACKENDS:
                for fmt in FORMATS:
                    SPEC.kernel(fmt, "cuda", backend)(*case.args())
                    calls += 1
        torch.cuda.synchronize()
    res = {"calls": calls, "triton_compiles": tc.count, "cute_compiles": cc.count,
           "monitor_events": len(mon.events), "missed": {k: len(v) for k, v in ledger.missed().items()},
           "requested_keys": {k: len(v) for k, v in ledger.requested.items()}}
    log(f"replay: {res}")
    return res


def timings(sizes, copy_gbs: float, log) -> list[dict]:
    rows = []
    compiled = {fmt: torch.compile(CORES[fmt], dynamic=True) for fmt in FORMATS}
    for t in sizes:
        case = make_case(t, torch.float32, seed=t).to("cuda")
        call = case.args()
        for fmt in FORMATS:
            nbytes = bytes_moved(fmt, t)
            variants = {}
            for backend in BACKENDS:
                kernel = SPEC.kernel(fmt, "cuda", backend)
                spec_args = kernel.launch_args(*case.args(), kernel.outputs(t, torch.device("cuda")), SS, HS)
                key = kernel.dispatch(case.index_q, case.cos_sin_cache, t)
                exe = kernel._get_or_compile(key)
                variants[backend] = lambda exe=exe, a=spec_args: exe(*a)
                variants[f"{backend} (op)"] = lambda k=kernel, a=call: k(*a)
            variants["torch eager"] = lambda f=CORES[fmt], a=call: f(*a)
            variants["torch.compile"] = lambda f=compiled[fmt], a=call: f(*a)
            for name, fn in variants.items():
                try:
                    ms = bench_median_ms(fn, graph="(op)" not in name and name != "torch.compile")
                except Exception as exc:  # report, keep going
                    log(f"T={t} {fmt} {name}: failed ({type(exc).__name__}: {exc})")
                    continue
                gbs = nbytes / (ms * 1e-3) / 1e9
                rows.append({"T": t, "format": fmt, "impl": name, "ms": ms, "GB/s": gbs,
                             "pct_of_copy": 100 * gbs / copy_gbs, "bytes": nbytes})
                log(f"T={t:6d} {fmt:6s} {name:16s} {ms * 1e3:10.1f} us {gbs:8.0f} GB/s "
                    f"{100 * gbs / copy_gbs:5.1f}%")
        torch.cuda.empty_cache()
    return rows


def plot(rows, copy_gbs: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, fmt in zip(axes, FORMATS, strict=True):
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = [(r["T"], r["GB/s"]) for r in rows if r["format"] == fmt and r["impl"] == impl]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=impl)
        ax.axhline(copy_gbs, color="k", ls="--", lw=1, label=f"copy {copy_gbs:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens T")
        ax.set_title(f"indexer-Q {fmt}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s (bytes model)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    if not torch.cuda.is_available():
        print("indexer_q benchmark: needs a CUDA device", file=sys.stderr)
        return 2
    result: dict = {"provenance": provenance()}
    log(str(result["provenance"]))
    result["copy_GBps"] = copy_gbs = copy_bandwidth_gbs()
    log(f"copy bandwidth: {copy_gbs:.0f} GB/s")
    result["warmup"] = warm_all(log)
    result["numerics"] = numerics(args.cases, log)
    result["replay"] = replay(log)
    sizes = [1, 16, 128, 1024] if args.quick else [1, 16, 128, 1024, 8192, 65536]
    result["timings"] = rows = timings(sizes, copy_gbs, log)
    result["log"] = lines
    write_json(out / "indexer_q.json", result)
    write_csv(out / "indexer_q.csv", rows)
    plot(rows, copy_gbs, out / "indexer_q.png")
    ok = all(r["bit_exact"] == r["cases"] for r in result["numerics"])
    ok &= result["replay"]["triton_compiles"] == 0 and result["replay"]["cute_compiles"] == 0
    ok &= not result["replay"]["missed"]
    log(f"ALL CHECKS {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
