"""Host overhead per op call: what Python costs before the kernel runs, and where it goes.

For every public op (its small valid call from :mod:`dsv4kit.testing.valid_calls`) and every
backend that runs here, five paths, each timed as the best of ``--repeats`` means over
``--calls`` back-to-back calls (no synchronize):

* ``op full``: :meth:`FamilySpec.call_checked` with launch plans off, the path every call took
  before plans;
* ``op planned``: the public op with its signature planned at both layers (the op's call plan,
  :mod:`dsv4kit.family.plans`, then the kernel's launch plan, :mod:`dsv4kit.jit.launch_plans`),
  served by its hot guard (``SignatureGuard``: no signature computed);
* ``kernel full``: the kernel object called directly, launch plans off (its own checks, dispatch,
  executor lookup, argument building, launch);
* ``kernel planned``: the kernel object with its launch plan (on a GPU, Triton's direct launch
  of the warmed ``CompiledKernel``);
* ``empty launch`` (GPU, Triton rows): an empty ``@triton.jit`` kernel launched through
  ``JITFunction.run``, the floor the issue compares with.

``--debug-checks off`` (default: the GPU's default) leaves out the value checks that read device
memory; ``default`` takes the op's default (on under the CPU interpreter), ``on`` forces them.
``--executor noop`` (the only choice on a CPU) replaces the warmed executors with a function
that does nothing, so the numbers are validation + dispatch + executor lookup + argument
building, without the launcher; ``real`` (GPU) keeps the launcher. A cProfile of the planned
path gives the top functions by own time, and ``parts (op planned) us`` times the planned op's
pieces alone: the hot guard, the plan's body (outputs, views, the launch), the executor-cache
validity check, and ``launch_signature`` (what the guard replaces). Nothing is launched under
``noop``.

    python benchmarks/host_overhead.py --out benchmarks/results/host_overhead_cpu
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dsv4kit.bench import provenance, write_json
from dsv4kit.family import FamilySpec
from dsv4kit.family.spec import DEFAULT_VARIANT
from dsv4kit.jit import class_plans, launch_plans
from dsv4kit.kernels import families
from dsv4kit.platform import current_platform
from dsv4kit.results import kernel_source_provenance
from dsv4kit.testing.valid_calls import sized_call, twin, valid_call


def _mean_us(fn: Any, calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def _variant(spec: FamilySpec, call: dict[str, Any]) -> str:
    if spec.variant_arg is None:
        return DEFAULT_VARIANT
    default = next(a.default for a in spec.args if a.name == spec.variant_arg)
    return call.get(spec.variant_arg, default)


def _noop_executors(kernel: Any) -> None:
    cache = kernel._executor_cache()
    for key in list(cache):
        cache[key] = lambda *args: None


def _profile(fn: Any, calls: int, top: int) -> list[str]:
    """The top ``top`` functions by own time over ``calls`` calls of ``fn``."""
    return _profile_calls([fn] * calls, top)


_DEBUG = {"off": False, "on": True, "default": None}


def _parts(spec: FamilySpec, kwargs: dict[str, Any], calls: int, repeats: int) -> dict[str, float] | None:
    """The planned op call's pieces, each timed alone (None when no hot entry serves the call)."""
    hot = spec._launches.hot
    served = [(fast, guard, ts) for fast, guard in hot if (ts := guard((), kwargs)) is not None]
    if not served:
        return None
    fast, guard, tensors = served[0]
    kernel_tensors = [tensors[i] for i in fast.order]
    parts = {"hot guard": lambda: guard((), kwargs), "plan body": lambda: fast.plan.run(*kernel_tensors),
             "validity": fast.valid,
             "launch_signature (replaced)": lambda: launch_plans.launch_signature((), kwargs),
             **_body_parts(fast.plan, kernel_tensors)}
    return {k: (round(_mean_us(fn, calls, repeats), 2) if callable(fn) else fn) for k, fn in parts.items()}


