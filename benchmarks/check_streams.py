#!/usr/bin/env python3
"""Stream correctness of every family's public op, both backends, on a GPU.

    python3 benchmarks/check_streams.py --out DIR [--families a,b] [--backends triton,cutedsl]
    python3 benchmarks/check_streams.py --dry-run      # CPU: build every entry, run its references

Each launch must go to ``torch.cuda.current_stream()`` at call time. Per (family, backend):

* ``a_same_stream``    on a side stream: a long ``torch.cuda._sleep``, then the real input copied
                       over a poisoned one, then the op (``with torch.cuda.stream(s)``): the op must
                       see the copy. A launch on any other stream would run during the sleep.
* ``a_control``        the same, but the op issued on a third stream that does not wait: it must
                       *not* match (proves the check can tell streams apart; the earlier version of
                       this script dropped a side-stream probe for not being able to).
* ``b_event``          stream B: sleep, write the input, record an event; stream A waits on the
                       event, then the op on A: it must see the write.
* ``c_graph``          capture the op in ``torch.cuda.graph`` on a non-default stream; poison the
                       outputs, replay: equal to the reference; then new input values copied into
                       the captured buffers, outputs poisoned, replay: equal to the new reference.
* ``d_alloc``          the op on a side stream: the outputs it allocates come from the caching
                       allocator's pool of that stream (read from ``torch.cuda.memory_snapshot``)
                       and equal the reference when used there; in-place ops: values only.

Every comparison is bit-exact against the family's PyTorch reference (run on CPU copies), and
every check also verifies that the poisoned input would have given a different result. The
in-place families (K3, K4, the store hooks E1..E5, the C4 compressors K5, K6, K9, the C128
compressors K7, K8a, K8b) are compared on what they write: for the store hooks and compressors the
*whole* cache storage (sentinel bytes, page tails; K7: the whole ``out``); the C4 compressors' cache
by ``c4_compress.cases.judge(...).ok`` (the compressor rule, every byte it does not judge
bit-exact), K7's ``out`` by ``c128_compress.cases.judge_k7`` (the FP32 rule, every other row
bit-exact) and K8's cache by ``judge_store``, since they are not bit-exact across backends.

A family is one entry of ``FAMILIES``: name -> ``build(backend, seed) -> StreamCall``; every
registered family needs at least one (the script refuses to run otherwise, ``--dry-run`` too).
Writes ``streams.json`` and ``streams.md`` under ``--out``; prints PASS/FAIL per check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: Where the builders put their tensors (``cuda``; ``cpu`` only to test the builders themselves).
DEVICE = "cuda"
#: GPU cycles of the side-stream sleep (~0.1 s at ~2 GHz): far longer than one op's host path.
SLEEP_CYCLES = 200_000_000
CHECKS = ("a_same_stream", "a_control", "b_event", "c_graph", "d_alloc")


@dataclass
class StreamCall:
    """One op call on device tensors, and what the checks need to know about it.

    ``run()``: issue the op on the current stream, return its outputs (tensors). ``data``: an
    input tensor the checks overwrite (poisoned, then restored late). ``reset()``:
    poison the outputs the op writes in place (no-op for ops that allocate their outputs).
    ``reference()``: the outputs the op must produce from the current device inputs (CPU).
    ``allocates``: whether the op allocates its outputs (checked against the stream's pool).
    ``poison``: a valid input value for ``data`` that gives other outputs (default: zeros).
    """

    run: Callable[[], tuple[torch.Tensor, ...]]
    data: torch.Tensor
    reset: Callable[[], None]
    reference: Callable[[], tuple[torch.Tensor, ...]]
    allocates: bool
    poison: Callable[[torch.Tensor], None] = torch.Tensor.zero_
    #: ``compare(got, want) -> bool`` (default: :func:`same`, bit-exact); the C4 compressors judge
    #: their cache by the compressor rule instead.
    compare: Callable[[tuple, tuple], bool] | None = None

    def matches(self, got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
        return (self.compare or same)(got, want)


#: How the ops were reached (recorded in the provenance).
OP_SOURCE: dict[str, str] = {}


def _op(name: str):
    """The public op ``dsv4kit.ops.<name>`` (through its family spec, the same object, when the
    ops module cannot import every family of the tree)."""
    try:
        import dsv4kit.ops as ops

        OP_SOURCE[name] = "dsv4kit.ops"
        return getattr(ops, name)
    except Exception as exc:
        from dsv4kit.kernels import family

        OP_SOURCE[name] = f"FamilySpec.op (dsv4kit.ops did not import: {type(exc).__name__}: {exc})"

        from dsv4kit.kernels import FAMILY_NAMES

        for fam in FAMILY_NAMES:
            try:
                spec = family(fam)
            except Exception:  # noqa: BLE001  (a family whose folder does not import)
                continue
            if spec.op_name == name:
                return spec.op
        raise


def _cpu_copy(t):
    """A CPU copy of ``t`` with its strides (a paged cache's page stride is part of its contract)."""
    if not isinstance(t, torch.Tensor):
        return t
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    return t.as_strided((span,), (1,)).to("cpu", copy=True).as_strided(t.shape, t.stride())


def _cpu(*ts):
    """CPU copies (never the tensors themselves: a reference writes its in-place outputs)."""
    return tuple(_cpu_copy(t) for t in ts)


# --------------------------------------------------------------------------- families


def build_indexer_q(fmt: str) -> Callable[[str, int], StreamCall]:
    def build(backend: str, seed: int) -> StreamCall:
        from dsv4kit.kernels.indexer_q import reference as r
        from dsv4kit.kernels.indexer_q.cases import make_case

        op = _op("indexer_q_rope_quant")
        ref = r.indexer_q_fp8_reference if fmt == "fp8" else r.indexer_q_mxfp4_reference
        c = make_case(257, seed=seed).to(DEVICE)
        return StreamCall(
            run=lambda: tuple(op(*c.args(), cache_format=fmt, backend=backend)),
            data=c.index_q, reset=lambda: None,
            reference=lambda: tuple(ref(*_cpu(*c.args()))), allocates=True)

    return build


def build_dequant_gather(backend: str, seed: int) -> StreamCall:
    from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache_reference as ref
    from dsv4kit.kernels.dequant_gather.cases import SENTINEL, make_case

    op = _op("dequantize_and_gather_k_cache")
    c = make_case([700, 33, 300], [500, 33, 20], offset=5, block_size=64, content="bytes",
                  seed=seed).to(DEVICE)

    def run():
        return (op(*c.args(), backend=backend),)

    # Poison: every byte 0xA5, a finite e4m3 code under an in-contract scale byte (165).
    return StreamCall(run=run, data=c.k_cache, reset=lambda: c.out.view(torch.uint8).fill_(SENTINEL),
                      reference=lambda: (ref(*_cpu(*c.args())),), allocates=False,
                      poison=lambda t: t.fill_(SENTINEL))


def build_save_partial_states(backend: str, seed: int) -> StreamCall:
    from dsv4kit.kernels.save_partial_states import reference as r
    from dsv4kit.kernels.save_partial_states.cases import SENTINEL_WORD, make_case, state_words

    op = _op("save_partial_states")
    c = make_case(t=513, seed=seed, device=DEVICE)

    def run():
        op(*c.args(), backend=backend)
        return (c.state_cache,)

    def reference():
        args = _cpu(*c.args())
        r.save_partial_states_reference(*args)
        return (args[4],)

    return StreamCall(run=run, data=c.kv, reset=lambda: state_words(c.state_cache).fill_(SENTINEL_WORD),
                      reference=reference, allocates=False)


def build_rowquant(backend: str, seed: int) -> StreamCall:
    from dsv4kit.kernels.rowquant.cases import regime
    from dsv4kit.kernels.rowquant.reference import rowquant_reference

    op = _op("rowquant")
    x = regime("normal", 300, 512, seed=seed).to(DEVICE)
    return StreamCall(run=lambda: tuple(op(x, backend=backend)), data=x, reset=lambda: None,
                      reference=lambda: tuple(rowquant_reference(x.cpu())), allocates=True)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 view of every byte of ``t``'s storage (on its device): the whole cache."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage()).view(torch.uint8)


def _clone_storage(t, device):
    """``t`` on ``device`` with its whole storage (page tails, pads), strides and storage offset."""
    if not isinstance(t, torch.Tensor):
        return t
    raw = _whole(t).to(device, copy=True)
    return raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def _sentinel(t: torch.Tensor, byte: int = 0xA5) -> None:
    _whole(t).fill_(byte)


def build_store(hook: str, **fmt) -> Callable[[str, int], StreamCall]:
    """E1..E5 store hooks: rows -> the whole cache, BIT-EXACT (sentinel bytes included)."""

    def build(backend: str, seed: int) -> StreamCall:
        from dsv4kit.kernels import family
        from dsv4kit.kernels.encoders.cases import make_case
        from dsv4kit.kernels.encoders.reference import CACHE_ARG

        spec = family(hook)
        op, ref = _op(spec.op_name), spec.variants["default"].reference
        c = make_case(hook, 257, kv_bs=16, seed=seed, **fmt).fresh(DEVICE)
        args, cache = c.args, c.args[CACHE_ARG[hook]]

        def run():
            op(**args, backend=backend)
            return (_whole(cache),)

        def reference():
            cpu = {k: _clone_storage(v, "cpu") for k, v in args.items()}
            ref(**cpu)
            return (_whole(cpu[CACHE_ARG[hook]]),)

        return StreamCall(run=run, data=args["rows"], reset=lambda: _sentinel(cache), reference=reference,
                          allocates=False)

    return build


def build_c4(op_name: str, **fmt) -> Callable[[str, int], StreamCall]:
    """K5, K6, K9: state -> the whole cache, judged by ``cases.judge`` (the compressor rule; every
    byte the rule does not judge BIT-EXACT). ``data`` is the state cache; seed 1 keeps seed 0's
    layout (block table, slots) with other state values (-0.75 x), so the captured graph's
    buffers take them."""

    def build(backend: str, seed: int) -> StreamCall:
        from dataclasses import replace

        from dsv4kit.kernels import family
        from dsv4kit.kernels.c4_compress.cases import judge, make_case

        spec = family(op_name)
        op, ref = _op(spec.op_name), spec.variants["default"].reference
        c = make_case(op_name, lens=(21, 9, 3), starts=(0, 5, 1001), kv_bs=16, seed=0, **fmt).fresh(DEVICE)
        if seed:
            c.args["state_cache"].mul_(-0.75)
        args, cache = c.args, c.cache
        cases: dict[int, object] = {}          # id(want bytes) -> the CPU case it was computed from

        def run():
            op(**args, backend=backend)
            return (_whole(cache),)

        def reference():
            cpu = {k: _clone_storage(v, "cpu") for k, v in args.items()}
            pristine = {k: _clone_storage(v, "cpu") for k, v in args.items()}
            ref(**cpu)
            want = _whole(cpu[c.cache_arg])
            cases[id(want)] = (replace(c, args=pristine), want)
            return (want,)

        def compare(got, want) -> bool:
            if len(got) != 1 or len(want) != 1 or id(want[0]) not in cases:
                return same(got, want)
            case, _ = cases[id(want[0])]
            proto = case.cache
            g = got[0].cpu().view(proto.dtype).as_strided(proto.shape, proto.stride(), proto.storage_offset())
            w = want[0].view(proto.dtype).as_strided(proto.shape, proto.stride(), proto.storage_offset())
            return judge(case, g, w).ok

        return StreamCall(run=run, data=args["state_cache"], reset=lambda: _sentinel(cache),
                          reference=reference, allocates=False, compare=compare)

    return build


def build_c128(op_name: str, **fmt) -> Callable[[str, int], StreamCall]:
    """K7, K8a, K8b: K7 state -> ``out`` (the whole storage, judged by ``cases.judge_k7``: the FP32
    rule on the pooled rows, every other row BIT-EXACT); K8 ``compressed_kv`` -> the whole cache
    (``cases.judge_store``: the compressor rule, every byte it does not judge BIT-EXACT). ``data``
    is the state (K7) or ``compressed_kv`` (K8); seed 1 keeps seed 0's layout with other values
    (-0.75 x), so the captured graph's buffers take them."""

    def build(backend: str, seed: int) -> StreamCall:
        from dataclasses import replace

        from dsv4kit.kernels import family
        from dsv4kit.kernels.c128_compress.cases import judge_k7, judge_store, make_k7_case, make_k8_case

        spec = family(op_name)
        op, ref = _op(spec.op_name), spec.variants["default"].reference
        if op_name == "c128_compress":
            c = make_k7_case(lens=(140, 20, 3), starts=(120, 240, 1020), seed=0).fresh(DEVICE)
            data_arg, judge = "state_cache", judge_k7
        else:
            c = make_k8_case(op_name, t=257, boundaries=3, kv_bs=2, seed=0, **fmt).fresh(DEVICE)
            data_arg, judge = "compressed_kv", judge_store
        if seed:
            c.args[data_arg].mul_(-0.75)
        args, output = c.args, c.output
        cases: dict[int, object] = {}          # id(want bytes) -> the CPU case it was computed from

        def run():
            op(**args, backend=backend)
            return (_whole(output),)

        def reference():
            cpu = {k: _clone_storage(v, "cpu") for k, v in args.items()}
            pristine = {k: _clone_storage(v, "cpu") for k, v in args.items()}
            ref(**cpu)
            want = _whole(cpu[c.output_arg])
            cases[id(want)] = replace(c, args=pristine)
            return (want,)

        def compare(got, want) -> bool:
            if len(got) != 1 or len(want) != 1 or id(want[0]) not in cases:
                return same(got, want)
            case = cases[id(want[0])]
            proto = case.output
            g = got[0].cpu().view(proto.dtype).as_strided(proto.shape, proto.stride(), proto.storage_offset())
            w = want[0].view(proto.dtype).as_strided(proto.shape, proto.stride(), proto.storage_offset())
            return judge(case, g, w).ok

        return StreamCall(run=run, data=args[data_arg], reset=lambda: _sentinel(output), reference=reference,
                          allocates=False, compare=compare)

    return build


#: family name -> build(backend, seed). A new family is one entry here (every registered family
#: needs at least one: :func:`check_table`).
FAMILIES: dict[str, Callable[[str, int], StreamCall]] = {
    "indexer_q/fp8 (K1)": build_indexer_q("fp8"),
    "indexer_q/mxfp4 (K2)": build_indexer_q("mxfp4"),
    "dequant_gather (K3)": build_dequant_gather,
    "save_partial_states (K4)": build_save_partial_states,
    "rowquant": build_rowquant,
    "store_rows_ds (E1)": build_store("store_rows_ds"),
    "store_rows_plain/bf16 (E2)": build_store("store_rows_plain"),
    "store_rows_plain/e4m3 (E3)": build_store("store_rows_plain", fp8_scale=0.37),
    "store_rows_indexer/fp8 (E4)": build_store("store_rows_indexer", use_fp4=False),
    "store_rows_indexer/mxfp4 (E5)": build_store("store_rows_indexer", use_fp4=True),
    "c4_compress_ds_mla (K5)": build_c4("c4_compress_ds_mla"),
    "c4_compress_plain/bf16 (K6)": build_c4("c4_compress_plain"),
    "c4_compress_plain/e4m3 (K6)": build_c4("c4_compress_plain", fp8_scale=0.37),
    "indexer_compress/fp8 (K9)": build_c4("indexer_compress", use_fp4=False),
    "indexer_compress/mxfp4 (K9)": build_c4("indexer_compress", use_fp4=True),
    "c128_compress (K7)": build_c128("c128_compress"),
    "c128_norm_rope_store_ds_mla (K8a)": build_c128("c128_norm_rope_store_ds_mla"),
    "c128_norm_rope_store_plain/bf16 (K8b)": build_c128("c128_norm_rope_store_plain"),
    "c128_norm_rope_store_plain/e4m3 (K8b)": build_c128("c128_norm_rope_store_plain", fp8_scale=0.37),
}


def entry_family(name: str) -> str:
    """The family an entry of :data:`FAMILIES` checks (its name up to the first ``/`` or space)."""
    return name.split(" ")[0].split("/")[0]


def check_table() -> None:
    """Refuse to run when a registered family has no entry (or an entry names no family)."""
    from dsv4kit.kernels import FAMILY_NAMES

    covered = {entry_family(n) for n in FAMILIES}
    missing = [f for f in FAMILY_NAMES if f not in covered]
    extra = sorted(covered - set(FAMILY_NAMES))
    if missing or extra:
        raise SystemExit(f"check_streams.py: FAMILIES does not match dsv4kit.kernels.families(): missing "
                         f"{missing}, not a family {extra}. Add an entry per family.")


# --------------------------------------------------------------------------- comparisons


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1) if t.dim() == 0 else t
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
    """Same dtypes, shapes and bits (so -0 and NaN payloads count as written)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        g, w = g.cpu().contiguous(), w.cpu().contiguous()
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(_bits(g), _bits(w)):
            return False
    return True


def _poison_outputs(outs: tuple[torch.Tensor, ...]) -> None:
    for o in outs:
        o.view(torch.uint8).fill_(0xA5) if o.is_contiguous() else o.fill_(0)


def _stream_of(t: torch.Tensor) -> int | None:
    """The stream whose pool the caching allocator served ``t``'s block from (None: not found)."""
    addr = t.untyped_storage().data_ptr()
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= addr < seg["address"] + seg["total_size"]:
            return seg.get("stream")
    return None


# --------------------------------------------------------------------------- checks


def check_same_stream(call: StreamCall, want, poisoned_want, control: bool) -> tuple[bool, str]:
    """(a) sleep + write + op on one side stream; ``control``: the op on a stream that does not wait."""
    src = call.data.clone()
    call.reset()
    call.poison(call.data)
    torch.cuda.synchronize()
    s, other = torch.cuda.Stream(), torch.cuda.Stream()
    t0 = time.perf_counter()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        call.data.copy_(src)
        if not control:
            outs = call.run()
    if control:
        with torch.cuda.stream(other):
            outs = call.run()
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    got = _cpu(*outs)
    ok = call.matches(got, want)
    saw_poison = call.matches(got, poisoned_want)
    call.data.copy_(src)
    torch.cuda.synchronize()
    detail = (f"matches reference: {ok}; matches the poisoned-input result: {saw_poison}; "
              f"host {host_ms:.1f} ms")
    # The control passes when the op, issued on a stream that does not wait, missed the write.
    return (not ok) if control else ok, detail


def check_event(call: StreamCall, want) -> tuple[bool, str]:
    """(b) write on B behind a sleep, event; A waits on the event, op on A."""
    src = call.data.clone()
    call.reset()
    call.poison(call.data)
    torch.cuda.synchronize()
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    ev = torch.cuda.Event()
    with torch.cuda.stream(b):
        torch.cuda._sleep(SLEEP_CYCLES)
        call.data.copy_(src)
        ev.record(b)
    a.wait_event(ev)
    with torch.cuda.stream(a):
        outs = call.run()
    torch.cuda.synchronize()
    ok = call.matches(_cpu(*outs), want)
    return ok, f"matches reference: {ok}"


def check_graph(call: StreamCall, want, data2: torch.Tensor) -> tuple[bool, str]:
    """(c) capture on a non-default stream, replay into poisoned outputs, then with new inputs."""
    call.reset()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        outs = call.run()
    call.reset()
    if call.allocates:
        _poison_outputs(outs)
    with torch.cuda.stream(s):
        g.replay()
    torch.cuda.synchronize()
    ok1 = call.matches(_cpu(*outs), want)
    src = call.data.clone()
    call.data.copy_(data2)
    call.reset()
    want2 = call.reference()
    if call.allocates:
        _poison_outputs(outs)
    torch.cuda.synchronize()
    g.replay()                            # on the default stream this time
    torch.cuda.synchronize()
    ok2 = call.matches(_cpu(*outs), want2)
    differs = not same(want2, want)
    call.data.copy_(src)
    torch.cuda.synchronize()
    del g
    return ok1 and ok2 and differs, (f"replay 1 matches reference: {ok1}; replay 2 (new inputs) matches "
                                     f"new reference: {ok2}; new reference differs from the first: {differs}")


def check_alloc(call: StreamCall, want) -> tuple[bool, str]:
    """(d) op on a side stream: outputs from that stream's pool, usable there."""
    call.reset()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        outs = call.run()
        used = tuple(o.clone() for o in outs)       # use them on the stream they were made for
    streams = [_stream_of(o) for o in outs] if call.allocates else []
    torch.cuda.synchronize()
    ok = call.matches(_cpu(*used), want) and call.matches(_cpu(*outs), want)
    if not call.allocates:
        return ok, f"writes in place; values match reference: {ok}"
    on_s = all(st == s.cuda_stream for st in streams)
    return ok and on_s, (f"values match reference: {ok}; output blocks from the side stream's pool: {on_s} "
                         f"(streams {streams}, side stream {s.cuda_stream})")


def run_family(name: str, build, backend: str) -> list[dict]:
    rows = []

    def row(check: str, ok: bool | None, detail: str) -> None:
        status = "PASS" if ok else ("SKIP" if ok is None else "FAIL")
        rows.append({"family": name, "backend": backend, "check": check, "status": status, "detail": detail})
        print(f"{status}  {name:26s} {backend:8s} {check:14s} {detail}", flush=True)

    try:
        call = build(backend, 0)
        data2 = build(backend, 1).data
        if data2.shape != call.data.shape or data2.dtype != call.data.dtype:
            raise RuntimeError(f"build(seed=1) gave data {tuple(data2.shape)} {data2.dtype}, expected the "
                               f"shape and dtype of seed 0")
        call.reset()
        call.run()                       # warm: compiles the key (if not warmed) outside the checks
        torch.cuda.synchronize()
        call.reset()
        want = call.reference()
        src = call.data.clone()
        call.poison(call.data)
        call.reset()
        poisoned_want = call.reference()
        call.data.copy_(src)
        torch.cuda.synchronize()
        if same(want, poisoned_want):
            raise RuntimeError("the poisoned input gives the reference's result: the checks could not "
                               "detect a wrong stream")
    except Exception as exc:
        for check in CHECKS:
            row(check, False, f"setup failed: {type(exc).__name__}: {str(exc)[:300]}")
        traceback.print_exc()
        return rows
    checks = {
        "a_same_stream": lambda: check_same_stream(call, want, poisoned_want, control=False),
        "a_control": lambda: check_same_stream(call, want, poisoned_want, control=True),
        "b_event": lambda: check_event(call, want),
        "c_graph": lambda: check_graph(call, want, data2),
        "d_alloc": lambda: check_alloc(call, want),
    }
    for check, fn in checks.items():
        try:
            ok, detail = fn()
        except Exception as exc:
            ok, detail = False, f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
            torch.cuda.synchronize()
        row(check, ok, detail)
    return rows


def write_md(path: Path, rows: list[dict], prov: dict) -> None:
    fams = list(dict.fromkeys(r["family"] for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    lines = ["# Stream correctness of the public ops (`benchmarks/check_streams.py`)", "",
             f"{prov.get('device')}, torch {prov.get('torch')}, triton {prov.get('triton')}, "
             f"nvidia-cutlass-dsl {prov.get('nvidia-cutlass-dsl')}, {prov.get('date')}, commit "
             f"`{str(prov.get('commit'))[:10]}`. Checks: see the script's docstring.", "",
             "| family | backend | " + " | ".join(CHECKS) + " |", "|---|---|" + "---|" * len(CHECKS)]
    for f in fams:
        for b in backends:
            cells = {r["check"]: r["status"] for r in rows if r["family"] == f and r["backend"] == b}
            if cells:
                lines.append(f"| {f} | {b} | " + " | ".join(cells.get(c, "-") for c in CHECKS) + " |")
    n_fail = sum(r["status"] == "FAIL" for r in rows)
    lines += ["", f"{len(rows)} checks, {n_fail} failed.", ""]
    path.write_text("\n".join(lines))


def dry_run(families: str | None = None) -> int:
    """Build every selected entry on the CPU and check what the GPU checks rely on (exit 0 iff all hold)."""
    global DEVICE
    DEVICE = "cpu"
    names = list(FAMILIES) if not families else [n for n in FAMILIES
                                                 if any(n.startswith(f) for f in families.split(","))]
    n_bad = 0
    for name in names:
        try:
            call = FAMILIES[name]("triton", 0)
            data2 = FAMILIES[name]("triton", 1).data
            assert data2.shape == call.data.shape and data2.dtype == call.data.dtype, "seed 1 shape"
            call.reset()
            want = call.reference()
            assert call.matches(want, want), "the reference does not match itself"
            src = call.data.clone()
            call.poison(call.data)
            call.reset()
            poisoned = call.reference()
            call.data.copy_(src)
            assert not same(want, poisoned), "the poisoned input gives the reference's result"
            assert not call.matches(poisoned, want), "compare accepts the poisoned result"
            call.data.copy_(data2)
            call.reset()
            assert not same(call.reference(), want), "seed 1's data gives the same result"
            print(f"DRY OK    {name}", flush=True)
        except Exception as exc:  # noqa: BLE001
            n_bad += 1
            print(f"DRY FAIL  {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    print(f"\ndry run: {len(names)} entries, {n_bad} failed")
    return 0 if n_bad == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--families", help="comma-separated names of FAMILIES (default: all)")
    ap.add_argument("--backends", default="triton,cutedsl")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU: build every entry's inputs (seeds 0 and 1), run its reference, check that the "
                         "poisoned input changes the result; no CUDA needed")
    a = ap.parse_args(argv)
    check_table()
    if a.dry_run:
        return dry_run(a.families)
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU")
        return 2
    from dsv4kit.bench import provenance
    from dsv4kit.results import kernel_source_hash

    names = list(FAMILIES) if not a.families else [n for n in FAMILIES
                                                   if any(n.startswith(f) for f in a.families.split(","))]
    fam_dirs = sorted({entry_family(n) for n in names})
    prov = provenance({"check": "check_streams", "family": fam_dirs, "sleep_cycles": SLEEP_CYCLES,
                       "kernel_source_hash": {f: kernel_source_hash(f) for f in fam_dirs}})
    rows: list[dict] = []
    for backend in a.backends.split(","):
        for name in names:
            rows += run_family(name, FAMILIES[name], backend)
    n_fail = sum(r["status"] != "PASS" for r in rows)
    print(f"\n{len(rows)} checks, {n_fail} not passed: {'STREAMS OK' if n_fail == 0 else 'STREAMS WRONG'}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        prov["op_source"] = OP_SOURCE
        (a.out / "streams.json").write_text(json.dumps({"provenance": prov, "checks": rows,
                                                        "failed": n_fail}, indent=1))
        write_md(a.out / "streams.md", rows, prov)
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
