"""``dsv4kit bench`` and ``dsv4kit inspect``: the benchmark sweep, and what warmup compiled for a key.

    dsv4kit bench   [--family F ...] [--backend triton|cutedsl|all] [--sizes N,N,...] [--json FILE]
                    [--csv FILE] [--plot FILE] [--no-reference] [--no-compile] [--rep-ms MS]
    dsv4kit inspect KERNEL KEY... [--regs | --ptx | --sass] [--arch sm_90a] [--backend B] [--variant V]

``bench`` needs a CUDA device: it runs :func:`dsv4kit.bench.run_sweep` (the copy ceiling and an
empty kernel measured first, in the same process; per point the kernel in a CUDA graph, the op,
the eager reference and ``torch.compile`` of it), prints a table, and writes the results in the
one schema of :mod:`dsv4kit.bench_schema` (``--json``, ``--csv``) and a bandwidth figure
(``--plot``). Without a GPU it says what is missing and exits 2.

``inspect`` needs no GPU: it compiles ``KEY`` of ``KERNEL`` for ``--arch`` (ahead of time, as
warmup does on a CPU machine; a key this process already warmed is taken from the kernel's
artifact) and prints the artifact's resources (``--regs``, the default: registers, spills,
shared memory, ...), its PTX (``--ptx``) or its SASS (``--sass``, disassembled with the
``cuobjdump`` that ships inside the Triton wheel, ``triton/backends/nvidia/bin``; exit 2 where
there is none). ``KERNEL``: a kernel class name (``IndexerQFp8Triton``) or a family / op name
(``indexer_q``, ``indexer_q_rope_quant``; then ``--backend`` and ``--variant`` pick the class).
``KEY``: ``field=value`` pairs (one argument each, or comma-separated), or the key's repr as
printed by warmup (``IndexerQBase.CompileKey(head_dim=128, ...)``).

Exit codes: 0 ok; 1 a compile failed; 2 bad command line, or nothing to run it on (no GPU for
``bench``, no tool for ``--sass``).

These subcommands join the ``dsv4kit`` CLI through :func:`add_bench_parsers`; ``python -m
dsv4kit.bench_cli`` runs them alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BenchCliError",
    "add_bench_parsers",
    "cmd_bench",
    "cmd_inspect",
    "find_kernel",
    "main",
    "parse_key",
    "sass_tool",
]


class BenchCliError(Exception):
    """A bad command line or a missing prerequisite: the message is printed, exit code 2."""


# --------------------------------------------------------------------------- parsers


def _sizes(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in re.split(r"[,\s]+", value.strip()) if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {value!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected sizes >= 1, got {value!r}")
    return sizes


def _families(value: str) -> list[str]:
    return [v for v in re.split(r"[,\s]+", value.strip()) if v]


class _PlanNamesHelp(argparse.HelpFormatter):
    """Help text with ``{plans}`` replaced by the sweep plans' names when the help is printed: the
    plans live in the family folders, which building the parser does not import."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text and "{plans}" in text:
            from dsv4kit.bench import PLANS

            text = text.replace("{plans}", ", ".join(PLANS))
        return text


