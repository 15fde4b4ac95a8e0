"""Encoders E1..E5 (spec §2.9) on a GPU: every cache byte of both backends vs the reference.

    python3 benchmarks/encoders_gpu_check.py --out DIR_OR_FILE.json [--cases-per-encoder 64] [--seed 0]

For each store hook and format (E1 fp8_ds_mla, E2 bf16 rows, E3 e4m3 rows / fp8_scale, E4 FP8
indexer, E5 MXFP4 indexer) and each backend (triton, cutedsl):

1. warms every key of the hook on the backend (its default config: every format), then counts
   Triton and CuTeDSL compiles over all the calls below (expected: zero);
2. runs random cases covering every regime of §2.12: ``zero`` (+0 and -0), ``tiny`` (2^-60..2^-50
   and blocks with amax in (0, 0.0273], the D1 demo, incl. amax at and around the floor 1e-4),
   ``normal``, ``large`` (up to 2^100), ``saturating`` (block amax exactly 448 * 2^k or 6 * 2^k
   and the next bf16 value above, E3 clamp cases), ``outlier`` (one element 1e4 x its block),
   ``crafted`` (bf16 ties and carries, e4m3 ties 17 / 19 * 2^e and the carry 15.875 -> 16,
   e4m3 subnormal ties, E2M1 thresholds 0.25 .. 5.0 * 2^e and their bf16 neighbours, small
   negatives that round to -0) and ``mixed`` (every row its own regime); T from 1 to 2049;
   kv_bs 1, 2, 3/5 and 64 with minimal and packed page strides; caches that start 0 or 64
   bytes into their buffer; slots shuffled, with -1 (and other negatives), all valid, all
   skipped; E3 with fp8_scale 1, 2^-4, 0.37 and 3.1e-3;
3. fills every buffer byte with the sentinel 0xA5, runs the reference on the CPU and the kernel on
   the GPU on identical buffers, and compares **every byte of the whole buffer** (entries, scale
   regions, pad bytes, page padding, bytes before the first page and after the last).

Prints a table (cases bit-exact and mismatching bytes per encoder and backend), the first
mismatches with their page / region / entry, and writes everything as JSON to ``--out`` (a file
ending in .json, or a directory that gets ``encoders_gpu_check.json``). Exit code 0 iff every
case is bit-exact and nothing compiled after warmup.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.bench import provenance, write_json  # noqa: E402
from dsv4kit.kernels.encoders.reference import (  # noqa: E402
    store_rows_ds_reference,
    store_rows_indexer_reference,
    store_rows_plain_reference,
)
from dsv4kit.kernels.encoders.spec import SPECS  # noqa: E402

BACKENDS = ("triton", "cutedsl")
SENTINEL = 0xA5
TAIL = 64
ENCODERS = ("E1", "E2", "E3", "E4", "E5")
REGIMES = ("zero", "tiny", "normal", "large", "saturating", "outlier", "crafted", "mixed")
SIZES = (1, 7, 32, 257, 513, 2049)
SLOT_PATTERNS = ("shuffled", "sparse", "in_order", "all_skipped")
FP8_SCALES = (1.0, 2.0**-4, 0.37, 3.1e-3)


@dataclass(frozen=True)
class Enc:
    """One encoder's hook and geometry: row width, entry width in cache elements, element size,
    the quantization block (for the regimes), page strides (in cache elements) per kv_bs."""

    name: str
    hook: str
    dim: int
    width: int
    esize: int
    block: int
    geometries: tuple[tuple[int, int], ...]      # (kv_bs, page stride in elements)


ENC = {
    "E1": Enc("E1", "store_rows_ds", 512, 584, 1, 64,
              ((1, 1152), (1, 1728), (2, 1728), (2, 2304), (3, 2304), (64, 37440), (64, 39168))),
    "E2": Enc("E2", "store_rows_plain", 512, 512, 2, 64,
              ((1, 512), (1, 528), (2, 1024), (2, 1072), (5, 2560 + 48), (64, 32768), (64, 32768 + 16))),
    "E3": Enc("E3", "store_rows_plain", 512, 512, 1, 64,
              ((1, 512), (1, 528), (2, 1024), (2, 1072), (5, 2560 + 48), (64, 32768), (64, 32768 + 16))),
    "E4": Enc("E4", "store_rows_indexer", 128, 132, 1, 128,
              ((1, 132), (1, 136), (2, 264), (3, 396 + 8), (64, 8448), (64, 8640))),
    "E5": Enc("E5", "store_rows_indexer", 128, 132, 1, 32,
              ((1, 132), (1, 136), (2, 264), (3, 396 + 8), (64, 8448), (64, 8640))),
}


# ------------------------------------------------------------------------ rows of every regime

def _next_bf16_above(x: float) -> float:
    """The bf16 value just above the positive bf16 value ``x``."""
    u = torch.tensor([x], dtype=torch.float32).view(torch.int32)
    return float((u + 0x10000).view(torch.float32))


def _signs(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)


def _domain(x: torch.Tensor) -> torch.Tensor:
    """Spec §2.1 rule 4: each element 0 or of magnitude in [2^-60, 2^100] (signs kept)."""
    a = x.abs()
    x = torch.where(a > 2.0**100, torch.copysign(torch.tensor(2.0**100), x), x)
    return torch.where((a > 0) & (a < 2.0**-60), torch.copysign(torch.tensor(0.0), x), x)


def _log_uniform(n: int, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    return torch.exp2(lo + (hi - lo) * torch.rand(n, generator=g)) * _signs(n, g)


def _block_tiny(n: int, g: torch.Generator) -> torch.Tensor:
    kind = int(torch.randint(0, 3, (1,), generator=g))
    if kind == 0:
        return _log_uniform(n, -60, -50, g)
    # D1 demo: block amax in (0, 0.0273], including the floor 1e-4 and its neighbours.
    targets = (0.0273, 448 * 2.0**-14, 0.01, 1e-3, 1.5e-4, 1e-4, 1e-4 * (1 + 2**-7), 1e-4 * (1 - 2**-7),
               5e-5, 2.0**-20, 2.0**-40)
    amax = targets[int(torch.randint(0, len(targets), (1,), generator=g))]
    v = torch.randn(n, generator=g)
    v = v / v.abs().max() * amax
    if kind == 2:
        v[int(torch.randint(0, n, (1,), generator=g))] = -amax
    return v


def _amax_element(enc: Enc, g: torch.Generator) -> tuple[float, int]:
    """A saturating block amax and the block exponent it gives: 448 * 2^k (Q8) or 6 * 2^k (MXFP4),
    or the next bf16 value above it (exponent + 1)."""
    k = int(torch.randint(-24, 60, (1,), generator=g))
    base = (6.0 if enc.name == "E5" else 448.0) * 2.0**k
    if bool(torch.rand(1, generator=g) < 0.5):
        return base, k
    return _next_bf16_above(base), k + 1


# e4m3 grid values / ties / carries relative to the block scale 2^e (amax element = 448 * 2^e).
_E4M3_CRAFT = (17.0, 19.0, 15.875, 8.5, 9.5, 16.5, 23.0, 25.0, 31.0, 240.0, 232.0, 248.0, 440.0, 436.0,
               2.0**-6, 2.0**-6 * (1 + 2**-4), 2.0**-6 * (1 - 2**-5),                 # normal/subnormal edge
               1 / 1024, 3 / 1024, 5 / 1024, 7 / 1024, 9 / 1024, 13 / 1024, 15 / 1024,  # subnormal ties
               2.0**-11, 2.0**-12, 0.0)
# bf16 ties and carries (relative): 1 + 3*2^-8 -> 1 + 2^-6 (tie to even), 1 + 2^-8 -> 1, 2 - 2^-9 -> 2.
_BF16_CRAFT = (1 + 3 * 2.0**-8, 1 + 2.0**-8, 1 + 5 * 2.0**-8, 2 - 2.0**-9, 2 - 2.0**-8,
               1 + 2.0**-8 + 2.0**-20, 1 + 3 * 2.0**-8 - 2.0**-20, 1.0)
# E2M1 thresholds relative to 2^e (amax element = 6 * 2^e) and small values that round to 0 / -0.
_E2M1_CRAFT = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.1, 0.24)


def _craft_block(enc: Enc, n: int, g: torch.Generator, scale: float) -> torch.Tensor:
    def pick(vals: tuple[float, ...]) -> torch.Tensor:
        return torch.tensor(vals, dtype=torch.float64)[torch.randint(0, len(vals), (n,), generator=g)]

    if enc.name in ("E1", "E4"):
        amax, e = _amax_element(enc, g)
        v = pick(_E4M3_CRAFT) * 2.0**e
        mix = torch.rand(n, generator=g) < 0.25            # some bf16 ties too (still below the amax)
        v = torch.where(mix, pick(_BF16_CRAFT) * 2.0 ** (e + 6), v)
        v = v * _signs(n, g)
        v[int(torch.randint(0, n, (1,), generator=g))] = amax * float(_signs(1, g))
    elif enc.name == "E5":
        amax, e = _amax_element(enc, g)
        ulp = torch.where(torch.rand(n, generator=g) < 0.5, 1.0, 1.0 + 2.0**-7)   # exact, or bf16 above
        ulp = torch.where(torch.rand(n, generator=g) < 0.3, 1.0 - 2.0**-8, ulp)   # or bf16 below
        v = pick(_E2M1_CRAFT) * ulp * 2.0**e * _signs(n, g)
        v[int(torch.randint(0, n, (1,), generator=g))] = amax * float(_signs(1, g))
    elif enc.name == "E3":
        # e4m3 ties after the scale: bf16(y) * fl(1/s) on the grid's midpoints, clamps, -0.
        v = pick(_E4M3_CRAFT + (447.0, 448.0, 449.0, 464.0, 465.0, 480.0, 1e4)) * scale * _signs(n, g)
    else:
        e = int(torch.randint(-50, 90, (1,), generator=g))
        v = pick(_BF16_CRAFT) * 2.0**e * _signs(n, g)
    return v.float()


def _saturating_block(enc: Enc, n: int, g: torch.Generator, scale: float) -> torch.Tensor:
    if enc.name == "E3":
        v = torch.randn(n, generator=g) * 300 * scale
        fixed = torch.tensor([448.0, -448.0, 464.0, -464.0, 447.9, 448.1, 2000.0, -1e6]) * scale
        idx = torch.randperm(n, generator=g)[: fixed.numel()]
        v[idx] = fixed
        return v
    amax, _ = _amax_element(enc, g)
    v = (torch.rand(n, generator=g) * 2 - 1) * amax * 0.9
    v[int(torch.randint(0, n, (1,), generator=g))] = amax * float(_signs(1, g))
    return v


def make_rows(enc: Enc, regime: str, t: int, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """fp32 rows ``[t, enc.dim]`` of ``regime`` (per quantization block where the regime says so)."""
    d, blk = enc.dim, enc.block
    rows = torch.empty(t, d)
    for r in range(t):
        reg = regime
        if regime == "mixed":
            reg = REGIMES[int(torch.randint(0, len(REGIMES) - 1, (1,), generator=g))]
        for b0 in range(0, d, blk):
            n = blk
            if reg == "zero":
                v = torch.where(torch.rand(n, generator=g) < 0.5, -0.0, 0.0)
            elif reg == "tiny":
                v = _block_tiny(n, g)
            elif reg == "normal":
                v = torch.randn(n, generator=g) * (scale if enc.name == "E3" else 1.0)
            elif reg == "large":
                v = torch.randn(n, generator=g) * 2.0 ** float(torch.randint(20, 99, (1,), generator=g))
            elif reg == "saturating":
                v = _saturating_block(enc, n, g, scale)
            elif reg == "outlier":
                v = torch.randn(n, generator=g)
                v[int(torch.randint(0, n, (1,), generator=g))] = 1e4 * float(_signs(1, g))
            elif reg == "crafted":
                v = _craft_block(enc, n, g, scale)
            else:
                raise ValueError(reg)
            rows[r, b0:b0 + blk] = v
    return _domain(rows).contiguous()


# ------------------------------------------------------------------------ caches and slots

def make_cache(enc: Enc, num_pages: int, kv_bs: int, stride: int, lead: int, device: str):
    """``(buffer, cache)``: every byte 0xA5; the cache view starts ``lead`` bytes into the buffer."""
    page_bytes = stride * enc.esize
    buf = torch.full((lead + num_pages * page_bytes + TAIL,), SENTINEL, dtype=torch.uint8, device=device)
    body = buf[lead:]
    if enc.name == "E2":
        cache = body.view(torch.bfloat16).as_strided((num_pages, kv_bs, 512), (stride, 512, 1))
    elif enc.name == "E3":
        cache = body.view(torch.float8_e4m3fn).as_strided((num_pages, kv_bs, 512), (stride, 512, 1))
    else:
        cache = body.as_strided((num_pages, kv_bs, enc.width), (stride, enc.width, 1))
    return buf, cache


def make_slots(pattern: str, t: int, capacity: int, g: torch.Generator) -> torch.Tensor:
    if pattern == "in_order":
        return torch.arange(t, dtype=torch.int64)
    if pattern == "all_skipped":
        return torch.full((t,), -1, dtype=torch.int64)
    s = torch.randperm(capacity, generator=g)[:t].to(torch.int64)
    frac = 0.15 if pattern == "shuffled" else 0.5
    skip = torch.rand(t, generator=g) < frac
    neg = torch.tensor([-1, -1, -1, -2, -1000, -(2**40)], dtype=torch.int64)
    s[skip] = neg[torch.randint(0, neg.numel(), (int(skip.sum()),), generator=g)]
    return s


@dataclass
class Case:
    label: str
    enc: Enc
    regime: str
    t: int
    kv_bs: int
    stride: int
    lead: int
    pattern: str
    scale: float | None
    rows: torch.Tensor
    slots: torch.Tensor
    num_pages: int

    def extra(self, device: str) -> tuple[Any, ...]:
        if self.enc.name == "E3":
            return (torch.tensor([self.scale], dtype=torch.float32, device=device),)
        if self.enc.name in ("E4", "E5"):
            return (self.enc.name == "E5",)
        return ()


def make_cases(enc: Enc, n: int, seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    cases = []
    for i in range(n):
        regime = REGIMES[i % len(REGIMES)]
        t = SIZES[(i // len(REGIMES)) % len(SIZES)] if i < len(REGIMES) * len(SIZES) else \
            int(torch.randint(1, 1200, (1,), generator=g))
        kv_bs, stride = enc.geometries[i % len(enc.geometries)]
        pattern = "all_skipped" if i % 11 == 10 else SLOT_PATTERNS[i % 3]
        lead = 64 if i % 2 else 0
        scale = float(torch.tensor(FP8_SCALES[i % len(FP8_SCALES)], dtype=torch.float32)) \
            if enc.name == "E3" else None
        num_pages = max(1, math.ceil(t * 1.3 / kv_bs) + (i % 3))
        rows = make_rows(enc, regime, t, g, scale or 1.0)
        slots = make_slots(pattern, t, num_pages * kv_bs, g)
        label = (f"{enc.name} #{i} {regime} T={t} kv_bs={kv_bs} stride={stride} lead={lead} {pattern}"
                 + (f" s={scale:g}" if scale is not None else ""))
        cases.append(Case(label, enc, regime, t, kv_bs, stride, lead, pattern, scale, rows, slots, num_pages))
    return cases


# ------------------------------------------------------------------------ running and comparing

REFERENCE = {"store_rows_ds": store_rows_ds_reference, "store_rows_plain": store_rows_plain_reference,
             "store_rows_indexer": store_rows_indexer_reference}


def reference_bytes(case: Case) -> torch.Tensor:
    buf, cache = make_cache(case.enc, case.num_pages, case.kv_bs, case.stride, case.lead, "cpu")
    REFERENCE[case.enc.hook](case.rows, cache, case.slots, *case.extra("cpu"))
    return buf


def kernel_bytes(case: Case, backend: str) -> torch.Tensor:
    buf, cache = make_cache(case.enc, case.num_pages, case.kv_bs, case.stride, case.lead, "cuda")
    out = SPECS[case.enc.hook].op(case.rows.cuda(), cache, case.slots.cuda(), *case.extra("cuda"),
                                  backend=backend)
    assert out is None
    torch.cuda.synchronize()
    return buf.cpu()


def where(case: Case, off: int) -> str:
    """Page / region / entry of buffer byte ``off``."""
    enc = case.enc
    if off < case.lead:
        return f"before the first page (+{off})"
    o = off - case.lead
    page_bytes = case.stride * enc.esize
    page, p = divmod(o, page_bytes)
    if page >= case.num_pages:
        return f"after the last page (+{o - case.num_pages * page_bytes})"
    bs = case.kv_bs
    if enc.name == "E1":
        if p < bs * 576:
            e, b = divmod(p, 576)
            part = "nope" if b < 448 else "rope"
            return f"page {page} entry {e} {part} byte {b}"
        if p < bs * 584:
            e, b = divmod(p - bs * 576, 8)
            return f"page {page} entry {e} scale byte {b}" + (" (pad)" if b == 7 else "")
    elif enc.name in ("E2", "E3"):
        if p < bs * 512 * enc.esize:
            e, b = divmod(p, 512 * enc.esize)
            return f"page {page} entry {e} byte {b}"
    else:
        tok = 128 if enc.name == "E4" else 64
        if p < bs * tok:
            e, b = divmod(p, tok)
            return f"page {page} entry {e} data byte {b}"
        if p < bs * (tok + 4):
            e, b = divmod(p - bs * tok, 4)
            return f"page {page} entry {e} scale byte {b}"
    return f"page {page} unused byte {p}"


def compare(case: Case, got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    bad = (got != want).nonzero().flatten()
    first = [{"offset": int(o), "where": where(case, int(o)), "got": int(got[o]), "want": int(want[o])}
             for o in bad[:8].tolist()]
    return {"bytes": int(want.numel()), "bad_bytes": int(bad.numel()), "first": first}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a .json file, or a directory for encoders_gpu_check.json")
    ap.add_argument("--cases-per-encoder", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out = out if out.suffix == ".json" else out / "encoders_gpu_check.json"
    if not torch.cuda.is_available():
        print("encoders_gpu_check: needs a CUDA device", file=sys.stderr)
        return 2
    from dsv4kit.backends.cutedsl import count_cute_compiles
    from dsv4kit.backends.triton import count_triton_compiles

    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    result: dict[str, Any] = {"provenance": provenance(), "args": vars(args)}
    log(str(result["provenance"]))

    # 1. warmup (every key of each hook, both backends)
    warm: list[dict[str, Any]] = []
    available = []
    for backend in BACKENDS:
        for hook in dict.fromkeys(e.hook for e in ENC.values()):
            try:
                k = SPECS[hook].kernel(device="cuda", backend=backend)
                t0 = time.perf_counter()
                reports = k.warmup()
                warm.append({"backend": backend, "hook": hook, "keys": [str(r.key) for r in reports],
                             "seconds": time.perf_counter() - t0})
                available.append((backend, hook))
            except Exception as exc:  # report and go on with what works
                warm.append({"backend": backend, "hook": hook, "error": f"{type(exc).__name__}: {exc}"})
                log(f"warmup {backend} {hook}: FAILED {type(exc).__name__}: {exc}")
    result["warmup"] = warm

    # 2./3. cases
    records: list[dict[str, Any]] = []
    with count_triton_compiles() as tc, count_cute_compiles() as cc:
        for ei, name in enumerate(ENCODERS):
            enc = ENC[name]
            t0 = time.perf_counter()
            cases = make_cases(enc, args.cases_per_encoder, args.seed * 1000 + ei)
            for case in cases:
                want = reference_bytes(case)
                for backend in BACKENDS:
                    rec: dict[str, Any] = {"encoder": name, "backend": backend, "case": case.label,
                                           "regime": case.regime, "T": case.t, "kv_bs": case.kv_bs,
                                           "page_stride": case.stride, "lead": case.lead,
                                           "slots": case.pattern, "fp8_scale": case.scale,
                                           "written_rows": int((case.slots >= 0).sum())}
                    if (backend, enc.hook) not in available:
                        rec["error"] = "not warmed (see warmup)"
                    else:
                        try:
                            rec.update(compare(case, kernel_bytes(case, backend), want))
                        except Exception as exc:
                            rec["error"] = f"{type(exc).__name__}: {exc}"
                            rec["traceback"] = traceback.format_exc(limit=6)
                    rec["bit_exact"] = rec.get("bad_bytes") == 0 and "error" not in rec
                    if not rec["bit_exact"]:
                        what = rec.get("error") or f"{rec['bad_bytes']} bytes, first {rec['first'][:3]}"
                        log(f"MISMATCH {backend:8s} {case.label}: {what}")
                    records.append(rec)
            log(f"{name}: {len(cases)} cases in {time.perf_counter() - t0:.1f} s")
    result["compiles_after_warmup"] = {"triton": tc.count, "cutedsl": cc.count}
    result["cases"] = records

    # summary table
    summary = []
    log("")
    log(f"{'encoder':8s} {'backend':8s} {'cases':>6s} {'exact':>6s} {'bad bytes':>10s} "
        f"{'bytes compared':>15s}")
    for name in ENCODERS:
        for backend in BACKENDS:
            rs = [r for r in records if r["encoder"] == name and r["backend"] == backend]
            row = {"encoder": name, "backend": backend, "cases": len(rs),
                   "bit_exact": sum(r["bit_exact"] for r in rs),
                   "bad_bytes": sum(r.get("bad_bytes", 0) for r in rs),
                   "errors": sum("error" in r for r in rs),
                   "bytes": sum(r.get("bytes", 0) for r in rs)}
            summary.append(row)
            log(f"{name:8s} {backend:8s} {row['cases']:6d} {row['bit_exact']:6d} {row['bad_bytes']:10d} "
                f"{row['bytes']:15d}" + (f"  ({row['errors']} errors)" if row["errors"] else ""))
    log("")
    per_regime = {}
    for r in records:
        key = f"{r['encoder']}/{r['backend']}/{r['regime']}"
        ok, n = per_regime.get(key, (0, 0))
        per_regime[key] = (ok + r["bit_exact"], n + 1)
    result["per_regime"] = {k: {"bit_exact": v[0], "cases": v[1]} for k, v in per_regime.items()}
    log(f"compiles after warmup: triton {tc.count}, cutedsl {cc.count}")
    result["summary"] = summary
    ok = all(r["bit_exact"] for r in records) and tc.count == 0 and cc.count == 0
    result["pass"] = ok
    log(f"ALL CHECKS {'PASS' if ok else 'FAIL'}")
    result["log"] = lines
    write_json(out, result)
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
