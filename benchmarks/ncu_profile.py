#!/usr/bin/env python3
"""Hardware counters of the sweep kernels on the GPU (issue 16, deliverable 1), by Nsight Compute.

    python3 benchmarks/ncu_profile.py --out DIR [--families F,...] [--size N] [--ncu PATH]

For every sweep plan of :data:`dsv4kit.bench.PLANS` (or ``--families``), at its largest size (or
``--size``), each point and backend: the op is called once to compile and warm, then once between
``cudaProfilerStart`` / ``cudaProfilerStop``; the whole script runs under ``ncu
--profile-from-start off --clock-control none`` (the clocks are left alone, as the device notes
ask), so exactly those calls' kernels are profiled, once each (kernel replay). The copy ceiling
(``dsv4kit.bench.copy_bandwidth_gbs``, a ``cudaMemcpy``, which ncu does not profile) is measured in
the same process outside the profiled ranges. Per kernel the record keeps: duration, DRAM bytes
read and written (against the plan's bytes model), DRAM throughput (% of peak), achieved and
theoretical occupancy, issue-slot use, warp instructions, registers, and the warp-stall reasons
(% of active warps' cycles).

Writes ``ncu_raw.log`` (ncu's own CSV), ``ncu_profile.json`` (provenance, per kernel the numbers
above with its plan, kernel, config, backend, size and bytes-model bytes) and ``ncu_profile.md``.
``--child`` is the profiled process (internal).
"""

from __future__ import annotations

