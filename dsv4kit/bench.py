"""Timing harness for GPU benchmarks: copy-bandwidth ceiling, medians, provenance, result files.

Every benchmark script reports bandwidth from an explicit bytes model against the copy
bandwidth measured in the same run, so a number is never compared with a datasheet.

The sweep of ``dsv4kit bench`` runs here too; what it sweeps lives with each family. Every kernel
folder has a ``bench.py`` whose ``PLANS`` holds one :class:`SweepPlan` per family (or per group of
ops sharing a core, e.g. ``c128_store``: K8a / K8b), each with its sizes, its bytes model (the
folder's ``*_bytes`` functions, the same models the ``benchmarks/`` scripts recorded with) and a
builder of the op's arguments at one size from the family's seeded ``cases`` module.
:data:`PLANS` (plan name -> plan) gathers them through the family specs on first use
(:meth:`dsv4kit.family.FamilySpec.bench_plans`, folders in family order); :func:`run_sweep`
times, per point and backend, the kernel (the op captured in a CUDA graph and replayed: GPU time
only), the whole op call (events over back-to-back calls), the eager reference and
``torch.compile`` of it, into :class:`dsv4kit.bench_schema.BenchRow` rows.

Graph replays re-read the same buffers, so a point whose bytes fit a few times in the GPU's L2
(50 MiB on the H200) is timed partly from L2 and can read above the copy ceiling: such points are
marked ``L2`` in the log, the provenance records the L2 size, and every plan's largest size clears
:data:`L2_MULTIPLE` times it (a test holds the sizes to that) unless the plan says why it cannot.
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import json
import os
import platform as _platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DECODE_SIZES",
    "ENTRY_BYTES",
    "H200_L2_BYTES",
    "L2_MULTIPLE",
    "PLANS",
    "BenchResult",
    "Point",
    "SweepPlan",
    "backend_kernels",
    "bench_median_ms",
    "copy_bandwidth_gbs",
    "empty_kernel_us",
    "family_plans",
    "graph_median_ms",
    "in_request_order",
    "no_cuda_for",
    "provenance",
    "request_batch",
    "run_child",
    "run_sweep",
    "select_plans",
    "write_csv",
    "write_json",
]


#: The H200's L2 in bytes (``L2_cache_size``): what the sizes of :data:`PLANS` are held against.
H200_L2_BYTES = 50 * 2**20
#: A point under this many L2s of bytes is marked as timed partly from L2.
L2_MULTIPLE = 4


def no_cuda_for(script: str) -> bool:
    """True, after saying so on stderr, when no CUDA device is visible to the GPU check ``script``
    (which then exits 2; its ``--cpu-smoke`` runs the script's paths on CPU instead)."""
    if torch.cuda.is_available():
        return False
    print(f"{script}: needs a CUDA device (none is visible); --cpu-smoke runs the script's paths on CPU",
          file=sys.stderr)
    return True


def provenance(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Device, versions, date and commit of this run, and the package's own version and kernel
    source hashes (:func:`dsv4kit.results.package_provenance`). The commit is ``DSV4KIT_COMMIT``
    when set (the operator's word, for a copied tree), else that of the package's own git checkout,
    else ``unknown``: never the commit of a repository that merely encloses the tree."""
    from dsv4kit.results import package_provenance

    package = package_provenance()
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("DSV4KIT_COMMIT") or package["commit"],
        "dsv4kit": package["dsv4kit"],
        "python": _platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        from importlib.metadata import version

        info["nvidia-cutlass-dsl"] = version("nvidia-cutlass-dsl")
    except Exception:
        info["nvidia-cutlass-dsl"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, sm=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1), l2_cache_bytes=p.L2_cache_size,
                    cuda=torch.version.cuda)
    else:
        info["device"] = "cpu"
    info.update(extra or {})
    return info


def bench_median_ms(fn: Callable[[], Any], *, graph: bool = True, rep_ms: int = 200) -> float:
    """Median time of ``fn`` in ms: CUDA-graph replays when possible (no launch gaps), else events.

    Both are ordered after the work already queued on the caller's current stream (the inputs
    ``fn`` reads may still be being written there) and leave the caller's stream ordered after
    everything they ran: see :func:`graph_median_ms`.
    """
    from triton.testing import do_bench

    if graph:
        try:
            return graph_median_ms(fn, rep_ms=rep_ms)
        except Exception:  # some launchers cannot be captured; fall back to plain events
            torch.cuda.synchronize()  # (a device fault is sticky: this raises it instead)
    return float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def graph_median_ms(fn: Callable[[], Any], *, rep_ms: int = 200, retries: int = 10) -> float:
    """Median ms of one ``fn`` from replays of a CUDA graph of ``fn`` unrolled to about ``rep_ms``.

    The method of ``triton.testing.do_bench_cudagraph`` (one eager call, a 5-call estimate, a
    graph of ``rep_ms / estimate`` calls, ``retries`` timed replays), with one difference that
    matters: Triton's version runs ``fn`` on a fresh ``torch.cuda.Stream()`` (a pool stream,
    created non-blocking) that never waits for the caller's stream, so its first eager calls can
    start while the caller's queued writes of ``fn``'s inputs are still running. In the K3 sweep
    the kernel then read a block table and lengths that still held the previous contents of
    reused allocations, and faulted on an illegal address at the same point of every full run,
    never under ``CUDA_LAUNCH_BLOCKING=1`` (``benchmarks/results/NOTES.md``; reproduced on purpose
    by ``benchmarks/k3_fault_probe.py``, since removed: ``tests/test_bench_harness.py`` holds the
    ordering). Here the side stream waits for the caller's stream first, and the caller's stream
    waits for the side stream at the end.
    """
    caller = torch.cuda.current_stream()
    side = torch.cuda.Stream(device=caller.device)
    side.wait_stream(caller)  # fn's inputs may still be being written on the caller's stream
    try:
        with torch.cuda.stream(side):
            fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                fn()
            end.record()
            end.synchronize()
            estimate_ms = start.elapsed_time(end) / 5
            n_repeat = 1000 if estimate_ms == 0 else max(1, int(rep_ms / estimate_ms))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # (synchronizes the device before capturing)
                for _ in range(n_repeat):
                    fn()
            times = []
            for _ in range(retries):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / n_repeat)
    finally:
        caller.wait_stream(side)
    torch.cuda.synchronize()  # nothing of the graph is in flight when it is destroyed
    del g
    times.sort()
    mid = len(times) // 2
    return float(times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2)


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), median of many copies."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench_median_ms(lambda: dst.copy_(src), graph=False, rep_ms=400)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def run_child(cmd: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """Run one configuration in its own process: ``(returncode, stdout + stderr)``; a timeout is
    returncode -1 with what the child printed so far."""
    try:
        run = subprocess.run(list(cmd), capture_output=True, text=True, env=dict(env), timeout=timeout)
        return run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as exc:
        out = "".join(x.decode() if isinstance(x, bytes) else x for x in (exc.stdout or "", exc.stderr or ""))
        return -1, f"timed out after {timeout} s\n{out}"


def write_json(path: str | Path, obj: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2, default=str) + "\n")


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        w.writerows(rows)


def backend_kernels(spec: Any, platform: Any, variant: str = "default",
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """One kernel object of ``spec`` per backend that can run on ``platform`` (Triton always,
    CuTeDSL where it imports), chosen by the platform's backend predicate; the others are logged."""
    out = {}
    for backend in ("triton", "cutedsl"):
        try:
            out[backend] = spec.kernel(variant, platform.device, backend, platform)
        except Exception as exc:  # CuTeDSL not installed, or not runnable here
            log(f"{backend} kernel unavailable: {type(exc).__name__}: {exc}")
    return out


# --------------------------------------------------------------------------- sweep plans


@dataclass(frozen=True)
class Point:
    """One timed point: the family (op) it calls, its row labels, bytes and argument builder.

    ``build(device)`` returns the op's arguments by name (the variant argument included).
    """

    family: str
    kernel: str
    config: str
    size: int
    nbytes: int
    build: Callable[[str], dict[str, Any]] = field(compare=False, repr=False)


@dataclass(frozen=True)
class SweepPlan:
    """The sweep of one family or kernel folder: sizes, and the points at one size.

    ``families``: the :func:`dsv4kit.kernels.family` names whose ops it times. ``sizes``: the
    default large sizes; ``decode_sizes``: the decode sizes swept too (token-count axes only).
    ``size_axis``: what ``size`` counts. ``hash_family``: the name given to
    :func:`dsv4kit.results.kernel_source_hash` for the provenance. ``in_l2_why``: set where even
    the largest size stays under :data:`L2_MULTIPLE` L2s of bytes, saying why.
    """

    name: str
    families: tuple[str, ...]
    sizes: tuple[int, ...]
    points: Callable[[int], list[Point]] = field(compare=False, repr=False)
    decode_sizes: tuple[int, ...] = ()
    size_axis: str = "tokens T"
    hash_family: str = ""
    in_l2_why: str = ""

    def default_sizes(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((*self.decode_sizes, *self.sizes)))


#: The decode sizes (tokens per step) swept by the plans with a token-count axis.
DECODE_SIZES = (1, 8, 64, 256)
#: Bytes of one compressed cache entry per store format (the C4 / C128 compressors, the store hooks).
ENTRY_BYTES = {"fp8_ds_mla": 584, "bf16": 1024, "e4m3": 512, "fp8": 132, "mxfp4": 68}


def request_batch(tokens: int, ratio: int, requests: int = 4
                  ) -> tuple[tuple[int, ...], tuple[int, ...] | None, int]:
    """A compressor sweep's batch of ``tokens``: ``(lens, starts, closes)``.

    ``lens``: the tokens over ``min(requests, tokens)`` requests, as even as possible. ``starts``:
    at decode sizes (``tokens <= 256``) each request's first position, past its first windows and
    such that its last token closes a window (a decode step that writes); None (start at 0) above.
    ``closes``: the tokens closing a window of ``ratio`` (positions p with ``(p + 1) % ratio == 0``).
    """
    k = max(1, min(requests, tokens))
    lens = tuple(tokens // k + (1 if i < tokens % k else 0) for i in range(k))
    starts = None if tokens > 256 else tuple(ratio * (-(-(n + 2 * ratio) // ratio)) - n for n in lens)
    closes = sum((s + n) // ratio - s // ratio for s, n in zip(starts or (0,) * k, lens, strict=True))
    return lens, starts, closes


#: Per-token arrays of the compressor ops (what :func:`in_request_order` sorts).
_PER_TOKEN = ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping")


def in_request_order(args: Mapping[str, Any]) -> dict[str, Any]:
    """A compressor call with its tokens sorted by (request, position), the layout of a serving
    batch. The cases interleave requests (kernels must not assume an order); the sweep measures
    the order production has. Same tokens, same bytes; only the order of the per-token arrays."""
    order = torch.argsort(args["token_to_req"].long() * (1 << 40) + args["positions"])
    return {k: (v[order].contiguous() if k in _PER_TOKEN and v is not None else v) for k, v in args.items()}


def family_plans() -> dict[str, SweepPlan]:
    """Every family's sweep plans by plan name: the ``PLANS`` of each kernel folder's ``bench.py``
    (:meth:`dsv4kit.family.FamilySpec.bench_plans`), folders in family order."""
    from dsv4kit.kernels import families

    plans: dict[str, SweepPlan] = {}
    for spec in families():
        for plan in spec.bench_plans():
            plans.setdefault(plan.name, plan)
    return plans


#: Every family's sweep plans by plan name (:func:`family_plans`, read on first use).
PLANS: dict[str, SweepPlan]


def __getattr__(name: str) -> Any:
    # PLANS is read from the family folders on first use: importing this module (every GPU script
    # does, for provenance) imports no family.
    if name == "PLANS":
        plans = globals()["PLANS"] = family_plans()
        return plans
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plans() -> dict[str, SweepPlan]:
    return globals()["PLANS"] if "PLANS" in globals() else __getattr__("PLANS")


def select_plans(names: Sequence[str] | None) -> list[SweepPlan]:
    """The plans for ``names`` (plan names or family names; None: every plan), in :data:`PLANS`
    order. ValueError naming what is known when a name has no plan."""
    plans = _plans()
    if not names:
        return list(plans.values())
    from dsv4kit.kernels import FAMILY_NAMES

    chosen: list[str] = []
    for n in names:
        plan = n if n in plans else next((p.name for p in plans.values() if n in p.families), None)
        if plan is None:
            why = "a registered family without a sweep plan yet" if n in FAMILY_NAMES else "not a family"
            raise ValueError(f"--family {n}: {why}; families with a sweep: "
                             + ", ".join(f"{p.name} ({', '.join(p.families)})" if p.families != (p.name,)
                                         else p.name for p in plans.values()))
        chosen.append(plan)
    return [plans[n] for n in plans if n in chosen]


# --------------------------------------------------------------------------- the sweep


@dataclass
class BenchResult:
    """What :func:`run_sweep` measured: rows of the one schema, decode rows, provenance."""

    provenance: dict[str, Any]
    copy_GBps: float
    rows: list[Any] = field(default_factory=list)
    decode: list[Any] = field(default_factory=list)
    empty_kernel_us: float | None = None

    def to_json(self) -> dict[str, Any]:
        from dsv4kit.bench_schema import host_rows, results_json

        return results_json(self.rows, self.provenance, self.copy_GBps, decode=self.decode,
                            host=host_rows(self.rows))


def empty_kernel_us(rep_ms: int = 100) -> float:
    """GPU time of an empty Triton kernel in µs (CUDA-graph replays on the current stream)."""
    import triton

    @triton.jit
    def _empty(x_ptr):  # pragma: no cover - GPU only
        pass

    buf = torch.zeros(1, device="cuda")
    return 1e3 * graph_median_ms(lambda: _empty[(1,)](buf), rep_ms=rep_ms)


def _time(fn: Callable[[], Any], graph: bool, rep_ms: int) -> tuple[float, str, str]:
    """``(median µs, timing label, error)``; a graph capture that fails falls back to events."""
    from triton.testing import do_bench

    if graph:
        try:
            return 1e3 * graph_median_ms(fn, rep_ms=rep_ms), "cuda-graph replay", ""
        except Exception as exc:  # a launcher that cannot be captured: time with events
            torch.cuda.synchronize()
            note = f"graph capture failed ({type(exc).__name__}); events"
            try:
                return 1e3 * float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")), note, ""
            except Exception as exc2:
                return float("nan"), note, f"{type(exc2).__name__}: {str(exc2)[:200]}"
    try:
        return 1e3 * float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")), "events (do_bench)", ""
    except Exception as exc:
        torch.cuda.synchronize()
        return float("nan"), "events (do_bench)", f"{type(exc).__name__}: {str(exc)[:200]}"


def run_sweep(plans: Sequence[SweepPlan], *, backends: Sequence[str] = ("triton", "cutedsl"),
              sizes: Sequence[int] | None = None, reference: bool = True, compile_reference: bool = True,
              rep_ms: int = 100, compile_budget_s: float = 120.0, copy_bytes: int = 2 << 30,
              reference_max_bytes: int = 1 << 30, platform: Any = None,
              log: Callable[[str], None] = print) -> BenchResult:
    """Time every point of ``plans`` on the current GPU (see the module docstring).

    The copy ceiling (:func:`copy_bandwidth_gbs`) and an empty kernel are measured first, in the
    same process. Per point and backend: ``kernel (graph replay)`` (the op captured in a CUDA
    graph: its GPU time), ``op`` (the whole call: host time included); then, when ``reference``,
    the eager reference and (``compile_reference``, while ``compile_budget_s`` lasts) its
    ``torch.compile``, at points of at most ``reference_max_bytes``. A backend that cannot run
    here is logged and skipped; a point that raises becomes a row with ``error`` set, and the
    sweep goes on. ``platform``: the kit's platform (default: this process's).
    """
    from dsv4kit.bench_schema import (
        KERNEL,
        OP,
        REF_COMPILE,
        REF_EAGER,
        DecodeRow,
        make_row,
    )
    from dsv4kit.kernels import family as family_spec
    from dsv4kit.platform import current_platform
    from dsv4kit.results import kernel_source_provenance

    if not torch.cuda.is_available():
        raise RuntimeError("run_sweep needs a CUDA device")
    platform = platform if platform is not None else current_platform()
    prov = provenance({**kernel_source_provenance(p.hash_family for p in plans), "arch": platform.arch,
                       "script": "dsv4kit bench", "rep_ms": rep_ms,
                       "copy_ceiling": "dsv4kit.bench.copy_bandwidth_gbs: triton.testing.do_bench median of "
                                       "dst.copy_(src), read + write bytes"})
    copy = copy_bandwidth_gbs(copy_bytes)
    log(f"device-to-device copy: {copy:.0f} GB/s")
    l2 = prov.get("l2_cache_bytes") or 0
    log(f"L2: {l2 / 2**20:.0f} MiB; rows marked L2 moved under {L2_MULTIPLE}x that (partly L2-resident)")
    empty = empty_kernel_us()
    log(f"empty Triton kernel: {empty:.2f} us (graph replay)")
    res = BenchResult(prov, copy, empty_kernel_us=empty)
    compiled: dict[tuple[str, str], Any] = {}
    budget = compile_budget_s
    for plan in plans:
        kernels = {}
        for fam in plan.families:
            spec = family_spec(fam)
            for b in backends:
                for v in spec.variants:
                    try:
                        kernels[(fam, v, b)] = spec.kernel(v, platform.device, b, platform)
                    except Exception as exc:
                        log(f"{fam} {v} {b}: unavailable ({type(exc).__name__}: {exc})")
        for size in (sizes or plan.default_sizes()):
            for pt in plan.points(size):
                spec = family_spec(pt.family)
                try:
                    args = pt.build("cuda")
                except Exception as exc:
                    log(f"{pt.kernel} {pt.config} size {size}: inputs failed ({type(exc).__name__}: {exc})")
                    continue
                variant = args.get(spec.variant_arg, "default") if spec.variant_arg else "default"
                fns: list[tuple[str, str, Callable[[], Any], bool]] = []
                for b in backends:
                    if (pt.family, variant, b) not in kernels:
                        continue
                    call = functools.partial(spec.op, **args, backend=b, debug_checks=False)
                    fns += [(b, KERNEL, call, True), (b, OP, call, False)]
                ref = spec.variants[variant].reference
                ref_args = {k: v for k, v in args.items() if k != spec.variant_arg}
                reference_here = reference and pt.nbytes <= reference_max_bytes
                if reference_here:
                    fns.append(("torch", REF_EAGER, lambda r=ref, a=ref_args: r(**a), False))
                if reference_here and compile_reference and budget > 0:
                    key = (pt.family, variant)
                    t0 = time.perf_counter()
                    try:
                        fn = compiled.get(key) or torch.compile(ref, dynamic=True)
                        fn(**ref_args)  # compile outside the timing
                        compiled[key] = fn
                        fns.append(("torch", REF_COMPILE, lambda f=fn, a=ref_args: f(**a), False))
                    except Exception as exc:
                        log(f"torch.compile({spec.op_name} reference) failed: {type(exc).__name__}: "
                            f"{str(exc)[:200]}")
                    budget -= time.perf_counter() - t0
                for backend, what, fn, graph in fns:
                    us, timing, err = _time(fn, graph, rep_ms)
                    row = make_row(plan.name, pt.kernel, backend, what, pt.size, pt.nbytes, us, copy,
                                   config=pt.config, timing=timing, error=err)
                    res.rows.append(row)
                    frac = f"{100 * row.fraction_of_copy:5.1f}%" if row.fraction_of_copy else "    -"
                    in_l2 = "  L2" if pt.nbytes < L2_MULTIPLE * l2 else ""
                    log(f"{pt.kernel:28s} {pt.config:34s} {size:>8d} {backend:8s} {what:30s} {us:10.1f} us "
                        f"{frac}{in_l2}" + (f"  {err}" if err else ""))
                    if what == KERNEL and size in plan.decode_sizes and not err:
                        res.decode.append(DecodeRow(plan.name, pt.kernel, backend, size, us, empty,
                                                    us - empty, pt.config))
                del args, fns
                torch.cuda.empty_cache()
    return res
