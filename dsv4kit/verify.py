"""``dsv4kit verify``: every family's numerics battery on this machine's device, one verdict.

For each family and backend the battery warms the keys its cases request, then runs every case
with the JIT monitor in ``error`` mode: the kernel's output is compared byte for byte (sentinel
bytes of written buffers included) with the PyTorch reference run on the CPU, and any compile
after warmup is a failure. On a GPU both backends run; on a CPU only Triton, under the
interpreter, on the small cases (CuTeDSL kernels run only on a GPU).

A battery is a family's seeded cases (its ``cases.py``) as op arguments by name; families whose
kernels follow a rounding rule rather than bit-identity (the compressors, spec §2.12) also give
the rule's judge, so a case passes when bit-identical or judged correct, and the verdict counts
both. This command is the one a user runs on their card; the bandwidth is ``dsv4kit bench``.

``--extended`` adds the compressors' extended cases (:data:`EXTENDED`, judged by the same rule):
C4 random cases at odd state block strides and padded to T = 4200 (past CuTeDSL's decode kernel),
production-layout cases at T = 16384 and 65536; C128 K7 at odd block strides, K8a on a packed
pool, K7 -> K8 chains end to end, large-T cases (K7, K8 given the reference's pooled rows, chains),
the warmed executors launched alone on the large cases and on decode steps. On a GPU the CUDA
reference is also judged against the CPU one (information, not part of the verdict) and the
warmed keys' registers and spills go to the JSON. On a CPU the sizes are scaled down
(:data:`CPU_EXTENDED`, whose notes the verdict prints).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dsv4kit.errors import UnwarmedKeyError
from dsv4kit.family import DEFAULT_VARIANT, FamilySpec
from dsv4kit.jit import JitMonitor
from dsv4kit.kernels import FAMILY_NAMES, family
from dsv4kit.platform import BACKENDS, Platform, current_platform

__all__ = ["BATTERIES", "CPU_EXTENDED", "EXTENDED", "GPU_EXTENDED", "Before", "Check", "Extended", "Row",
           "add_parser", "run_verify", "verdict_table"]

#: A case's judge when bit-identity is not the rule: (case arguments after the kernel, after the
#: reference) -> pass.
Judge = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Before:
    """Another family's op run first on its own ``args``; its result is the case's argument ``into``
    (a K7 -> K8 chain). ``reference``: both sides get the CPU reference's result instead (the case
    judges its own op alone on the reference's input)."""

    family: str
    args: Mapping[str, Any]
    into: str
    reference: bool = False


#: How the kernel side runs a case other than through the op: (spec, arguments on the device,
#: device, backend, platform) -> result (e.g. the warmed executor launched alone).
Call = Callable[[FamilySpec, dict[str, Any], str, str, Platform], Any]


@dataclass(frozen=True)
class Check:
    """One seeded case: op arguments by name (CPU tensors, written buffers sentinel-filled)."""

    label: str
    args: Mapping[str, Any]
    judge: Judge | None = None
    before: Before | None = None
    call: Call | None = None


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
    #: ``--extended`` on a GPU: cases whose CUDA reference was judged against the CPU one, and
    #: those that passed (information: not part of the verdict).
    reference_cases: int = 0
    reference_passed: int = 0
    #: The warmed keys: key, registers, spills.
    warmed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.cases > 0 and self.passed == self.cases and not self.compiles_after_warmup

    def json(self) -> dict[str, Any]:
        return {"family": self.family, "backend": self.backend, "cases": self.cases,
                "bit_identical": self.bit_identical, "passed": self.passed,
                "compiles_after_warmup": self.compiles_after_warmup, "pass": self.ok,
                "failures": self.failures[:10], "seconds": round(self.seconds, 3),
                "reference_cases": self.reference_cases, "reference_passed": self.reference_passed,
                "warmed": self.warmed}


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


_C4_TOKENS = {True: (1, 7, 33), False: (1, 7, 32, 257, 513)}
_C128_TOKENS: dict[bool, dict[str, Any]] = {True: {"tokens": (1, 7, 33)}, False: {}}


