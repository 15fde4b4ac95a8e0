"""In-process A/B of ``PlanTable.missed`` (issue 36), CPU, no-op executors.

``before`` clears ``missed`` in every table of the op after each call, which is what the code did
before the flag (every call tries the hot guards first); ``after`` leaves it. The two modes
alternate ``R`` times in one process on the same plans: ``fixed`` (one shape, 64 calls) and
``cycle`` (32 seen shapes, twice) are the best mean of the ``R`` rounds, ``new shape`` the median of
12 single calls per round of shapes never called (their keys warm). Run from the repository root:
``python benchmarks/results/host_overhead_cpu_hot_miss/ab_missed.py [OPS] [R]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from dsv4kit.jit import launch_plans
from dsv4kit.kernels import families
from dsv4kit.testing.valid_calls import sized_call


def _noop(*_: Any) -> None:
    return None


def ab(name: str, rounds: int) -> str:
    spec = next(s for s in families() if s.name == name)
    fixed = {**sized_call(spec, 3), "debug_checks": False}
    cycle = [{**sized_call(spec, n), "debug_checks": False} for n in range(1, 33)]
    pool = {m: [{**sized_call(spec, n), "debug_checks": False} for n in range(33 + i, 33 + 24 * rounds, 2)]
            for i, m in enumerate(("before", "after"))}
    op = spec.op
    op(**fixed)
    kernels = list(spec._kernels.values())
    for k in kernels:  # no-op executors, every key compiled to one as well
        type(k).compile = lambda self, key: self._cache_executor(key, _noop)
        cache = k._executor_cache()
        for key in list(cache):
            cache[key] = _noop
    for c in (*cycle, *pool["before"], *pool["after"]):  # every key warm
        op(**c)
    tables = [spec._launches, *(launch_plans.plans_of(k) for k in kernels)]
    for t in tables:
        t.clear()
    for c in (fixed, fixed, *cycle, *cycle):  # seen twice: planned
        op(**c)
    res: dict[str, dict[str, list[float]]] = {m: {"fixed": [], "cycle": [], "new": []} for m in pool}
    fresh = {m: iter(pool[m]) for m in pool}
    for _ in range(rounds):
        for mode in ("before", "after"):
            def call(c: dict[str, Any], mode: str = mode) -> None:
                op(**c)
                if mode == "before":
                    for t in tables:
                        t.missed = False

            for label, calls in (("fixed", [fixed] * 64), ("cycle", cycle * 2)):
                t0 = time.perf_counter()
                for c in calls:
                    call(c)
                res[mode][label].append((time.perf_counter() - t0) / len(calls) * 1e6)
            call(fixed)
            for _ in range(12):
                c = next(fresh[mode])
                t0 = time.perf_counter()
                call(c)
                res[mode]["new"].append((time.perf_counter() - t0) * 1e6)
            for _ in range(3):
                call(fixed)
    line = [f"{spec.op_name:32s}"]
    for label in ("fixed", "cycle", "new"):
        pick = statistics.median if label == "new" else min
        b, a = pick(res["before"][label]), pick(res["after"][label])
        line.append(f"{label} {b:6.2f} -> {a:6.2f} us ({100 * (a - b) / b:+.0f} %)")
    return "  ".join(line)


if __name__ == "__main__":
    ops = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else [s.name for s in families()]
    for name in ops:
        print(ab(name, int(sys.argv[2]) if len(sys.argv) > 2 else 10), flush=True)
