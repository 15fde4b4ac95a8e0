"""One results schema for every kernel family, and converters from every recorded benchmark file.

Every family's GPU script recorded its timings with its own columns (``benchmarks/results/``):
``indexer_q`` a ``pct_of_copy`` *percent* and ``ms``, ``dequant_gather`` a ``fraction_of_copy``
*fraction* and ``median_us``, and so on. This module defines the one row they all convert to,

    ``family, kernel, backend, variant, size, bytes, median_us, GBps, copy_GBps, fraction_of_copy``

(:class:`BenchRow`; plus ``config``, the parameters that tell two series of one kernel apart,
``timing``, how the median was taken, and ``error``), two smaller tables for decode-size latency
(:class:`DecodeRow`) and host overhead per op call (:class:`HostRow`), and one converter per
recorded run (:func:`recorded_runs`). A converter reads the recorded files as they are (nothing is
rewritten) and copies their provenance unchanged; values are converted only by unit (``ms`` ->
``us``, percent -> fraction), so the tests compare every converted value with its source file.

``backend`` is ``triton``, ``cutedsl`` or ``torch`` (the PyTorch reference); ``variant`` is one
of :data:`VARIANTS`: the kernel alone (CUDA-graph replays: GPU time only), the whole op call
(events over back-to-back calls: host time included), or the reference, eager or compiled.

A run of ``dsv4kit bench`` writes the same schema (:func:`results_json`, ``"schema":
"dsv4kit.bench/1"``) with its provenance, including the kernel source hash of every family timed.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dsv4kit.results import Recorded, results_dir

__all__ = [
    "BENCH_RUNS",
    "BENCH_RUNS_H100",
    "HostOverhead",
    "LaunchPlanCheck",
    "BANDWIDTH_FIELDS",
    "DECODE_SIZES",
    "SCHEMA",
    "VARIANTS",
    "BenchRow",
    "DecodeRow",
    "HostRow",
    "RecordedRun",
    "NcuKernel",
    "SassMix",
    "decode_rows",
    "host_rows",
    "label",
    "make_row",
    "WarmupKey",
    "read_results",
    "recorded_host_overhead",
    "recorded_launch_plans",
    "recorded_ncu",
    "recorded_sass_mix",
    "recorded_warmup",
    "recorded_run",
    "recorded_runs",
    "results_json",
    "rows_from_dicts",
    "write_rows_csv",
]

#: The ``schema`` value of a results JSON this module writes.
SCHEMA = "dsv4kit.bench/1"
#: The columns every family's bandwidth row has, in this order.
BANDWIDTH_FIELDS = ("family", "kernel", "backend", "variant", "size", "bytes", "median_us", "GBps",
                    "copy_GBps", "fraction_of_copy")
#: Token counts of a decode step (issue 16): the decode-latency table's sizes.
DECODE_SIZES = (1, 8, 64, 256)

KERNEL = "kernel (graph replay)"
KERNEL_DECODE = "kernel (graph replay), decode"
OP = "op"
REF_EAGER = "reference (eager, validated)"
REF_COMPILE = "reference (torch.compile)"
CORE_EAGER = "core (eager)"
CORE_COMPILE = "core (torch.compile)"
#: What a row timed (see the module docstring).
VARIANTS = (KERNEL, KERNEL_DECODE, OP, REF_EAGER, REF_COMPILE, CORE_EAGER, CORE_COMPILE)
GRAPH = "cuda-graph replay"
EVENTS = "events (do_bench)"


def _nan_none(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


@dataclass(frozen=True)
class BenchRow:
    """One timed point of one kernel (or reference), in the one schema.

    ``size``: the family's size axis (tokens T; rows gathered for ``dequant_gather``; rows for
    ``rowquant``). ``bytes``: the family's bytes model (every input read once, every output
    written once; None where the record has none). ``GBps = bytes / median``; ``copy_GBps``:
    the device-to-device copy measured in the same run (None where the run measured none);
    ``fraction_of_copy = GBps / copy_GBps`` (a fraction, never a percent). ``config``: the
    parameters that tell two series of one kernel apart (e.g. ``block_size=256 gather_lens``),
    ``""`` when there is one series.
    """

    family: str
    kernel: str
    backend: str
    variant: str
    size: int
    bytes: int | None
    median_us: float
    GBps: float | None
    copy_GBps: float | None
    fraction_of_copy: float | None
    config: str = ""
    timing: str = ""
    error: str = ""

    @property
    def series(self) -> tuple[str, str, str, str]:
        """``(kernel, config, backend, variant)``: the rows of one line in a size sweep."""
        return (self.kernel, self.config, self.backend, self.variant)

    def to_dict(self) -> dict[str, Any]:
        """The row as a plain dict (schema fields first; NaN as None)."""
        d = asdict(self)
        return {k: _nan_none(v) for k, v in d.items()}


@dataclass(frozen=True)
class DecodeRow:
    """GPU time of one kernel at a decode size (CUDA-graph replays), next to an empty kernel's.

    ``empty_kernel_us``: an empty Triton kernel's replay on the same stream in the same run, and
    ``over_empty_us = kernel_us - empty_kernel_us`` (both None where the run timed none).
    """

    family: str
    kernel: str
    backend: str
    size: int
    kernel_us: float
    empty_kernel_us: float | None
    over_empty_us: float | None
    config: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: _nan_none(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class HostRow:
    """Host overhead of one op call: the op's time minus its kernel's GPU time at the same point.

    ``op_us``: the whole op, timed over back-to-back calls (events); ``kernel_us``: the kernel
    alone (graph replays); ``host_us = op_us - kernel_us``. Where the op is host-bound (small
    sizes: the GPU waits for the next launch) this is the time per call spent in Python,
    validation, dispatch and launch; where the GPU is the bottleneck it goes to ~0 and says
    nothing. ``method`` says how it was obtained.
    """

    family: str
    kernel: str
    backend: str
    size: int
    op_us: float
    kernel_us: float
    host_us: float
    config: str = ""
    method: str = "op events minus kernel graph replay, same run and point"

    def to_dict(self) -> dict[str, Any]:
        return {k: _nan_none(v) for k, v in asdict(self).items()}


def make_row(family: str, kernel: str, backend: str, variant: str, size: int, nbytes: int | None,
             median_us: float, copy_gbps: float | None, *, config: str = "", timing: str = "",
             error: str = "") -> BenchRow:
    """A row from a timing: ``GBps`` and ``fraction_of_copy`` computed from the bytes model."""
    ok = nbytes is not None and nbytes > 0 and median_us == median_us and median_us > 0
    gbps = nbytes / (median_us * 1e-6) / 1e9 if ok else None  # type: ignore[operator]
    frac = gbps / copy_gbps if gbps is not None and copy_gbps else None
    return BenchRow(family, kernel, backend, variant, int(size), nbytes, float(median_us), gbps, copy_gbps,
                    frac, config, timing, error)


# --------------------------------------------------------------------------- derived tables


def decode_rows(rows: Iterable[BenchRow], sizes: Sequence[int] = DECODE_SIZES) -> list[DecodeRow]:
    """Kernel-alone rows at decode sizes as decode-latency rows (no empty kernel: None)."""
    out = []
    for r in rows:
        if r.variant in (KERNEL, KERNEL_DECODE) and r.size in sizes and r.backend != "torch" \
                and r.bytes and r.median_us == r.median_us:
            out.append(DecodeRow(r.family, r.kernel, r.backend, r.size, r.median_us, None, None, r.config,
                                 r.error))
    return out


def host_rows(rows: Iterable[BenchRow]) -> list[HostRow]:
    """Every (op, kernel) pair of one point (same kernel, config, backend, size) as a host row."""
    rows = list(rows)
    kern = {(r.kernel, r.config, r.backend, r.size): r for r in rows if r.variant == KERNEL}
    out = []
    for r in rows:
        k = kern.get((r.kernel, r.config, r.backend, r.size))
        if r.variant == OP and k is not None and r.median_us == r.median_us and k.median_us == k.median_us:
            out.append(HostRow(r.family, r.kernel, r.backend, r.size, r.median_us, k.median_us,
                               r.median_us - k.median_us, r.config))
    return out


# --------------------------------------------------------------------------- one recorded run


@dataclass(frozen=True)
class RecordedRun:
    """One recorded benchmark run, converted: its record (provenance), rows and sources.

    ``name``: the run's path relative to the results directory. ``family``: the kernel family
    (or kernel folder) it measured, what :meth:`status` compares the kernel source hash with.
    ``sources``: the files the rows were read from. ``note``: what the run is, in a sentence.
    """

    name: str
    family: str
    record: Recorded
    copy_GBps: float | None
    rows: tuple[BenchRow, ...]
    sources: tuple[Path, ...]
    note: str = ""
    decode: tuple[DecodeRow, ...] = field(default=())

    @property
    def provenance(self) -> Mapping[str, Any]:
        return self.record.provenance

    def status(self) -> str:
        """``recorded at <commit> on <device>, <date>`` plus whether the kernel source changed."""
        return self.record.status(self.family)

    def current(self) -> bool:
        """True when the recorded kernel source hash equals the source now."""
        return self.record.current(self.family)

    def host(self) -> list[HostRow]:
        return host_rows(self.rows)

    def to_json(self) -> dict[str, Any]:
        """The run in the one schema (:func:`results_json`), provenance copied unchanged."""
        return results_json(self.rows, dict(self.provenance), self.copy_GBps, decode=self.decode,
                            host=self.host(), source=self.name)


def results_json(rows: Iterable[BenchRow], provenance: Mapping[str, Any], copy_gbps: float | None, *,
                 decode: Iterable[DecodeRow] = (), host: Iterable[HostRow] = (),
                 source: str | None = None) -> dict[str, Any]:
    """A results JSON object: schema, provenance (with ``kernel_source_hash``), copy, the tables."""
    out: dict[str, Any] = {"schema": SCHEMA, "provenance": dict(provenance), "copy_GBps": copy_gbps,
                           "rows": [r.to_dict() for r in rows], "decode": [d.to_dict() for d in decode],
                           "host": [h.to_dict() for h in host]}
    if source is not None:
        out["source"] = source
    return out


def _from_dict(cls: type, d: Mapping[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def read_results(path: str | Path) -> tuple[dict[str, Any], list[BenchRow], list[DecodeRow], list[HostRow]]:
    """Read a results JSON written by :func:`results_json`: (provenance, rows, decode, host)."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} results file (schema {data.get('schema')!r})")
    rows = [_from_dict(BenchRow, r) for r in data["rows"]]
    rows = [BenchRow(**{**asdict(r), "median_us": float("nan") if r.median_us is None else r.median_us})
            for r in rows]
    return (data["provenance"], rows, [_from_dict(DecodeRow, d) for d in data.get("decode", [])],
            [_from_dict(HostRow, h) for h in data.get("host", [])])


