#!/usr/bin/env python3
"""Every GPU kernel of the kit over its test shapes, both backends, for compute-sanitizer.

    compute-sanitizer --tool memcheck  --report-api-errors no python3 benchmarks/sanitize_cases.py --quick
    compute-sanitizer --tool racecheck --report-api-errors no python3 benchmarks/sanitize_cases.py --quick
    compute-sanitizer --tool initcheck --report-api-errors no python3 benchmarks/sanitize_cases.py --quick
    python3 benchmarks/sanitize_cases.py [--quick] [--families a,b] [--backends triton,cutedsl] [--json F]
    python3 benchmarks/sanitize_cases.py --dry-run [--quick]      # CPU: build every input, run the references

For every family of ``dsv4kit.kernels.families()`` (a family without an entry in :data:`CASES`
is an error: exit 3, so a new family cannot be forgotten), every case of its entry (``--quick``:
a few small ones, the sanitizers are ~100x slower; default: more, from the families' seeded
random cases), and every backend (``triton``; ``cutedsl`` where ``import cutlass`` works): the
case's inputs are copied to the GPU with their strides, storage offsets and the bytes around them,
the public op is called, ``torch.cuda.synchronize()``, and the result is checked against the
family's PyTorch reference run on CPU copies of the same inputs: the op's returned tensors and
the *whole storage* of every tensor argument (what an op writes in place, and that nothing else
was written) are compared byte for byte, except the cache of the C4 compressors, which follows
the compressor rule (``c4_compress.cases.judge(...).ok``: every byte the rule does not judge is
still byte-exact), and the outputs of the C128 compressors: K7's ``out`` by the FP32 rule
(``c128_compress.cases.judge_k7``: every other row byte-exact; its return must be ``out[:T]``), the
K8a / K8b cache by the compressor rule (``judge_store``). Kernels compile on their first call
(outside nothing: the sanitizer sees the compile's launches too, which is fine).

Prints one line per (family, backend, case), then a summary; exit code 0 iff every case passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BACKENDS = ("triton", "cutedsl")


@dataclass
class Case:
    """One call: the op's arguments (CPU tensors) and, for a family with several variants, which."""

    label: str
    kwargs: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- the case table


def _k4(quick: bool) -> list[Case]:
    from dsv4kit.kernels.save_partial_states.cases import FLASH_STATES, TEST_TOKENS, make_case, random_case

    if quick:
        cs = [make_case(FLASH_STATES[0], 7, seed=1), make_case(FLASH_STATES[1], 33, pooled=True, seed=2),
              make_case(FLASH_STATES[2], 5, layout="unaligned", pooled=True, seed=3)]
    else:
        cs = [make_case(cfg, t, seed=t) for cfg in FLASH_STATES for t in TEST_TOKENS]
        cs += [random_case(i, max_tokens=600) for i in range(12)]
    return [Case(c.label, c.kwargs()) for c in cs]


def _k1k2(quick: bool) -> list[Case]:
    from dsv4kit.kernels.indexer_q.cases import REGIMES, make_case

    names = ("positions", "index_q", "cos_sin_cache", "index_weights")
    out = []
    shapes = [(1, "normal"), (33, "crafted")] if quick else [
        (t, r) for t in (1, 7, 32, 257, 513) for r in ("normal",)] + [(65, r) for r in REGIMES]
    for fmt in ("fp8", "mxfp4"):
        for t, reg in shapes:
            c = make_case(t, regime=reg, seed=t, max_pos=512 if quick else 8192)
            kw = dict(zip(names, c.args(), strict=True))
            kw["cache_format"] = fmt
            out.append(Case(f"{fmt} T={t} {reg}", kw))
    return out


def _k3(quick: bool) -> list[Case]:
    from dsv4kit.kernels.dequant_gather.cases import make_case

    names = ("out", "k_cache", "seq_lens", "gather_lens", "block_table", "block_size", "offset")
    specs = [([9, 3], [4, 3], dict(block_size=16)), ([70, 1], None, dict(block_size=64, offset=5))]
    if not quick:
        specs += [([700, 33, 300], [500, 33, 20], dict(offset=5, block_size=64, content="bytes")),
                  ([257], [257], dict(block_size=256)), ([1], [1], dict(block_size=1)),
                  ([130, 64, 5], None, dict(block_size=32, page_stride=19584)),
                  ([513, 0, 2], [100, 0, 2], dict(block_size=64, offset=3))]
    out = []
    for i, (lens, glens, kw) in enumerate(specs):
        c = make_case(lens, glens, seed=i, **kw)
        out.append(Case(c.label, dict(zip(names, c.args(), strict=True))))
    return out