def add_bench_parsers(subparsers: Any) -> None:
    """Add ``bench`` and ``inspect`` to ``subparsers`` (an ``add_subparsers()`` result); each
    sets ``handler(args, parser) -> int`` as its default."""
    b = subparsers.add_parser(
        "bench", help="GPU sweep of the kernels: bandwidth vs the copy ceiling, op, eager and compiled "
                      "reference",
        description="GPU sweep: per family and size, the kernel (CUDA-graph replays), the op call, the eager "
                    "reference and torch.compile of it, against the device-to-device copy measured in the "
                    "same run. Needs a CUDA device (exit 2 without one).", formatter_class=_PlanNamesHelp)
    b.add_argument("--family", type=_families, action="extend", default=None, metavar="F",
                   help="plan or family name(s), comma-separated or repeated (default: all: {plans})")
    b.add_argument("--backend", choices=("all", "triton", "cutedsl"), default="all",
                   help="backend(s) to time (default all that run here)")
    b.add_argument("--sizes", type=_sizes, default=None,
                   help="sizes to sweep, comma-separated (default: each family's decode and large sizes)")
    b.add_argument("--json", metavar="FILE", default=None, help="write the results (dsv4kit.bench/1) to FILE")
    b.add_argument("--csv", metavar="FILE", default=None, help="write the bandwidth rows as CSV to FILE")
    b.add_argument("--plot", metavar="FILE", default=None, help="write the bandwidth figure to FILE")
    b.add_argument("--no-reference", action="store_true", help="do not time the PyTorch reference")
    b.add_argument("--no-compile", action="store_true", help="do not time torch.compile of the reference")
    b.add_argument("--rep-ms", type=int, default=100, help="milliseconds of replays per timing (default 100)")
    b.set_defaults(handler=cmd_bench)

    i = subparsers.add_parser(
        "inspect", help="compile one key for an arch (no GPU needed) and print its registers, PTX or SASS",
        description="Compile KEY of KERNEL for --arch ahead of time and print what warmup compiled.")
    i.add_argument("kernel", metavar="KERNEL", help="kernel class name, or family / op name")
    i.add_argument("key", metavar="KEY", nargs="*",
                   help="field=value pairs, or the key's repr (no KEY: list the key's fields)")
    what = i.add_mutually_exclusive_group()
    what.add_argument("--regs", action="store_true", help="registers, spills, shared memory (default)")
    what.add_argument("--ptx", action="store_true", help="the PTX text")
    what.add_argument("--sass", action="store_true", help="the SASS (cuobjdump from the Triton wheel)")
    i.add_argument("--arch", default="sm_90a", help="target arch (default sm_90a)")
    i.add_argument("--backend", choices=("triton", "cutedsl"), default="triton",
                   help="with a family name: the backend's class (default triton)")
    i.add_argument("--variant", default=None, help="with a family name: the variant (default: the first)")
    i.set_defaults(handler=cmd_inspect)


# --------------------------------------------------------------------------- bench


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def bench_table(rows: Sequence[Any]) -> str:
    """The bandwidth rows as a fixed-width text table."""
    head = f"{'kernel':30s} {'config':36s} {'size':>8s} {'backend':8s} {'variant':30s} {'us':>10s} " \
           f"{'GB/s':>8s} {'of copy':>8s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        gbps = f"{r.GBps:8.0f}" if r.GBps is not None else f"{'-':>8s}"
        frac = f"{100 * r.fraction_of_copy:7.1f}%" if r.fraction_of_copy is not None else f"{'-':>8s}"
        lines.append(f"{r.kernel:30s} {r.config:36s} {r.size:>8d} {r.backend:8s} {r.variant:30s} "
                     f"{r.median_us:10.1f} {gbps} {frac}" + (f"  ERROR {r.error}" if r.error else ""))
    return "\n".join(lines)