def write_rows_csv(path: str | Path, rows: Iterable[BenchRow]) -> None:
    """The rows as CSV, schema columns first (empty cells for None)."""
    names = [f.name for f in fields(BenchRow)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None else v for k, v in r.to_dict().items()})


def rows_from_dicts(dicts: Iterable[Mapping[str, Any]]) -> list[BenchRow]:
    """Rows from dicts (or CSV rows) that already have the schema's columns (strings parsed)."""
    out = []
    for d in dicts:
        def num(k: str, d: Mapping[str, Any] = d) -> float | None:
            v = d.get(k)
            return None if v in (None, "") else float(v)

        nbytes = num("bytes")
        out.append(BenchRow(str(d["family"]), str(d["kernel"]), str(d["backend"]), str(d["variant"]),
                            int(d["size"]), None if nbytes is None else int(nbytes),
                            float(d["median_us"]), _nan_none(num("GBps")), num("copy_GBps"),
                            _nan_none(num("fraction_of_copy")), str(d.get("config") or ""),
                            str(d.get("timing") or ""), str(d.get("error") or "")))
    return out


# --------------------------------------------------------------------------- converters


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _f(s: str | float | None) -> float:
    return float("nan") if s in (None, "") else float(s)  # type: ignore[arg-type]


def _opt(s: str | float | None) -> float | None:
    v = _f(s)
    return None if math.isnan(v) else v