def _rowquant(quick: bool) -> list[Case]:
    from dsv4kit.kernels.rowquant.cases import REGIMES, regime

    shapes = [("normal", 3, 256), ("large", 17, 512)] if quick else [
        (r, m, n) for r in REGIMES for m, n in ((1, 128), (37, 512), (300, 1024))]
    return [Case(f"{r} {m}x{n}", {"x": regime(r, m, n, seed=m)}) for r, m, n in shapes]


def _c4(op: str) -> Callable[[bool], list[Case]]:
    def build(quick: bool) -> list[Case]:
        from dsv4kit.kernels.c4_compress.cases import make_case, random_case

        fmt = [{}]
        if op == "c4_compress_plain":
            fmt = [{}, {"fp8_scale": 0.37}]
        elif op == "indexer_compress":
            fmt = [{"use_fp4": False}, {"use_fp4": True}]
        if quick:
            cs = [make_case(op, lens=(9,), seed=1, **f) for f in fmt]
            cs += [make_case(op, lens=(21, 9, 3), starts=(0, 5, 1001), kv_bs=2, seed=2, **f) for f in fmt]
        else:
            cs = []
        # T = 4105: past CuTeDSL's decode kernel (a CTA per token up to T = 4096), into its prefill one.
        cs += [make_case(op, lens=(2100, 2000, 5), starts=(0, 5, 1001), seed=3, **fmt[-1])]
        if not quick:
            cs += [make_case(op, lens=lens, seed=len(lens), **f) for f in fmt
                   for lens in ((1,), (7,), (32,), (257,), (21, 9, 3))]
            cs += [random_case(op, i) for i in range(12)]
        return [Case(c.label, dict(c.args), {"c4_op": op}) for c in cs]

    return build


def _c128(op: str) -> Callable[[bool], list[Case]]:
    """K7 (``out`` judged by the FP32 rule), K8a / K8b (the cache by the compressor rule)."""

    def build(quick: bool) -> list[Case]:
        from dsv4kit.kernels.c128_compress.cases import TEST_TOKENS, make_k7_case, make_k8_case, random_case

        if op == "c128_compress":
            if quick:
                cs = [make_k7_case(lens=(9,), starts=(120,), seed=1),
                      make_k7_case(lens=(21, 9, 3), starts=(0, 250, 1001), seed=2)]
            else:
                cs = [make_k7_case(lens=(t,), starts=(max(0, 128 - t),), seed=t) for t in TEST_TOKENS]
                cs += [make_k7_case(lens=(140, 20, 3), starts=(120, 240, 1020), seed=5)]
                cs += [random_case(op, i) for i in range(12)]
        else:
            fmt = [{}] if op == "c128_norm_rope_store_ds_mla" else [{}, {"fp8_scale": 0.37}]
            if quick:
                cs = [make_k8_case(op, t=7, boundaries=2, kv_bs=2, seed=1, **f) for f in fmt]
                cs += [make_k8_case(op, t=33, boundaries=3, kv_bs=1, seed=2, **f) for f in fmt]
            else:
                cs = [make_k8_case(op, t=t, boundaries=min(t, 3), kv_bs=kv_bs, seed=t, **f) for f in fmt
                      for t in TEST_TOKENS for kv_bs in (1, 2)]
                cs += [random_case(op, i) for i in range(12)]
        return [Case(c.label, dict(c.args), {"c128_op": op}) for c in cs]

    return build


def _store(hook: str) -> Callable[[bool], list[Case]]:
    def build(quick: bool) -> list[Case]:
        from dsv4kit.kernels.encoders.cases import REGIMES, make_case, random_case

        fmt = [{}]
        if hook == "store_rows_plain":
            fmt = [{}, {"fp8_scale": 0.37}]
        elif hook == "store_rows_indexer":
            fmt = [{"use_fp4": False}, {"use_fp4": True}]
        if quick:
            cs = [make_case(hook, 7, seed=1, **f) for f in fmt]
            cs += [make_case(hook, 37, regime="crafted", kv_bs=64, seed=2, **f) for f in fmt]
        else:
            cs = [make_case(hook, t, regime=r, seed=t, **f) for f in fmt for t in (1, 37, 257)
                  for r in REGIMES[:3]]
            cs += [random_case(hook, i) for i in range(14)]
        return [Case(c.label, dict(c.args)) for c in cs]

    return build