def _c4(op: str) -> Callable[[int, bool], list[Check]]:
    def checks(n: int, small: bool) -> list[Check]:
        from dsv4kit.kernels.c4_compress.cases import judge, random_case

        tokens = _C4_TOKENS[small]
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
            case = random_case(op, i, **_C128_TOKENS[small])
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


# --------------------------------------------------------------------------- extended cases


@dataclass(frozen=True)
class Extended:
    """Sizes of the extended cases: the GPU checks' own (:data:`GPU_EXTENDED`), or scaled down for
    the Triton interpreter (:data:`CPU_EXTENDED`; ``notes`` say what and are printed)."""

    past_decode_t: int = 4200                 # C4: T of the padded copies (past CTA_PER_TOKEN_UP_TO)
    large: tuple[int, ...] = (16384, 65536)   # T of the production-layout cases
    c128_large: tuple[int, ...] | None = None  # C128's, where not ``large``
    large_requests: tuple[int, ...] = (1, 4)  # C4: requests of a large case (C128: always 4)
    all_formats: bool = True                  # C4: every format of an op at large T (else its first)
    chains: int = 12                          # C128: chains K7 -> K8 per store op
    packed: int = 3                           # C128: K8a cases on the packed pool
    decode: tuple[int, ...] = (1, 8, 64, 256)  # C128: decode steps, the executor launched alone
    device_reference: bool = True             # judge the CUDA reference against the CPU one
    notes: tuple[str, ...] = ()


GPU_EXTENDED = Extended()
CPU_EXTENDED = Extended(
    past_decode_t=64, large=(64,), c128_large=(512,), large_requests=(4,), all_formats=False, chains=1,
    packed=1, decode=(1, 8), device_reference=False,
    notes=("C4 random cases padded to T=64, not 4200 (the CuTeDSL prefill kernel they reach runs on a GPU)",
           "large cases at T=64 (C4: four requests, one format per op) and T=512 (C128), not 16384, 65536",
           "C128: 1 chain per store op (not 12), 1 packed-pool case (not 3), decode steps T=1, 8 (not 1, 8, "
           "64, 256)",
           "no CUDA reference to judge against the CPU one; no CuTeDSL backend"))


def _c4_extended(op: str) -> Callable[[int, bool, Extended], list[Check]]:
    def checks(n: int, small: bool, ext: Extended) -> list[Check]:
        from dsv4kit.kernels.c4_compress.cases import extended_cases, judge

        cases = extended_cases(op, n, tokens=_C4_TOKENS[small], past_decode_t=ext.past_decode_t,
                               large=ext.large, all_formats=ext.all_formats, nreqs=ext.large_requests)
        return [Check(c.label, c.args, _judge_cache(c, judge, c.cache_arg)) for c in cases]

    return checks


def _launch_alone(spec: FamilySpec, args: dict[str, Any], device: str, backend: str,
                  platform: Platform) -> None:
    """The warmed executor launched with the operands the op builds (C128's ``kernel_launch``)."""
    from dsv4kit.kernels.c128_compress.cases import kernel_launch

    exe, launch = kernel_launch(spec, spec.kernel(DEFAULT_VARIANT, device, backend, platform), args)
    exe(*launch)


def _c128_extended(op: str) -> Callable[[int, bool, Extended], list[Check]]:
    def checks(n: int, small: bool, ext: Extended) -> list[Check]:
        from dsv4kit.kernels.c128_compress import cases as cc

        alone = "kernel alone: "
        out: list[Check] = []
        if op == cc.K7:
            for i in range(0, n, 10):
                c = cc.odd_stride(cc.random_case(op, i, **_C128_TOKENS[small]))
                out.append(Check(c.label, c.args, _judge_cache(c, cc.judge_k7, c.output_arg)))
            for t in _c128_large(ext):
                c = cc.large_chains(t, cc.STORE_FORMATS[:1])[0][1].k7
                j = _judge_cache(c, cc.judge_k7, c.output_arg)
                out += [Check(c.label, c.args, j), Check(alone + c.label, c.args, j, call=_launch_alone)]
        else:
            if op == cc.K8A:
                out += [Check(c.label, c.args, _judge_cache(c, cc.judge_store, c.output_arg))
                        for c in cc.packed_cases(ext.packed)]
            for i in range(ext.chains):
                ch = cc.chain_case(op, i)
                out.append(_chain_check(cc, ch))
            for t in _c128_large(ext):
                for name, ch in cc.large_chains(t, tuple(f for f in cc.STORE_FORMATS if f[0] == op)):
                    s = ch.store
                    label = f"{op} T={t} {name} (the reference's pooled rows)"
                    j = _judge_fed(s, cc.judge_store, s.output_arg, "compressed_kv")
                    fed = Before(cc.K7, ch.k7.args, "compressed_kv", reference=True)
                    out += [Check(label, s.args, j, fed), Check(alone + label, s.args, j, fed, _launch_alone),
                            _chain_check(cc, ch)]
        for t in ext.decode:
            c = cc.decode_case(op, t)
            rule = cc.judge_k7 if op == cc.K7 else cc.judge_store
            out.append(Check(f"{alone}decode T={t} {c.label}", c.args, _judge_cache(c, rule, c.output_arg),
                             call=_launch_alone))
        return out

    return checks