# indexer_q: ``impl`` -> (backend, variant, timing); the script timed "torch eager" in graphs.
_INDEXER_IMPL = {"triton": ("triton", KERNEL, GRAPH), "triton (op)": ("triton", OP, EVENTS),
                 "cutedsl": ("cutedsl", KERNEL, GRAPH), "cutedsl (op)": ("cutedsl", OP, EVENTS),
                 "torch eager": ("torch", CORE_EAGER, GRAPH),
                 "torch.compile": ("torch", CORE_COMPILE, EVENTS)}


def _indexer_q(root: Path, name: str) -> RecordedRun:
    """``indexer_q_h200*.json`` (rows also in the ``.csv`` of the same name): ``ms``, percent."""
    path = root / name
    data = json.loads(path.read_text())
    copy = float(data["copy_GBps"])
    rows = []
    for r in _csv(path.with_suffix(".csv")):
        backend, variant, timing = _INDEXER_IMPL[r["impl"]]
        rows.append(BenchRow("indexer_q", f"indexer_q/{r['format']}", backend, variant, int(r["T"]),
                             int(r["bytes"]), 1e3 * float(r["ms"]), float(r["GB/s"]), copy,
                             float(r["pct_of_copy"]) / 100, "", timing))
    return RecordedRun(name, "indexer_q", Recorded.from_path(path), copy, tuple(rows),
                       (path, path.with_suffix(".csv")), "K1 FP8 / K2 MXFP4: benchmarks/indexer_q.py",
                       tuple(decode_rows(rows)))