def _body_parts(plan: launch_plans.LaunchPlan, tensors: list[torch.Tensor]) -> dict[str, Any]:
    """The plan body's pieces as callables: each fresh output's ``empty_strided``, the launch with
    this call's arguments, and on a Triton direct launch the launch's own steps and the two ways
    past ``CudaLauncher.__call__`` (its C ``launch``)."""
    launch = plan.launch
    if launch is None:
        return {}
    parts: dict[str, Any] = {}
    for i, (shape, stride, dtype, dev) in enumerate(plan.fresh):
        parts[f"empty_strided #{i}"] = (lambda a=shape, b=stride, c=dtype, d=dev:
                                        torch.empty_strided(a, b, dtype=c, device=d))
    args = _launch_args(plan, tensors)
    parts["launch"] = lambda: launch(args)
    cells = (c.cell_contents for c in launch.__closure__ or ())
    free = dict(zip(launch.__code__.co_freevars, cells, strict=True))
    if "ck" not in free:
        return parts                       # not Triton's direct launch: the executor call is the launch
    ck, grid, device = free["ck"], free["grid"], free["device"]
    g0, g1, g2 = (*grid, 1, 1)[:3]
    values = free["template"].copy()
    for slot, a in zip(free["slots"], args, strict=True):
        values[slot] = a
    stream = free["get_stream"](device)
    run_, function, packed = ck.run, ck.function, ck.packed_metadata
    c_launch = run_.launch
    coop, pdl = run_.launch_cooperative_grid, run_.launch_pdl
    parts.update({
        "triton: current device": free["get_device"],
        "triton: current stream": lambda: free["get_stream"](device),
        "triton: launch_metadata": lambda: ck.launch_metadata(grid, stream, *values),
        "triton: CudaLauncher.__call__": lambda: run_(g0, g1, g2, stream, function, packed, None, None, None,
                                                      *values),
        "triton: C launch": lambda: c_launch(g0, g1, g2, stream, function, coop, pdl, None, None, packed,
                                             None, None, None, *values),
    })
    parts["triton: scratch bytes"] = (run_.global_scratch_size, run_.profile_scratch_size)
    return parts


def _launch_args(plan: launch_plans.LaunchPlan, tensors: list[torch.Tensor]) -> list[Any]:
    """The executor arguments ``plan`` builds for ``tensors`` (its launch intercepted, run once)."""
    seen: list[list[Any]] = []
    original = plan.launch
    cells = dict(zip(plan.run.__code__.co_freevars, plan.run.__closure__ or (), strict=True))
    cell = cells["launch"]
    cell.cell_contents = lambda args: seen.append(args)
    try:
        plan.run(*tensors)
    finally:
        cell.cell_contents = original
    return seen[0]


def measure(spec: FamilySpec, backend: str, device: str, executor: str, calls: int, repeats: int,
            top: int, debug_checks: str = "off") -> dict[str, Any]:
    """One op on one backend: the three paths' mean µs per call and a profile of the planned path."""
    # twin, not .to: the same sizes, strides and offsets on the device (.to would compact a view)
    call = {k: (twin(v, device) if isinstance(v, torch.Tensor) else v) for k, v in valid_call(spec).items()}
    call["debug_checks"] = _DEBUG[debug_checks]
    kernel = spec.kernel(_variant(spec, call), torch.device(device), backend)
    spec.op(**call, backend=backend)                  # warms the key and plans the signature
    if executor == "noop":
        _noop_executors(kernel)
    kernel_args = {k: v for k, v in call.items() if k != spec.variant_arg}   # debug_checks included
    paths = {  # name: (call, launch plans on)
        "op full": (lambda: spec.call_checked(**call, backend=backend), False),
        "op planned": (lambda: spec.op(**call, backend=backend), True),
        "kernel full": (lambda: kernel(**kernel_args), False),
        "kernel planned": (lambda: kernel(**kernel_args), True),
    }
    row: dict[str, Any] = {"family": spec.name, "op": spec.op_name, "kernel": kernel.name, "backend": backend,
                           "executor": executor, "debug_checks": debug_checks, "calls": calls,
                           "repeats": repeats}
    try:
        for name, (fn, plans) in paths.items():
            launch_plans.set_enabled(plans)
            fn()                                      # plans the signature (or runs once) untimed
            row[f"{name} us"] = round(_mean_us(fn, calls, repeats), 2)
        row["launch plan"] = bool(launch_plans.plans_of(kernel))
        if device == "cuda":
            torch.cuda.synchronize()
        row["profile (op planned)"] = _profile(paths["op planned"][0], calls, top)
        row["parts (op planned) us"] = _parts(spec, {**call, "backend": backend}, calls, repeats)
    finally:
        launch_plans.set_enabled(True)
    type(kernel).clear_cache()                        # the no-op executors must not outlive the run
    return row