def _writable(flag: str, value: str | None) -> None:
    if value is None:
        return
    parent = Path(value).parent
    if Path(value).is_dir() or (parent.exists() and not os.access(parent, os.W_OK)):
        raise BenchCliError(f"{flag}: {value} is not a writable file name")


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the sweep (see the module docstring); 2 without a GPU or for an unknown family."""
    from dsv4kit.bench import select_plans

    try:
        plans = select_plans(args.family)
        for flag in ("json", "csv", "plot"):
            _writable(f"--{flag}", getattr(args, flag))
    except (ValueError, BenchCliError) as exc:
        print(f"dsv4kit bench: {exc}", file=sys.stderr)
        return 2
    if not _has_cuda():
        import torch

        print("dsv4kit bench: needs a CUDA device, and this machine has none (torch "
              f"{torch.__version__}, torch.cuda.is_available() is False). Nothing was timed. The plan "
              f"would sweep: {', '.join(p.name for p in plans)}. Recorded H200 results: "
              "dsv4kit.bench_schema.recorded_runs() and notebooks/06_benchmarks.ipynb; compiled code "
              "without a GPU: dsv4kit inspect.", file=sys.stderr)
        return 2
    from dsv4kit import bench
    from dsv4kit.bench_schema import write_rows_csv

    backends = ("triton", "cutedsl") if args.backend == "all" else (args.backend,)
    res = bench.run_sweep(plans, backends=backends, sizes=args.sizes, reference=not args.no_reference,
                          compile_reference=not args.no_compile, rep_ms=args.rep_ms)
    print()
    print(bench_table(res.rows))
    print(f"\ncopy ceiling {res.copy_GBps:.0f} GB/s, empty kernel {res.empty_kernel_us:.2f} us; "
          f"{res.provenance.get('device')}, commit {str(res.provenance.get('commit'))[:10]}")
    if args.json:
        bench.write_json(args.json, res.to_json())
    if args.csv:
        write_rows_csv(args.csv, res.rows)
    if args.plot:
        from dsv4kit.viz.bench import plot_bandwidth

        fig = plot_bandwidth(res.rows, title=f"LIVE: {res.provenance.get('device')}, "
                                             f"commit {str(res.provenance.get('commit'))[:10]}")
        fig.savefig(args.plot, dpi=110)
    return 1 if any(r.error for r in res.rows) else 0


# --------------------------------------------------------------------------- inspect


def find_kernel(name: str, backend: str = "triton", variant: str | None = None) -> tuple[Any, str, str]:
    """``(family spec, variant, backend)`` of a kernel class name or a family / op name.

    BenchCliError (naming the known kernels) when nothing matches.
    """
    from dsv4kit.kernels import families

    specs = families()
    for spec in specs:
        for v, var in spec.variants.items():
            for b in ("triton", "cutedsl"):
                if var.class_name(b) == name:
                    return spec, v, b
    for spec in specs:
        if name in (spec.name, spec.op_name):
            v = variant if variant is not None else next(iter(spec.variants))
            if v not in spec.variants:
                raise BenchCliError(f"{name}: unknown variant {v!r}; variants: {', '.join(spec.variants)}")
            return spec, v, backend
    classes = sorted({var.class_name(b) for s in specs for var in s.variants.values()
                      for b in ("triton", "cutedsl")})
    raise BenchCliError(f"unknown kernel {name!r}: expected a kernel class ({', '.join(classes)}) or a "
                        f"family / op name ({', '.join(sorted({s.name for s in specs}))})")


_PAIR = re.compile(r"""(\w+)\s*=\s*('[^']*'|"[^"]*"|[^,\s()]+)""")


def _value(text: str, current: Any, where: str) -> Any:
    import torch

    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if isinstance(current, bool):
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise BenchCliError(f"{where}: expected True or False, got {text!r}")
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise BenchCliError(f"{where}: expected an integer, got {text!r}") from None
    if isinstance(current, float):
        try:
            return float(text)
        except ValueError:
            raise BenchCliError(f"{where}: expected a number, got {text!r}") from None
    if isinstance(current, torch.dtype):
        dt = getattr(torch, text.removeprefix("torch."), None)
        if not isinstance(dt, torch.dtype):
            raise BenchCliError(f"{where}: expected a torch dtype name, got {text!r}")
        return dt
    return text


def parse_key(key_cls: type, tokens: Sequence[str]) -> Any:
    """A ``key_cls`` (a CompileKey dataclass) from ``field=value`` tokens or a repr.

    Every field without a default must be given; values are parsed by the type of the field's
    value in a probe key (int, float, bool, str, torch dtype). BenchCliError on a bad key.
    """
    text = " ".join(tokens).strip()
    m = re.match(r"^[\w.]*\((.*)\)$", text, re.S)
    if m:
        text = m.group(1)
    flds = {f.name: f for f in dataclasses.fields(key_cls)}
    given: dict[str, str] = {}
    rest = _PAIR.sub(" ", text)
    if rest.strip(" ,\t\n"):
        raise BenchCliError(f"key: expected field=value pairs or a key repr, got {' '.join(tokens)!r} "
                            f"(not understood: {rest.strip(' ,')!r}); fields: {', '.join(flds)}")
    for name, value in _PAIR.findall(text):
        if name not in flds:
            raise BenchCliError(f"key: {key_cls.__qualname__} has no field {name!r}; fields: "
                                f"{', '.join(flds)}")
        given[name] = value
    missing = [n for n, f in flds.items() if n not in given and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise BenchCliError(f"key: missing field(s) {', '.join(missing)} of {key_cls.__qualname__}; fields: "
                            f"{', '.join(flds)}")
    probe = {n: f.default for n, f in flds.items() if f.default is not dataclasses.MISSING}
    values: dict[str, Any] = {}
    for n, v in given.items():
        current = probe.get(n)
        if current is None:  # no default to take the type from: the annotation's name
            ann = str(flds[n].type)
            current = (False if "bool" in ann else 0 if "int" in ann else 0.0 if "float" in ann
                       else __import__("torch").float32 if "dtype" in ann else "")
        values[n] = _value(v, current, f"key field {n}")
    try:
        return key_cls(**values)
    except Exception as exc:
        raise BenchCliError(f"key: {key_cls.__qualname__}({text}): {type(exc).__name__}: {exc}") from None


def sass_tool() -> Path | None:
    """The ``cuobjdump`` inside the Triton wheel (``triton/backends/nvidia/bin``), else None."""
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).resolve().parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _sass(cubin: bytes, tool: Path) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{tool.name} -sass failed: {out.stderr.strip()[:500]}")
    return out.stdout