_DEQUANT_IMPL = {"triton": ("triton", KERNEL), "cutedsl": ("cutedsl", KERNEL),
                 "reference": ("torch", REF_EAGER), "torch.compile(reference)": ("torch", REF_COMPILE)}


def _dequant_gather(root: Path, name: str) -> RecordedRun:
    """A ``dequant_gather/`` run directory: ``bandwidth.csv`` (``median_us``, a fraction)."""
    path = root / name
    src = _csv(path / "bandwidth.csv")
    summary = path / "summary.json"
    if summary.is_file():
        copy = float(json.loads(summary.read_text())["copy_GBps"])
    else:  # the quick record has no summary: its rows' GBps / fraction is the copy it measured
        r0 = next(r for r in src if _f(r["fraction_of_copy"]) > 0)
        copy = float(r0["GBps"]) / float(r0["fraction_of_copy"])
    rows = []
    for r in src:
        backend, variant = _DEQUANT_IMPL[r["impl"]]
        gather = "gather_lens" if r["has_gather_lens"] == "True" else "no gather_lens"
        config = f"block_size={r['block_size']} {gather} nreq={r['nreq']}"
        timing = GRAPH if r["timing"].startswith("cuda-graph") else "events"
        rows.append(BenchRow("dequant_gather", "dequant_gather", backend, variant, int(r["rows"]),
                             int(r["bytes"]), _f(r["median_us"]), _opt(r["GBps"]), copy,
                             _opt(r["fraction_of_copy"]), config, timing, r["error"]))
    return RecordedRun(name, "dequant_gather", Recorded.from_path(path), copy, tuple(rows),
                       (path / "bandwidth.csv",), "K3: benchmarks/dequant_gather.py; size = rows gathered")


_IMPL = {"triton": ("triton", KERNEL), "triton (op)": ("triton", OP), "cutedsl": ("cutedsl", KERNEL),
         "cutedsl (op)": ("cutedsl", OP), "torch eager (reference, validated)": ("torch", REF_EAGER),
         "torch eager (core)": ("torch", CORE_EAGER), "torch.compile (core)": ("torch", CORE_COMPILE),
         "torch eager (core scatter)": ("torch", CORE_EAGER),
         "torch.compile (core scatter)": ("torch", CORE_COMPILE)}