#: The sizes of the three serving regimes (``sized_call``'s ``n``): one fixed shape, a cycle of
#: 32 shapes seen before, and shapes never seen before (their keys warm).
FIXED_N, CYCLE_N, NEW_N = 3, range(1, 33), range(33, 33 + 96)
#: Shapes profiled apart (``--profile``): never called before either.
PROFILE_N = range(129, 129 + 48)


def _profile_calls(fns: list[Any], top: int) -> list[str]:
    """The top ``top`` functions by own time over one call of each of ``fns``."""
    prof = cProfile.Profile()
    prof.enable()
    for fn in fns:
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    lines = [ln.rstrip() for ln in out.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return [ln.replace(str(Path.cwd()) + "/", "") for ln in lines[start:]]


def _forget_plans(spec: FamilySpec) -> None:
    """Drop every plan of ``spec``'s op and kernels: the shapes called so far are unseen again."""
    spec._launches.clear()
    for kernel in spec._kernels.values():
        launch_plans.plans_of(kernel).clear()


def regimes(spec: FamilySpec, backend: str, device: str, executor: str, calls: int, repeats: int,
            debug_checks: str = "off", profile: int = 0) -> dict[str, Any]:
    """Host µs per public op call (launch plans on, nothing synchronized) in three regimes:
    ``fixed`` (one shape, back to back), ``cycle`` (32 shapes seen before, in turn) and ``new shape``
    (each call a shape never called before whose key is warm: median and 90th percentile of the
    single calls). ``profile``: also a cProfile of new-shape calls (another 48 shapes), its top
    ``profile`` functions by own time."""
    flag = _DEBUG[debug_checks]

    def call_at(n: int) -> dict[str, Any]:
        c = {k: (twin(v, device) if isinstance(v, torch.Tensor) else v)
             for k, v in sized_call(spec, n).items()}
        return {**c, "debug_checks": flag, "backend": backend}

    fixed, cycle, new = call_at(FIXED_N), [call_at(n) for n in CYCLE_N], [call_at(n) for n in NEW_N]
    unseen = [call_at(n) for n in PROFILE_N] if profile else []
    op = spec.op
    for c in (fixed, *cycle, *new, *unseen):    # warms every key these shapes dispatch to
        op(**c)
    if executor == "noop":
        for kernel in spec._kernels.values():
            _noop_executors(kernel)
    _forget_plans(spec)
    for c in (fixed, *cycle):          # seen: planned at both layers
        op(**c)
    if device == "cuda":
        torch.cuda.synchronize()
    row: dict[str, Any] = {"op": spec.op_name, "backend": backend, "executor": executor}
    row["fixed us"] = round(_mean_us(lambda: op(**fixed), calls, repeats), 2)
    turn = iter(())

    def next_in_cycle() -> None:
        nonlocal turn
        c = next(turn, None)
        if c is None:
            turn = iter(cycle)
            c = next(turn)
        op(**c)

    row["cycle us"] = round(_mean_us(next_in_cycle, calls, repeats), 2)
    singles = []
    for c in new:
        t0 = time.perf_counter()
        op(**c)
        singles.append((time.perf_counter() - t0) * 1e6)
    singles.sort()
    row["new shape us"] = round(singles[len(singles) // 2], 2)
    row["new shape p90 us"] = round(singles[int(len(singles) * 0.9)], 2)
    row["new shapes"] = len(singles)
    if unseen:
        row["profile (new shape)"] = _profile_calls([lambda c=c: op(**c) for c in unseen], profile)
    if device == "cuda":
        torch.cuda.synchronize()
    for kernel in spec._kernels.values():
        type(kernel).clear_cache()      # the no-op executors must not outlive the run
    _forget_plans(spec)
    return row


def floors(calls: int, repeats: int) -> dict[str, float]:
    """What any launch costs on this host (GPU), side by side: an empty ``@triton.jit`` kernel
    through ``JITFunction.run``, the same warmed binary through its C launcher (the raw launch: what
    a direct launch ends with), and an empty torch op."""
    import triton

    from dsv4kit.backends.triton import _c_launch

    @triton.jit
    def _empty(x_ptr):  # pragma: no cover - GPU only
        pass

    buf = torch.zeros(1, device="cuda")
    ck = _empty[(1,)](buf)  # JITFunction.run returns the CompiledKernel it launched
    out = {"JITFunction.run (empty kernel) us": round(_mean_us(lambda: _empty[(1,)](buf), calls, repeats), 2)}
    direct = _c_launch(ck.run)
    if direct is not None:
        c_launch, coop, pdl = direct
        function, packed = ck.function, ck.packed_metadata
        stream = torch.cuda.current_stream().cuda_stream
        out["raw launch (warmed binary, C launcher) us"] = round(_mean_us(
            lambda: c_launch(1, 1, 1, stream, function, coop, pdl, None, None, packed, None, None, None, buf),
            calls, repeats), 2)
    out["torch x.add_(0) us"] = round(_mean_us(lambda: buf.add_(0), calls, repeats), 2)
    torch.cuda.synchronize()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for host_overhead.json")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--top", type=int, default=12, help="profile lines per op")
    p.add_argument("--executor", choices=("noop", "real"), default="noop")
    p.add_argument("--debug-checks", choices=tuple(_DEBUG), default="off",
                   help="off (default; a GPU's default), on, or the op's default (on under the interpreter)")
    p.add_argument("--families", default="", help="comma-separated family names (default: all)")
    p.add_argument("--backends", default="triton,cutedsl",
                   help="comma-separated backends to time, of those that run here (default: both)")
    p.add_argument("--profile", type=int, default=0,
                   help="with the regimes: a cProfile of new-shape calls, its top N functions")
    p.add_argument("--class-plans", choices=("on", "off"), default="on",
                   help="class plans (dsv4kit.jit.class_plans: new sizes of a traced class), on by default")
    p.add_argument("--only", choices=("all", "paths", "regimes"), default="all",
                   help="the five paths per op, the three serving regimes per op, or both (default)")
    args = p.parse_args(argv)
    class_plans.set_enabled(args.class_plans == "on")
    plat = current_platform()
    device = "cuda" if plat.is_cuda else "cpu"
    if args.executor == "real" and device == "cpu":
        p.error("--executor real needs a GPU (on a CPU the launch is the Triton interpreter)")
    here = ["triton"] + (["cutedsl"] if plat.is_cuda and plat.cutedsl else [])
    backends = [b for b in here if b in args.backends.split(",")]
    wanted = {f for f in args.families.split(",") if f}
    rows, regime_rows = [], []
    for spec in families():
        if wanted and spec.name not in wanted:
            continue
        for backend in backends:
            if args.only != "paths":
                try:
                    r = regimes(spec, backend, device, args.executor, args.calls, args.repeats,
                                args.debug_checks, args.profile)
                except Exception as exc:  # recorded: one op's failure must not lose the others
                    r = {"op": spec.op_name, "backend": backend, "error": f"{type(exc).__name__}: {exc}"}
                    print(f"{spec.op_name:<32} {backend:<8} FAILED {r['error']}", flush=True)
                else:
                    print(f"{r['op']:<32} {backend:<8} fixed {r['fixed us']:7.1f}  cycle "
                          f"{r['cycle us']:7.1f}  new shape {r['new shape us']:7.1f} "
                          f"(p90 {r['new shape p90 us']:7.1f}) us", flush=True)
                regime_rows.append(r)
            if args.only == "regimes":
                continue
            row = measure(spec, backend, device, args.executor, args.calls, args.repeats, args.top,
                          args.debug_checks)
            print(f"{row['op']:<32} {backend:<8} op full {row['op full us']:7.1f} planned "
                  f"{row['op planned us']:7.1f}  kernel full {row['kernel full us']:7.1f} planned "
                  f"{row['kernel planned us']:7.1f} us", flush=True)
            rows.append(row)
    try:
        floor = floors(args.calls, args.repeats) if device == "cuda" else {}
    except Exception as exc:  # recorded with the rows already measured
        floor = {"error": f"{type(exc).__name__}: {exc}"}
    for name, us in floor.items():
        print(f"floor: {name} {us}")
    out = Path(args.out)
    write_json(out / "host_overhead.json", {
        "empty_launch_us": floor.get("JITFunction.run (empty kernel) us"),
        "floors": floor,
        "regimes": regime_rows,
        "provenance": provenance({**kernel_source_provenance(s.name for s in families()
                                                             if not wanted or s.name in wanted),
                                  "platform": str(plat), "executor": args.executor,
                                  "class_plans": args.class_plans,
                                  "debug_checks": args.debug_checks}),
        "method": "best of repeats of the mean over back-to-back calls; noop: executors replaced by a "
                  "function doing nothing (validation, dispatch, lookup, argument building; no launcher)",
        "rows": rows})
    print(f"wrote {out / 'host_overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
