"""Class plans on the GPU: a call of new sizes served by a class plan (:mod:`dsv4kit.jit.class_plans`)
writes the same bytes as the full path.

For every public op and backend here: the op's sized calls (``dsv4kit.testing.valid_calls``) moved
to the GPU, value checks off. Sizes 1, 1, 2, 3 make the op's call plan and its class plan; then each
of ``--sizes`` (never called before) runs twice on fresh copies of the same inputs: once as it comes
(a class plan serves it unless a guard fails) and once with class and launch plans off (the full
path). What each returns and every tensor argument after the call (the caches it writes) are
compared byte for byte; the record counts the calls a class plan served.

    python benchmarks/class_plans_gpu_check.py --out DIR     # DIR/class_plans.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from dsv4kit.bench import provenance, write_json
from dsv4kit.family import plans as call_plans
from dsv4kit.jit import class_plans, launch_plans
from dsv4kit.kernels import families
from dsv4kit.platform import current_platform
from dsv4kit.results import kernel_source_provenance
from dsv4kit.testing.fast_path import as_bytes
from dsv4kit.testing.valid_calls import sized_call, twin


def _written(op: Any, call: dict[str, Any], backend: str) -> list[bytes]:
    copy = {k: (twin(v) if isinstance(v, torch.Tensor) else v) for k, v in call.items()}
    out = op(**copy, backend=backend, debug_checks=False)
    torch.cuda.synchronize()
    return as_bytes(out) + [b for v in copy.values() for b in as_bytes(v)]


def _on_gpu(call: dict[str, Any]) -> dict[str, Any]:
    return {k: twin(v, "cuda") if isinstance(v, torch.Tensor) else v for k, v in call.items()}


def check(spec: Any, backend: str, sizes: list[int]) -> dict[str, Any]:
    served = [0]
    real = call_plans.serve

    def counted(table: Any, args: Any, kwargs: Any) -> Any:
        r = real(table, args, kwargs)
        served[0] += r is not class_plans.MISS
        return r

    call_plans.serve = counted
    try:
        for n in (1, 1, 2, 3):
            _written(spec.op, _on_gpu(sized_call(spec, n)), backend)
        same = 0
        for n in sizes:
            call = _on_gpu(sized_call(spec, n))
            planned = _written(spec.op, call, backend)
            before = class_plans.set_enabled(False)
            try:
                with launch_plans.disabled():
                    full = _written(spec.op, call, backend)
            finally:
                class_plans.set_enabled(before)
            same += planned == full
    finally:
        call_plans.serve = real
    return {"op": spec.op_name, "backend": backend, "calls": len(sizes), "identical": same,
            "served by a class plan": served[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", default="50,51,53,57,64,77")
    args = p.parse_args(argv)
    plat = current_platform()
    if not plat.is_cuda:
        p.error("needs a GPU")
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for spec in families():
        for backend in ["triton"] + (["cutedsl"] if plat.cutedsl else []):
            try:
                row = check(spec, backend, sizes)
            except Exception as exc:  # recorded: one op's failure must not lose the others
                row = {"op": spec.op_name, "backend": backend, "error": f"{type(exc).__name__}: {exc}"}
            print(row, flush=True)
            rows.append(row)
    write_json(Path(args.out) / "class_plans.json", {
        "rows": rows, "provenance": provenance({**kernel_source_provenance(s.name for s in families()),
                                                "platform": str(plat)})})
    bad = [r for r in rows if r.get("identical") != r.get("calls")]
    print(f"{len(rows) - len(bad)} / {len(rows)} ops identical on every call")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