def _impl_csv_rows(path: Path, stem: str, family: str, kernel: Callable[[Mapping[str, str]], str],
                   config: Callable[[Mapping[str, str]], str]) -> tuple[float, list[BenchRow]]:
    """The copy ceiling of ``path/<stem>.json`` and the rows of ``path/<stem>.csv``, as the K4 and
    C4 scripts write them: ``impl`` (:data:`_IMPL`), ``T``, ``bytes``, ``median_us``, ``GBps``,
    ``pct_of_copy`` (a percent, empty where none), ``timing``, ``error``; ``kernel(r)`` and
    ``config(r)`` name a row's kernel and configuration."""
    copy = float(json.loads((path / f"{stem}.json").read_text())["copy_GBps"])
    rows = []
    for r in _csv(path / f"{stem}.csv"):
        backend, variant = _IMPL[r["impl"]]
        rows.append(BenchRow(family, kernel(r), backend, variant, int(r["T"]), int(r["bytes"]),
                             _f(r["median_us"]), _opt(r["GBps"]), copy,
                             None if r["pct_of_copy"] == "" else float(r["pct_of_copy"]) / 100, config(r),
                             r["timing"], r["error"]))
    return copy, rows


def _save_partial_states(root: Path, name: str) -> RecordedRun:
    """``save_partial_states_h200/``: ``median_us``, ``pct_of_copy`` a percent."""
    path = root / name
    copy, rows = _impl_csv_rows(
        path, "save_partial_states", "save_partial_states", lambda r: "save_partial_states",
        lambda r: (f"SW={r['state_width']} R={r['compress_ratio']} sbs={r['state_block_size']} "
                   f"layout={r['layout']}" + (" pooled" if r["pooled"] == "True" else "")))
    return RecordedRun(name, "save_partial_states", Recorded.from_path(path), copy, tuple(rows),
                       (path / "save_partial_states.csv",), "K4: benchmarks/save_partial_states.py",
                       tuple(decode_rows(rows)))


def _c4_compress(root: Path, name: str) -> RecordedRun:
    """``c4_compress_h200/``: ``op, format`` (the format string starts with the op), a percent."""
    path = root / name
    copy, rows = _impl_csv_rows(
        path, "c4_compress", "c4_compress", lambda r: r["op"],
        lambda r: r["format"][len(r["op"]):].strip() if r["format"].startswith(r["op"]) else r["format"])
    return RecordedRun(name, "c4_compress", Recorded.from_path(path), copy, tuple(rows),
                       (path / "c4_compress.csv",), "K5 / K6 / K9: benchmarks/c4_compress.py")


def _c128_compress(root: Path, name: str) -> RecordedRun:
    """``c128_compress_h200/``: already this schema; its ``check.json`` holds the decode table."""
    path = root / name
    rows = rows_from_dicts(_csv(path / "c128_compress.csv"))
    check = json.loads((path / "check.json").read_text())
    copy = float(check["copy_GBps"])
    decode = []
    for d in check.get("decode", []):
        kernel = d["op"] if d["op"] != "c128_norm_rope_store_plain" else \
            f"{d['op']}/{'bf16' if 'bf16' in d['format'] else 'e4m3'}"
        decode.append(DecodeRow("c128_compress", kernel, d["backend"], int(d["T"]), float(d["kernel_us"]),
                                float(d["empty_kernel_us"]), float(d["over_empty_us"]), d["format"],
                                d.get("error", "")))
    return RecordedRun(name, "c128_compress", Recorded.from_path(path), copy, tuple(rows),
                       (path / "c128_compress.csv", path / "check.json"),
                       "K7 / K8a / K8b: benchmarks/c128_compress_gpu_check.py", tuple(decode))


def _rowquant(root: Path, name: str) -> RecordedRun:
    """``backends_h200.json``: one rowquant point (8192 x 4096), ``median_ms`` and GB/s, no copy."""
    path = root / name
    data = json.loads(path.read_text())
    rows = []
    for backend, t in data["timing_8192x4096"].items():
        rows.append(BenchRow("rowquant", "rowquant", backend, KERNEL, 8192, None, 1e3 * float(t["median_ms"]),
                             float(t["GB_per_s"]), None, None, "n_cols=4096", ""))
    return RecordedRun(name, "rowquant", Recorded.from_path(path), None, tuple(rows), (path,),
                       "rowquant (the backends' example kernel): benchmarks/verify_backends.py; no copy "
                       "ceiling and no bytes recorded")