#: family name -> cases(quick). A new family is one entry here (a family without one is an error).
CASES: dict[str, Callable[[bool], list[Case]]] = {
    "save_partial_states": _k4,
    "c4_compress_ds_mla": _c4("c4_compress_ds_mla"),
    "c4_compress_plain": _c4("c4_compress_plain"),
    "indexer_compress": _c4("indexer_compress"),
    "c128_compress": _c128("c128_compress"),
    "c128_norm_rope_store_ds_mla": _c128("c128_norm_rope_store_ds_mla"),
    "c128_norm_rope_store_plain": _c128("c128_norm_rope_store_plain"),
    "indexer_q": _k1k2,
    "dequant_gather": _k3,
    "store_rows_ds": _store("store_rows_ds"),
    "store_rows_plain": _store("store_rows_plain"),
    "store_rows_indexer": _store("store_rows_indexer"),
    "rowquant": _rowquant,
}


def check_table() -> list:
    """The registered families, in order; raises if the table misses one or names a stranger."""
    from dsv4kit.kernels import families

    specs = families()
    names = [s.name for s in specs]
    missing = [n for n in names if n not in CASES]
    extra = [n for n in CASES if n not in names]
    if missing or extra:
        raise SystemExit(f"sanitize_cases.py: CASES does not match dsv4kit.kernels.families(): "
                         f"missing {missing}, not a family {extra}. Add an entry per family.")
    return list(specs)


# --------------------------------------------------------------------------- copies and comparisons


def clone_storage(t: Any, device: torch.device | str) -> Any:
    """``t`` on ``device`` with its whole storage (bytes around the view too), strides and offset."""
    if not isinstance(t, torch.Tensor):
        return t
    nbytes = t.untyped_storage().nbytes()
    if nbytes == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    raw = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    raw = raw.view(torch.uint8).to(device, copy=True)
    return raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of every byte of ``t``'s storage."""
    raw = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    return raw.view(torch.uint8).to("cpu", copy=True)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for t in x if isinstance(t, torch.Tensor)]
    return []


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def reference_call(spec: Any, case: Case) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """(pristine CPU inputs, the reference's return, the CPU arguments after the reference ran)."""
    variant = case.kwargs.get(spec.variant_arg, "default") if spec.variant_arg else "default"
    pristine = {k: clone_storage(v, "cpu") for k, v in case.kwargs.items()}
    ref_args = {k: clone_storage(v, "cpu") for k, v in case.kwargs.items() if k != spec.variant_arg}
    ret = spec.variants[variant].reference(**ref_args)
    return pristine, ret, ref_args


def compare(spec: Any, case: Case, pristine: dict, ref_ret: Any, ref_args: dict, got_ret: Any,
            got_args: dict) -> tuple[bool, str]:
    """The op's returns and every tensor argument's storage against the reference's."""
    bad = []
    rw, rg = _tensors(ref_ret), _tensors(got_ret)
    c128 = None
    if "c128_op" in case.meta:
        from dsv4kit.kernels.c128_compress.cases import C128Case

        c128 = C128Case(case.meta["c128_op"], pristine, case.label)
    if len(rw) != len(rg):
        bad.append(f"returned {len(rg)} tensors, reference {len(rw)}")
    elif c128 is not None and c128.op == "c128_compress":
        # K7 returns out[:T]: a view of the caller's ``out`` (judged below by the FP32 rule), not bits.
        out, t = got_args["out"], int(pristine["positions"].numel())
        bad += [f"return[{i}] is not out[:{t}]" for i, g in enumerate(rg)
                if g.data_ptr() != out.data_ptr() or tuple(g.shape) != (t, out.shape[1])]
    else:
        bad += [f"return[{i}]" for i, (g, w) in enumerate(zip(rg, rw, strict=True)) if not _same_bits(g, w)]
    c4_cache = None
    if "c4_op" in case.meta:
        from dsv4kit.kernels.c4_compress.cases import C4Case

        c4 = C4Case(case.meta["c4_op"], pristine, case.label)
        c4_cache = c4.cache_arg
    for k, w in ref_args.items():
        if not isinstance(w, torch.Tensor):
            continue
        g = got_args[k]
        if k == c4_cache:
            from dsv4kit.kernels.c4_compress.cases import judge

            got_cpu = clone_storage(g, "cpu")
            v = judge(c4, got_cpu, w)
            if not v.ok:
                bad.append(f"{k} (compressor rule: {v.summary()[:300]})")
        elif c128 is not None and k == c128.output_arg:
            from dsv4kit.kernels.c128_compress.cases import judge_k7, judge_store

            got_cpu = clone_storage(g, "cpu")
            v = (judge_k7 if c128.op == "c128_compress" else judge_store)(c128, got_cpu, w)
            if not v.ok:
                rule = "FP32 rule" if c128.op == "c128_compress" else "compressor rule"
                bad.append(f"{k} ({rule}: {v.summary()[:300]})")
        elif not torch.equal(storage_bytes(g), storage_bytes(w)):
            n = int((storage_bytes(g) != storage_bytes(w)).sum())
            bad.append(f"{k} ({n} bytes differ)")
    return (not bad), ("ok" if not bad else "MISMATCH: " + "; ".join(bad))


