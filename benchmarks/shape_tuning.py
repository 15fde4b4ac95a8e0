#!/usr/bin/env python3
"""Launch shapes of a kernel on a GPU: the same sweep under several tile / warp / grid choices.

    python3 benchmarks/shape_tuning.py k3 --out DIR [--shapes 8x4x32,4x1x4,...] [--sizes 1048576]
    python3 benchmarks/shape_tuning.py k3-cute --out DIR [--shapes 8,16,32]
    python3 benchmarks/shape_tuning.py store --out DIR [--shapes E1:2x2x4,E4:16x1x4,...] [--sizes 65536]
    python3 benchmarks/shape_tuning.py store-cute --out DIR [--shapes idx:4,idx:8,ds:2,...]
    python3 benchmarks/shape_tuning.py iq --out DIR [--shapes 8x2,16x4,...] [--sizes 1,8,64,256]

Targets (:data:`TARGETS`):

* ``k3``: the Triton K3 kernel, ``ROWSxWARPSxPER_PROG``: rows per tile (``ROWS``, a constexpr: a
  compile of its own), ``NUM_WARPS``, and ``gpu_rows_per_program`` (a runtime argument).
* ``k3-cute``: the CuTeDSL K3 kernel, ``ROWS_PER_CTA`` (a runtime argument: nothing compiles).
* ``store``: the Triton store hooks, ``ENC:ROWSxSUBxWARPS`` for one encoder (E1..E5):
  :func:`~dsv4kit.kernels.encoders.triton.tile_rows` (rows per tile, tiles per program) and the
  warps per program; the other encoders keep theirs.
* ``store-cute``: the CuTeDSL store hooks, ``ds:R`` (head 512: E1-E3) or ``idx:R`` (the indexer's
  E4 / E5): :func:`~dsv4kit.kernels.encoders.cutedsl.rows_per_warp`, a compile-time constant.
* ``iq``: the Triton K1 / K2 decode key (coarsen 1), ``GROUPSxWARPS``: thread groups per program
  (:data:`~dsv4kit.kernels.indexer_q.triton.THREAD_GROUPS`, so ``GROUPS`` rows a program) and
  warps per program; the prefill key keeps its shape. Sized at the decode sizes by default.

Each shape runs the target's ``dsv4kit bench`` sweep plan at ``--sizes`` (its backend only, no
reference, launch plans off: a plan keeps its first call's grid) with fresh kernel objects, so the
bytes model and the copy ceiling are those of ``dsv4kit bench``; the knobs are restored afterwards.
Writes ``shape_tuning_<target>.json`` (provenance, the default, per shape the sweep rows) and
prints a table: the shapes the kit launches are chosen from it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclasses.dataclass(frozen=True)
class Target:
    plan: str
    backend: str
    sizes: str
    shapes: str
    apply: Callable[[str], contextlib.AbstractContextManager[None]]   # a shape, set while inside
    default: Callable[[], dict[str, Any]]


@contextlib.contextmanager
def _patched(*changes: tuple[Any, str, Any]) -> Iterator[None]:
    """Each ``(owner, attribute, value)`` set while inside; the old values back after, also when the
    body raises."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
    for owner, name, value in changes:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _k3(shape: str) -> contextlib.AbstractContextManager[None]:
    from dsv4kit.backends.triton import Const
    from dsv4kit.kernels.dequant_gather import triton as k3

    rows, warps, per_prog = (int(v) for v in shape.split("x"))
    cls = k3.DequantGatherTriton
    return _patched((cls, "params", {**cls.params, "ROWS": Const(rows)}), (k3, "NUM_WARPS", warps),
                    (cls, "gpu_rows_per_program", per_prog))


def _k3_default() -> dict[str, Any]:
    from dsv4kit.kernels.dequant_gather import triton as k3

    return {"ROWS": k3.DequantGatherTriton.params["ROWS"].value, "NUM_WARPS": k3.NUM_WARPS,
            "gpu_rows_per_program": k3.DequantGatherTriton.gpu_rows_per_program}


def _k3_cute(shape: str) -> contextlib.AbstractContextManager[None]:
    from dsv4kit.kernels.dequant_gather.cutedsl import DequantGatherCuTeDSL

    return _patched((DequantGatherCuTeDSL, "rows_per_cta", int(shape)))


def _k3_cute_default() -> dict[str, Any]:
    from dsv4kit.kernels.dequant_gather.cutedsl import DequantGatherCuTeDSL

    return {"rows_per_cta": DequantGatherCuTeDSL.rows_per_cta}


def _store(shape: str) -> contextlib.AbstractContextManager[None]:
    from dsv4kit.kernels.encoders import spec
    from dsv4kit.kernels.encoders import triton as enc

    name, dims = shape.split(":")
    which = getattr(spec, name)
    rows, sub, warps = (int(v) for v in dims.split("x"))
    if sub != 1 and which in (spec.E4, spec.E5):
        raise SystemExit(f"{shape}: the E4 / E5 branch of store_rows_kernel stores one tile per program")
    tile_rows, options = enc.tile_rows, enc._StoreRowsTriton.launch_options

    def tile(key: Any) -> tuple[int, int]:
        return (rows, sub) if spec.key_encoder(key) == which else tile_rows(key)

    def launch_options(self: Any, key: Any) -> dict[str, Any]:
        return {"num_warps": warps} if spec.key_encoder(key) == which else options(self, key)

    return _patched((enc, "tile_rows", tile), (enc._StoreRowsTriton, "launch_options", launch_options))