def _encoders(root: Path, name: str) -> RecordedRun:
    """``encoders_h200/``: numerics only (bytes compared per case), no timings: no rows."""
    path = root / name
    return RecordedRun(name, "encoders", Recorded.from_path(path), None, (), (path,),
                       "store hooks E1-E5: benchmarks/encoders_gpu_check.py; numerics only, no timings")


def _bench(root: Path, name: str) -> RecordedRun:
    """``bench_h200/<plan>.json``: one ``dsv4kit bench --family <plan>`` run, written in this schema."""
    path = root / name
    prov, rows, decode, _ = read_results(path)
    (family,) = prov["family"]
    copy = json.loads(path.read_text())["copy_GBps"]
    return RecordedRun(name, family, Recorded.from_path(path), copy, tuple(rows), (path,),
                       f"dsv4kit bench --family {family}: kernel (graph replay), op, eager and compiled "
                       "reference, decode sizes", tuple(decode))


#: The plans ``dsv4kit bench`` recorded on the H200 (``bench_h200/<plan>.json``).
BENCH_RUNS = tuple(f"bench_h200/{plan}.json" for plan in (
    "indexer_q", "dequant_gather", "save_partial_states", "c4_compress", "c128_compress", "store_rows",
    "rowquant"))

#: The plans ``dsv4kit bench`` recorded on an H100 on 2026-12-06 (``bench_h100/<plan>.json``): the
#: kernels of that day, which the H200 records predate (another device: another copy ceiling).
BENCH_RUNS_H100 = tuple(f"bench_h100/{plan}.json" for plan in (
    "indexer_q", "dequant_gather", "save_partial_states", "c4_compress", "c128_compress", "c128_store",
    "store_rows", "rowquant"))

#: Every recorded run with timings (or, for the encoders, the record saying there are none):
#: ``(path under the results directory, converter)``. Runs of other kinds (replays, sanitizers,
#: stream checks, the K3 fault probes and the faulted sweeps) hold no bandwidth numbers.
CONVERTERS: tuple[tuple[str, Callable[[Path, str], RecordedRun]], ...] = (
    ("indexer_q_h200.json", _indexer_q),
    ("indexer_q_h200_v2.json", _indexer_q),
    ("indexer_q_h200_v1.json", _indexer_q),
    ("dequant_gather", _dequant_gather),
    ("dequant_gather/full_sweep_run2", _dequant_gather),
    ("dequant_gather/quick_4a499f7", _dequant_gather),
    ("save_partial_states_h200", _save_partial_states),
    ("c4_compress_h200", _c4_compress),
    ("c128_compress_h200", _c128_compress),
    ("backends_h200.json", _rowquant),
    ("encoders_h200/encoders_gpu_check.json", _encoders),
    *((name, _bench) for name in BENCH_RUNS),
    *((name, _bench) for name in BENCH_RUNS_H100),
)
#: Runs whose record is the current one of their family (the others are history): the one sweep
#: of every family by ``dsv4kit bench``, and the C128 record for what that sweep lacks (K8a / K8b,
#: and K7 on tokens in (request, position) order; the sweep's K7 tokens are interleaved).
CURRENT = (*BENCH_RUNS, "c128_compress_h200")


def recorded_run(name: str, root: Path | None = None) -> RecordedRun:
    """The converted run ``name`` (a path of :data:`CONVERTERS`) under ``root`` (default: the
    results directory of :func:`dsv4kit.results.results_dir`)."""
    root = root if root is not None else results_dir()
    if root is None:
        from dsv4kit.results import not_found_message

        raise FileNotFoundError(not_found_message(name))
    conv = dict(CONVERTERS).get(name)
    if conv is None:
        raise KeyError(f"no converter for {name!r}; recorded runs: {', '.join(n for n, _ in CONVERTERS)}")
    return conv(root, name)


def recorded_runs(root: Path | None = None, *, current_only: bool = False) -> list[RecordedRun]:
    """Every recorded run of :data:`CONVERTERS` found under ``root`` (absent ones are skipped)."""
    root = root if root is not None else results_dir()
    if root is None:
        return []
    names = [n for n, _ in CONVERTERS if not current_only or n in CURRENT]
    return [recorded_run(n, root) for n in names if (root / n).exists()]