# --------------------------------------------------------------------------- running


def cutedsl_available() -> tuple[bool, str]:
    try:
        import cutlass  # noqa: F401

        return True, ""
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {exc}"


def run_case(spec: Any, case: Case, backend: str, device: str = "cuda") -> tuple[bool, str]:
    """One call on ``device`` (``cpu``: the Triton interpreter, to test this script), checked."""
    pristine, ref_ret, ref_args = reference_call(spec, case)
    dev = {k: clone_storage(v, device) for k, v in case.kwargs.items()}
    if device != "cpu":
        torch.cuda.synchronize()
    ret = spec.op(**dev, backend=backend)
    if device != "cpu":
        torch.cuda.synchronize()
    return compare(spec, case, pristine, ref_ret, ref_args, ret, dev)


def dry_run(quick: bool, families: list[str] | None = None) -> dict[str, int]:
    """CPU: build every entry's cases, run the references on them; {family: number of cases}."""
    counts = {}
    for spec in check_table():
        if families and spec.name not in families:
            continue
        cases = CASES[spec.name](quick)
        if not cases:
            raise SystemExit(f"sanitize_cases.py: {spec.name}: no cases")
        for c in cases:
            reference_call(spec, c)
        counts[spec.name] = len(cases)
        print(f"DRY  {spec.name:22s} {len(cases):3d} cases built, references ran", flush=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few small cases per family (for the sanitizers)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: build every input, run the references")
    ap.add_argument("--families", help="comma-separated family names (default: all)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--json", type=Path, help="write the rows and provenance here")
    a = ap.parse_args(argv)
    specs = check_table()
    only = a.families.split(",") if a.families else None
    if only:
        unknown = [f for f in only if f not in CASES]
        if unknown:
            print(f"unknown families {unknown}; known: {', '.join(CASES)}")
            return 2
    if a.dry_run:
        counts = dry_run(a.quick, only)
        print(f"\ndry run: {len(counts)} families, {sum(counts.values())} cases: TABLE OK")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: this script needs a GPU (use --dry-run on CPU)")
        return 2
    backends = []
    for b in a.backends.split(","):
        if b == "cutedsl":
            ok, why = cutedsl_available()
            if not ok:
                print(f"SKIP backend cutedsl: import cutlass failed ({why})")
                continue
        backends.append(b)
    rows: list[dict] = []
    t0 = time.perf_counter()
    for spec in specs:
        if only and spec.name not in only:
            continue
        cases = CASES[spec.name](a.quick)
        for backend in backends:
            for i, case in enumerate(cases):
                t1 = time.perf_counter()
                try:
                    ok, detail = run_case(spec, case, backend)
                except Exception as exc:  # noqa: BLE001
                    ok, detail = False, f"{type(exc).__name__}: {str(exc)[:400]}"
                    traceback.print_exc()
                    try:
                        torch.cuda.synchronize()
                    except Exception:  # noqa: BLE001
                        pass
                ms = (time.perf_counter() - t1) * 1e3
                status = "PASS" if ok else "FAIL"
                print(f"{status}  {spec.name:22s} {backend:8s} #{i:<3d} {case.label[:90]:90s} {ms:8.1f} ms  "
                      f"{detail}", flush=True)
                rows.append({"family": spec.name, "backend": backend, "case": i, "label": case.label,
                             "status": status, "detail": detail, "ms": round(ms, 1)})
    n_fail = sum(r["status"] != "PASS" for r in rows)
    print("\nsummary:")
    for spec in specs:
        for b in backends:
            rs = [r for r in rows if r["family"] == spec.name and r["backend"] == b]
            if rs:
                print(f"  {spec.name:22s} {b:8s} {sum(r['status'] == 'PASS' for r in rs):3d}/{len(rs)} pass")
    print(f"{len(rows)} calls, {n_fail} failed, {time.perf_counter() - t0:.1f} s: "
          f"{'ALL CASES OK' if n_fail == 0 and rows else 'CASES FAILED'}")
    if a.json:
        from dsv4kit.bench import provenance

        prov = provenance({"check": "sanitize_cases", "quick": a.quick, "backends": backends})
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"provenance": prov, "rows": rows, "failed": n_fail}, indent=1))
    return 0 if n_fail == 0 and rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
