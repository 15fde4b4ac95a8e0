"""Does each backend launch on torch's current stream? (A launch on another stream races
with torch's caching allocator: memory freed on the current stream can be reused while the
kernel still reads it.)

    python3 benchmarks/check_streams.py

For each backend: on a fresh side stream, queue a ~200 ms GPU sleep, then the kernel, then read
whether the kernel's output is already written (it must not be: the kernel is queued behind the
sleep); then capture the launch in a CUDA graph and check a replay writes the output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4kit.kernels.indexer_q import IndexerQConfig, indexer_q_kernel  # noqa: E402
from dsv4kit.kernels.indexer_q.cases import make_case  # noqa: E402


def launches_on_current_stream(exe, args, out: torch.Tensor) -> bool:
    """Queue a long sleep then the kernel on a side stream; snapshot the output from the default
    stream while the side stream is still asleep. Written already = the kernel went elsewhere."""
    side = torch.cuda.Stream()                     # torch's pool streams do not sync with stream 0
    out.fill_(-1.0)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(400_000_000)             # ~0.2 s of spinning
        exe(*args)
    snapshot = out.clone()                         # on the default stream, not waiting for `side`
    torch.cuda.current_stream().synchronize()
    still_asleep = not side.query()
    side.synchronize()
    return still_asleep and bool((snapshot == -1.0).all())


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
        kernel = indexer_q_kernel("fp8", "cuda", backend)
        kernel.warmup(IndexerQConfig())
        exe = kernel._get_or_compile(kernel.dispatch(case.index_q, case.cos_sin_cache, 64))
        outs = kernel.outputs(64, torch.device("cuda"))
        args = kernel.launch_args(*case.args(), outs, 128**-0.5, 64**-0.5)
        on_current = launches_on_current_stream(exe, args, outs[1])
        captured = graph_replays(exe, args, outs[1])
        print(f"{backend:8s} on torch's current stream: {on_current}; CUDA graph replays it: {captured}")
        ok &= on_current and captured is True
    print("STREAMS OK" if ok else "STREAMS WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
