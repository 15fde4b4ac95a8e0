"""Locate the K3 full-sweep fault: run the suspect sweep point step by step, synchronizing
after each step, one backend per process (a fault poisons the CUDA context).

    python3 benchmarks/k3_fault_probe.py [--nreq 16] [--rows 16384]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def probe(backend: str, nreq: int, rows: int) -> None:
    import torch
    from dequant_gather import bench_inputs, bench_ms, kernels

    from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as ref
    from dsv4kit.platform import current_platform

    k = kernels(current_platform())[backend]
    args, _ = bench_inputs(nreq, rows, 256, True, "cuda", seed=nreq * 7 + rows)
    key = k.dispatch(args[1], args[3])
    k.warmup(keys=[key])
    exe = k._get_or_compile(key)
    launch = k.launch_args(key, *args[:5], args[6])
    steps = {
        "one launch": lambda: exe(*launch),
        "graph timing": lambda: bench_ms(lambda: exe(*launch), "cuda", False, graph=True),
        "event timing (L2 flushed)": lambda: bench_ms(lambda: exe(*launch), "cuda", False, graph=False),
    }
    for name, step in steps.items():
        step()
        torch.cuda.synchronize()
        print(f"{backend}: {name}: ok", flush=True)
    want = args[0].clone()
    ref(want, *args[1:])
    same = torch.equal(args[0].view(torch.int16), want.view(torch.int16))
    print(f"{backend}: output equals the reference: {same}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nreq", type=int, default=16)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--backend")
    a = ap.parse_args()
    if a.backend:
        probe(a.backend, a.nreq, a.rows)
        return 0
    rc = 0
    for backend in ("triton", "cutedsl"):
        r = subprocess.run([sys.executable, __file__, "--backend", backend, "--nreq", str(a.nreq),
                            "--rows", str(a.rows)], check=False, capture_output=True, text=True)
        print(r.stdout[-1500:], r.stderr[-800:] if r.returncode else "", f"[{backend} rc={r.returncode}]")
        rc |= r.returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
