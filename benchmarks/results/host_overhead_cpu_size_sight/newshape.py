"""Median host µs of a public op's call at shapes never seen (keys warm, no-op executors), on the CPU.

Run from a tree's root: ``python newshape.py rowquant,c4_compress_plain`` (family or op names).
"""

from __future__ import annotations

import statistics
import sys
import time

sys.path.insert(0, "benchmarks")
from host_overhead import _forget_plans, _noop_executors  # noqa: E402

from dsv4kit.kernels import families  # noqa: E402
from dsv4kit.testing.valid_calls import sized_call  # noqa: E402


def median_new_shape_us(name: str, shapes: int = 80, passes: int = 3) -> float:
    """The best over ``passes`` of the median single-call time at ``shapes`` shapes, plans forgotten."""
    spec = next(s for s in families() if name in (s.name, s.op_name))
    calls = [{**sized_call(spec, n), "debug_checks": False, "backend": "triton"}
             for n in range(1, shapes + 1)]
    for c in calls:
        spec.op(**c)                   # warms every key these shapes dispatch to
    for kernel in spec._kernels.values():
        _noop_executors(kernel)
    best = float("inf")
    for _ in range(passes):
        _forget_plans(spec)
        singles = []
        for c in calls:
            t0 = time.perf_counter()
            spec.op(**c)
            singles.append(time.perf_counter() - t0)
        best = min(best, statistics.median(singles) * 1e6)
    for kernel in spec._kernels.values():
        type(kernel).clear_cache()     # the no-op executors must not outlive the run
    return best


if __name__ == "__main__":
    print(" | ".join(f"{n} {median_new_shape_us(n):.1f}" for n in sys.argv[1].split(",")))