_WS = re.compile(r"\s+")


def label(row: BenchRow) -> str:
    """A short legend label: ``<kernel> [config] <backend> <variant>``."""
    return _WS.sub(" ", f"{row.kernel} {row.config} {row.backend} {row.variant}").strip()


# --------------------------------------------------------------------------- recorded warmup


@dataclass(frozen=True)
class WarmupKey:
    """One key a recorded GPU run warmed: compile seconds (None where not recorded), registers
    and spills of the compiled kernel, and the run (``source``) that recorded it."""

    family: str
    backend: str
    key: str
    seconds: float | None
    registers: int | None
    spills: int | None
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def recorded_warmup(root: Path | None = None) -> list[WarmupKey]:
    """The per-key warmup reports of the current recorded runs (every family that recorded one)."""
    root = root if root is not None else results_dir()
    out: list[WarmupKey] = []
    if root is None:
        return out

    def add(family: str, backend: str, k: Mapping[str, Any], source: str) -> None:
        out.append(WarmupKey(family, backend, str(k["key"]), k.get("seconds"), k.get("registers"),
                             k.get("spills"), source))

    def load(rel: str) -> Any:
        path = root / rel
        return json.loads(path.read_text()) if path.is_file() else None

    if (d := load("indexer_q_h200.json")) is not None:
        for k in d["warmup"]["rows"]:
            fmt = "fp8" if "Fp8" in k["kernel"] else "mxfp4"
            add(f"indexer_q/{fmt}", k["backend"], k, "indexer_q_h200.json")
    if (d := load("dequant_gather/coverage.json")) is not None:
        for backend, r in d.items():
            for k in r.get("per_key", []):
                add("dequant_gather", backend, k, "dequant_gather/coverage.json")
    if (d := load("save_partial_states_h200/save_partial_states.json")) is not None:
        for backend, r in d["warmup"].items():
            for k in r["keys"]:
                add("save_partial_states", backend, k, "save_partial_states_h200/save_partial_states.json")
    if (d := load("c4_compress_h200/c4_compress.json")) is not None:
        for name, r in d["warmup"].items():
            op, backend = name.split(" ")
            for k in r["keys"]:
                add(op, backend, k, "c4_compress_h200/c4_compress.json")
    if (d := load("c128_compress_h200/check.json")) is not None:
        for r in d["warmup"]:
            for k in r["keys"]:
                add(r["op"], r["backend"], k, "c128_compress_h200/check.json")
    if (d := load("backends_h200.json")) is not None:
        for backend, r in d["warmup"].items():
            for k in r.get("per_key", []):
                add("rowquant", backend, k, "backends_h200.json")
    return out


# --------------------------------------------------------------------------- host overhead, launch plans


@dataclass(frozen=True)
class HostOverhead:
    """``host_overhead_<device>/host_overhead.json`` (``benchmarks/host_overhead.py``): µs of host
    time per call on each path, per op and backend, and an empty Triton launch for scale."""

    record: Recorded
    rows: tuple[Mapping[str, Any], ...]
    empty_launch_us: float | None

    PATHS = ("op full", "op planned", "kernel full", "kernel planned")


@dataclass(frozen=True)
class LaunchPlanCheck:
    """``launch_plans_<device>/launch_plans.json`` (``benchmarks/launch_plans_gpu_check.py``): per op
    and backend, whether the planned call and its CUDA-graph replay wrote the full path's bytes."""

    record: Recorded
    rows: tuple[Mapping[str, Any], ...]

    def ok(self) -> int:
        return sum(bool(r.get("ok")) for r in self.rows)


def recorded_host_overhead(root: Path | None = None, name: str = "host_overhead_h200/host_overhead.json"
                           ) -> HostOverhead:
    """The recorded host-overhead run ``name`` under ``root`` (default: the results directory)."""
    path = (root if root is not None else results_dir()) / name
    data = json.loads(path.read_text())
    return HostOverhead(Recorded.from_path(path), tuple(data["rows"]), data.get("empty_launch_us"))


