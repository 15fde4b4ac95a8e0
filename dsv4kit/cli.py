"""dsv4kit: warm a DSv4 model's attention kernels, replay serving traces, report coverage.

    dsv4kit warmup   [--preset flash|pro] [--arch sm_90a|sm_100a] [--cache-dtype ...] ...
    dsv4kit coverage [same options] [--trace decode|prefill|mixed|all] [--steps N] [--plot FILE]
                     [--json FILE|-]
    dsv4kit cache    ls | verify | clear | export FILE | import FILE   [--cache-dir DIR]
    dsv4kit bench    [--family F] [--backend B] [--sizes ...] [--json FILE]   (a GPU; else exit 2)
    dsv4kit inspect  KERNEL [FIELD=VALUE ...] [--arch sm_90a] [--regs|--ptx|--sass]

warmup and coverage load the keys an artifact store holds (``--cache-dir``, default
``$DSV4KIT_CACHE_DIR`` or the user cache dir; ``--no-cache``: none) and compile the others in
``--jobs`` worker processes (default: the cores this process may use, or 1 when that is 2 or fewer).
A ``--cache-dir`` that is not a directory (a regular file, or a path under one) is a bad command
line (exit 2); a default location ($DSV4KIT_CACHE_DIR or the user cache dir) that is not one is
said once on stderr and warmup goes on without a store. The warmup report splits the time into
start-up and imports, toolchain setup, loads (from the store or from Triton's own cache) and
compiles, and says per key whether it was a store ``hit``, ``loaded (triton cache)`` or ``compiled``.

``--json FILE`` writes a machine-readable report (``-``: to stdout, the text report then goes to
stderr). The coverage report (``"schema": "dsv4kit.coverage/1"``) holds, per kernel, the keys
warmed / requested / missed / dead as ``{"key_class": ..., "key": {field: value}}`` dicts (the
CompileKey's ``dataclasses.asdict``), the reason of every dead key, the nearest warmed key and the
differing fields of every missed one; per model family, its kernels and calls or why this runtime
never calls it; totals; and ``ok``.

Exit codes: 0 success; 1 a key failed to compile, or the replay missed a key / compiled after
warmup; 2 bad command line (unknown preset, arch or cache dtype, block size not a power of two,
trace longer than the max model length, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsv4kit.errors import KernelInputError, format_key
from dsv4kit.formats.cache_dtypes import INDEXER_CACHE_DTYPES, ROPE_CACHE_DTYPES

DEVICES = ("auto", "cpu", "cuda")


# --------------------------------------------------------------------------- argument types


def _preset(value: str) -> str:
    from dsv4kit.model.stack import PRESET_NAMES, resolve_preset

    try:
        resolve_preset(value)
    except KernelInputError:
        raise argparse.ArgumentTypeError(
            f"unknown preset {value!r}: expected one of {', '.join(PRESET_NAMES)}") from None
    return value


def _arch(value: str) -> str:
    from dsv4kit.platform import KNOWN_ARCHS

    if value not in KNOWN_ARCHS:
        hint = f" (did you mean {value}a?)" if f"{value}a" in KNOWN_ARCHS else ""
        raise argparse.ArgumentTypeError(
            f"unknown arch {value!r}: expected one of {', '.join(KNOWN_ARCHS)}{hint}")
    return value


def _cache_dtype(value: str) -> str:
    from dsv4kit.formats.cache_dtypes import CACHE_DTYPES

    if value not in CACHE_DTYPES:
        raise argparse.ArgumentTypeError(
            f"unsupported KV cache dtype {value!r}: expected one of {', '.join(CACHE_DTYPES)}")
    return value


def _integer(value: str, what: str = "") -> int:
    """``int(value)``, else an argparse error ``"<what> 'x' is not an integer"``."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}{value!r} is not an integer") from None


