"""``dsv4kit verify``: every family's numerics battery on this machine's device, one verdict.

For each family and backend the battery warms the keys its cases request, then runs every case
with the JIT monitor in ``error`` mode: the kernel's output is compared byte for byte (sentinel
bytes of written buffers included) with the PyTorch reference run on the CPU, and any compile
after warmup is a failure. On a GPU both backends run; on a CPU only Triton, under the
interpreter, on the small cases (CuTeDSL kernels run only on a GPU).

A battery is a family's seeded cases (its ``cases.py``) as op arguments by name; families whose
kernels follow a rounding rule rather than bit-identity (the compressors, spec §2.12) also give
the rule's judge, so a case passes when bit-identical or judged correct, and the verdict counts
both. This command is the one a user runs on their card; the bandwidth is ``dsv4kit bench``, and
the cases these batteries do not run yet (the C4 and C128 compressors' large, padded and chained
cases) are ``benchmarks/``'s two compressor checks (``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dsv4kit.errors import UnwarmedKeyError
from dsv4kit.family import DEFAULT_VARIANT, FamilySpec
from dsv4kit.jit import JitMonitor
from dsv4kit.kernels import FAMILY_NAMES, family
from dsv4kit.platform import BACKENDS, Platform, current_platform

__all__ = ["BATTERIES", "Check", "Row", "add_parser", "run_verify", "verdict_table"]

#: A case's judge when bit-identity is not the rule: (case arguments after the kernel, after the
#: reference) -> pass.
Judge = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Check:
    """One seeded case: op arguments by name (CPU tensors, written buffers sentinel-filled)."""

    label: str
    args: Mapping[str, Any]
    judge: Judge | None = None


@dataclass
class Row:
    """The verdict of one family on one backend."""

    family: str
    backend: str
    cases: int = 0
    bit_identical: int = 0
    passed: int = 0
    compiles_after_warmup: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.cases > 0 and self.passed == self.cases and not self.compiles_after_warmup

    def json(self) -> dict[str, Any]:
        return {"family": self.family, "backend": self.backend, "cases": self.cases,
                "bit_identical": self.bit_identical, "passed": self.passed,
                "compiles_after_warmup": self.compiles_after_warmup, "pass": self.ok,
                "failures": self.failures[:10], "seconds": round(self.seconds, 3)}


# --------------------------------------------------------------------------- batteries
# One per family: ``(n, small) -> checks``, from the family's own cases module (imported on use).


def _rowquant(n: int, small: bool) -> list[Check]:
    from dsv4kit.kernels.rowquant.cases import REGIMES, regime

    rows = (1, 3, 17) if small else (1, 7, 257, 511, 512, 1000, 4099)
    widths = (512,) if small else (512, 4096)
    out = []
    for i in range(n):
        m, w, r = rows[i % len(rows)], widths[(i // len(rows)) % len(widths)], REGIMES[i % len(REGIMES)]
        out.append(Check(f"{r} [{m}, {w}]", {"x": regime(r, m, w, seed=i)}))
    return out


def _indexer_q(n: int, small: bool) -> list[Check]:
    from dsv4kit.kernels.indexer_q.cases import REGIMES, make_case

    sizes = (1, 7, 33) if small else (1, 7, 32, 257, 511, 512, 513, 3000)
    out = []
    for i in range(n):
        t, regime = sizes[i % len(sizes)], REGIMES[i % len(REGIMES)]
        cs = (torch.float32, torch.bfloat16)[(i // len(REGIMES)) % 2]
        c = make_case(t, cs, regime, seed=1000 + i)
        for fmt in ("fp8", "mxfp4"):
            out.append(Check(f"{fmt} T={t} {regime} {cs}", {
                "positions": c.positions, "index_q": c.index_q, "cos_sin_cache": c.cos_sin_cache,
                "index_weights": c.index_weights, "cache_format": fmt}))
    return out


def _dequant_gather(n: int, small: bool) -> list[Check]:
    from dsv4kit.kernels.dequant_gather.cases import make_case, table_case

    rnd = random.Random(1234)
    cases = [table_case()]
    for i in range(n - 1):
        bs = rnd.choice([1, 2, 64] if small else [1, 2, 64, 256])
        nreq = rnd.randint(1, 3 if small else 6)
        seq = [rnd.choice([0, 1, rnd.randint(1, 4 * bs + 9)]) for _ in range(nreq)]
        gl = [rnd.randint(0, s) for s in seq] if rnd.random() < 0.5 else None
        stride = None if rnd.random() < 0.5 else (-(-bs * 584 // 576) + rnd.randint(0, 3)) * 576
        cases.append(make_case(seq, gl, offset=rnd.randint(0, 9), block_size=bs, page_stride=stride,
                               content=rnd.choice(["encoded", "bytes"]), seed=i))
    names = ("out", "k_cache", "seq_lens", "gather_lens", "block_table", "block_size", "offset")
    return [Check(c.label or f"case {i}", dict(zip(names, c.args(), strict=True)))
            for i, c in enumerate(cases)]


def _save_partial_states(n: int, small: bool) -> list[Check]:
    from dsv4kit.kernels.save_partial_states.cases import random_case

    out = []
    for i in range(n):
        c = random_case(i, max_tokens=40 if small else 3000)
        out.append(Check(f"case {i}", c.kwargs()))
    return out


def _encoders(hook: str) -> Callable[[int, bool], list[Check]]:
    def checks(n: int, small: bool) -> list[Check]:
        from dsv4kit.kernels.encoders.cases import random_case

        cases = [random_case(hook, i) for i in range(n)]
        return [Check(c.label or f"case {i}", c.args) for i, c in enumerate(cases)]

    return checks


def _c4(op: str) -> Callable[[int, bool], list[Check]]:
    def checks(n: int, small: bool) -> list[Check]:
        from dsv4kit.kernels.c4_compress.cases import judge, random_case

        tokens = (1, 7, 33) if small else (1, 7, 32, 257, 513)
        out = []
        for i in range(n):
            case = random_case(op, i, tokens=tokens)
            out.append(Check(case.label or f"case {i}", case.args, _judge_cache(case, judge, case.cache_arg)))
        return out

    return checks


def _c128(op: str) -> Callable[[int, bool], list[Check]]:
    def checks(n: int, small: bool) -> list[Check]:
        from dsv4kit.kernels.c128_compress.cases import judge_k7, judge_store, random_case

        rule = judge_k7 if op == "c128_compress" else judge_store
        out = []
        for i in range(n):
            kw = {"tokens": (1, 7, 33)} if small else {}
            case = random_case(op, i, **kw)
            out.append(Check(case.label or f"case {i}", case.args, _judge_cache(case, rule, case.output_arg)))
        return out

    return checks


def _judge_cache(case: Any, rule: Callable[..., Any], arg: str) -> Judge:
    """The family rule's verdict on the buffer ``arg`` the op writes (kernel vs reference)."""
    return lambda got, want: bool(rule(case, got[arg], want[arg]).ok)


