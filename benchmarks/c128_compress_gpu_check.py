#!/usr/bin/env python3
"""K7, K8a, K8b (the C128 compressors) on a GPU: both backends judged against the reference (numerics only).

    python3 benchmarks/c128_compress_gpu_check.py --out DIR [--cases 60] [--chains 12]
        [--large 16384,65536] [--no-cpu-reference] [--backends triton,cutedsl]
    python3 benchmarks/c128_compress_gpu_check.py --out DIR --cpu-smoke    # this script's paths, on CPU

Bandwidth and decode latency are not measured here: ``python3 -m dsv4kit bench --family
c128_compress`` (K7) and ``--family c128_store`` (K8a, K8b) time them (kernel alone, op, eager
reference, ``torch.compile``; decode sizes next to an empty kernel) against the copy bandwidth of
their run, with the bytes models ``c128_compress_bytes`` and ``c128_store_bytes`` of
:mod:`dsv4kit.kernels.c128_compress.bench`.

1. Warmup: every key of the three ops on both backends (triton, cutedsl), over the configs
   ``C128CompressConfig(cache_dtype in fp8_ds_mla / fp8 / bfloat16, norm_weight_dtype bf16 / fp32)``
   and the keys every case below dispatches to (K8a page geometries kv_bs 1 / 2 at strides 1152,
   1728, 2304 and the packed 39168; trap 4). Registers and spills are logged per key.
2. Numerics, inside Triton's and CuTeDSL's compile counters and the JIT monitor in ``error`` mode
   (expected: zero compiles): per op ``--cases`` random cases ``cases.random_case(op, i)``, for K7
   every 10th also with a state block stride that is not a multiple of 4 (the element-load path);
   K8a on a packed pool (kv_bs 2, page stride 39168); ``--chains`` chains K7 -> K8 per store op
   (``make_chain_case``: kv_bs 1 / 2, page strides, both norm weight dtypes, every kv / score
   regime, e4m3 scales, windows crossing 127, 255 and ending at 1 048 575), each chain run with
   one backend end to end and judged by ``judge_chain`` against the reference chain; and the large
   cases (T in ``--large``: 4 requests from position 0, tokens in request order, no padding): K7,
   K8a (E1), K8b (E2 bf16, E3 e4m3) given the reference's pooled rows, and the chains. Every case
   runs on sentinel-filled (0xA5) ``fresh`` copies: the reference on CUDA tensors and (unless
   ``--no-cpu-reference``) on CPU tensors, each backend on CUDA tensors; judged with the cases'
   judges (K7: the FP32 rule, other rows of ``out`` untouched; K8 and chains: the compressor rule,
   every byte it does not judge bit-exact). The CUDA reference is judged against the CPU one too.
3. The kernel alone, in the same counters: per backend the warmed executor launched with the
   operands the op builds (``state_operands``, ``NormStoreOperands``), run once and judged, on
   every large case and on decode steps T in {1, 8, 64, 256} (one boundary at most; judged
   against the CPU reference).

Writes under ``--out``: ``check.json`` (everything; also written after the case numerics, so a
timed-out run keeps them), ``c128_compress.md`` (numerics summary), ``provenance.json`` and
``c128_compress.log``. Exit code 0 iff every kernel case and every kernel-alone launch check
conforms for every requested backend and nothing compiled after warmup; 1 otherwise; 2 without a
CUDA device (unless ``--cpu-smoke``: the same flow on CPU, Triton under the interpreter only, 2
random cases per op, 1 chain per store op, no large or decode cases; the kernel-alone launch and
the eager check-free core are run once on the first random case of each op and judged).
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

from dsv4kit.formats.ds_mla import enc_ds, write_ds_entries  # noqa: E402
from dsv4kit.formats.plain_row import write_plain_rows  # noqa: E402
from dsv4kit.formats.rope import compressed_position, rope_rotate  # noqa: E402
from dsv4kit.formats.state_cache import pool_windows, rmsnorm  # noqa: E402
from dsv4kit.kernels.c128_compress import SPECS, C128CompressConfig  # noqa: E402
from dsv4kit.kernels.c128_compress.cases import (  # noqa: E402
    KV_REGIMES,
    LAST_POSITION,
    OPS,
    SCORE_REGIMES,
    C128Case,
    ChainCase,
    K7Verdict,
    cpu_copy,
    judge_chain,
    judge_k7,
    judge_store,
    make_chain_case,
    make_k7_case,
    make_k8_case,
    random_case,
)
from dsv4kit.kernels.c128_compress.reference import (  # noqa: E402
    CACHE_ARG,
    RATIO,
    STATE_BLOCK_SIZE,
    check_c128_compress_inputs,
    check_c128_store_inputs,
)
from dsv4kit.kernels.c128_compress.spec import NormStoreOperands, state_operands  # noqa: E402
from dsv4kit.kernels.encoders.spec import cache_operands  # noqa: E402
from dsv4kit.testing.cache_judge import VerdictSummary  # noqa: E402
from dsv4kit.testing.compressor_data import odd_block_stride  # noqa: E402

FAMILY = "c128_compress"
BACKENDS = ("triton", "cutedsl")
K7, K8A, K8B = OPS
CONFIGS = [C128CompressConfig(cache_dtype=d, norm_weight_dtype=w)
           for d in ("fp8_ds_mla", "fp8", "bfloat16") for w in ("bfloat16", "float32")]
#: Formats of the large K8 cases: (op, make_chain_case keywords, name).
STORE_FORMATS = ((K8A, {}, "E1 fp8_ds_mla"), (K8B, {}, "E2 bf16 rows"),
                 (K8B, {"fp8_scale": 0.37}, "E3 e4m3 rows"))
DECODE_SIZES = (1, 8, 64, 256)
#: (lens, starts) of the chains, cycled: windows crossing 127 and 255, ending at 1 048 575.
CHAIN_WINDOWS = (
    ((130, 7), (0, 0)),
    ((260, 3), (0, 125)),
    ((130,), (LAST_POSITION + 1 - 130,)),
    ((140, 20), (120, 240)),
    ((300,), (0,)),
    ((64, 200, 9), (100, 0, 250)),
    ((1,), (127,)),
    ((257, 2), (1001, 254)),
    ((128,), (LAST_POSITION + 1 - 128,)),
    ((513,), (0,)),
    ((33, 33, 33), (95, 223, 991)),
    ((7, 129), (121, LAST_POSITION + 1 - 129)),
)
#: K8a page strides of the chains (kv_bs 1 and 2 alike; None: the allocator's), trap 4's packed 39168.
DS_STRIDES = (None, 2304, 39168, 1728)
PACKED_STRIDE = 39168

_LINES: list[str] = []
_LOG_FILE: list[Any] = []



def _print_log(msg: str) -> None:
    print(msg, flush=True)


def cutlass_status() -> tuple[bool, str]:
    """Whether CUTLASS's DSL imports here, and its version (or why not)."""
    try:
        import cutlass

        return True, getattr(cutlass, "__version__", "unknown")
    except Exception as exc:  # ImportError or a broken install
        return False, f"{type(exc).__name__}: {exc}"


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

