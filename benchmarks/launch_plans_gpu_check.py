"""Launch plans on the GPU: a planned call (Triton: the direct launch of the warmed CompiledKernel;
CuTeDSL: the warmed function) writes the same bytes as the full path, eagerly and replayed from a
CUDA graph, and a bad call after the plan warmed is still a named error.

For every public op and backend: the op's valid call (``dsv4kit.testing.valid_calls``) moved to the
GPU with the same sizes, strides and offsets, value checks off. Three runs on fresh copies of the
same inputs: the full path (launch plans off), a planned call (after the calls that make the
plan: a signature is planned on its ``plan_after``-th call), and a CUDA graph of a planned call,
replayed. Each run's outputs and every tensor argument (the caches it writes) are compared byte
for byte with the full path's. On Triton, where
the full path is a direct launch too, it is itself held to the same call through ``JITFunction.run``
(which the direct launch declines while a launch hook is registered). Then four bad
calls with the plan in place (a CPU tensor, another dtype, one dim more, a meta tensor), which must
raise ``KernelInputError`` (the CPU matrix checks that it names the argument).

    python benchmarks/launch_plans_gpu_check.py --out DIR     # DIR/launch_plans.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from dsv4kit.bench import provenance, write_json
from dsv4kit.errors import KernelInputError
from dsv4kit.jit import launch_plans
from dsv4kit.jit.launch_plans import plans_of
from dsv4kit.kernels import families
from dsv4kit.platform import current_platform
from dsv4kit.results import kernel_source_provenance
from dsv4kit.testing.valid_calls import twin, valid_call


def _copy(call: dict[str, Any]) -> dict[str, Any]:
    return {k: (twin(v) if isinstance(v, torch.Tensor) else v) for k, v in call.items()}


def _bytes(result: Any, call: dict[str, Any]) -> list[bytes]:
    outs = result if isinstance(result, tuple) else (result,)
    return [t.detach().view(torch.uint8).cpu().numpy().tobytes() for t in (*outs, *call.values())
            if isinstance(t, torch.Tensor)]


def _plan_of(spec: Any) -> Any:
    for kernel in spec._kernels.values():
        for plan in plans_of(kernel).values():
            return plan
    return None


#: The row fields each op's line prints.
SHOWN = ("planned", "direct_launch", "direct_matches_jit_run", "eager_identical", "graph_identical", "error")


def _through_jit_run(spec: Any, base: dict[str, Any]) -> list[bytes]:
    """The full path with a (no-op) launch hook registered: Triton's direct launch declines such a
    call, so the warmed binary runs through ``JITFunction.run``, a launch independent of the direct
    one that the full and planned paths both take."""
    from triton import knobs

    def hook(metadata: Any) -> None:
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        with launch_plans.disabled():
            call = _copy(base)
            return _bytes(spec.op(**call), call)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)


def check(spec: Any, backend: str) -> dict[str, Any]:
    base = {k: (twin(v, "cuda") if isinstance(v, torch.Tensor) else v) for k, v in valid_call(spec).items()}
    base.update(backend=backend, debug_checks=False)
    row: dict[str, Any] = {"op": spec.op_name, "family": spec.name, "backend": backend}
    with launch_plans.disabled():
        call = _copy(base)
        want = _bytes(spec.op(**call), call)
    if backend == "triton":
        row["direct_matches_jit_run"] = _through_jit_run(spec, base) == want
    for k in spec._kernels.values():
        plans_of(k).clear()
    for _ in range(launch_plans._STATE["plan_after"]):  # the last of these makes the plan
        spec.op(**_copy(base))
    plan = _plan_of(spec)
    row["planned"] = plan is not None
    launch = getattr(plan, "launch", None)
    row["direct_launch"] = launch is not None and "_direct_launcher" in launch.__qualname__
    call = _copy(base)
    row["eager_identical"] = _bytes(spec.op(**call), call) == want
    call = _copy(base)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        spec.op(**_copy(base))                        # warm the side stream's allocator pool
        with torch.cuda.graph(graph, stream=stream):
            result = spec.op(**call)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    row["graph_identical"] = _bytes(result, call) == want
    bad: dict[str, bool] = {}
    name, t = next((k, v) for k, v in base.items() if isinstance(v, torch.Tensor))
    other = t.view(torch.uint8) if t.dtype != torch.uint8 else t.view(torch.int8)
    for kind, value in (("cpu tensor", t.cpu()), ("another dtype", other), ("one dim more", t.unsqueeze(0)),
                        ("meta tensor", t.to("meta"))):
        try:
            spec.op(**{**_copy(base), name: value})
            bad[kind] = False
        except KernelInputError:
            bad[kind] = True
        except Exception:
            bad[kind] = False
    row["bad_inputs_named"] = bad
    row["ok"] = (row["planned"] and row["eager_identical"] and row["graph_identical"] and all(bad.values())
                 and (backend != "triton" or (row["direct_launch"] and row["direct_matches_jit_run"])))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    plat = current_platform()
    if not plat.is_cuda:
        p.error("needs a GPU")
    backends = ["triton"] + (["cutedsl"] if plat.cutedsl else [])
    rows = []
    for spec in families():
        for backend in backends:
            try:
                row = check(spec, backend)
            except Exception as exc:
                row = {"op": spec.op_name, "family": spec.name, "backend": backend, "ok": False,
                       "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rows.append(row)
            print(f"{row['op']:<32} {backend:<8} {'ok' if row['ok'] else 'FAIL'} "
                  + " ".join(f"{k}={row[k]}" for k in SHOWN if k in row), flush=True)
    prov = provenance({**kernel_source_provenance(s.name for s in families()), "platform": str(plat)})
    write_json(Path(args.out) / "launch_plans.json", {"provenance": prov, "rows": rows})
    ok = sum(r["ok"] for r in rows)
    print(f"{ok}/{len(rows)} op x backend pairs identical on every path, bad inputs named")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
