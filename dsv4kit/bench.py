"""Timing harness for GPU benchmarks: copy-bandwidth ceiling, medians, provenance, result files.

Every benchmark script reports bandwidth from an explicit bytes model against the copy
bandwidth measured in the same run, so a number is never compared with a datasheet.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform as _platform
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "backend_kernels",
    "bench_median_ms",
    "copy_bandwidth_gbs",
    "graph_median_ms",
    "provenance",
    "write_csv",
    "write_json",
]


def provenance(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Device, versions, date and commit of this run (``DSV4KIT_COMMIT`` wins over git)."""
    commit = os.environ.get("DSV4KIT_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=False).stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
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
                    memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
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
    by ``benchmarks/k3_fault_probe.py``). Here the side stream waits for the caller's stream
    first, and the caller's stream waits for the side stream at the end.
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
