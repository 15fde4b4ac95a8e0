"""Warmup timing with the artifact store: cold, cold with workers, warm (all hits), first call.

    .venv/bin/python benchmarks/warmup_timing.py [--out benchmarks/results/warmup_cpu]

DSv4-Flash, every family, for two platforms of this machine: ``--device cpu`` (Triton compiled
ahead of time for sm_90a, run under the interpreter) and ``--device cuda --arch sm_90a`` (what
an H100/H200 process selects: CuTeDSL; compile only without a GPU). Each configuration runs
in a fresh Python process with its own empty Triton cache; "cold" starts from an empty store,
"warm" from the store the cold ``--jobs 1`` run filled (and still an empty Triton cache, so the
store alone supplies the artifacts). Imports are timed separately from warmup. On CPU the warm
run then times the first real call of a warmed Triton op under the interpreter (K3
dequant-gather, block size 64).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "warmup_cpu"

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, triton
from dsv4kit.jit import ArtifactStore, WarmupRegistry
from dsv4kit.model.stack import DSv4AttentionStack, gpu_platform, warmup
from dsv4kit.platform import cpu_platform
device, jobs, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if device == "cuda":
    import cutlass.cute  # CuTeDSL kernels import it; count it with the imports
t_import = time.perf_counter() - t0
t1 = time.perf_counter()
plat = gpu_platform("sm_90a") if device == "cuda" else cpu_platform("sm_90a")
stack = DSv4AttentionStack("flash", plat)
t_build = time.perf_counter() - t1
report = warmup(stack.registry, jobs=jobs, store=ArtifactStore(root), progress=False)
rows = report.rows()
out = {"import_s": t_import, "build_s": t_build, "warmup_s": report.wall_seconds,
       "keys": report.num_keys, "failures": len(report.failures),
       "hits": sum(r.get("origin") == "hit" for r in rows),
       "compiled": sum(r.get("origin") == "compiled" for r in rows),
       "pool_keys": getattr(report, "pool_keys", 0),
       "backends": sorted({k.backend for k in report.kernels})}
if "--first-call" in sys.argv:  # CPU: Triton under the interpreter; cuda: the warmed kernel on the GPU
    from dsv4kit.kernels.dequant_gather.cases import make_case
    from dsv4kit.ops import dequantize_and_gather_k_cache
    from dsv4kit.jit import JitMonitor
    case = make_case([5], block_size=64, device=device if torch.cuda.is_available() else "cpu")
    with JitMonitor("error"):
        t2 = time.perf_counter()
        dequantize_and_gather_k_cache(*case.args(), platform=plat)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out["first_call_s"] = time.perf_counter() - t2
print("RESULT " + json.dumps(out))
"""


def run_config(device: str, jobs: int, store: Path, first_call: bool = False) -> dict:
    """One configuration in a fresh process with an empty Triton cache; its measurements."""
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as tc:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "TRITON_CACHE_DIR": tc, "PYTHONPATH": path}   # keep a CuTeDSL bundle's path
        argv = [sys.executable, "-c", _CHILD, device, str(jobs), str(store)]
        t0 = time.perf_counter()
        proc = subprocess.run(argv + (["--first-call"] if first_call else []), capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=1800)
        wall = time.perf_counter() - t0
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{device} jobs={jobs} failed:\n{proc.stderr[-3000:]}")
    return {"device": device, "jobs": jobs, "process_wall_s": wall, **json.loads(line[len("RESULT "):])}


def provenance() -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    load = os.getloadavg()
    cpu = f"{os.cpu_count()} cores ({platform.processor() or platform.machine()})"
    where = f"{torch.cuda.get_device_name()} host, {cpu}" if torch.cuda.is_available() else f"CPU only, {cpu}"
    return {"date": datetime.date.today().isoformat(), "commit": os.environ.get("DSV4KIT_COMMIT") or commit,
            "device": where,
            "load_average_at_start": [round(x, 2) for x in load],
            "versions": {d: version(d) for d in ("torch", "triton", "nvidia-cutlass-dsl", "apache-tvm-ffi")}
            | {"python": platform.python_version()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--jobs", type=int, default=min(8, max(2, (os.cpu_count() or 2) // 2)),
                    help="workers of the parallel cold run (default: half the cores, 2 to 8)")
    args = ap.parse_args()
    prov = provenance()
    runs = []
    with tempfile.TemporaryDirectory(prefix="dsv4kit-bench-store-") as tmp:
        for device in ("cpu", "cuda"):
            cold, cold2 = Path(tmp) / f"{device}-cold1", Path(tmp) / f"{device}-cold2"
            first = device == "cpu" or torch.cuda.is_available()   # a first real call where one can run
            plan = (("cold", 1, cold, False), ("cold", args.jobs, cold2, False), ("warm", 1, cold, first))
            for phase, jobs, store, f in plan:
                r = {"phase": phase, **run_config(device, jobs, store, f)}
                print(json.dumps(r), flush=True)
                runs.append(r)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "warmup_timing.json").write_text(json.dumps({"provenance": prov, "runs": runs}, indent=2))
    print(f"written to {args.out / 'warmup_timing.json'}")


if __name__ == "__main__":
    main()