import argparse
import csv
import functools
import glob
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The counters read per kernel: (column, ncu metric).
METRICS = (
    ("duration_us", "gpu__time_duration.sum"),
    ("dram_read_B", "dram__bytes_read.sum"),
    ("dram_write_B", "dram__bytes_write.sum"),
    ("dram_pct_peak", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("achieved_occupancy_pct", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("theoretical_occupancy_pct", "sm__maximum_warps_per_active_cycle_pct"),
    ("issue_active_pct", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    ("warp_instructions", "smsp__inst_executed.sum"),
    ("registers", "launch__registers_per_thread"),
    ("grid", "launch__grid_size"),
    ("block", "launch__block_size"),
)
#: Warp-stall reasons (``smsp__warp_issue_stalled_<r>_per_warp_active.pct``): optional (a second
#: run leaves them out if this ncu refuses one).
STALLS = ("long_scoreboard", "lg_throttle", "barrier", "short_scoreboard", "math_pipe_throttle", "wait",
          "no_instruction", "not_selected", "mio_throttle", "dispatch_stall", "drain", "membar",
          "branch_resolving")


def stall_metric(reason: str) -> str:
    return f"smsp__warp_issue_stalled_{reason}_per_warp_active.pct"


def find_ncu(given: str | None) -> str | None:
    if given:
        return given
    found = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu") + glob.glob("/usr/local/cuda*/bin/ncu"))
    return shutil.which("ncu") or (found[-1] if found else None)


# --------------------------------------------------------------------------- the profiled process


def child(families: list[str] | None, size: int | None, manifest: Path) -> int:
    """Run each point's op once warm, once between profiler start / stop; write the labels in order."""
    import torch

    from dsv4kit.bench import select_plans
    from dsv4kit.kernels import family as family_spec

    labels: list[dict] = []

    def profiled(fn, label: dict) -> None:
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        labels.append(label)

    from dsv4kit.bench import copy_bandwidth_gbs

    copy = copy_bandwidth_gbs()
    for plan in select_plans(families):
        at = size or plan.sizes[-1]
        for pt in plan.points(at):
            spec = family_spec(pt.family)
            args = pt.build("cuda")
            for backend in ("triton", "cutedsl"):
                call = functools.partial(spec.op, **args, backend=backend, debug_checks=False)
                label = {"plan": plan.name, "kernel": pt.kernel, "config": pt.config, "backend": backend,
                         "size": pt.size, "model_bytes": pt.nbytes}
                try:
                    profiled(call, label)
                except Exception as exc:  # a backend that cannot run here: recorded, not profiled
                    print(f"{pt.kernel} {pt.config} {backend}: {type(exc).__name__}: {exc}", flush=True)
            del args
            torch.cuda.empty_cache()
    manifest.write_text(json.dumps({"copy_GBps": copy, "calls": labels}, indent=1) + "\n")
    return 0


# --------------------------------------------------------------------------- the parent


def parse_raw(text: str) -> list[dict[str, str]]:
    """ncu ``--csv --page raw``: a header row of metric names, a units row, one row per kernel."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2:
        return []
    head, units = rows[0], rows[1]
    out = []
    for r in rows[2:]:
        rec = dict(zip(head, r, strict=False))
        rec["_units"] = dict(zip(head, units, strict=False))
        out.append(rec)
    return out


def _num(v: str | None) -> float | None:
    try:
        return float(str(v).replace(",", ""))
    except (TypeError, ValueError):
        return None


#: ncu's time units, in microseconds.
_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
       "second": 1e6, "s": 1e6}
#: ncu's byte units, in bytes.
_B = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def _value(r: dict[str, str], metric: str) -> float | None:
    """``metric`` of row ``r`` in microseconds (times) or bytes (byte counts), else as printed."""
    v = _num(r.get(metric))
    unit = r.get("_units", {}).get(metric, "")
    if v is None:
        return None
    return v * _US[unit] if unit in _US else v * _B[unit] if unit in _B else v


def summarize(raw: list[dict[str, str]], labels: list[dict]) -> list[dict]:
    """One record per profiled kernel, labelled in launch order (each op launches one kernel)."""
    out = []
    for i, r in enumerate(raw):
        rec = dict(labels[i]) if i < len(labels) else {"plan": "?", "kernel": "?"}
        rec["ncu_kernel_name"] = r.get("Kernel Name", "")
        for col, metric in METRICS:
            rec[col] = _value(r, metric)
        rec["stalls_pct"] = {s: _num(r.get(stall_metric(s))) for s in STALLS if r.get(stall_metric(s))}
        dram = (rec["dram_read_B"] or 0) + (rec["dram_write_B"] or 0)
        rec["dram_B_over_model"] = dram / rec["model_bytes"] if rec.get("model_bytes") else None
        rec["dram_GBps"] = dram / (rec["duration_us"] * 1e3) if rec["duration_us"] else None
        out.append(rec)
    if len(raw) != len(labels):
        print(f"warning: {len(raw)} kernels profiled for {len(labels)} calls: labels may be shifted",
              flush=True)
    return out


def markdown(records: list[dict], prov: dict, ceiling: float | None) -> str:
    lines = [
        "# Nsight Compute counters of the sweep kernels: `benchmarks/ncu_profile.py`", "",
        f"Recorded {prov.get('date')} at commit `{str(prov.get('commit'))[:10]}` on {prov.get('device')}; "
        f"ncu `{prov.get('ncu_version')}`, `--clock-control none`, one kernel replay per call. "
        "DRAM GB/s = (bytes DRAM read + wrote) / duration (under the profiler); the copy ceiling, "
        f"measured in the same process without the profiler: {ceiling:.0f} GB/s." if ceiling else "", "",
        "| plan | kernel | config | backend | size | us | DRAM B / model B | DRAM GB/s | of copy "
        "| DRAM % peak | occupancy achieved / theoretical % | issue active % | regs "
        "| top stalls (% of warp cycles) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in records:
        stalls = sorted((r.get("stalls_pct") or {}).items(), key=lambda kv: -(kv[1] or 0))[:3]
        f = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        frac = r["dram_GBps"] / ceiling if ceiling and r.get("dram_GBps") else None
        lines.append(
            f"| {r['plan']} | {r['kernel']} | {r.get('config', '')} | {r.get('backend', '')} "
            f"| {r.get('size', '')} | {f(r['duration_us'])} | {f(r['dram_B_over_model'], 3)} "
            f"| {f(r['dram_GBps'], 0)} | {f(None if frac is None else 100 * frac)} % "
            f"| {f(r['dram_pct_peak'])} "
            f"| {f(r['achieved_occupancy_pct'])} / {f(r['theoretical_occupancy_pct'])} "
            f"| {f(r['issue_active_pct'])} "
            f"| {f(r['registers'], 0)} | " + ", ".join(f"{k} {v:.0f}" for k, v in stalls) + " |")
    return "\n".join(lines) + "\n"


def run_ncu(ncu: str, metrics: list[str], cmd: list[str], log: Path, timeout: float) -> tuple[int, str]:
    argv = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--target-processes", "all",
            "--csv", "--page", "raw", "--metrics", ",".join(metrics), "--log-file", str(log), *cmd]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return p.returncode, p.stdout[-4000:] + p.stderr[-4000:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--families", default=None)
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--timeout", type=float, default=500)
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    fams = a.families.split(",") if a.families else None
    if a.child is not None:
        return child(fams, a.size, a.child)
    if a.out is None:
        ap.error("--out is required")
    import torch

    if not torch.cuda.is_available():
        print("ncu_profile.py profiles kernels: it needs a CUDA device", file=sys.stderr)
        return 2
    ncu = find_ncu(a.ncu)
    if ncu is None:
        print("no ncu (PATH, /opt/nvidia/nsight-compute/*/ncu, /usr/local/cuda*/bin/ncu)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    manifest, raw = a.out / "manifest.json", a.out / "ncu_raw.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(manifest)]
    if a.families:
        cmd += ["--families", a.families]
    if a.size:
        cmd += ["--size", str(a.size)]
    base = [m for _, m in METRICS]
    rc, tail = run_ncu(ncu, base + [stall_metric(s) for s in STALLS], cmd, raw, a.timeout)
    if rc != 0 and not manifest.exists():
        print(f"ncu with stall metrics failed (rc {rc}); again without them:\n{tail}", flush=True)
        rc, tail = run_ncu(ncu, base, cmd, raw, a.timeout)
    print(tail, flush=True)
    if rc != 0 or not manifest.exists():
        print(f"ncu failed (rc {rc})", file=sys.stderr)
        return 1
    from dsv4kit.bench import provenance, select_plans
    from dsv4kit.results import kernel_source_provenance

    version = subprocess.run([ncu, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    prov = provenance({**kernel_source_provenance(p.hash_family for p in select_plans(fams)),
                       "script": "benchmarks/ncu_profile.py", "device": torch.cuda.get_device_name(),
                       "ncu_version": version.splitlines()[-1] if version else None})
    calls = json.loads(manifest.read_text())
    records = summarize(parse_raw(raw.read_text()), calls["calls"])
    doc = {"provenance": prov, "copy_GBps": calls["copy_GBps"], "kernels": records}
    (a.out / "ncu_profile.json").write_text(json.dumps(doc, indent=1) + "\n")
    (a.out / "ncu_profile.md").write_text(markdown(records, prov, calls["copy_GBps"]))
    print((a.out / "ncu_profile.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
