#!/usr/bin/env python3
"""The grid of the Triton C4 compressors (K5, K6, K9) on a GPU: tokens per chunk, programs; and
where the CuTeDSL ones switch from their decode kernel to their prefill kernel.

    python3 benchmarks/c4_tuning.py --out DIR [--sizes 4096,65536] [--shapes 8x2048,8x1056,...] [--rep-ms 40]
    python3 benchmarks/c4_tuning.py --out DIR --cute-up-to 0,1073741824 [--sizes 1024,4096,16384]

``--cute-up-to``: instead of the Triton shapes, the CuTeDSL sweep once per value of
``cutedsl.CTA_PER_TOKEN_UP_TO`` (0: the prefill kernel at every T; a huge value: the decode kernel
at every T); a runtime choice, so nothing compiles again.

For every ``CHUNKxPROGRAMS`` of ``--shapes`` the Triton kernel's
:func:`~dsv4kit.kernels.c4_compress.triton.launch_shape` is set to give chunks of CHUNK tokens and at
most PROGRAMS programs at every size (``SHARE_FROM_TOKENS = 1``), and the ``c4_compress`` sweep plan
of ``dsv4kit bench`` runs at ``--sizes`` (kernel in a CUDA graph and the op; tokens in request
order, as a model orders them) with fresh kernel objects. The outputs are the sweep's own rows, so
the bytes model and the copy ceiling are those of ``dsv4kit bench``. Writes ``c4_tuning.json``
(provenance, per shape the sweep rows) and prints a table: the grid the kit launches is chosen from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))   # shape_tuning's writer

from dsv4kit.bench import PLANS, run_sweep  # noqa: E402
from dsv4kit.jit import launch_plans  # noqa: E402
from dsv4kit.kernels import family  # noqa: E402
from dsv4kit.kernels.c4_compress import triton as c4_triton  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sizes", default="4096,65536")
    ap.add_argument("--shapes", default="1x1048576,4x1048576,8x1048576,8x4096,8x2048,8x1056,8x528")
    ap.add_argument("--maxnreg", default="0", help="register caps to try (0: none), comma-separated")
    ap.add_argument("--rep-ms", type=int, default=40)
    ap.add_argument("--cute-up-to", default="",
                    help="CuTeDSL decode-kernel thresholds to time, comma-separated")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("c4_tuning.py times kernels: it needs a CUDA device", file=sys.stderr)
        return 2
    sizes = [int(s) for s in a.sizes.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    choices = [(*shape, int(r)) for r in a.maxnreg.split(",") for shape in shapes]
    names = ("SHARE_FROM_TOKENS", "TOKENS_PER_CHUNK", "MAX_PROGRAMS", "MAX_REGISTERS")
    saved = tuple(getattr(c4_triton, n) for n in names)
    default = dict(zip(names, saved, strict=True))
    result: dict = {"sizes": sizes, "default": default, "runs": {}}
    if a.cute_up_to:
        return _write(a.out, _cute_split(result, sizes, [int(v) for v in a.cute_up_to.split(",")], a.rep_ms))
    try:
        # A launch plan keeps the grid of its first call (a constant per shape): no plans here.
        with launch_plans.disabled():
            for chunk, programs, regs in choices:
                name = f"{chunk}x{programs}" + (f" r{regs}" if regs else "")
                c4_triton.SHARE_FROM_TOKENS = 1
                c4_triton.TOKENS_PER_CHUNK, c4_triton.MAX_PROGRAMS = chunk, programs
                c4_triton.MAX_REGISTERS = regs or None
                # Fresh kernels: the register cap is a compile option.
                for fam in PLANS["c4_compress"].families:
                    family(fam)._kernels.clear()
                res = run_sweep([PLANS["c4_compress"]], backends=("triton",), sizes=sizes, reference=False,
                                rep_ms=a.rep_ms, log=lambda m, n=name: print(f"{n}: {m}", flush=True))
                result["provenance"] = res.provenance
                result["runs"][name] = [dataclasses.asdict(r) for r in res.rows]
    finally:
        for n, v in zip(names, saved, strict=True):
            setattr(c4_triton, n, v)
    return _write(a.out, result)


def _cute_split(result: dict, sizes: list[int], values: list[int], rep_ms: int) -> dict:
    """The CuTeDSL sweep once per ``CTA_PER_TOKEN_UP_TO`` value (runs named ``cute_up_to=V``)."""
    from dsv4kit.kernels.c4_compress import cutedsl as c4_cute

    saved = c4_cute.CTA_PER_TOKEN_UP_TO
    result["default"] = {"CTA_PER_TOKEN_UP_TO": saved}
    try:
        with launch_plans.disabled():      # a plan keeps its first call's arguments
            for v in values:
                c4_cute.CTA_PER_TOKEN_UP_TO = v
                name = f"cute_up_to={v}"
                res = run_sweep([PLANS["c4_compress"]], backends=("cutedsl",), sizes=sizes, reference=False,
                                rep_ms=rep_ms, log=lambda m, n=name: print(f"{n}: {m}", flush=True))
                result["provenance"] = res.provenance
                result["runs"][name] = [dataclasses.asdict(r) for r in res.rows]
    finally:
        c4_cute.CTA_PER_TOKEN_UP_TO = saved
    return result


def _write(out: Path, result: dict) -> int:
    from shape_tuning import write_runs

    write_runs(out / "c4_tuning.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