def log(msg: str) -> None:
    _print_log(msg)
    _LINES.append(msg)
    for f in _LOG_FILE:
        f.write(msg + "\n")
        f.flush()


# ------------------------------------------------------------------------ cases


def odd_stride(case: C128Case, extra: int = 3) -> C128Case:
    """K7 ``case`` with its state re-laid at block stride ``stride + extra`` (not a multiple of 4:
    the element-load path; the base stays 16-byte aligned, §2.8 allows any stride >= sbs * 2SW)."""
    odd = odd_block_stride(case.args["state_cache"], extra)
    label = f"{case.label} block_stride={odd.stride(0)}"
    return replace(case, args=dict(case.args, state_cache=odd), label=label)


def packed_cases(n: int) -> list[C128Case]:
    """K8a on a packed pool (kv_bs 2, page stride 39168: trap 4's other key)."""
    shapes = ((32, 4, torch.bfloat16), (257, 3, torch.float32), (7, 2, torch.bfloat16))
    return [make_k8_case(K8A, t=t, boundaries=b, kv_bs=2, page_stride=PACKED_STRIDE, norm_dtype=w,
                         kv_regime=KV_REGIMES[i % len(KV_REGIMES)], seed=900 + i)
            for i, (t, b, w) in enumerate(shapes[:n])]