#: family name -> its battery.
BATTERIES: dict[str, Callable[[int, bool], list[Check]]] = {
    "save_partial_states": _save_partial_states,
    **{op: _c4(op) for op in ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress")},
    **{op: _c128(op) for op in ("c128_compress", "c128_norm_rope_store_ds_mla",
                                "c128_norm_rope_store_plain")},
    "indexer_q": _indexer_q,
    "dequant_gather": _dequant_gather,
    **{hook: _encoders(hook) for hook in ("store_rows_ds", "store_rows_plain", "store_rows_indexer")},
    "rowquant": _rowquant,
}


# --------------------------------------------------------------------------- running


def _copy(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` with its whole storage on ``device``: strides, offset and the bytes around it (the
    sentinel) kept, so a kernel's stray write shows."""
    s = t.untyped_storage()
    # the byte view lives where the storage does (a CPU view of a CUDA storage is refused)
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(s, 0, (s.nbytes(),), (1,))
    raw = raw.to(device, copy=True)
    return raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def _on(args: Mapping[str, Any], device: torch.device | str) -> dict[str, Any]:
    return {k: _copy(v, device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    s = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(s, 0, (s.nbytes(),), (1,)) if t.is_cpu else \
        _storage_bytes(_copy(t, "cpu"))


def _outputs(spec: FamilySpec, args: Mapping[str, Any], result: Any) -> list[torch.Tensor]:
    """What the op produced: its written arguments (whole storages), else its returned tensors."""
    if spec.mutates:
        return [_storage_bytes(args[m]) for m in spec.mutates if args.get(m) is not None]
    out = result if isinstance(result, tuple) else (result,)
    return [o.detach().cpu().contiguous().view(torch.uint8) for o in out]


def _reference(spec: FamilySpec, args: Mapping[str, Any]) -> Any:
    values, _ = spec.bind(**args)
    variant = values.pop(spec.variant_arg) if spec.variant_arg else DEFAULT_VARIANT
    return spec.variants[variant].reference(**values)


def _variant(spec: FamilySpec, args: Mapping[str, Any]) -> str:
    return args.get(spec.variant_arg, DEFAULT_VARIANT) if spec.variant_arg else DEFAULT_VARIANT


def _warm(spec: FamilySpec, checks: Sequence[Check], device: str, backend: str, platform: Platform) -> None:
    """Compile the keys the cases request (what a runtime's warmup registers for these calls)."""
    keys: dict[str, dict[Any, None]] = {}
    for c in checks:
        kernel = spec.kernel(_variant(spec, c.args), device, backend, platform)
        key = spec.dispatch(kernel, c.args) if _dispatch_by_name(spec) else None
        keys.setdefault(_variant(spec, c.args), {})
        if key is not None:
            keys[_variant(spec, c.args)][key] = None
    for variant, ks in keys.items():
        kernel = spec.kernel(variant, device, backend, platform)
        cfg = None if ks else (spec.config_type() if spec.config_type else None)
        kernel.warmup(cfg, keys=list(ks) if ks else None)


def _dispatch_by_name(spec: FamilySpec) -> bool:
    names = {a.name for a in spec.args}
    return all(p in names for p in spec.contract._dispatch_program.params)  # type: ignore[attr-defined]


def _run_case(spec: FamilySpec, check: Check, device: str, backend: str,
              platform: Platform) -> tuple[bool, bool]:
    """(bit-identical, passed) of one case: the kernel on ``device`` vs the reference on the CPU."""
    want_args = _on(check.args, "cpu")
    want = _outputs(spec, want_args, _reference(spec, want_args))
    got_args = _on(check.args, device)
    result = spec.op(**got_args, backend=backend, platform=platform, debug_checks=device == "cpu")
    if device != "cpu":
        torch.cuda.synchronize()
    got = _outputs(spec, got_args, result)
    same = len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    if same or check.judge is None:
        return same, same
    cpu = {k: _copy(v, "cpu") if isinstance(v, torch.Tensor) else v for k, v in got_args.items()}
    return False, check.judge(cpu, want_args)


def verify_family(name: str, backend: str, *, device: str, platform: Platform, cases: int,
                  small: bool) -> Row:
    """Warm, then run the battery of ``name`` on ``backend`` under ``JitMonitor("error")``."""
    spec, row, t0 = family(name), Row(name, backend), time.perf_counter()
    checks = BATTERIES[name](cases, small)
    try:
        _warm(spec, checks, device, backend, platform)
    except Exception as exc:  # a warmup that fails is the verdict, not a crash of the command
        row.failures.append(f"warmup: {type(exc).__name__}: {exc}")
        row.cases = len(checks)
        return row
    with JitMonitor("error") as monitor:
        for c in checks:
            row.cases += 1
            try:
                same, ok = _run_case(spec, c, device, backend, platform)
            except UnwarmedKeyError as exc:  # counted once, from the monitor's events below
                row.failures.append(f"{c.label}: compile after warmup: {exc}")
                continue
            except Exception as exc:  # one case's crash fails the case, the battery goes on
                row.failures.append(f"{c.label}: {type(exc).__name__}: {exc}")
                continue
            row.bit_identical += same
            row.passed += ok
            if not ok:
                row.failures.append(f"{c.label}: differs from the reference")
    row.compiles_after_warmup = len(monitor.events)
    row.seconds = time.perf_counter() - t0
    return row


def run_verify(families: Iterable[str] | None = None, *, cases: int | None = None,
               backends: Sequence[str] | None = None, platform: Platform | None = None) -> list[Row]:
    """Every (family, backend) verdict on the present device (see the module docstring)."""
    p = platform or current_platform()
    device = "cuda" if p.is_cuda else "cpu"
    small = not p.is_cuda
    if backends is None:
        backends = BACKENDS if p.is_cuda and p.cutedsl else ("triton",)
    n = cases if cases is not None else (3 if small else 60)
    return [verify_family(f, b, device=device, platform=p, cases=n, small=small)
            for f in (families or FAMILY_NAMES) for b in backends]


def verdict_table(rows: Sequence[Row], platform: Platform) -> str:
    """One screen: a row per family and backend, then the verdict."""
    where = f"cuda {platform.arch} ({platform.device_name})" if platform.is_cuda else \
        "cpu (Triton interpreter, small cases)"
    lines = [f"dsv4kit verify on {where}", "",
             f"{'family':30s} {'backend':8s} {'cases':>5s} {'bit-identical':>13s} {'compiles':>8s}  verdict"]
    for r in rows:
        lines.append(f"{r.family:30s} {r.backend:8s} {r.cases:5d} {r.bit_identical:13d} "
                     f"{r.compiles_after_warmup:8d}  {'pass' if r.ok else 'FAIL'}")
        lines += [f"    {f}" for f in r.failures[:3]]
    bad = sum(not r.ok for r in rows)
    lines += ["", "ALL PASS" if not bad else f"{bad} of {len(rows)} FAIL"]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


def _family_list(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in BATTERIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown families {bad}; expected some of {', '.join(BATTERIES)}")
    return names


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``verify`` on the ``dsv4kit`` subparsers ``sub``."""
    p = sub.add_parser("verify", help="check every family's numerics and zero-compile contract here",
                       description=__doc__.splitlines()[0],
                       epilog="Exit codes: 0 every family passes, 1 a case differs or compiled after warmup.")
    p.add_argument("--families", type=_family_list, default=None, help="comma-separated names (default: all)")
    p.add_argument("--backends", type=lambda v: [b for b in v.split(",") if b], default=None,
                   help="triton,cutedsl (default: both on a GPU, triton on a CPU)")
    p.add_argument("--cases", type=int, default=None,
                   help="cases per family (default: 60 on a GPU, 3 on a CPU)")
    p.add_argument("--json", metavar="FILE", default=None, help="write the verdicts as JSON ('-': stdout)")
    p.set_defaults(handler=cmd_verify)
    return p


def cmd_verify(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.backends and any(b not in BACKENDS for b in args.backends):
        parser.error(f"--backends: expected some of {', '.join(BACKENDS)}")
    platform = current_platform()
    rows = run_verify(args.families, cases=args.cases, backends=args.backends, platform=platform)
    print(verdict_table(rows, platform))
    if args.json:
        from dsv4kit.bench import provenance  # a record says where it came from (commit, versions, hashes)
        from dsv4kit.cli import _write_json  # `--json -`: the CLI keeps stdout for the JSON alone

        _write_json(args.json, {"device": "cuda" if platform.is_cuda else "cpu", "arch": platform.arch,
                                "pass": all(r.ok for r in rows), "rows": [r.json() for r in rows],
                                "provenance": provenance({"platform": str(platform)})})
    return 0 if all(r.ok for r in rows) else 1