def recorded_launch_plans(root: Path | None = None, name: str = "launch_plans_h200/launch_plans.json"
                          ) -> LaunchPlanCheck:
    """The recorded launch-plan check ``name`` under ``root`` (default: the results directory)."""
    path = (root if root is not None else results_dir()) / name
    return LaunchPlanCheck(Recorded.from_path(path), tuple(json.loads(path.read_text())["rows"]))


@dataclass(frozen=True)
class SassMix:
    """One kernel of ``sass_mix_sm90a/sass_mix.json`` (``benchmarks/sass_mix.py``, static, on CPU):
    its instruction time over its DRAM time at the copy rate, and the fraction of the copy that
    bounds (``1 / ratio`` above 1)."""

    kernel: str                        # as the bench rows name it ("indexer_q/fp8", "rowquant", ...)
    backend: str
    config: str
    registers: int | None
    occupancy: float
    instr_per_byte: float
    instr_over_dram: float
    busiest: str
    ceiling_fraction_of_copy: float
    path_instructions: int | None = None  # one pass of a thread's main path (loops once)
    load_batches: int | None = None       # dependent global-load batches on that path


def recorded_sass_mix(root: Path | None = None, name: str = "sass_mix_sm90a/sass_mix.json"
                      ) -> tuple[Recorded, list[SassMix]]:
    """The recorded static SASS analysis ``name`` under ``root`` (default: the results directory)."""
    path = (root if root is not None else results_dir()) / name
    out = []
    for k in json.loads(path.read_text())["kernels"]:
        head = k["sass"]["headline"]
        pm = head["pipe_model"]
        kernel = k["family"] if k["variant"] == "default" else f"{k['family']}/{k['variant']}"
        out.append(SassMix(kernel, k["backend"], k["config"], k["resources"].get("registers"),
                           k["occupancy"]["occupancy"], head["instr_per_byte"], pm["instr_over_dram"],
                           pm["busiest"], pm["ceiling_fraction_of_copy"], k["sass"]["main_path"]["total"],
                           k["sass"]["load_batches"]["batches"]))
    return Recorded.from_path(path), out


@dataclass(frozen=True)
class NcuKernel:
    """One kernel of ``ncu_h200/ncu_profile.json`` (``benchmarks/ncu_profile.py``: Nsight Compute,
    one kernel replay at the plan's largest size). Percentages as ncu reports them (0-100)."""

    plan: str
    kernel: str                        # as the bench rows name it
    config: str
    backend: str
    size: int
    duration_us: float
    dram_over_model: float             # DRAM bytes read + written over the plan's bytes model
    dram_GBps: float
    achieved_occupancy_pct: float
    theoretical_occupancy_pct: float
    issue_active_pct: float
    registers: int | None
    stalls_pct: dict[str, float]       # warp-stall reason -> % of active warps' cycles

    def top_stalls(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` largest stall reasons, largest first."""
        return sorted(self.stalls_pct.items(), key=lambda kv: -kv[1])[:n]


def recorded_ncu(root: Path | None = None, name: str = "ncu_h200/ncu_profile.json"
                 ) -> tuple[Recorded, float, list[NcuKernel]]:
    """The recorded Nsight Compute counters ``name`` under ``root``: the record, the copy ceiling
    measured in that process (GB/s), one :class:`NcuKernel` per profiled kernel."""
    path = (root if root is not None else results_dir()) / name
    data = json.loads(path.read_text())
    out = [NcuKernel(k["plan"], k["kernel"], k.get("config", ""), k["backend"], int(k["size"]),
                     float(k["duration_us"]), float(k["dram_B_over_model"]), float(k["dram_GBps"]),
                     float(k["achieved_occupancy_pct"]), float(k["theoretical_occupancy_pct"]),
                     float(k["issue_active_pct"]), None if k["registers"] is None else int(k["registers"]),
                     {r: float(v) for r, v in (k.get("stalls_pct") or {}).items() if v is not None})
           for k in data["kernels"]]
    return Recorded.from_path(path), float(data["copy_GBps"]), out