def _store_default() -> dict[str, Any]:
    from dsv4kit.kernels.encoders import spec
    from dsv4kit.kernels.encoders import triton as enc
    from dsv4kit.platform import cpu_platform

    out: dict[str, Any] = {}
    for cls in (enc.StoreRowsDsTriton, enc.StoreRowsPlainTriton, enc.StoreRowsIndexerTriton):
        k = cls(cpu_platform())
        for key in k.get_warmup_keys():
            out[f"E{spec.key_encoder(key)}"] = {"tile_rows": enc.tile_rows(key), **k.launch_options(key)}
    return out


def _store_cute(shape: str) -> contextlib.AbstractContextManager[None]:
    from dsv4kit.kernels.encoders import cutedsl as enc

    which, r = shape.split(":")
    saved = enc.rows_per_warp

    def rows_per_warp(nb: int) -> int:
        return int(r) if (nb > 2) == (which == "ds") else saved(nb)

    return _patched((enc, "rows_per_warp", rows_per_warp))


def _store_cute_default() -> dict[str, Any]:
    from dsv4kit.kernels.encoders import cutedsl as enc

    return {"rows_per_warp": {"ds": enc.rows_per_warp(8), "idx": enc.rows_per_warp(2)}, "warps": enc.WARPS}


def _iq(shape: str) -> contextlib.AbstractContextManager[None]:
    from dsv4kit.kernels.indexer_q import triton as iq

    groups, warps = (int(v) for v in shape.split("x"))
    options = iq._TritonLaunch.launch_options

    def launch_options(self: Any, key: Any) -> dict[str, Any]:
        return {"num_warps": warps} if key.coarsen == 1 else options(self, key)

    return _patched((iq, "THREAD_GROUPS", groups), (iq._TritonLaunch, "launch_options", launch_options))


def _iq_default() -> dict[str, Any]:
    from dsv4kit.kernels.indexer_q import triton as iq
    from dsv4kit.kernels.indexer_q.spec import IndexerQBase
    from dsv4kit.platform import cpu_platform

    key = IndexerQBase.CompileKey(head_dim=128, rope_dim=64, num_heads=64, cos_sin_dtype="float32", coarsen=1)
    return {"THREAD_GROUPS": iq.THREAD_GROUPS,
            **iq.IndexerQFp8Triton(cpu_platform()).launch_options(key)}


TARGETS: dict[str, Target] = {
    "k3": Target("dequant_gather", "triton", "1048576", "8x4x32,4x1x4,4x1x8,4x2x8,2x1x4,8x1x8",
                 _k3, _k3_default),
    "k3-cute": Target("dequant_gather", "cutedsl", "1048576", "32,16,8,64", _k3_cute, _k3_cute_default),
    "store": Target("store_rows", "triton", "65536",
                    "E1:2x2x4,E1:2x1x2,E1:2x2x2,E1:1x2x1,E1:2x1x1,E1:1x1x1,E1:4x1x4,E1:4x2x8,"
                    "E4:16x1x4,E4:8x1x2,E4:4x1x1,E4:32x1x4,E4:8x1x1,"
                    "E5:16x1x4,E5:8x1x2,E5:4x1x1,E5:32x1x4,E5:8x1x1", _store, _store_default),
    "store-cute": Target("store_rows", "cutedsl", "65536", "idx:4,idx:8,idx:16,idx:2,ds:1,ds:2",
                         _store_cute, _store_cute_default),
    "iq": Target("indexer_q", "triton", "1,8,64,256", "8x2,8x1,16x2,16x4,32x4,64x4", _iq, _iq_default),
}


def _fresh_kernels(families: tuple[str, ...]) -> None:
    """Drop the families' kernel objects and their classes' executors: executors are cached per
    class and key, and a CuTeDSL executor is the compiled code itself (a compile-time constant of
    a shape would otherwise keep its first value; Triton's runtime JIT hid that for Triton)."""
    from dsv4kit.kernels import family

    for fam in families:
        spec = family(fam)
        for k in spec._kernels.values():
            type(k).clear_cache()
        spec._kernels.clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sizes", default=None)
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--rep-ms", type=int, default=40)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("shape_tuning.py times kernels: it needs a CUDA device", file=sys.stderr)
        return 2
    from dsv4kit.bench import PLANS, run_sweep
    from dsv4kit.jit import launch_plans

    t = TARGETS[a.target]
    plan = PLANS[t.plan]
    sizes = [int(s) for s in (a.sizes or t.sizes).split(",")]
    result: dict[str, Any] = {"target": a.target, "sizes": sizes, "default": t.default(), "runs": {}}
    with launch_plans.disabled():
        for shape in (a.shapes or t.shapes).split(","):
            with t.apply(shape):
                _fresh_kernels(plan.families)
                res = run_sweep([plan], backends=(t.backend,), sizes=sizes, reference=False, rep_ms=a.rep_ms,
                                log=lambda m, s=shape: print(f"{s}: {m}", flush=True))
            result["provenance"] = res.provenance
            name = shape if shape not in result["runs"] else f"{shape} #{len(result['runs'])}"  # a repeat
            result["runs"][name] = [dataclasses.asdict(r) for r in res.rows]
    _fresh_kernels(plan.families)    # no kernel of a tuned shape outlives the sweep
    write_runs(a.out / f"shape_tuning_{a.target}.json", result)
    return 0


def write_runs(path: Path, result: dict[str, Any]) -> None:
    """Write a sweep-per-choice ``result`` (``runs``: choice -> sweep rows) as JSON and print it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    for choice, rows in result["runs"].items():
        for r in rows:
            frac = f"{100 * r['fraction_of_copy']:5.1f} %" if r["fraction_of_copy"] else "-"
            print(f"{choice:>12s}  {r['kernel']:20s} {r['config']:36s} {r['size']:>8d} {r['variant']:22s} "
                  f"{r['median_us']:9.1f} us  {frac}")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
