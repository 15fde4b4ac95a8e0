"""Class plans on / off, alternated in one process per op (no-op executors): host µs of a public op
call of sizes never called before (keys warm), the median of single calls. See README.md."""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from host_overhead import _forget_plans, _noop_executors  # noqa: E402

from dsv4kit.jit import class_plans  # noqa: E402
from dsv4kit.kernels import families  # noqa: E402
from dsv4kit.testing.valid_calls import sized_call  # noqa: E402

ROUNDS, CALLS = 3, 30


def main() -> None:
    warnings.simplefilter("ignore")
    wanted = set(sys.argv[1:])
    print(f"{'op':32s} {'off us':>8s} {'on us':>8s}  {'on/off':>6s}   rounds (off / on medians)")
    for spec in families():
        if wanted and spec.name not in wanted:
            continue
        def call(n: int, spec=spec) -> dict:
            return {**sized_call(spec, n), "debug_checks": False, "backend": "triton"}

        for n in (1, 2, 3, 300):               # every key these sizes dispatch to, warm
            spec.op(**call(n))
        for kernel in spec._kernels.values():
            _noop_executors(kernel)
        _forget_plans(spec)
        fresh = iter(range(4, 300))
        for _ in range(3):                      # the class plans made again with the no-op executors
            spec.op(**call(next(fresh)))
        medians: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(ROUNDS):
            for mode in ("off", "on"):
                class_plans.set_enabled(mode == "on")
                singles = []
                for c in [call(next(fresh)) for _ in range(CALLS)]:  # made first: timed back to back
                    t0 = time.perf_counter()
                    spec.op(**c)
                    singles.append((time.perf_counter() - t0) * 1e6)
                medians[mode].append(statistics.median(singles))
        class_plans.set_enabled(True)
        off, on = min(medians["off"]), min(medians["on"])
        rounds = " ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(medians["off"], medians["on"], strict=True))
        print(f"{spec.op_name:32s} {off:8.1f} {on:8.1f}  {on / off:6.2f}   {rounds}", flush=True)


if __name__ == "__main__":
    main()