def chain_case(op: str, i: int) -> ChainCase:
    """The ``i``-th chain K7 -> ``op``: windows, kv_bs, page stride, norm dtype, regimes, e4m3 scale."""
    lens, starts = CHAIN_WINDOWS[i % len(CHAIN_WINDOWS)]
    kv_bs = (1, 2)[i % 2]
    if op == K8A:
        stride, fp8_scale = DS_STRIDES[(i // 2) % len(DS_STRIDES)], None
    else:
        stride = (None, kv_bs * 512 + 16, kv_bs * 1024 + 48)[(i // 2) % 3]
        fp8_scale = (None, 0.37, 1.0, 2.0**-4)[i % 4]
    return make_chain_case(
        op, lens=lens, starts=starts, kv_bs=kv_bs, page_stride=stride,
        norm_dtype=(torch.bfloat16, torch.float32)[(i // 3) % 2], kv_regime=KV_REGIMES[i % len(KV_REGIMES)],
        score_regime=SCORE_REGIMES[(3 * i + 1) % len(SCORE_REGIMES)], fp8_scale=fp8_scale,
        padding=i % 3 != 1, seed=300 + i)


def _reorder(args: dict[str, Any], order: torch.Tensor, names: tuple[str, ...]) -> dict[str, Any]:
    out = dict(args)
    for n in names:
        out[n] = args[n][order].contiguous()
    return out


def in_order(chain: ChainCase) -> ChainCase:
    """``chain`` with its tokens sorted by (request, position), the production layout (the cases
    interleave requests): each token's rows and entries are the same, only the token order changes."""
    a = chain.k7.args
    order = torch.argsort(a["token_to_req"].long() * (1 << 40) + a["positions"])
    k7 = replace(chain.k7, args=_reorder(a, order, ("token_to_req", "positions", "slot_mapping")),
                 label=chain.k7.label + " in order")
    names = ("compressed_kv", "positions", "slot_mapping", "kv_slot_mapping")
    store = replace(chain.store, args=_reorder(chain.store.args, order, names))
    return ChainCase(k7, store)


def large_chains(t: int) -> list[tuple[str, ChainCase]]:
    """The chains of one large T, one per store format, sharing one K7 case (same seed, same tokens)."""
    lens = tuple([t // 4] * 3 + [t - 3 * (t // 4)])
    out = []
    k7 = None
    for op, kw, name in STORE_FORMATS:
        c = make_chain_case(op, lens=lens, starts=(0, 0, 0, 0), kv_bs=2, padding=False, seed=t, **kw)
        c = in_order(c)
        if k7 is None:
            k7 = c.k7
        else:
            assert torch.equal(c.k7.args["positions"], k7.args["positions"])
            c = ChainCase(k7, c.store)
        c.k7.meta.update(format="fp32 rows", large=True)
        c.store.meta.update(format=name, large=True)
        out.append((name, c))
    return out


def decode_case(op: str, t: int) -> C128Case:
    """A decode step of ``t`` requests, one new token each, exactly one of them a boundary."""
    if op == K7:
        starts = [127 + 128 * 9]
        for r in range(1, t):
            p = 200 + 37 * r
            starts.append(p + 1 if (p + 1) % RATIO == 0 else p)
        case = make_k7_case(lens=(1,) * t, starts=tuple(starts), padding=False, seed=t)
    else:
        case = make_k8_case(op, t=t, boundaries=1, kv_bs=2, padding=False, seed=t)
    case.meta.update(format="fp32 rows" if op == K7 else ("E1 fp8_ds_mla" if op == K8A else "E2 bf16 rows"))
    return case


def dispatch_key(k: Any, op: str, args: dict[str, Any]) -> Any:
    return k.dispatch(**{n: args[n] for n in SPECS[op].contract._dispatch_program.params})


# ------------------------------------------------------------------------ running and judging


class Ctx:
    """What one run needs: device, platform, backends, whether a CPU reference is computed."""

    def __init__(self, device: str, platform: Any, backends: list[str], cpu_ref: bool) -> None:
        self.device = device
        self.platform = platform
        self.backends = backends
        self.cpu_ref = cpu_ref and device != "cpu"

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def op(self, op: str, backend: str):
        spec = SPECS[op]
        return lambda **kw: spec.op(**kw, backend=backend, platform=self.platform)


def _ref(op: str):
    return SPECS[op].variants["default"].reference


def run_one(item: C128Case | ChainCase, device: str, k7_fn, k8_fn, ctx: Ctx) -> torch.Tensor:
    """Run ``item`` on fresh sentinel copies on ``device``; a CPU copy of what it wrote (with strides)."""
    c = item.fresh(device)
    if isinstance(c, ChainCase):
        ckv = k7_fn(**c.k7.args)
        k8_fn(**{**c.store.args, "compressed_kv": ckv})
        out = c.store.output
    elif c.op == K7:
        ret = k7_fn(**c.args)
        t = int(c.args["positions"].numel())
        if ret.data_ptr() != c.output.data_ptr() or tuple(ret.shape) != (t, 512):
            raise AssertionError(f"K7 returned {tuple(ret.shape)} at {ret.data_ptr()}, not out[:{t}]")
        out = c.output
    else:
        ret = k8_fn(**c.args)
        if ret is not None:
            raise AssertionError(f"{c.op} returned {type(ret).__name__}, not None")
        out = c.output
    if device == "cuda":
        torch.cuda.synchronize()
    return cpu_copy(out)


def run_reference(item: C128Case | ChainCase, device: str, ctx: Ctx) -> torch.Tensor:
    store = item.store.op if isinstance(item, ChainCase) else item.op
    return run_one(item, device, _ref(K7), _ref(store), ctx)


def run_kernel(item: C128Case | ChainCase, backend: str, ctx: Ctx) -> torch.Tensor:
    store = item.store.op if isinstance(item, ChainCase) else item.op
    return run_one(item, ctx.device, ctx.op(K7, backend), ctx.op(store, backend), ctx)


def judge(item: C128Case | ChainCase, got: torch.Tensor, want: torch.Tensor) -> Any:
    if isinstance(item, ChainCase):
        return judge_chain(item, got, want)
    return (judge_k7 if item.op == K7 else judge_store)(item, got, want)


def verdict_record(v: Any) -> dict[str, Any]:
    if isinstance(v, K7Verdict):
        rep = v.report
        return {"ok": v.ok, "written": v.rows, "other_equal": v.other_rows_equal, "elements": v.elements,
                "bit_identical": v.bit_identical, "violations": rep.violations, "scale_mismatches": 0,
                "used_step": 0, "worst": rep.worst, "summary": v.summary()}
    reps = list(v.reports.values())
    return {"ok": v.ok, "written": v.written, "other_equal": v.other_bytes_equal, "elements": v.elements,
            "bit_identical": v.bit_identical, "violations": sum(r.violations for r in reps),
            "scale_mismatches": sum(r.scale_mismatches for r in reps),
            "used_step": sum(r.used_step for r in reps), "summary": v.summary()}


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}",
            "traceback": traceback.format_exc(limit=8)}


def _tokens(item: C128Case | ChainCase) -> int:
    a = item.k7.args if isinstance(item, ChainCase) else item.args
    return int(a["positions"].numel())


def check_case(item: C128Case | ChainCase, set_name: str, ctx: Ctx
               ) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """Judge every backend on ``item`` against the reference(s); returns the records and the references."""
    chain = isinstance(item, ChainCase)
    op = item.store.op if chain else item.op
    meta = item.store.meta if chain else item.meta
    base = {"op": f"{K7} -> {op}" if chain else op, "set": set_name, "case": item.label, "T": _tokens(item),
            "format": meta.get("format", "")}
    recs: list[dict[str, Any]] = []
    wants = {ctx.device: run_reference(item, ctx.device, ctx)}
    if ctx.cpu_ref:
        wants["cpu"] = run_reference(item, "cpu", ctx)
        try:
            rec = verdict_record(judge(item, wants[ctx.device], wants["cpu"]))
        except Exception as exc:
            rec = _error(exc)
        recs.append({**base, "backend": f"reference@{ctx.device}", "reference": "cpu", **rec})
    for backend in ctx.backends:
        try:
            got = run_kernel(item, backend, ctx)
        except Exception as exc:
            err = _error(exc)
            recs += [{**base, "backend": backend, "reference": ref, **err} for ref in wants]
            with contextlib.suppress(Exception):
                ctx.sync()
            continue
        for ref, want in wants.items():
            try:
                rec = verdict_record(judge(item, got, want))
            except Exception as exc:
                rec = _error(exc)
            recs.append({**base, "backend": backend, "reference": ref, **rec})
    for r in recs:
        if not r["ok"]:
            log(f"NONCONFORMING {r['backend']:14s} vs {r['reference']}-ref [{set_name}] {item.label}: "
                f"{r.get('error') or r['summary']}")
    return recs, wants


# ------------------------------------------------------------------------ kernel alone, check-free core


def kernel_launch(k: Any, op: str, a: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """The warmed executor of one call and its arguments, built as the op builds them (after the
    op's metadata checks): ``state_operands`` (K7), ``NormStoreOperands`` (K8)."""
    name = k.name
    key = dispatch_key(k, op, a)
    if op == K7:
        t = check_c128_compress_inputs(name, a["state_cache"], a["token_to_req"], a["positions"],
                                       a["slot_mapping"], a["block_table"], a["out"])
        ops = state_operands(name, a["state_cache"], a["block_table"], t)
        launch = k.launch_args(key, a["token_to_req"], a["positions"], a["slot_mapping"], a["block_table"],
                               a["out"], ops, t)
    else:
        cache = a[CACHE_ARG[op]]
        t, eps = check_c128_store_inputs(name, op, a["compressed_kv"], a["positions"], a["slot_mapping"],
                                         a["kv_slot_mapping"], a["rms_norm_weight"], a["rms_norm_eps"],
                                         a["cos_sin_cache"], cache, a.get("fp8_scale"))
        ops = NormStoreOperands(eps, cache_operands(cache, a.get("fp8_scale"), a["compressed_kv"]))
        launch = k.launch_args(key, a["compressed_kv"], a["positions"], a["slot_mapping"],
                               a["kv_slot_mapping"], a["rms_norm_weight"], a["cos_sin_cache"], ops, t)
    return k._get_or_compile(key), launch


def k7_core(state_cache: torch.Tensor, block_table: torch.Tensor, req: torch.Tensor, pos: torch.Tensor,
            out: torch.Tensor, idx: torch.Tensor) -> None:
    """K7 without checks (what ``torch.compile`` gets): gather the 128-row windows, pool, store rows."""
    j = torch.arange(RATIO, device=pos.device)
    q = pos[:, None] - (RATIO - 1) + j[None, :]
    blocks = block_table[req[:, None], q // STATE_BLOCK_SIZE].to(torch.int64)
    rows = state_cache[blocks, q % STATE_BLOCK_SIZE]
    half = rows.shape[-1] // 2
    out[idx] = pool_windows(rows[..., :half], rows[..., half:])


def k8a_core(ckv: torch.Tensor, pos: torch.Tensor, w: torch.Tensor, eps: float, cs: torch.Tensor,
             k_cache: torch.Tensor, idx: torch.Tensor, slots: torch.Tensor) -> None:
    """K8a without checks: rmsnorm, rope at (p // 128) * 128, E1, write."""
    y = rope_rotate(rmsnorm(ckv[idx], w, eps), cs[compressed_position(pos[idx], RATIO)])
    write_ds_entries(k_cache, slots, enc_ds(y))


def k8b_core(ckv: torch.Tensor, pos: torch.Tensor, w: torch.Tensor, eps: float, cs: torch.Tensor,
             kv_cache: torch.Tensor, fp8_scale: torch.Tensor | None, idx: torch.Tensor,
             slots: torch.Tensor) -> None:
    """K8b without checks: rmsnorm, rope, E2 / E3, write."""
    y = rope_rotate(rmsnorm(ckv[idx], w, eps), cs[compressed_position(pos[idx], RATIO)])
    write_plain_rows(kv_cache, slots, y, fp8_scale)


def core_call(op: str, a: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """(core function, its arguments) for the call ``a``: the selected tokens computed outside."""
    boundary = (a["slot_mapping"] >= 0) & ((a["positions"] + 1) % RATIO == 0)
    if op == K7:
        idx = torch.nonzero(boundary).flatten()
        return k7_core, (a["state_cache"], a["block_table"], a["token_to_req"][idx].long(),
                         a["positions"][idx], a["out"], idx)
    idx = torch.nonzero(boundary & (a["kv_slot_mapping"] >= 0)).flatten()
    slots = a["kv_slot_mapping"][idx]
    common = (a["compressed_kv"], a["positions"], a["rms_norm_weight"], float(a["rms_norm_eps"]),
              a["cos_sin_cache"])
    if op == K8A:
        return k8a_core, (*common, a["k_cache"], idx, slots)
    return k8b_core, (*common, a["kv_cache"], a.get("fp8_scale"), idx, slots)


def judged_run(case: C128Case, fn, want: torch.Tensor, ctx: Ctx) -> dict[str, Any]:
    """Run ``fn(fresh_args)`` once on a fresh copy of ``case`` and judge what it wrote."""
    c = case.fresh(ctx.device)
    try:
        fn(c.args)
        ctx.sync()
        return verdict_record(judge(case, cpu_copy(c.output), want))
    except Exception as exc:
        with contextlib.suppress(Exception):
            ctx.sync()
        return _error(exc)


def launch_check(case: C128Case, backend: str, k: Any, want: torch.Tensor, ctx: Ctx, what: str) -> dict:
    """The kernel alone (executor + launch args as the op builds them), once, judged."""

    def fn(a: dict[str, Any]) -> None:
        exe, launch = kernel_launch(k, case.op, a)
        exe(*launch)

    rec = {"op": case.op, "case": case.label, "T": _tokens(case), "backend": backend, "what": what,
           **judged_run(case, fn, want, ctx)}
    log(f"  kernel alone ({what}) {backend:8s} {case.op}: {'conforms' if rec['ok'] else 'FAILS'} "
        f"{rec.get('bit_identical', 0)}/{rec.get('elements', 0)} bit-identical"
        + (f"  {rec.get('error', '')}" if not rec["ok"] else ""))
    return rec


def core_check(case: C128Case, fn, want: torch.Tensor, ctx: Ctx, what: str) -> dict:
    """A core (eager or compiled) once on a fresh copy, judged (information; not part of the pass)."""

    def run(a: dict[str, Any]) -> None:
        core, cargs = core_call(case.op, a)
        (fn or core)(*cargs)

    rec = {"op": case.op, "case": case.label, "T": _tokens(case), "what": what,
           **judged_run(case, run, want, ctx)}
    log(f"  {what} {case.op}: {'conforms' if rec['ok'] else 'FAILS'} "
        f"{rec.get('bit_identical', 0)}/{rec.get('elements', 0)} bit-identical"
        + (f"  {rec.get('error', '')}" if not rec["ok"] else ""))
    return rec


# ------------------------------------------------------------------------ kernel-alone checks


def large_launch_checks(large_items: list[tuple[C128Case, torch.Tensor]], kernels: dict, ctx: Ctx
                        ) -> list[dict]:
    """The kernel alone on every large case, once per backend, judged against the reference."""
    checks: list[dict] = []
    for case, want in large_items:
        for backend, k in kernels[case.op].items():
            checks.append(launch_check(case, backend, k, want, ctx, f"large T={_tokens(case)}"))
    return checks


def decode_launch_checks(decode: list[C128Case], kernels: dict, ctx: Ctx) -> list[dict]:
    """The kernel alone on the decode steps, once per backend, judged against the CPU reference."""
    checks: list[dict] = []
    for case in decode:
        want = run_reference(case, "cpu", ctx)
        for backend, k in kernels[case.op].items():
            checks.append(launch_check(case, backend, k, want, ctx, f"decode T={_tokens(case)}"))
    return checks


# ------------------------------------------------------------------------ summary and files


#: Sums per op, backend, reference and case set (``random``, ``odd_stride``, ``large``, ...).
SUMMARY = VerdictSummary("set", "other", "other bytes / rows", op_width=52, set_width=11)


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return SUMMARY.rows(records, log)


def markdown(result: dict[str, Any]) -> str:
    prov = result["provenance"]
    lines = [
        f"# C128 compressors (K7, K8a, K8b) on {prov.get('device')}",
        "",
        f"date {prov.get('date')}, commit `{str(prov.get('commit'))[:12]}`, torch {prov.get('torch')}, "
        f"triton {prov.get('triton')}, nvidia-cutlass-dsl {prov.get('nvidia-cutlass-dsl')}, "
        f"kernel source hash `{str(prov.get('kernel_source_hash', ''))[:16]}`"
        + (" (**CPU smoke run**: Triton interpreter)" if prov.get("cpu_smoke") else ""),
        "",
        f"Result: **{'PASS' if result.get('pass') else 'FAIL'}**. Compiles after warmup: "
        f"{result.get('numerics_compiles')}. Bandwidth: `python3 -m dsv4kit bench --family "
        f"c128_compress` (K7), `--family c128_store` (K8a, K8b).",
        "",
        "## Numerics (K7: FP32 rule; K8 and chains: compressor rule; sentinel-filled outputs)",
        "",
        "| op | backend | reference | set | conforming | violations | used step | scale | bit-identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("summary", []):
        frac = r["bit_identical"] / r["elements"] if r["elements"] else float("nan")
        lines.append(f"| {r['op']} | {r['backend']} | {r['reference']} | {r['set']} "
                     f"| {r['conforming']}/{r['cases']} | {r['violations']} | {r['used_step']} "
                     f"| {r['scale_mismatches']} "
                     f"| {r['bit_identical']}/{r['elements']} ({frac:.4%}) |")
    checks = result.get("launch_checks", [])
    if checks:
        ok = sum(bool(c["ok"]) for c in checks)
        lines += ["", f"Kernel alone (executor + launch args as the op builds them), run once and judged: "
                      f"{ok}/{len(checks)} conform."]
    cores = result.get("core_checks", [])
    if cores:
        lines += [f"Check-free torch core, judged (information): "
                  f"{sum(bool(c['ok']) for c in cores)}/{len(cores)} conform."]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, result: dict[str, Any]) -> None:
    from dsv4kit.bench import write_json

    result["log"] = _LINES
    write_json(out / "check.json", result)
    (out / "c128_compress.md").write_text(markdown(result))


# ------------------------------------------------------------------------ main


def warm(kernels: dict, items: list[C128Case | ChainCase]) -> tuple[list[dict], bool]:
    """Warm every config key and every key the cases dispatch to, per backend and op."""
    need: dict[str, list[dict[str, Any]]] = {op: [] for op in OPS}
    for it in items:
        for c in ((it.k7, it.store) if isinstance(it, ChainCase) else (it,)):
            need[c.op].append(c.args)
    out, ok = [], True
    for op in OPS:
        for backend, k in kernels[op].items():
            keys = list(dict.fromkeys([key for cfg in CONFIGS for key in k.get_warmup_keys(cfg)]
                                      + [dispatch_key(k, op, a) for a in need[op]]))
            t0 = time.perf_counter()
            reports = k.compile_many(keys)
            errors = [f"{r.key}: {r.error}" for r in reports if not r.ok]
            ok = ok and not errors
            out.append({"backend": backend, "op": op, "seconds": time.perf_counter() - t0,
                        "keys": [{"key": str(r.key), "registers": r.info.get("registers"),
                                  "spills": r.info.get("spills"), "seconds": r.seconds, "error": r.error}
                                 for r in reports]})
            log(f"warmup {backend:8s} {op:28s} {len(keys)} keys in {time.perf_counter() - t0:.1f} s, "
                f"registers {[r.info.get('registers') for r in reports]}, "
                f"spills {[r.info.get('spills') for r in reports]}"
                + (f", ERRORS {errors}" if errors else ""))
    return out, ok


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for the result files")
    ap.add_argument("--cases", type=int, default=60,
                    help="random cases per op (cases.random_case(op, i), i < N)")
    ap.add_argument("--chains", type=int, default=12, help="chains K7 -> K8 per store op")
    ap.add_argument("--large", default="16384,65536",
                    help="comma-separated T of the large cases ('' for none)")
    ap.add_argument("--no-cpu-reference", action="store_true", help="judge against the CUDA reference only")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="CPU, Triton interpreter only: 2 random cases per op, 1 chain per store op, no "
                         "large or decode cases (tests this script)")
    a = ap.parse_args(argv)
    if a.cpu_smoke:
        a.cases, a.chains, a.large, a.backends = 2, 1, "", "triton"
    return a


def main(argv: list[str] | None = None) -> int:
    from dsv4kit.bench import no_cuda_for, provenance, write_json

    a = parse_args(argv)
    if not a.cpu_smoke and no_cuda_for("c128_compress_gpu_check"):
        return 2
    from dsv4kit.platform import cpu_platform, current_platform
    from dsv4kit.results import kernel_source_files, kernel_source_hash

    _LINES.clear()
    a.out.mkdir(parents=True, exist_ok=True)
    logf = open(a.out / "c128_compress.log", "w")  # noqa: SIM115  (closed in the finally below)
    _LOG_FILE[:] = [logf]
    try:
        return _run(a, cpu_platform() if a.cpu_smoke else current_platform(), provenance, write_json,
                    kernel_source_hash, kernel_source_files)
    finally:
        _LOG_FILE.clear()
        logf.close()


def _run(a: argparse.Namespace, platform: Any, provenance, write_json, kernel_source_hash,
         kernel_source_files) -> int:
    device = "cpu" if a.cpu_smoke else "cuda"
    backends = [b for b in a.backends.split(",") if b]
    ok_cutlass, cutlass_version = cutlass_status()
    prov = provenance({"kernel": "C128 compressors (K7, K8a, K8b)", "family": FAMILY, "arch": platform.arch,
                       "cutlass": cutlass_version if ok_cutlass else None,
                       "kernel_source_hash": kernel_source_hash(FAMILY),
                       "kernel_source_files": kernel_source_files(FAMILY), "cpu_smoke": a.cpu_smoke,
                       "backends": backends})
    write_json(a.out / "provenance.json", prov)
    log(str(prov))
    result: dict[str, Any] = {"provenance": prov, "args": {k: str(v) for k, v in vars(a).items()}}
    t_start = time.perf_counter()
    failures: list[str] = []

    # the kernels, per op and backend
    kernels: dict[str, dict[str, Any]] = {op: {} for op in OPS}
    for backend in backends:
        for op in OPS:
            try:
                kernels[op][backend] = SPECS[op].kernel(device=device, backend=backend, platform=platform)
            except Exception as exc:
                failures.append(f"backend {backend} unavailable for {op}: {type(exc).__name__}: {exc}")
                log(f"BACKEND UNAVAILABLE {backend} {op}: {type(exc).__name__}: {exc}")
    backends = [b for b in backends if all(b in kernels[op] for op in OPS)]
    for op in OPS:
        kernels[op] = {b: k for b, k in kernels[op].items() if b in backends}
    ctx = Ctx(device, platform, backends, not a.no_cpu_reference)
    sizes = [int(s) for s in a.large.split(",") if s.strip()]

    # the small cases (built first: warmup covers every key they dispatch to)
    random_sets: dict[str, list[tuple[str, C128Case]]] = {}
    for op in OPS:
        items = []
        for i in range(a.cases):
            case = random_case(op, i)
            items.append(("random", case))
            if op == K7 and i % 10 == 0:
                items.append(("odd_stride", odd_stride(case)))
        random_sets[op] = items
    packed = packed_cases(1 if a.cpu_smoke else 3)
    chains = [chain_case(op, i) for op in (K8A, K8B) for i in range(a.chains)]
    decode = [] if a.cpu_smoke else [decode_case(op, t) for op in OPS for t in DECODE_SIZES]
    items: list[Any] = [c for s in random_sets.values() for _, c in s] + packed + chains + decode

    # 1. warmup
    result["warmup"], warm_ok = warm(kernels, items)
    if not warm_ok:
        failures.append("warmup: some keys failed to compile")

    # 2. numerics, inside the compile counters and the monitor (error mode)
    records: list[dict[str, Any]] = []
    launch_checks: list[dict[str, Any]] = []
    core_checks: list[dict[str, Any]] = []
    large_items: list[tuple[C128Case, torch.Tensor]] = []
    counters = Counters("cutedsl" in backends)
    try:
        for op in OPS:
            t0 = time.perf_counter()
            for set_name, case in random_sets[op]:
                records += check_case(case, set_name, ctx)[0]
            if op == K8A:
                for case in packed:
                    records += check_case(case, "packed", ctx)[0]
            log(f"{op}: {len(random_sets[op])} cases{' + packed pools' if op == K8A else ''} in "
                f"{time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        for chain in chains:
            records += check_case(chain, "chain", ctx)[0]
        log(f"{len(chains)} chains K7 -> K8 in {time.perf_counter() - t0:.1f} s")
        if a.cpu_smoke:
            # the kernel-alone launch and the check-free core, once per op on the first random case
            for op in OPS:
                case = random_sets[op][0][1]
                want = run_reference(case, device, ctx)
                for backend, k in kernels[op].items():
                    launch_checks.append(launch_check(case, backend, k, want, ctx, "random case 0"))
                core_checks.append(core_check(case, None, want, ctx, "eager core"))
        for t in sizes:
            t0 = time.perf_counter()
            lc = large_chains(t)
            k7_case = lc[0][1].k7
            recs, wants = check_case(k7_case, "large", ctx)
            records += recs
            pooled = wants.get("cpu", wants[device]).cpu()[:t].contiguous()
            large_items.append((k7_case, wants[device]))
            for _, chain in lc:
                label = f"{chain.store.op} T={t} {chain.store.meta['format']} (the reference's pooled rows)"
                store = replace(chain.store, args={**chain.store.args, "compressed_kv": pooled}, label=label)
                recs, swants = check_case(store, "large", ctx)
                records += recs
                large_items.append((store, swants[device]))
                records += check_case(chain, "large_chain", ctx)[0]
            log(f"large T={t}: K7, 3 stores, 3 chains judged in {time.perf_counter() - t0:.1f} s")
            del lc, wants
        result["cases"] = records
        result["pass"] = False
        write_outputs(a.out, result)  # the case numerics survive a run that times out below
        # 3. the kernel alone on the large cases and the decode steps, in the same counters
        if large_items or decode:
            t0 = time.perf_counter()
            try:
                launch_checks += large_launch_checks(large_items, kernels, ctx)
                launch_checks += decode_launch_checks(decode, kernels, ctx)
            except Exception:
                result["launch_error"] = traceback.format_exc()
                log(result["launch_error"])
                failures.append("kernel-alone checks raised")
            log(f"kernel alone: {len(launch_checks)} launches judged in {time.perf_counter() - t0:.1f} s")
    finally:
        numerics_compiles = counters.close()
    del large_items
    result["numerics_compiles"] = numerics_compiles
    log(f"numerics compiles after warmup: {numerics_compiles}")
    result["cases"] = records
    result["summary"] = summarize(records)
    result["launch_checks"] = launch_checks
    result["core_checks"] = core_checks

    # verdict
    bad_cases = [r for r in records if r["backend"] in BACKENDS and not r["ok"]]
    bad_launch = [r for r in launch_checks if not r["ok"]]
    if not any(r["backend"] in BACKENDS for r in records):
        failures.append("no kernel case ran")
    if bad_cases:
        failures.append(f"{len(bad_cases)} kernel records do not conform")
    if bad_launch:
        failures.append(f"{len(bad_launch)} kernel-alone launch checks do not conform")
    nc = numerics_compiles
    if nc["triton_compiles"] or nc["cute_compiles"] or nc["monitor_events"]:
        failures.append(f"compiles during the numerics: {nc}")
    ok = not failures
    result["pass"] = ok
    result["failures"] = failures
    result["seconds"] = time.perf_counter() - t_start
    for f in failures:
        log(f"FAILURE: {f}")
    log(f"ALL CHECKS {'PASS' if ok else 'FAIL'} in {result['seconds']:.0f} s; results in {a.out}")
    write_outputs(a.out, result)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
