"""Timing harness for GPU benchmarks: copy-bandwidth ceiling, medians, provenance, result files.

Every benchmark script reports bandwidth from an explicit bytes model against the copy
bandwidth measured in the same run, so a number is never compared with a datasheet.

The sweep of ``dsv4kit bench`` lives here too: one :class:`SweepPlan` per kernel family (or per
kernel folder whose ops share a core) in :data:`PLANS`, each with its sizes, its bytes model (the
``*_bytes`` functions, the same models the ``benchmarks/`` scripts recorded with) and a builder of
the op's arguments at one size from the family's seeded ``cases`` module; :func:`run_sweep`
times, per point and backend, the kernel (the op captured in a CUDA graph and replayed: GPU time
only), the whole op call (events over back-to-back calls), the eager reference and
``torch.compile`` of it, into :class:`dsv4kit.bench_schema.BenchRow` rows.

Graph replays re-read the same buffers, so a point whose bytes fit a few times in the GPU's L2
(50 MiB on the H200) is timed partly from L2 and can read above the copy ceiling: such points are
marked ``L2`` in the log, the provenance records the L2 size, and every plan's largest size clears
:data:`L2_MULTIPLE` times it (a test holds the sizes to that) unless the plan says why it cannot.
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import json
import os
import platform as _platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "H200_L2_BYTES",
    "L2_MULTIPLE",
    "PLANS",
    "BenchResult",
    "Point",
    "SweepPlan",
    "backend_kernels",
    "bench_median_ms",
    "c128_compress_bytes",
    "c128_store_bytes",
    "c4_compress_bytes",
    "copy_bandwidth_gbs",
    "dequant_gather_bytes",
    "empty_kernel_us",
    "graph_median_ms",
    "in_request_order",
    "indexer_q_bytes",
    "no_cuda_for",
    "provenance",
    "run_child",
    "rowquant_bytes",
    "run_sweep",
    "save_partial_states_bytes",
    "store_rows_bytes",
    "select_plans",
    "write_csv",
    "write_json",
]


#: The H200's L2 in bytes (``L2_cache_size``): what the sizes of :data:`PLANS` are held against.
H200_L2_BYTES = 50 * 2**20
#: A point under this many L2s of bytes is marked as timed partly from L2.
L2_MULTIPLE = 4


def no_cuda_for(script: str) -> bool:
    """True, after saying so on stderr, when no CUDA device is visible to the GPU check ``script``
    (which then exits 2; its ``--cpu-smoke`` runs the script's paths on CPU instead)."""
    if torch.cuda.is_available():
        return False
    print(f"{script}: needs a CUDA device (none is visible); --cpu-smoke runs the script's paths on CPU",
          file=sys.stderr)
    return True


def provenance(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Device, versions, date and commit of this run, and the package's own version and kernel
    source hashes (:func:`dsv4kit.results.package_provenance`). The commit is ``DSV4KIT_COMMIT``
    when set (the operator's word, for a copied tree), else that of the package's own git checkout,
    else ``unknown``: never the commit of a repository that merely encloses the tree."""
    from dsv4kit.results import package_provenance

    package = package_provenance()
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("DSV4KIT_COMMIT") or package["commit"],
        "dsv4kit": package["dsv4kit"],
        "python": _platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        from importlib.metadata import version

        info["nvidia-cutlass-dsl"] = version("nvidia-cutlass-dsl")
    except Exception:
        info["nvidia-cutlass-dsl"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, sm=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1), l2_cache_bytes=p.L2_cache_size,
                    cuda=torch.version.cuda)
    else:
        info["device"] = "cpu"
    info.update(extra or {})
    return info


def bench_median_ms(fn: Callable[[], Any], *, graph: bool = True, rep_ms: int = 200) -> float:
    """Median time of ``fn`` in ms: CUDA-graph replays when possible (no launch gaps), else events.

    Both are ordered after the work already queued on the caller's current stream (the inputs
    ``fn`` reads may still be being written there) and leave the caller's stream ordered after
    everything they ran: see :func:`graph_median_ms`.
    """
    from triton.testing import do_bench

    if graph:
        try:
            return graph_median_ms(fn, rep_ms=rep_ms)
        except Exception:  # some launchers cannot be captured; fall back to plain events
            torch.cuda.synchronize()  # (a device fault is sticky: this raises it instead)
    return float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def graph_median_ms(fn: Callable[[], Any], *, rep_ms: int = 200, retries: int = 10) -> float:
    """Median ms of one ``fn`` from replays of a CUDA graph of ``fn`` unrolled to about ``rep_ms``.

    The method of ``triton.testing.do_bench_cudagraph`` (one eager call, a 5-call estimate, a
    graph of ``rep_ms / estimate`` calls, ``retries`` timed replays), with one difference that
    matters: Triton's version runs ``fn`` on a fresh ``torch.cuda.Stream()`` (a pool stream,
    created non-blocking) that never waits for the caller's stream, so its first eager calls can
    start while the caller's queued writes of ``fn``'s inputs are still running. In the K3 sweep
    the kernel then read a block table and lengths that still held the previous contents of
    reused allocations, and faulted on an illegal address at the same point of every full run,
    never under ``CUDA_LAUNCH_BLOCKING=1`` (``benchmarks/results/NOTES.md``; reproduced on purpose
    by ``benchmarks/k3_fault_probe.py``). Here the side stream waits for the caller's stream
    first, and the caller's stream waits for the side stream at the end.
    """
    caller = torch.cuda.current_stream()
    side = torch.cuda.Stream(device=caller.device)
    side.wait_stream(caller)  # fn's inputs may still be being written on the caller's stream
    try:
        with torch.cuda.stream(side):
            fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                fn()
            end.record()
            end.synchronize()
            estimate_ms = start.elapsed_time(end) / 5
            n_repeat = 1000 if estimate_ms == 0 else max(1, int(rep_ms / estimate_ms))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # (synchronizes the device before capturing)
                for _ in range(n_repeat):
                    fn()
            times = []
            for _ in range(retries):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / n_repeat)
    finally:
        caller.wait_stream(side)
    torch.cuda.synchronize()  # nothing of the graph is in flight when it is destroyed
    del g
    times.sort()
    mid = len(times) // 2
    return float(times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2)


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), median of many copies."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench_median_ms(lambda: dst.copy_(src), graph=False, rep_ms=400)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def run_child(cmd: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """Run one configuration in its own process: ``(returncode, stdout + stderr)``; a timeout is
    returncode -1 with what the child printed so far."""
    try:
        run = subprocess.run(list(cmd), capture_output=True, text=True, env=dict(env), timeout=timeout)
        return run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as exc:
        out = "".join(x.decode() if isinstance(x, bytes) else x for x in (exc.stdout or "", exc.stderr or ""))
        return -1, f"timed out after {timeout} s\n{out}"


def write_json(path: str | Path, obj: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2, default=str) + "\n")


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        w.writerows(rows)


def backend_kernels(spec: Any, platform: Any, variant: str = "default",
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """One kernel object of ``spec`` per backend that can run on ``platform`` (Triton always,
    CuTeDSL where it imports), chosen by the platform's backend predicate; the others are logged."""
    out = {}
    for backend in ("triton", "cutedsl"):
        try:
            out[backend] = spec.kernel(variant, platform.device, backend, platform)
        except Exception as exc:  # CuTeDSL not installed, or not runnable here
            log(f"{backend} kernel unavailable: {type(exc).__name__}: {exc}")
    return out


# --------------------------------------------------------------------------- bytes models
# Every input read once, every output written once (the models of the benchmarks/ scripts; the
# tests check them against the ``bytes`` column of every recorded run).


def indexer_q_bytes(cache_format: str, tokens: int, cos_sin_bytes: int = 4) -> int:
    """K1 / K2: q (64 x 128 bf16), weights, position, one cos/sin row read; codes, scales written."""
    t = tokens
    read = t * 64 * 128 * 2 + t * 64 * 2 + t * 8 + t * 64 * cos_sin_bytes
    write = t * 64 * 128 + t * 64 * 4 if cache_format == "fp8" else t * 64 * 64 + t * 64 * 4 + t * 64 * 4
    return read + write


def dequant_gather_bytes(nreq: int, rows_per_request: int, block_size: int, has_gather_lens: bool) -> int:
    """K3: per gathered row 448 code + 128 rope + 7 scale bytes read, 1024 bytes written; one
    4-byte block-table entry per page touched (a window call touches one page more)."""
    pages = nreq * (-(-rows_per_request // block_size) + (1 if has_gather_lens else 0))
    return nreq * rows_per_request * (448 + 128 + 7 + 1024) + 4 * pages


def save_partial_states_bytes(state_width: int, compress_ratio: int, tokens: int) -> int:
    """K4: kv and score rows read, ``min(R, T)`` ape rows, positions and slots; state rows written."""
    t, sw = tokens, state_width
    return 4 * (2 * t * sw + min(compress_ratio, t) * sw + 2 * t * sw) + 16 * t


#: Bytes of one compressed cache entry per (op, format) of the C4 / C128 store formats.
ENTRY_BYTES = {"fp8_ds_mla": 584, "bf16": 1024, "e4m3": 512, "fp8": 132, "mxfp4": 68}


def c4_compress_bytes(head_size: int, tokens: int, entries: int, entry_bytes: int) -> int:
    """K5 / K6 / K9: every state row read once (``T * 4 * head`` fp32), every written entry, and
    the per-token arrays (positions, slots, kv slots int64; token_to_req int32)."""
    return 4 * tokens * 4 * head_size + entries * entry_bytes + tokens * (3 * 8 + 4)


def c128_compress_bytes(tokens: int, boundaries: int) -> int:
    """K7: 128 state rows of 1024 fp32 per boundary token, the per-token arrays (token_to_req,
    positions, slots), 512 fp32 written per boundary row."""
    return boundaries * 128 * 1024 * 4 + tokens * (4 + 8 + 8) + boundaries * 512 * 4


def c128_store_bytes(tokens: int, entries: int, entry_bytes: int, norm_weight_bytes: int) -> int:
    """K8a / K8b: the per-token arrays (positions, slots, kv slots: 24 B), 512 fp32 read per
    written row, the norm weight once, every written entry."""
    return tokens * 24 + entries * 512 * 4 + norm_weight_bytes + entries * entry_bytes


def store_rows_bytes(tokens: int, entries: int, head_size: int, entry_bytes: int) -> int:
    """E1-E5: the slots (int64 per row), an fp32 row read and an entry written per live slot."""
    return tokens * 8 + entries * (head_size * 4 + entry_bytes)


def rowquant_bytes(rows: int, cols: int, block: int = 128) -> int:
    """rowquant: the bf16 matrix read, the e4m3 codes and one fp32 scale per block written."""
    return rows * cols * 2 + rows * cols + rows * (cols // block) * 4


# --------------------------------------------------------------------------- sweep plans


@dataclass(frozen=True)
class Point:
    """One timed point: the family (op) it calls, its row labels, bytes and argument builder.

    ``build(device)`` returns the op's arguments by name (the variant argument included).
    """

    family: str
    kernel: str
    config: str
    size: int
    nbytes: int
    build: Callable[[str], dict[str, Any]] = field(compare=False, repr=False)


@dataclass(frozen=True)
class SweepPlan:
    """The sweep of one family or kernel folder: sizes, and the points at one size.

    ``families``: the :func:`dsv4kit.kernels.family` names whose ops it times. ``sizes``: the
    default large sizes; ``decode_sizes``: the decode sizes swept too (token-count axes only).
    ``size_axis``: what ``size`` counts. ``hash_family``: the name given to
    :func:`dsv4kit.results.kernel_source_hash` for the provenance. ``in_l2_why``: set where even
    the largest size stays under :data:`L2_MULTIPLE` L2s of bytes, saying why.
    """

    name: str
    families: tuple[str, ...]
    sizes: tuple[int, ...]
    points: Callable[[int], list[Point]] = field(compare=False, repr=False)
    decode_sizes: tuple[int, ...] = ()
    size_axis: str = "tokens T"
    hash_family: str = ""
    in_l2_why: str = ""

    def default_sizes(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((*self.decode_sizes, *self.sizes)))


def _split(total: int, n: int = 4) -> tuple[int, ...]:
    """``total`` tokens over ``min(n, total)`` requests, as even as possible."""
    k = max(1, min(n, total))
    return tuple(total // k + (1 if i < total % k else 0) for i in range(k))


def _indexer_q_points(t: int) -> list[Point]:
    def build(fmt: str) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.indexer_q.cases import make_case

            c = make_case(t, torch.float32, seed=t).to(device)
            names = ("positions", "index_q", "cos_sin_cache", "index_weights")
            return {**dict(zip(names, c.args(), strict=True)), "cache_format": fmt}

        return make

    return [Point("indexer_q", f"indexer_q/{fmt}", "", t, indexer_q_bytes(fmt, t), build(fmt))
            for fmt in ("fp8", "mxfp4")]


#: K3 keys swept: (block size, has gather_lens), and the requests a point's rows are spread over.
DEQUANT_KEYS = ((256, True), (64, False), (2, False))
DEQUANT_NREQ = 16


def _dequant_points(rows: int) -> list[Point]:
    nreq = min(DEQUANT_NREQ, rows)
    per = rows // nreq

    def build(bs: int, with_g: bool) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            return dequant_gather_inputs(nreq, per, bs, with_g, device, seed=nreq * 7 + per)

        return make

    return [Point("dequant_gather", "dequant_gather",
                  f"block_size={bs} {'gather_lens' if g else 'no gather_lens'} nreq={nreq}", nreq * per,
                  dequant_gather_bytes(nreq, per, bs, g), build(bs, g)) for bs, g in DEQUANT_KEYS]


def dequant_gather_inputs(nreq: int, rows: int, bs: int, with_g: bool, device: str, seed: int = 0
                          ) -> dict[str, Any]:
    """K3 arguments of one point (``benchmarks/dequant_gather.py``'s sweep inputs): ``rows`` rows
    per request of random entries; a window call reads the last ``rows`` of ``rows + 1000`` at
    offset 64, a compressed call all ``rows`` at offset 0."""
    from dsv4kit.formats.ds_mla import allocate_ds_cache, ds_page_regions

    gen = torch.Generator(device=device).manual_seed(seed)
    length = rows + 1000 if with_g else rows
    blocks = -(-length // bs)
    num_pages = nreq * blocks + 1
    cache = allocate_ds_cache(num_pages, bs, fill=0xA5, device=device)
    data, scales = ds_page_regions(cache)

    def ints(lo: int, hi: int, n: int) -> torch.Tensor:
        return torch.randint(lo, hi, (num_pages, bs, n), generator=gen, device=device, dtype=torch.int32)

    data[:, :, :448] = (ints(0, 0x7F, 448) | (ints(0, 2, 448) << 7)).to(torch.uint8)
    data[:, :, 448:] = ints(0, 256, 128).to(torch.uint8)
    scales[:, :, :7] = ints(105, 255, 7).to(torch.uint8)
    scales[:, :, 7] = 0
    perm = torch.randperm(num_pages, generator=gen, device=device)[: nreq * blocks]
    offset = 64 if with_g else 0
    return {"out": torch.empty((nreq, offset + rows, 512), dtype=torch.bfloat16, device=device),
            "k_cache": cache, "seq_lens": torch.full((nreq,), length, dtype=torch.int32, device=device),
            "gather_lens": torch.full((nreq,), rows, dtype=torch.int32, device=device) if with_g else None,
            "block_table": perm.view(nreq, blocks).to(torch.int32).contiguous(), "block_size": bs,
            "offset": offset}


#: The DSv4-Flash K4 configs: (state width, compress ratio, state block size).
K4_CONFIGS = ((1024, 4, 4), (512, 128, 8), (256, 4, 4))


def save_partial_states_inputs(cfg: tuple[int, int, int], t: int, device: str, seed: int = 0
                               ) -> dict[str, Any]:
    """K4 arguments of one point: kv / score column slices of one ``[T, 2 SW]`` buffer, a state
    cache with one spare block, block-shuffled slots (``benchmarks/save_partial_states.py``)."""
    from dsv4kit.formats.state_cache import allocate_state_cache

    sw, r, sbs = cfg
    g = torch.Generator(device=device).manual_seed(seed)
    kv_score = torch.randn(t, 2 * sw, device=device, generator=g)
    nsb = -(-t // sbs) + 1
    blocks = torch.randperm(nsb, device=device, generator=g)
    tok = torch.arange(t, device=device)
    return {"kv": kv_score[:, :sw], "score": kv_score[:, sw:],
            "ape": torch.randn(r, sw, device=device, generator=g),
            "positions": torch.arange(t, device=device, dtype=torch.int64) + 7,
            "state_cache": allocate_state_cache(nsb, sbs, sw, device=device),
            "slot_mapping": (blocks[tok // sbs] * sbs + tok % sbs).to(torch.int64),
            "state_block_size": sbs, "state_width": sw, "compress_ratio": r}


def _k4_points(t: int) -> list[Point]:
    def build(cfg: tuple[int, int, int]) -> Callable[[str], dict[str, Any]]:
        return lambda device: save_partial_states_inputs(cfg, t, device, seed=t)

    return [Point("save_partial_states", "save_partial_states", f"SW={sw} R={r} sbs={sbs} layout=slices", t,
                  save_partial_states_bytes(sw, r, t), build((sw, r, sbs))) for sw, r, sbs in K4_CONFIGS]


#: C4 points: (op, make_case keywords, config label, head size, entry bytes).
C4_POINTS = (
    ("c4_compress_ds_mla", {}, "", 512, ENTRY_BYTES["fp8_ds_mla"]),
    ("c4_compress_plain", {}, "", 512, ENTRY_BYTES["bf16"]),
    ("c4_compress_plain", {"fp8_scale": 0.5}, "fp8_scale=0.5", 512, ENTRY_BYTES["e4m3"]),
    ("indexer_compress", {"use_fp4": False}, "use_fp4=False", 128, ENTRY_BYTES["fp8"]),
    ("indexer_compress", {"use_fp4": True}, "use_fp4=True", 128, ENTRY_BYTES["mxfp4"]),
)


def _decode_starts(lens: tuple[int, ...], ratio: int, tokens: int) -> tuple[int, ...] | None:
    """At decode sizes (``tokens <= 256``): starts past the first windows such that each request's
    last token closes a window (a decode step that writes); None (start at 0) above."""
    if tokens > 256:
        return None
    return tuple(ratio * (-(-(n + 2 * ratio) // ratio)) - n for n in lens)


def _boundaries(lens: tuple[int, ...], starts: tuple[int, ...] | None, ratio: int) -> int:
    """Tokens closing a window: positions p with ``(p + 1) % ratio == 0``."""
    starts = starts or tuple(0 for _ in lens)
    return sum((s + n) // ratio - s // ratio for s, n in zip(starts, lens, strict=True))


#: Per-token arrays of the compressor ops (what :func:`in_request_order` sorts).
_PER_TOKEN = ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping")


def in_request_order(args: Mapping[str, Any]) -> dict[str, Any]:
    """A compressor call with its tokens sorted by (request, position), the layout of a serving
    batch. The cases interleave requests (kernels must not assume an order); the sweep measures
    the order production has. Same tokens, same bytes; only the order of the per-token arrays."""
    order = torch.argsort(args["token_to_req"].long() * (1 << 40) + args["positions"])
    return {k: (v[order].contiguous() if k in _PER_TOKEN and v is not None else v) for k, v in args.items()}


def _c4_points(t: int) -> list[Point]:
    lens = _split(t)
    starts = _decode_starts(lens, 4, t)
    entries = _boundaries(lens, starts, 4)

    def build(op: str, kw: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.c4_compress.cases import make_case

            case = make_case(op, lens=lens, starts=starts, kv_bs=64, padding=False, seed=t, **kw)
            return in_request_order(case.fresh(device).args)

        return make

    return [Point(op, op, cfg, t, c4_compress_bytes(head, t, entries, eb), build(op, kw))
            for op, kw, cfg, head, eb in C4_POINTS]


def _c128_points(t: int) -> list[Point]:
    lens = _split(t)
    starts = _decode_starts(lens, 128, t)

    def make(device: str) -> dict[str, Any]:
        from dsv4kit.kernels.c128_compress.cases import make_k7_case

        case = make_k7_case(lens=lens, starts=starts, padding=False, seed=t)
        return in_request_order(case.fresh(device).args)

    nbytes = c128_compress_bytes(t, _boundaries(lens, starts, 128))
    return [Point("c128_compress", "c128_compress", "", t, nbytes, make)]


#: K8 sweep points: (op, case keywords, config, entry format).
K8_POINTS = (
    ("c128_norm_rope_store_ds_mla", {}, "", "fp8_ds_mla"),
    ("c128_norm_rope_store_plain", {}, "bf16", "bf16"),
    ("c128_norm_rope_store_plain", {"fp8_scale": 0.5}, "fp8_scale=0.5", "e4m3"),
)


def _k8_points(t: int) -> list[Point]:
    boundaries = max(1, t // 128)   # one token in 128 closes a window

    def build(op: str, kw: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.c128_compress.cases import make_k8_case

            case = make_k8_case(op, t=t, boundaries=boundaries, kv_bs=64, padding=False, seed=t, **kw)
            return dict(case.fresh(device).args)

        return make

    out = []
    for op, kw, cfg, fmt in K8_POINTS:
        make = build(op, kw)
        a = make("cpu")             # the written entries and the norm weight's bytes, from the case
        entries = int(((a["slot_mapping"] >= 0) & ((a["positions"] + 1) % 128 == 0)
                       & (a["kv_slot_mapping"] >= 0)).sum())
        w = a["rms_norm_weight"]
        nbytes = c128_store_bytes(t, entries, ENTRY_BYTES[fmt], w.numel() * w.element_size())
        out.append(Point(op, op, cfg, t, nbytes, make))
    return out


#: Store-hook sweep points: (op, case keywords, config, head size, entry format).
STORE_POINTS = (
    ("store_rows_ds", {}, "", 512, "fp8_ds_mla"),
    ("store_rows_plain", {}, "bf16", 512, "bf16"),
    ("store_rows_plain", {"fp8_scale": 0.5}, "fp8_scale=0.5", 512, "e4m3"),
    ("store_rows_indexer", {"use_fp4": False}, "use_fp4=False", 128, "fp8"),
    ("store_rows_indexer", {"use_fp4": True}, "use_fp4=True", 128, "mxfp4"),
)


def _store_points(t: int) -> list[Point]:
    def build(op: str, kw: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            from dsv4kit.kernels.encoders.cases import make_case

            return dict(make_case(op, t, kv_bs=64, seed=t, **kw).fresh(device).args)

        return make

    from dsv4kit.kernels.encoders.cases import written_rows

    return [Point(op, op, cfg, t, store_rows_bytes(t, written_rows(t), head, ENTRY_BYTES[fmt]), build(op, kw))
            for op, kw, cfg, head, fmt in STORE_POINTS]


def _rowquant_points(m: int) -> list[Point]:
    n = 4096

    def make(device: str) -> dict[str, Any]:
        from dsv4kit.kernels.rowquant.cases import regime

        return {"x": regime("normal", m, n, seed=m).to(device=device, dtype=torch.bfloat16)}

    return [Point("rowquant", "rowquant", f"n_cols={n}", m, rowquant_bytes(m, n), make)]


_DECODE = (1, 8, 64, 256)
#: Every family with a sweep, by plan name (``c128_store``: K8a / K8b; ``store_rows``: E1-E5).
PLANS: dict[str, SweepPlan] = {p.name: p for p in (
    SweepPlan("indexer_q", ("indexer_q",), (1024, 8192, 65536), _indexer_q_points, _DECODE,
              hash_family="indexer_q"),
    SweepPlan("dequant_gather", ("dequant_gather",), (2048, 16384, 65536, 262144, 1048576), _dequant_points,
              size_axis="rows gathered (16 requests)", hash_family="dequant_gather"),
    SweepPlan("save_partial_states", ("save_partial_states",), (4096, 16384, 65536), _k4_points, _DECODE,
              hash_family="save_partial_states"),
    SweepPlan("c4_compress", ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress"),
              (4096, 16384, 65536, 262144), _c4_points, _DECODE, hash_family="c4_compress"),
    SweepPlan("c128_compress", ("c128_compress",), (4096, 16384, 65536), _c128_points, _DECODE,
              hash_family="c128_compress"),
    SweepPlan("c128_store", ("c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain"),
              (4096, 16384, 65536), _k8_points, _DECODE, hash_family="c128_compress",
              in_l2_why="one 128-token block in, one cache row out: 2 MB at T = 65536; latency-bound at "
                        "every T a step sees"),
    SweepPlan("store_rows", ("store_rows_ds", "store_rows_plain", "store_rows_indexer"),
              (16384, 65536, 524288), _store_points, _DECODE, hash_family="encoders"),
    SweepPlan("rowquant", ("rowquant",), (1024, 8192, 65536), _rowquant_points,
              size_axis="rows (4096 columns)", hash_family="rowquant"),
)}


def select_plans(names: Sequence[str] | None) -> list[SweepPlan]:
    """The plans for ``names`` (plan names or family names; None: every plan), in :data:`PLANS`
    order. ValueError naming what is known when a name has no plan."""
    if not names:
        return list(PLANS.values())
    from dsv4kit.kernels import FAMILY_NAMES

    chosen: list[str] = []
    for n in names:
        plan = n if n in PLANS else next((p.name for p in PLANS.values() if n in p.families), None)
        if plan is None:
            why = "a registered family without a sweep plan yet" if n in FAMILY_NAMES else "not a family"
            raise ValueError(f"--family {n}: {why}; families with a sweep: "
                             + ", ".join(f"{p.name} ({', '.join(p.families)})" if p.families != (p.name,)
                                         else p.name for p in PLANS.values()))
        chosen.append(plan)
    return [PLANS[n] for n in PLANS if n in chosen]


# --------------------------------------------------------------------------- the sweep


@dataclass
class BenchResult:
    """What :func:`run_sweep` measured: rows of the one schema, decode rows, provenance."""

    provenance: dict[str, Any]
    copy_GBps: float
    rows: list[Any] = field(default_factory=list)
    decode: list[Any] = field(default_factory=list)
    empty_kernel_us: float | None = None

    def to_json(self) -> dict[str, Any]:
        from dsv4kit.bench_schema import host_rows, results_json

        return results_json(self.rows, self.provenance, self.copy_GBps, decode=self.decode,
                            host=host_rows(self.rows))


def empty_kernel_us(rep_ms: int = 100) -> float:
    """GPU time of an empty Triton kernel in µs (CUDA-graph replays on the current stream)."""
    import triton

    @triton.jit
    def _empty(x_ptr):  # pragma: no cover - GPU only
        pass

    buf = torch.zeros(1, device="cuda")
    return 1e3 * graph_median_ms(lambda: _empty[(1,)](buf), rep_ms=rep_ms)


def _time(fn: Callable[[], Any], graph: bool, rep_ms: int) -> tuple[float, str, str]:
    """``(median µs, timing label, error)``; a graph capture that fails falls back to events."""
    from triton.testing import do_bench

    if graph:
        try:
            return 1e3 * graph_median_ms(fn, rep_ms=rep_ms), "cuda-graph replay", ""
        except Exception as exc:  # a launcher that cannot be captured: time with events
            torch.cuda.synchronize()
            note = f"graph capture failed ({type(exc).__name__}); events"
            try:
                return 1e3 * float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")), note, ""
            except Exception as exc2:
                return float("nan"), note, f"{type(exc2).__name__}: {str(exc2)[:200]}"
    try:
        return 1e3 * float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")), "events (do_bench)", ""
    except Exception as exc:
        torch.cuda.synchronize()
        return float("nan"), "events (do_bench)", f"{type(exc).__name__}: {str(exc)[:200]}"


def run_sweep(plans: Sequence[SweepPlan], *, backends: Sequence[str] = ("triton", "cutedsl"),
              sizes: Sequence[int] | None = None, reference: bool = True, compile_reference: bool = True,
              rep_ms: int = 100, compile_budget_s: float = 120.0, copy_bytes: int = 2 << 30,
              reference_max_bytes: int = 1 << 30, platform: Any = None,
              log: Callable[[str], None] = print) -> BenchResult:
    """Time every point of ``plans`` on the current GPU (see the module docstring).

    The copy ceiling (:func:`copy_bandwidth_gbs`) and an empty kernel are measured first, in the
    same process. Per point and backend: ``kernel (graph replay)`` (the op captured in a CUDA
    graph: its GPU time), ``op`` (the whole call: host time included); then, when ``reference``,
    the eager reference and (``compile_reference``, while ``compile_budget_s`` lasts) its
    ``torch.compile``, at points of at most ``reference_max_bytes``. A backend that cannot run
    here is logged and skipped; a point that raises becomes a row with ``error`` set, and the
    sweep goes on. ``platform``: the kit's platform (default: this process's).
    """
    from dsv4kit.bench_schema import (
        KERNEL,
        OP,
        REF_COMPILE,
        REF_EAGER,
        DecodeRow,
        make_row,
    )
    from dsv4kit.kernels import family as family_spec
    from dsv4kit.platform import current_platform
    from dsv4kit.results import kernel_source_provenance

    if not torch.cuda.is_available():
        raise RuntimeError("run_sweep needs a CUDA device")
    platform = platform if platform is not None else current_platform()
    prov = provenance({**kernel_source_provenance(p.hash_family for p in plans), "arch": platform.arch,
                       "script": "dsv4kit bench", "rep_ms": rep_ms,
                       "copy_ceiling": "dsv4kit.bench.copy_bandwidth_gbs: triton.testing.do_bench median of "
                                       "dst.copy_(src), read + write bytes"})
    copy = copy_bandwidth_gbs(copy_bytes)
    log(f"device-to-device copy: {copy:.0f} GB/s")
    l2 = prov.get("l2_cache_bytes") or 0
    log(f"L2: {l2 / 2**20:.0f} MiB; rows marked L2 moved under {L2_MULTIPLE}x that (partly L2-resident)")
    empty = empty_kernel_us()
    log(f"empty Triton kernel: {empty:.2f} us (graph replay)")
    res = BenchResult(prov, copy, empty_kernel_us=empty)
    compiled: dict[tuple[str, str], Any] = {}
    budget = compile_budget_s
    for plan in plans:
        kernels = {}
        for fam in plan.families:
            spec = family_spec(fam)
            for b in backends:
                for v in spec.variants:
                    try:
                        kernels[(fam, v, b)] = spec.kernel(v, platform.device, b, platform)
                    except Exception as exc:
                        log(f"{fam} {v} {b}: unavailable ({type(exc).__name__}: {exc})")
        for size in (sizes or plan.default_sizes()):
            for pt in plan.points(size):
                spec = family_spec(pt.family)
                try:
                    args = pt.build("cuda")
                except Exception as exc:
                    log(f"{pt.kernel} {pt.config} size {size}: inputs failed ({type(exc).__name__}: {exc})")
                    continue
                variant = args.get(spec.variant_arg, "default") if spec.variant_arg else "default"
                fns: list[tuple[str, str, Callable[[], Any], bool]] = []
                for b in backends:
                    if (pt.family, variant, b) not in kernels:
                        continue
                    call = functools.partial(spec.op, **args, backend=b, debug_checks=False)
                    fns += [(b, KERNEL, call, True), (b, OP, call, False)]
                ref = spec.variants[variant].reference
                ref_args = {k: v for k, v in args.items() if k != spec.variant_arg}
                reference_here = reference and pt.nbytes <= reference_max_bytes
                if reference_here:
                    fns.append(("torch", REF_EAGER, lambda r=ref, a=ref_args: r(**a), False))
                if reference_here and compile_reference and budget > 0:
                    key = (pt.family, variant)
                    t0 = time.perf_counter()
                    try:
                        fn = compiled.get(key) or torch.compile(ref, dynamic=True)
                        fn(**ref_args)  # compile outside the timing
                        compiled[key] = fn
                        fns.append(("torch", REF_COMPILE, lambda f=fn, a=ref_args: f(**a), False))
                    except Exception as exc:
                        log(f"torch.compile({spec.op_name} reference) failed: {type(exc).__name__}: "
                            f"{str(exc)[:200]}")
                    budget -= time.perf_counter() - t0
                for backend, what, fn, graph in fns:
                    us, timing, err = _time(fn, graph, rep_ms)
                    row = make_row(plan.name, pt.kernel, backend, what, pt.size, pt.nbytes, us, copy,
                                   config=pt.config, timing=timing, error=err)
                    res.rows.append(row)
                    frac = f"{100 * row.fraction_of_copy:5.1f}%" if row.fraction_of_copy else "    -"
                    in_l2 = "  L2" if pt.nbytes < L2_MULTIPLE * l2 else ""
                    log(f"{pt.kernel:28s} {pt.config:34s} {size:>8d} {backend:8s} {what:30s} {us:10.1f} us "
                        f"{frac}{in_l2}" + (f"  {err}" if err else ""))
                    if what == KERNEL and size in plan.decode_sizes and not err:
                        res.decode.append(DecodeRow(plan.name, pt.kernel, backend, size, us, empty,
                                                    us - empty, pt.config))
                del args, fns
                torch.cuda.empty_cache()
    return res