def _c128_large(ext: Extended) -> tuple[int, ...]:
    return ext.large if ext.c128_large is None else ext.c128_large


def _chain_check(cc: Any, ch: Any) -> Check:
    """A K7 -> K8 chain: K7 run first (by the same backend), its output K8's ``compressed_kv``."""
    s = ch.store
    return Check(ch.label, s.args, lambda got, want: bool(cc.judge_chain(ch, got[s.output_arg],
                                                                          want[s.output_arg]).ok),
                 Before(cc.K7, ch.k7.args, "compressed_kv"))


def _judge_fed(case: Any, rule: Callable[..., Any], arg: str, into: str) -> Judge:
    """The rule's verdict on ``arg`` for a case whose input ``into`` was fed (the reference's)."""
    return lambda got, want: bool(rule(replace(case, args={**case.args, into: want[into]}), got[arg],
                                       want[arg]).ok)


#: family name -> its extended battery ``(n, small, sizes) -> checks`` (``--extended``).
EXTENDED: dict[str, Callable[[int, bool, Extended], list[Check]]] = {
    **{op: _c4_extended(op) for op in ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress")},
    **{op: _c128_extended(op) for op in ("c128_compress", "c128_norm_rope_store_ds_mla",
                                         "c128_norm_rope_store_plain")},
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


def _warm(spec: FamilySpec, checks: Sequence[Check], device: str, backend: str,
          platform: Platform) -> list[Any]:
    """Compile the keys the cases request (what a runtime's warmup registers for these calls), those
    of the ops run before them too; the warmup reports."""
    calls = [(spec, c.args) for c in checks]
    calls += [(family(c.before.family), c.before.args) for c in checks if c.before and not c.before.reference]
    keys: dict[tuple[str, str], dict[Any, None]] = {}
    for s, args in calls:
        kernel = s.kernel(_variant(s, args), device, backend, platform)
        key = s.dispatch(kernel, args) if _dispatch_by_name(s) else None
        ks = keys.setdefault((s.name, _variant(s, args)), {})
        if key is not None:
            ks[key] = None
    reports: list[Any] = []
    for (name, variant), ks in keys.items():
        s = family(name)
        kernel = s.kernel(variant, device, backend, platform)
        cfg = None if ks else (s.config_type() if s.config_type else None)
        reports += kernel.warmup(cfg, keys=list(ks) if ks else None) or []
    return reports


def _dispatch_by_name(spec: FamilySpec) -> bool:
    names = {a.name for a in spec.args}
    return all(p in names for p in spec.contract._dispatch_program.params)  # type: ignore[attr-defined]


def _args(check: Check, device: str, fed: Any, run_before: Callable[[FamilySpec, dict[str, Any]], Any]
          ) -> dict[str, Any]:
    """The case's arguments on ``device``; with a :class:`Before`, its op's result (``run_before``'s,
    or the CPU reference's ``fed``) as the argument it feeds."""
    args = _on(check.args, device)
    b = check.before
    if b is not None:
        args[b.into] = (_copy(fed, device) if b.reference
                        else run_before(family(b.family), _on(b.args, device)))
    return args


def _judged(spec: FamilySpec, check: Check, args: dict[str, Any], result: Any, want_args: dict[str, Any],
            want: list[torch.Tensor]) -> tuple[bool, bool]:
    """(bit-identical, passed) of what a run wrote or returned against the CPU reference's ``want``."""
    got = _outputs(spec, args, result)
    same = len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    if same or check.judge is None:
        return same, same
    cpu = {k: _copy(v, "cpu") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    return False, check.judge(cpu, want_args)


def _run_case(spec: FamilySpec, check: Check, device: str, backend: str, platform: Platform,
              device_reference: bool = False) -> tuple[bool, bool, bool | None]:
    """(bit-identical, passed, the device reference passed or None) of one case: the kernel on
    ``device`` vs the reference on the CPU; with ``device_reference``, a judged case's reference on
    ``device`` too (information)."""
    want_args = _on(check.args, "cpu")
    fed = None
    if check.before is not None:
        b = check.before
        fed = want_args[b.into] = _reference(family(b.family), _on(b.args, "cpu"))
    want = _outputs(spec, want_args, _reference(spec, want_args))

    def op(s: FamilySpec, a: dict[str, Any]) -> Any:
        return s.op(**a, backend=backend, platform=platform, debug_checks=device == "cpu")

    got_args = _args(check, device, fed, op)
    result = check.call(spec, got_args, device, backend, platform) if check.call else op(spec, got_args)
    if device != "cpu":
        torch.cuda.synchronize()
    same, ok = _judged(spec, check, got_args, result, want_args, want)
    ref_ok = None
    if device_reference and device != "cpu" and check.judge is not None:
        ref_args = _args(check, device, fed, _reference)
        ref_result = _reference(spec, ref_args)
        torch.cuda.synchronize()
        ref_ok = _judged(spec, check, ref_args, ref_result, want_args, want)[1]
    return same, ok, ref_ok


def verify_family(name: str, backend: str, *, device: str, platform: Platform, cases: int,
                  small: bool, extended: Extended | None = None) -> Row:
    """Warm, then run the battery of ``name`` on ``backend`` under ``JitMonitor("error")`` (with
    ``extended``: its :data:`EXTENDED` cases of those sizes too)."""
    spec, row, t0 = family(name), Row(name, backend), time.perf_counter()
    checks = BATTERIES[name](cases, small)
    if extended is not None and name in EXTENDED:
        checks += EXTENDED[name](cases, small, extended)
    try:
        reports = _warm(spec, checks, device, backend, platform) or []
        row.warmed = [{"key": str(r.key), "registers": r.info.get("registers"),
                       "spills": r.info.get("spills")} for r in reports if hasattr(r, "info")]
    except Exception as exc:  # a warmup that fails is the verdict, not a crash of the command
        row.failures.append(f"warmup: {type(exc).__name__}: {exc}")
        row.cases = len(checks)
        return row
    with JitMonitor("error") as monitor:
        for c in checks:
            row.cases += 1
            try:
                same, ok, ref_ok = _run_case(spec, c, device, backend, platform,
                                             extended is not None and extended.device_reference)
            except UnwarmedKeyError as exc:  # counted once, from the monitor's events below
                row.failures.append(f"{c.label}: compile after warmup: {exc}")
                continue
            except Exception as exc:  # one case's crash fails the case, the battery goes on
                row.failures.append(f"{c.label}: {type(exc).__name__}: {exc}")
                continue
            row.bit_identical += same
            row.passed += ok
            if ref_ok is not None:
                row.reference_cases += 1
                row.reference_passed += ref_ok
            if not ok:
                row.failures.append(f"{c.label}: differs from the reference")
    row.compiles_after_warmup = len(monitor.events)
    row.seconds = time.perf_counter() - t0
    return row


def extended_sizes(platform: Platform, large: Sequence[int] | None = None) -> Extended:
    """The extended cases' sizes on ``platform`` (the GPU checks' on a GPU, scaled down on a CPU);
    ``large`` replaces the large cases' T."""
    ext = GPU_EXTENDED if platform.is_cuda else CPU_EXTENDED
    if large is not None:
        note = f"large cases at T={', '.join(map(str, large)) or 'none'} (--large)"
        notes = (*(n for n in ext.notes if not n.startswith("large")), note)
        ext = replace(ext, large=tuple(large), c128_large=None, notes=notes)
    return ext


def run_verify(families: Iterable[str] | None = None, *, cases: int | None = None,
               backends: Sequence[str] | None = None, platform: Platform | None = None,
               extended: bool | Extended = False) -> list[Row]:
    """Every (family, backend) verdict on the present device (see the module docstring); with
    ``extended`` (True: :func:`extended_sizes`) the compressors' extended cases too."""
    p = platform or current_platform()
    device = "cuda" if p.is_cuda else "cpu"
    small = not p.is_cuda
    if backends is None:
        backends = BACKENDS if p.is_cuda and p.cutedsl else ("triton",)
    n = cases if cases is not None else (3 if small else 60)
    ext = extended_sizes(p) if extended is True else (extended or None)
    return [verify_family(f, b, device=device, platform=p, cases=n, small=small, extended=ext)
            for f in (families or FAMILY_NAMES) for b in backends]


def verdict_table(rows: Sequence[Row], platform: Platform, extended: Extended | None = None) -> str:
    """One screen: a row per family and backend, then the verdict (and what ``extended`` scaled down)."""
    where = f"cuda {platform.arch} ({platform.device_name})" if platform.is_cuda else \
        "cpu (Triton interpreter, small cases)"
    lines = [f"dsv4kit verify on {where}", "",
             f"{'family':30s} {'backend':8s} {'cases':>5s} {'bit-identical':>13s} {'compiles':>8s}  verdict"]
    for r in rows:
        lines.append(f"{r.family:30s} {r.backend:8s} {r.cases:5d} {r.bit_identical:13d} "
                     f"{r.compiles_after_warmup:8d}  {'pass' if r.ok else 'FAIL'}")
        lines += [f"    {f}" for f in r.failures[:3]]
        if r.reference_cases:
            lines.append(f"    CUDA reference vs CPU reference: {r.reference_passed}/{r.reference_cases} "
                         "pass (information)")
    if extended is not None:
        lines += ["", "with the compressors' extended cases (--extended)"]
        lines += [f"  scaled down / skipped: {n}" for n in extended.notes]
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
    p.add_argument("--extended", action="store_true",
                   help="the compressors' extended cases too: odd strides, C4 padded to T=4200, large T, "
                        "C128 chains, packed pool, executors alone on large and decode steps (scaled down "
                        "on a CPU)")
    p.add_argument("--large", type=lambda v: [int(t) for t in v.split(",") if t.strip()], default=None,
                   help="--extended: comma-separated T of the large cases (default 16384,65536 on a GPU, "
                        "512 on a CPU; '' for none)")
    p.add_argument("--json", metavar="FILE", default=None, help="write the verdicts as JSON ('-': stdout)")
    p.set_defaults(handler=cmd_verify)
    return p


def cmd_verify(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.backends and any(b not in BACKENDS for b in args.backends):
        parser.error(f"--backends: expected some of {', '.join(BACKENDS)}")
    platform = current_platform()
    ext = extended_sizes(platform, args.large) if args.extended else None
    rows = run_verify(args.families, cases=args.cases, backends=args.backends, platform=platform,
                      extended=ext)
    print(verdict_table(rows, platform, ext))
    if args.json:
        from dsv4kit.bench import provenance  # a record says where it came from (commit, versions, hashes)
        from dsv4kit.cli import _write_json  # `--json -`: the CLI keeps stdout for the JSON alone

        _write_json(args.json, {"device": "cuda" if platform.is_cuda else "cpu", "arch": platform.arch,
                                "pass": all(r.ok for r in rows), "rows": [r.json() for r in rows],
                                "extended": None if ext is None else {
                                    "past_decode_t": ext.past_decode_t, "large": list(ext.large),
                                    "c128_large": list(_c128_large(ext)),
                                    "chains": ext.chains, "packed": ext.packed, "decode": list(ext.decode),
                                    "scaled_down": list(ext.notes)},
                                "provenance": provenance({"platform": str(platform)})})
    return 0 if all(r.ok for r in rows) else 1
