#!/usr/bin/env python3
"""The launch shape of the Triton K3 kernel (dequant-gather) on a GPU: rows per tile, warps per
program, rows per program.

    python3 benchmarks/k3_tuning.py --out DIR [--sizes 1048576] [--shapes 8x4x32,16x4x32,...] [--rep-ms 40]

Each ``ROWSxWARPSxPER_PROG`` of ``--shapes`` sets the tile (``ROWS``, a constexpr: a compile of
its own), ``NUM_WARPS`` and ``gpu_rows_per_program`` (a runtime argument) of
:mod:`dsv4kit.kernels.dequant_gather.triton`, and the ``dequant_gather`` sweep plan of
``dsv4kit bench`` runs at ``--sizes`` (Triton only, no reference) with fresh kernel objects, so the
bytes model and the copy ceiling are those of ``dsv4kit bench``. Why: Nsight Compute has the kernel
latency-bound (long-scoreboard 75-79 % of warp cycles at 73 % achieved occupancy, 40 registers);
what a shape changes is the bytes in flight per SM. Writes ``k3_tuning.json`` (provenance, per
shape the sweep rows) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.backends.triton import Const  # noqa: E402
from dsv4kit.bench import PLANS, run_sweep  # noqa: E402
from dsv4kit.jit import launch_plans  # noqa: E402
from dsv4kit.kernels import family  # noqa: E402
from dsv4kit.kernels.dequant_gather import triton as k3  # noqa: E402

DEFAULT_SHAPES = "8x4x32,8x4x64,8x4x16,16x4x32,16x4x64,16x8x64,8x8x32,4x4x32,4x2x16"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sizes", default="1048576")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--rep-ms", type=int, default=40)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("k3_tuning.py times kernels: it needs a CUDA device", file=sys.stderr)
        return 2
    sizes = [int(s) for s in a.sizes.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    cls = k3.DequantGatherTriton
    saved = (cls.params, k3.NUM_WARPS, cls.gpu_rows_per_program)
    result: dict = {"sizes": sizes, "default": {"ROWS": k3.ROWS, "NUM_WARPS": k3.NUM_WARPS,
                                                "gpu_rows_per_program": cls.gpu_rows_per_program}, "runs": {}}
    try:
        with launch_plans.disabled():      # a plan keeps the arguments of its first call
            for rows, warps, per_prog in shapes:
                name = f"{rows}x{warps}x{per_prog}"
                cls.params = {**saved[0], "ROWS": Const(rows)}
                k3.NUM_WARPS, cls.gpu_rows_per_program = warps, per_prog
                family("dequant_gather")._kernels.clear()
                res = run_sweep([PLANS["dequant_gather"]], backends=("triton",), sizes=sizes, reference=False,
                                rep_ms=a.rep_ms, log=lambda m, n=name: print(f"{n}: {m}", flush=True))
                result["provenance"] = res.provenance
                result["runs"][name] = [dataclasses.asdict(r) for r in res.rows]
    finally:
        cls.params, k3.NUM_WARPS, cls.gpu_rows_per_program = saved
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "k3_tuning.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    for name, rows in result["runs"].items():
        for r in rows:
            frac = f"{100 * r['fraction_of_copy']:5.1f} %" if r["fraction_of_copy"] else "-"
            print(f"{name:>9s}  {r['config']:36s} {r['size']:>8d} {r['variant']:24s} "
                  f"{r['median_us']:9.1f} us  {frac}")
    print(f"wrote {a.out / 'k3_tuning.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
