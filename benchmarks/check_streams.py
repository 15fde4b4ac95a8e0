"""Does each backend launch on torch's current stream?

    python3 benchmarks/check_streams.py

A launch on another stream would race with torch's caching allocator. The check captures one
launch of each backend in a CUDA graph (torch captures on a side stream in global mode, where a
launch onto any other stream fails the capture) and replays it into a poisoned output.
Recorded 2026-11-30 on the H200: both backends captured and replayed. (A first version also
probed with a sleeping side stream; torch's pool streams synchronize with the legacy default
stream, so that probe could not tell the streams apart and was removed.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.kernels.indexer_q import SPEC, IndexerQConfig  # noqa: E402
from dsv4kit.kernels.indexer_q.cases import make_case  # noqa: E402


def graph_replays(exe, args, out: torch.Tensor) -> bool | str:
    """Capture one launch in a CUDA graph; a replay must write the output."""
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            exe(*args)
    except Exception as exc:
        return f"capture failed: {type(exc).__name__}: {exc}"[:200]
    out.fill_(-1.0)
    g.replay()
    torch.cuda.synchronize()
    return bool((out != -1.0).all())


def main() -> int:
    ok = True
    case = make_case(64, seed=0).to("cuda")
    for backend in ("triton", "cutedsl"):
        kernel = SPEC.kernel("fp8", "cuda", backend)
        kernel.warmup(IndexerQConfig())
        exe = kernel._get_or_compile(kernel.dispatch(case.index_q, case.cos_sin_cache, 64))
        outs = kernel.outputs(64, torch.device("cuda"))
        args = kernel.launch_args(*case.args(), outs, 128**-0.5, 64**-0.5)
        captured = graph_replays(exe, args, outs[1])
        print(f"{backend:8s} captured on torch's current stream and replayed: {captured}")
        ok &= captured is True
    print("STREAMS OK" if ok else "STREAMS WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
