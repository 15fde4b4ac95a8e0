#!/usr/bin/env python3
"""The K3 full-sweep fault, reproduced on purpose: is the timing harness ordered after the
caller's stream? (GPU regression check of the fix in ``dsv4kit/bench.py``.)

    python3 benchmarks/k3_fault_probe.py --out DIR

Root cause (``benchmarks/results/NOTES.md``, K3): ``triton.testing.do_bench_cudagraph``, which
``dsv4kit.bench.bench_median_ms`` used to call, runs the timed function on a fresh
``torch.cuda.Stream()`` that never waits for the caller's stream. The sweep creates each point's
inputs (random cache, block table, lengths) on the current stream and times at once, so the
first eager launches of the kernel could run before those writes had landed, reading a block
table still holding the previous contents of a reused allocation: pages far outside the cache,
an illegal address. ``CUDA_LAUNCH_BLOCKING=1`` hid it (every launch completes before the next).

Two parts, both make the race certain instead of a matter of timing: the writes of the inputs
are queued behind ``torch.cuda._sleep`` on the current stream, and a harness is called at once.
First the process is *primed* as the sweep is when it times a point (torch's stream pool created,
the kernel's module loaded): in a fresh process those first uses synchronize with the device and
hide the race (the first version of this probe saw no race for that reason, H200, 2026-12-01).

1. ``ordering``: a function whose first call snapshots a flag written behind the sleep (in this
   process: no variant can fault). Every harness must see the written flag. Triton's
   ``do_bench_cudagraph`` sees the stale value (the check fails for the harness as it was
   before the fix); ``bench_median_ms`` must not.
2. ``k3``: the suspect sweep point (B=256, gather_lens, 16 requests x 16384 rows), its block
   table first filled with a page index far past the cache, the true table copied in behind the
   sleep. One subprocess per (harness, backend, CUDA_LAUNCH_BLOCKING), since a fault poisons the
   context: the old harness is expected to fault ("illegal memory access"), the fixed one to
   complete with the output bit-exact to the reference, and the old one under launch blocking to
   complete as well (as the full sweep did).

Writes ``k3_fault_probe.json`` under ``--out``; exit 0 when every expectation held.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: GPU cycles the current stream sleeps before the inputs are written (~0.1 s at ~2 GHz).
SLEEP_CYCLES = 200_000_000
#: A block-table entry far past any cache (stands in for the stale contents of a reused block).
STALE_PAGE = 0x3FFFFFFF


def harness(name: str):
    """The timing call under test: ``triton`` is what bench_median_ms was before the fix."""
    if name == "triton":
        from triton.testing import do_bench_cudagraph

        return lambda fn: float(do_bench_cudagraph(fn, rep=20, return_mode="median"))
    from dsv4kit.bench import bench_median_ms

    if name == "dsv4kit":
        return lambda fn: bench_median_ms(fn, graph=True, rep_ms=20)
    if name == "dsv4kit-events":
        return lambda fn: bench_median_ms(fn, graph=False, rep_ms=20)
    raise ValueError(name)


def prime() -> None:
    """Put the process in the state the sweep is in when it times a point: torch's stream pool
    created and the kernels' modules loaded. Both first uses synchronize with the device (pool
    creation, module load), which hides the race in a fresh process (seen on the H200)."""
    import torch

    with torch.cuda.stream(torch.cuda.Stream()):
        torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()


def ordering(name: str) -> dict:
    """Does the harness's first call of ``fn`` see a write queued before it on the caller's stream?"""
    import torch

    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    first = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    calls = [0]

    def fn() -> None:
        if calls[0] == 0:
            first.copy_(flag)
        else:
            sink.copy_(flag)
        calls[0] += 1

    prime()
    torch.cuda._sleep(SLEEP_CYCLES)
    flag.fill_(1)                      # queued behind the sleep on the caller's stream
    ms = harness(name)(fn)
    torch.cuda.synchronize()
    seen = int(first.item())
    return {"harness": name, "first_call_saw": seen, "ordered": seen == 1, "calls": calls[0], "ms": ms}


def k3_point(name: str, backend: str, nreq: int, rows: int) -> dict:
    """The suspect sweep point with a stale block table replaced behind a sleep, then timed."""
    import torch

    from dsv4kit.bench import backend_kernels
    from dsv4kit.kernels import family
    from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as ref
    from dsv4kit.kernels.dequant_gather.bench import dequant_gather_inputs
    from dsv4kit.platform import current_platform

    k = backend_kernels(family("dequant_gather"), current_platform())[backend]
    # (out, k_cache, seq_lens, gather_lens, block_table, block_size, offset): the sweep's inputs
    args = tuple(dequant_gather_inputs(nreq, rows, 256, True, "cuda", seed=nreq * 7 + rows).values())
    key = k.dispatch(args[1], args[3])
    k.warmup(keys=[key])
    exe = k._get_or_compile(key)
    launch = k.launch_args(key, *args[:5], args[6])
    exe(*launch)                      # the module loaded, as in the sweep (numerics ran it before)
    prime()
    bt = args[4]
    true_bt = bt.clone()
    bt.fill_(STALE_PAGE)
    args[0].view(torch.uint8).fill_(0xA5)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    bt.copy_(true_bt)                 # the table the sweep wrote, landing late
    t0 = time.perf_counter()
    ms = harness(name)(lambda: exe(*launch))
    torch.cuda.synchronize()
    want = args[0].clone()
    want.view(torch.uint8).fill_(0xA5)
    ref(want, *args[1:])
    exact = torch.equal(args[0].view(torch.int16), want.view(torch.int16))
    return {"ms": ms, "seconds": time.perf_counter() - t0, "output_equals_reference": bool(exact)}


def run_child(argv: list[str], env_extra: dict[str, str], timeout: int = 300) -> dict:
    env = dict(os.environ, **env_extra)
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, __file__, *argv], check=False, capture_output=True, text=True,
                           env=env, timeout=timeout)
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, str(exc.stdout or ""), "timeout"
    result = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
    return {"rc": rc, "result": result, "illegal_address": "illegal memory access" in (out + err),
            "stderr_tail": err[-600:], "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--nreq", type=int, default=16)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--child", choices=["k3"])
    ap.add_argument("--harness", default="dsv4kit")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--backends", default="triton,cutedsl")
    ap.add_argument("--lean", action="store_true", help="no launch-blocking and no events variants")
    a = ap.parse_args()
    if a.child == "k3":
        print("RESULT " + json.dumps(k3_point(a.harness, a.backend, a.nreq, a.rows)), flush=True)
        return 0

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU")
        return 2
    from dsv4kit.bench import provenance
    from dsv4kit.results import kernel_source_hash

    report: dict = {"provenance": provenance({"check": "k3_fault_probe", "family": "dequant_gather",
                                             "kernel_source_hash": kernel_source_hash("dequant_gather"),
                                             "sleep_cycles": SLEEP_CYCLES}),
                    "ordering": [], "k3": []}
    ok = True
    # 1. ordering of the harness alone (the regression check: "triton" is the harness before the fix).
    harnesses = [("triton", False), ("dsv4kit", True)] + ([] if a.lean else [("dsv4kit-events", True)])
    for name, want in harnesses:
        r = ordering(name)   # in this process: no variant faults, a stale read is all it can show
        saw = r["ordered"]
        r.update(expected_ordered=want, as_expected=saw == want)
        ok &= (saw is True) if name != "triton" else True   # only the fixed harness must hold
        report["ordering"].append(r)
        print(f"ordering  {name:15s} first call saw the queued write: {saw} (expected {want})", flush=True)
    # 2. the suspect K3 point.
    for backend in a.backends.split(","):
        variants = [("triton", {}, False), ("dsv4kit", {}, True)]
        if backend == "triton" and not a.lean:   # launch blocking hides the race (as in the full sweep)
            variants.append(("triton", {"CUDA_LAUNCH_BLOCKING": "1"}, True))
        for name, env, want_ok in variants:
            r = run_child(["--child", "k3", "--harness", name, "--backend", backend, "--nreq", str(a.nreq),
                           "--rows", str(a.rows)], env)
            clean = r["rc"] == 0 and bool(r["result"] and r["result"]["output_equals_reference"])
            r.update(harness=name, backend=backend, env=env, expected_clean=want_ok, clean=clean,
                     as_expected=clean == want_ok)
            if name == "dsv4kit":
                ok &= clean
            report["k3"].append(r)
            print(f"k3 {backend:8s} {name:8s} {'CLB=1' if env else '     '} rc={r['rc']} clean={clean} "
                  f"illegal_address={r['illegal_address']} (expected clean={want_ok})", flush=True)
    report["fixed_harness_ok"] = ok
    report["all_as_expected"] = all(r["as_expected"] for r in report["ordering"] + report["k3"])
    print(f"fixed harness ordered and clean: {ok}; every expectation (old harness races too): "
          f"{report['all_as_expected']}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "k3_fault_probe.json").write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