def _block_size(value: str) -> int:
    b = _integer(value, "block size ")
    from dsv4kit.model.stack import MAX_BLOCK_SIZE

    if b < 0 or b & (b - 1):
        raise argparse.ArgumentTypeError(f"block size {b} is not a power of two (or 0: no paged cache)")
    if b > MAX_BLOCK_SIZE:
        raise argparse.ArgumentTypeError(
            f"block size {b} is larger than {MAX_BLOCK_SIZE} (32-bit page offsets)")
    return b


def _dtype_list(value: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [v for v in items if v not in ROPE_CACHE_DTYPES]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"expected a comma list of float32, bfloat16; got {value!r}")
    return items


def _positive(value: str) -> int:
    n = _integer(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {n}")
    return n


def _default_jobs() -> int:
    # A worker pays 3-5 s of imports before it compiles anything: on 2 cores a cold DSv4-Flash
    # warmup took 10.7 s in-process and 15.7 s with 2 workers (benchmarks/results/warmup_cpu/).
    from dsv4kit.platform import available_cores

    cores = available_cores()
    return 1 if cores <= 2 else cores


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsv4kit", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Exit codes: 0 ok, 1 compile failure / missed key, 2 bad command "
                                       "line.")
    sub = p.add_subparsers(dest="command", required=True)
    commands = {
        "warmup": "compile every key the model registers (AOT for --arch on a CPU machine) and print a "
                  "per-kernel table",
        "coverage": "warm up, replay a serving trace under the JIT monitor in error mode, report missed and "
                    "dead keys per kernel",
    }
    for name, help_ in commands.items():
        s = sub.add_parser(name, help=help_, description=help_)
        g = s.add_argument_group("model and runtime settings")
        g.add_argument("--preset", type=_preset, default="flash", help="flash (DSv4-Flash, default) or pro")
        g.add_argument("--arch", type=_arch, default=None,
                       help="compile target, sm_90a (default on CPU) or sm_100a; on a GPU the device decides "
                            "and another arch is an error")
        g.add_argument("--device", choices=DEVICES, default="auto",
                       help="auto: the CUDA device if there is one, else cpu. cpu: Triton compiled AOT for "
                            "--arch (what a CPU process selects). cuda: select kernels as a GPU process of "
                            "--arch would (CuTeDSL where importable); without a GPU this is compile-only")
        g.add_argument("--backend", choices=("auto", "triton", "cutedsl"), default="auto",
                       help="force one backend for every kernel (default: the platform's choice)")
        g.add_argument("--cache-dtype", type=_cache_dtype, default="fp8_ds_mla",
                       help="KV cache dtype: fp8_ds_mla (default), bf16/bfloat16/auto, fp8/fp8_e4m3")
        g.add_argument("--indexer-cache", choices=INDEXER_CACHE_DTYPES, default="fp8",
                       help="indexer K cache format (default fp8): selects K1 or K2")
        g.add_argument("--block-size", type=_block_size, default=None,
                       help="KV cache block size B, a power of two or 0 (default: the preset's, 256)")
        g.add_argument("--max-batched-tokens", type=_positive, default=8192,
                       help="max tokens per step (default 8192)")
        g.add_argument("--max-num-seqs", type=_positive, default=256,
                       help="max sequences per step (default 256)")
        g.add_argument("--max-model-len", type=_positive, default=None,
                       help="max tokens per sequence (default: the preset's RoPE cache rows, 1048576)")
        g.add_argument("--no-cuda-graphs", action="store_true",
                       help="run decode eagerly (no capture sizes, no padded batches)")
        w = s.add_argument_group("warmup")
        w.add_argument("--jobs", type=_positive, default=_default_jobs(),
                       help="compile the keys missing from the artifact store in N worker processes "
                            "(both backends; each writes its keys into the store, this process then loads "
                            "them). Default: the cores this process may use (affinity, cgroup quota), or "
                            "1 when that is 2 or fewer: each worker pays a few seconds of imports first. "
                            "Workers start only for 2 or more missing keys")
        w.add_argument("--cache-dir", metavar="DIR", default=None,
                       help="artifact store directory (default: $DSV4KIT_CACHE_DIR, else "
                            "$XDG_CACHE_HOME/dsv4kit or ~/.cache/dsv4kit); stored keys load instead of "
                            "compiling")
        w.add_argument("--no-cache", action="store_true",
                       help="use no artifact store: compile every key (workers then share a temporary one)")
        w.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        w.add_argument("--warmup-block-size", type=_block_size, default=None,
                       help="misconfiguration drill: warm for this B while the runtime uses --block-size")
        w.add_argument("--warmup-cos-sin-dtypes", type=_dtype_list, default=None,
                       help="misconfiguration drill: warm indexer-Q for these RoPE cache dtypes only (comma "
                            "list of float32, bfloat16; default both, trap 1)")
        w.add_argument("--keys", action="store_true", help="also print one line per key")
        w.add_argument("--json", metavar="FILE", default=None,
                       help="write the report as JSON to FILE ('-': to stdout; the text report then goes to "
                            "stderr)")
        if name == "coverage":
            c = s.add_argument_group("trace and replay")
            c.add_argument("--trace", choices=("decode", "prefill", "mixed", "all"), default="all",
                           help="phases to replay (default all; decode includes the CUDA-graph capture)")
            c.add_argument("--steps", type=_positive, default=64, help="steps per phase (default 64)")
            c.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
            c.add_argument("--max-context", type=_positive, default=None,
                           help="longest sequence in the trace (default: --max-model-len)")
            c.add_argument("--rope-cache-dtype", choices=tuple(ROPE_CACHE_DTYPES), default="float32",
                           help="dtype of the runtime's RoPE cos/sin cache (default float32; bfloat16 "
                                "after a module-wide cast, trap 1)")
            c.add_argument("--launch", action="store_true",
                           help="launch the ops with real tensors (needs a CUDA device); default: derive "
                                "every call's key with the kernel's dispatch on metadata stand-ins")
            c.add_argument("--plot", metavar="FILE", default=None, help="write the coverage figure to FILE")
    _add_subcommands(sub)
    return p


