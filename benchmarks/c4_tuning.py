#!/usr/bin/env python3
"""Tokens per program of the Triton C4 compressors (K5, K6, K9) on a GPU: which grid to launch.

    python3 benchmarks/c4_tuning.py --out DIR [--sizes 4096,65536] [--tpp 1,2,4,8] [--rep-ms 40]

For every ``tpp`` the Triton kernel's :func:`~dsv4kit.kernels.c4_compress.triton.tokens_per_program`
is set to return it at every size (``SHARE_FROM_TOKENS = 1``), and the ``c4_compress`` sweep plan
of ``dsv4kit bench`` runs at ``--sizes`` (kernel in a CUDA graph and the op; tokens in request
order, as a model orders them) with fresh kernel objects. The outputs are the sweep's own rows, so
the bytes model and the copy ceiling are those of ``dsv4kit bench``. Writes ``c4_tuning.json``
(provenance, per tpp the sweep rows) and prints a table: the grid the kit launches is chosen from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.bench import PLANS, run_sweep  # noqa: E402
from dsv4kit.jit import launch_plans  # noqa: E402
from dsv4kit.kernels.c4_compress import triton as c4_triton  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sizes", default="4096,65536")
    ap.add_argument("--tpp", default="1,2,4,8")
    ap.add_argument("--rep-ms", type=int, default=40)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("c4_tuning.py times kernels: it needs a CUDA device", file=sys.stderr)
        return 2
    sizes = [int(s) for s in a.sizes.split(",")]
    choices = [int(s) for s in a.tpp.split(",")]
    saved = (c4_triton.SHARE_FROM_TOKENS, c4_triton.TOKENS_PER_PROGRAM)
    default = {"SHARE_FROM_TOKENS": saved[0], "TOKENS_PER_PROGRAM": saved[1]}
    result: dict = {"sizes": sizes, "default": default, "runs": {}}
    try:
        # A launch plan keeps the tpp of its first call (a constant per shape): no plans here.
        with launch_plans.disabled():
            for tpp in choices:
                c4_triton.SHARE_FROM_TOKENS, c4_triton.TOKENS_PER_PROGRAM = 1, tpp
                res = run_sweep([PLANS["c4_compress"]], backends=("triton",), sizes=sizes, reference=False,
                                rep_ms=a.rep_ms, log=lambda m, t=tpp: print(f"tpp={t}: {m}", flush=True))
                result["provenance"] = res.provenance
                result["runs"][str(tpp)] = [dataclasses.asdict(r) for r in res.rows]
    finally:
        c4_triton.SHARE_FROM_TOKENS, c4_triton.TOKENS_PER_PROGRAM = saved
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "c4_tuning.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    for tpp, rows in result["runs"].items():
        for r in rows:
            frac = f"{100 * r['fraction_of_copy']:5.1f} %" if r["fraction_of_copy"] else "-"
            print(f"tpp {tpp}  {r['kernel']:22s} {r['config']:30s} {r['size']:>6d} {r['variant']:24s} "
                  f"{r['median_us']:9.1f} us  {frac}")
    print(f"wrote {a.out / 'c4_tuning.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