def _regs_text(kernel: Any, key: Any, art: Any) -> str:
    from dsv4kit.errors import format_key

    lines = [f"{kernel.name} {format_key(key)}", f"  backend {art.backend}, target {art.target}, compile "
             f"{art.seconds:.2f} s"]
    for k, v in art.info.items():
        lines.append(f"  {k}: {v}")
    lines.append(f"  texts: {', '.join(art.text) or '-'}; binaries: {', '.join(art.binary) or '-'}")
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Compile one key and print its resources, PTX or SASS (see the module docstring)."""
    from dsv4kit.errors import KernelInputError
    from dsv4kit.platform import KNOWN_ARCHS, cpu_platform

    try:
        if args.arch not in KNOWN_ARCHS:
            raise BenchCliError(f"--arch: unknown arch {args.arch!r}: expected one of "
                                f"{', '.join(KNOWN_ARCHS)}")
        spec, variant, backend = find_kernel(args.kernel, args.backend, args.variant)
        try:
            cls = spec.kernel_class(variant, backend)
        except ImportError as exc:
            raise BenchCliError(f"{args.kernel}: the {backend} kernel does not import here ({exc})") from None
        if not args.key:
            fields = ", ".join(f"{f.name}: {getattr(f.type, '__name__', f.type)}"
                               for f in dataclasses.fields(cls.CompileKey))
            raise BenchCliError(f"{cls.__name__}: no KEY given; its CompileKey fields: {fields}")
        key = parse_key(cls.CompileKey, args.key)
        kernel = cls(cpu_platform(args.arch))
        try:
            kernel.check_key(key)
        except (KernelInputError, TypeError) as exc:
            raise BenchCliError(f"key: {exc}") from None
        tool = sass_tool() if args.sass else None
        if args.sass and tool is None:
            raise BenchCliError("--sass: no cuobjdump in this Triton install (looked in "
                                "triton/backends/nvidia/bin)")
    except BenchCliError as exc:
        print(f"dsv4kit inspect: {exc}", file=sys.stderr)
        return 2
    try:
        art = kernel.artifact(key) if key in kernel.compiled_keys() else None
        art = art or kernel.compile_for(key, args.arch)
    except Exception as exc:
        print(f"dsv4kit inspect: compile of {kernel.name} {key} for {args.arch} failed: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not (args.ptx or args.sass):
        print(_regs_text(kernel, key, art))
        return 0
    part, missing = ((art.text.get("ptx"), f"no PTX (texts: {', '.join(art.text)})") if args.ptx
                     else (art.binary.get("cubin"), "no cubin to disassemble"))
    if part is None:
        print(f"dsv4kit inspect: the {art.backend} artifact holds {missing}", file=sys.stderr)
        return 2
    print(part if args.ptx else _sass(part, tool))  # type: ignore[arg-type]
    return 0


# --------------------------------------------------------------------------- standalone


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dsv4kit.bench_cli bench|inspect ...``."""
    parser = argparse.ArgumentParser(prog="dsv4kit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parsers(sub)
    args = parser.parse_args(argv)
    return int(args.handler(args, parser))


if __name__ == "__main__":
    raise SystemExit(main())