# --------------------------------------------------------------------------- other subcommands
# Each lives in its own module: ``add_parser(sub)`` registers it and sets ``handler`` (args, parser) -> int.


def _add_subcommands(sub: Any) -> None:
    from dsv4kit import bench_cli, cache_cli, verify

    cache_cli.add_parser(sub)
    bench_cli.add_bench_parsers(sub)
    verify.add_parser(sub)


# --------------------------------------------------------------------------- building


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _platform(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    from dsv4kit.model.stack import gpu_platform
    from dsv4kit.platform import ARCH_ENV, DEFAULT_CPU_ARCH, cpu_platform, detect_platform

    if args.arch is None and os.environ.get(ARCH_ENV):   # the library's variable, honoured here too
        try:
            args.arch = _arch(os.environ[ARCH_ENV])
        except argparse.ArgumentTypeError as exc:
            parser.error(f"${ARCH_ENV}: {exc}")
    has_gpu = _has_cuda()
    device = args.device if args.device != "auto" else ("cuda" if has_gpu else "cpu")
    if device == "cuda" and has_gpu:
        try:
            return detect_platform(args.arch)
        except KernelInputError as exc:
            parser.error(f"--arch: {exc}")
    if device == "cuda":
        return gpu_platform(args.arch or DEFAULT_CPU_ARCH)
    return cpu_platform(args.arch or DEFAULT_CPU_ARCH)


def _output_path(parser: argparse.ArgumentParser, flag: str, value: str | None, suffix: str) -> str | None:
    """``value`` checked before any work (exit 2 if it cannot be written), ``suffix`` added when
    it has none (what matplotlib would do silently)."""
    if value is None or value == "-":
        return value
    path = Path(value)
    if path.is_dir():
        parser.error(f"{flag}: {value} is a directory; expected a file name")
    if not path.suffix:
        path = path.with_suffix(suffix)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"{flag}: cannot create {parent}: {exc.strerror}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        parser.error(f"{flag}: {path} is not writable")
    return str(path)


def _build(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Any, Any]:
    from dsv4kit.jit import WarmupRegistry
    from dsv4kit.model.stack import DSv4AttentionStack

    args.json = _output_path(parser, "--json", args.json, ".json")
    if getattr(args, "plot", None) is not None:
        args.plot = _output_path(parser, "--plot", args.plot, ".png")
    platform = _platform(args, parser)
    if getattr(args, "launch", False) and not _has_cuda():
        parser.error("--launch: needs a CUDA device (this machine has none); without --launch the replay "
                     "derives every call's key on CPU with the kernels' own dispatch")
    settings = dict(
        cache_dtype=args.cache_dtype, indexer_cache_dtype=args.indexer_cache,
        block_size=args.block_size, max_num_batched_tokens=args.max_batched_tokens,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
        rope_cache_dtype=getattr(args, "rope_cache_dtype", "float32"),
        cuda_graphs=not args.no_cuda_graphs,
        backend=None if args.backend == "auto" else args.backend,
    )
    drill = {k: v for k, v in (("block_size", args.warmup_block_size),
                               ("warmup_cos_sin_dtypes", args.warmup_cos_sin_dtypes)) if v is not None}
    registry = WarmupRegistry()
    try:
        if drill:
            # Warm one configuration, run another: the replay shows what the monitor catches.
            with registry.activate():
                DSv4AttentionStack(args.preset, platform, **{**settings, **drill})
            stack = DSv4AttentionStack(args.preset, platform, **settings)
        else:
            with registry.activate():
                stack = DSv4AttentionStack(args.preset, platform, **settings)
    except KernelInputError as exc:
        parser.error(str(exc))
    return stack, registry


class _NoStore(Exception):
    """The artifact store of the command line cannot be used (its message is one line)."""


def _store(args: argparse.Namespace) -> Any:
    """The artifact store of ``--cache-dir`` (None with ``--no-cache``, or when the default location
    is not a directory: said once on stderr). Raises :class:`_NoStore` when ``--cache-dir`` itself
    is not a directory: the user named it, so warming without it would hide a typo."""
    from dsv4kit.jit.store import ArtifactStore, default_cache_dir

    if args.no_cache:
        return None
    store = ArtifactStore(Path(args.cache_dir) if args.cache_dir else default_cache_dir())
    why = store.unusable()
    if why is None:
        return store
    if args.cache_dir:
        raise _NoStore(f"--cache-dir {why}")
    print(f"dsv4kit {args.command}: warning: the artifact store {why}; warming without a store",
          file=sys.stderr)
    return None


def _process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``), or None elsewhere."""
    try:
        start_ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _prepare_toolchains(registry: Any, store: Any) -> float:
    """Run each kernel class's once-per-process store setup (``prepare_store``, e.g. Triton's hash
    of its own installation) before warmup, so that the report shows it apart from the loads;
    returns the seconds it took."""
    t0 = time.perf_counter()
    if store is not None:
        prepared: set[type] = set()
        for reg in registry.registrations.values():
            cls = type(reg.kernel)
            hook = getattr(cls, "prepare_store", None)
            if hook is not None and cls not in prepared:
                prepared.add(cls)
                hook(reg.kernel)
    return time.perf_counter() - t0


def _origin(row: dict[str, Any]) -> str:
    """How a key was warmed: ``hit`` (the store), ``loaded (triton cache)`` (a store miss that
    Triton's own cache served: nothing compiled), ``compiled``."""
    origin = row.get("origin") or "compiled"
    return "loaded (triton cache)" if origin == "compiled" and row.get("triton_cache") else origin


def _time_table(rows: list[dict[str, Any]], started: float | None, setup: float) -> str:
    """Where the warm start's time went: start-up and imports, toolchain setup, loads, compiles."""
    lines = [f"{'time':<44} {'keys':>5} {'seconds':>8}", "-" * 59,
             f"{'start-up and imports (before warmup)':<44} {'-':>5} "
             f"{(f'{started:.2f}' if started is not None else '?'):>8}",
             f"{'toolchain setup (once per process)':<44} {'-':>5} {setup:>8.2f}"]
    for label, origin in (("loaded from the artifact store", "hit"),
                          ("loaded from Triton's own cache", "loaded (triton cache)"),
                          ("compiled", "compiled")):
        mine = [r for r in rows if not r["error"] and _origin(r) == origin]
        lines.append(f"{label:<44} {len(mine):>5} {sum(r['seconds'] for r in mine):>8.2f}")
    return "\n".join(lines)


def _warm(args: argparse.Namespace, stack: Any, registry: Any, store: Any = None) -> Any:
    from dsv4kit.model.stack import warmup

    started = _process_age()
    print(stack.describe())
    if args.warmup_block_size is not None or args.warmup_cos_sin_dtypes is not None:
        print(f"misconfiguration drill: warming with block size {args.warmup_block_size} / cos_sin dtypes "
              f"{args.warmup_cos_sin_dtypes} instead of the runtime's")
    none = "none (--no-cache)" if args.no_cache else "none"
    print(f"artifact store: {store.root if store is not None else none}")
    # Start cold, as a fresh serving process does: executors are cached per kernel class, so a
    # second run in one process (main() called twice) would otherwise find the first run's
    # executors, and the monitor would not see a misconfigured warmup's misses.
    stack.clear_compiled()
    for reg in registry.registrations.values():
        type(reg.kernel).clear_cache()
    setup = _prepare_toolchains(registry, store)
    report = warmup(registry, jobs=args.jobs, store=store, progress=not args.no_progress)
    print(f"\nwarmup ({stack.platform.arch}, {len(registry.registrations)} kernel(s), {report.num_keys} "
          f"key(s), {report.wall_seconds:.2f} s wall):")
    print(report.table())
    rows = report.rows()
    print(_time_table(rows, started, setup))
    origins = [_origin(r) for r in rows if not r["error"]]
    pool = getattr(report, "pool_keys", 0)
    cached = origins.count("loaded (triton cache)")
    print(f"store: {origins.count('hit')} hit(s), {origins.count('compiled')} compiled"
          + (f", {cached} loaded (triton cache)" if cached else "")
          + (f" ({pool} in {min(args.jobs, pool)} worker processes, --jobs {args.jobs})" if pool else ""))
    if args.keys:
        for row in rows:
            regs = row.get("registers", "-")
            print(f"  {row['kernel']:<24} {row['key']:<70} {row['seconds']:7.3f} s  regs {regs}"
                  f"  spills {row.get('spills', '-')}  {_origin(row)}"
                  + (f"  ERROR {row['error']}" if row["error"] else ""))
    for f in report.failures:
        print(f"FAILED {f.kernel} {format_key(f.key)}: {f.error}", file=sys.stderr)
    return report


#: What the JSON stdout of ``--json -`` is (set by :func:`main` before stdout goes to stderr).
_JSON_STDOUT: list[Any] = []


def _write_json(path: str, obj: Any) -> None:
    text = json.dumps(obj, indent=2, default=str)
    if path == "-":
        out = _JSON_STDOUT[-1] if _JSON_STDOUT else sys.stdout
        out.write(text + "\n")
        out.flush()
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


# --------------------------------------------------------------------------- the JSON report


def _plain(value: Any) -> Any:
    """A key field as JSON: dtypes by their short name, tuples as lists, the rest as is."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value).removeprefix("torch.")


def key_json(key: Any) -> dict[str, Any]:
    """``{"key_class": "<ContractClass>.CompileKey", "key": {field: value, ...}}`` of a CompileKey
    (a backend hook's compile event has no CompileKey: ``{"key_class": None, "key": {"text": ...}}``)."""
    if not dataclasses.is_dataclass(key) or isinstance(key, type):
        return {"key_class": None, "key": {"text": str(key)}}
    return {"key_class": type(key).__qualname__,
            "key": {k: _plain(v) for k, v in dataclasses.asdict(key).items()}}


def coverage_json(stack: Any, registry: Any, cov: Any) -> dict[str, Any]:
    """The machine-readable part of a coverage report: per kernel, per family, totals, ok."""
    ledger, result = cov.ledger, cov.result
    objs = {**stack.kernels(), **{r.kernel.name: r.kernel for r in registry.registrations.values()}}
    missed = {(m.kernel, m.key): m for m in cov.missed}
    dead = {(d.kernel, d.key): d.reason for d in cov.dead}
    kernels: dict[str, Any] = {}
    for name in ledger.kernels:
        kernel = objs.get(name)
        fam = next((f for f in stack.families if kernel is not None and f.owns(kernel)), None)
        requested = ledger.requested.get(name, {})
        miss_rows = []
        for key in ledger.missed().get(name, []):
            m = missed.get((name, key))
            near = None if m is None or m.nearest is None else key_json(m.nearest)
            diff = {} if m is None else {f: {"warmed": _plain(w), "requested": _plain(r)}
                                         for f, (w, r) in m.diff.items()}
            miss_rows.append({**key_json(key), "calls": requested[key], "nearest": near, "diff": diff})
        dead_rows = [{**key_json(key), "reason": dead.get((name, key), "never requested by this trace")}
                     for key in ledger.dead().get(name, [])]
        kernels[name] = {
            "family": fam.name if fam is not None else None,
            "spec_id": fam.spec_id if fam is not None else None,
            "backend": getattr(kernel, "backend", None),
            "target": getattr(kernel, "target", None),
            "selected": name in stack.kernels(),        # a kernel this runtime calls
            "warmed": [key_json(k) for k in ledger.warmed.get(name, {})],
            "requested": [{**key_json(k), "calls": n} for k, n in requested.items()],
            "missed": miss_rows,
            "dead": dead_rows,
            "counts": {"warmed": len(ledger.warmed.get(name, {})), "requested": len(requested),
                       "missed": len(miss_rows), "dead": len(dead_rows), "calls": sum(requested.values())},
        }
    families = []
    for fam in stack.families:
        names = list(dict.fromkeys(layer.kernels[fam.name].name for layer in stack.layers
                                   if fam.name in layer.kernels))
        sites = {site: n for (f, site), n in result.stats.calls.items() if f == fam.name}
        unused = None
        if not names:
            unused = stack.unused(fam) or \
                "not registered by this runtime configuration"
        families.append({"family": fam.name, "spec_id": fam.spec_id, "kernels": names,
                         "layers": sum(fam.name in layer.kernels for layer in stack.layers),
                         "calls": sum(sites.values()), "sites": sites, "unused": unused})
    totals = {"kernels": len(kernels), **{c: sum(k["counts"][c] for k in kernels.values())
                                          for c in ("warmed", "requested", "missed", "dead", "calls")},
              "compiles_after_warmup": len(result.compile_events)}
    return {"kernels": kernels, "families": families, "totals": totals}


def _events_json(events: list[Any]) -> list[dict[str, Any]]:
    """The monitor's compile events, one row per distinct (kernel, key, source), with its count."""
    counts: dict[tuple[str, Any, str], int] = {}
    for e in events:
        counts[(e.kernel, e.key, e.source)] = counts.get((e.kernel, e.key, e.source), 0) + 1
    return [{"kernel": k, **key_json(key), "source": src, "calls": n} for (k, key, src), n in counts.items()]


def _settings_json(stack: Any) -> dict[str, Any]:
    plat = stack.platform
    return {"preset": stack.preset.name, "device": plat.device, "arch": plat.arch,
            "cache_dtype": stack.cache_dtype, "kv_cache_dtype": stack.kv_cache_dtype,
            "indexer_cache_dtype": stack.indexer_cache_dtype, "block_size": stack.block_size,
            "max_num_batched_tokens": stack.max_num_batched_tokens, "max_num_seqs": stack.max_num_seqs,
            "max_model_len": stack.max_model_len, "rope_cache_dtype": stack.rope_cache_dtype,
            "warmup_cos_sin_dtypes": list(stack.warmup_cos_sin_dtypes), "cuda_graphs": stack.cuda_graphs,
            "backend": stack.backend, "norm_weight_dtype": stack.norm_weight_dtype}


# --------------------------------------------------------------------------- commands


def _store_or_exit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """:func:`_store`, with an unusable ``--cache-dir`` a command-line error (exit 2)."""
    try:
        return _store(args)
    except _NoStore as exc:
        parser.error(str(exc))


def cmd_warmup(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    store = _store_or_exit(args, parser)
    stack, registry = _build(args, parser)
    report = _warm(args, stack, registry, store)
    if args.json:
        _write_json(args.json, {"config": stack.describe(), "warmup": report.rows()})
    return 0 if report.ok else 1


def cmd_coverage(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from dsv4kit.jit import KeyLedger
    from dsv4kit.model.trace import coverage_report, make_trace, replay

    store = _store_or_exit(args, parser)
    stack, registry = _build(args, parser)
    if args.max_context is not None and args.max_context > stack.max_model_len:
        parser.error(f"--max-context: a trace of {args.max_context} tokens is longer than the max model "
                     f"length ({stack.max_model_len}; raise --max-model-len)")
    try:
        trace = make_trace(args.trace, stack, steps=args.steps, seed=args.seed, max_context=args.max_context)
    except KernelInputError as exc:
        parser.error(str(exc))
    ledger = KeyLedger()
    with ledger:
        report = _warm(args, stack, registry, store)
    if not report.ok:
        return 1
    t0 = time.perf_counter()
    result = replay(stack, trace, launch=args.launch, mode="error", ledger=ledger)
    cov = coverage_report(stack, ledger, result, stack.kernels() | {r.kernel.name: r.kernel for r in
                                                                    registry.registrations.values()})
    tokens = result.stats.tokens
    print(f"\ncoverage: trace {args.trace!r}, seed {args.seed}, {len(trace)} steps, longest sequence "
          f"{result.stats.max_seq_len} tokens, batches of {min(tokens)}-{max(tokens)} tokens "
          f"({time.perf_counter() - t0:.2f} s)")
    print(cov.summary())
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        from dsv4kit.viz.coverage import plot_coverage

        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig = plot_coverage(ledger, title=f"{stack.preset.name} {stack.platform.arch}: trace {args.trace}")
        fig.savefig(args.plot, dpi=120)
        print(f"coverage figure written to {args.plot}")
    if args.json:
        _write_json(args.json, {
            "schema": "dsv4kit.coverage/1",
            "config": stack.describe(), "settings": _settings_json(stack), "warmup": report.rows(),
            "trace": {"kind": args.trace, "seed": args.seed, "steps": len(trace),
                      "phases": dict(result.stats.phases), "launch": result.launch},
            "calls": {f"{f}/{s}": n for (f, s), n in result.stats.calls.items()},
            **coverage_json(stack, registry, cov),
            "missed": [str(m) for m in cov.missed], "dead": [str(d) for d in cov.dead],
            "compiles_after_warmup": _events_json(result.compile_events),
            "ok": cov.ok})
    return 0 if cov.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
    cmd = {"warmup": cmd_warmup, "coverage": cmd_coverage}.get(args.command) or args.handler
    if getattr(args, "json", None) != "-":
        return cmd(args, sub)
    # --json -: stdout carries the JSON only; everything else this command prints goes to stderr.
    _JSON_STDOUT.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return cmd(args, sub)
    finally:
        _JSON_STDOUT.pop()


if __name__ == "__main__":
    raise SystemExit(main())
