"""A DSv4 attention-side pipeline on real tensors: a serving trace drives every kernel in call order.

:class:`Pipeline` is an engine in miniature for a :class:`~dsv4kit.model.stack.DSv4AttentionStack`.
It allocates, per layer and sized from the runtime settings (B, ``max_model_len``,
``max_num_seqs``), the caches the layer has: the sliding-window page cache (B entries per page, in
the KV cache's format: fp8_ds_mla pages or plain rows), the compressed cache (``max(1, B // R)``
entries per page), the indexer K cache (FP8 or MXFP4, C4 layers), one state cache per compressor
(state block sizes from the preset: C4 4, C128 8, indexer 4), the fixed per-layer parameters
(``ape``, RMSNorm weights) and the fp32 RoPE cache. Physical blocks come from shuffled free lists,
one per cache geometry, shared by the layers like an engine's block tables; every buffer starts
filled with the sentinel byte 0xA5.

:meth:`Pipeline.step` runs one :class:`~dsv4kit.model.trace.Step`: per layer it draws seeded
per-token inputs (``kv_score`` per compressor, split into kv / score views; the indexer query and
weights; the sliding-window KV rows), stores the window rows (E1 or E2/E3 through the formats'
reference store hooks: that insert is not a family of the stack) and then makes exactly the op
calls the stack's families register for the layer (``stack.calls(layer, step)``, in family =
data-flow order: K4, K5/K6 + K9 or K7 -> K8, K1/K2, K3). Each call site's arguments come from
the family's model hooks; the pipeline replaces the stand-ins with real tensors through
:data:`FLOW`, the one table that knows a family's role in the layer (which compressor's state,
which cache, what its block table indexes, how its results are judged). ``backend=None`` runs
the public ops (the kernel each layer registered: Triton on CPU, under the interpreter);
``backend="reference"`` runs each family's reference with the same arguments. Kernel pipelines
warm the stack's registry first and run every step under :class:`~dsv4kit.jit.JitMonitor`
(``error``): a key warmup did not compile raises.

Traces: a sequence met with cached context (``context_len > 0``) that the pipeline has not
seen (every decode sequence of :func:`~dsv4kit.model.trace.make_trace`, or a preempted one) is
*adopted*: its history is prefilled first through the references, in every pipeline alike (as
if the trace had started mid-serving), then the step runs. When more than ``max_num_seqs``
sequences would be live, the least recently scheduled are evicted and their blocks freed.
Traces of advancing requests: :mod:`dsv4kit.model.requests`. The judge of a kernel pipeline
against a reference one: :func:`dsv4kit.model.judge.compare`.
"""

from __future__ import annotations

import hashlib
import random
import struct
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import DEFAULT_VARIANT, Call, TensorSpec
from dsv4kit.formats.cache_dtypes import NORM_WEIGHT_DTYPES
from dsv4kit.formats.ds_mla import allocate_ds_cache, store_rows_ds
from dsv4kit.formats.indexer_cache import allocate_indexer_cache
from dsv4kit.formats.plain_row import allocate_plain_cache, store_rows_plain
from dsv4kit.formats.rope import build_cos_sin_cache, compressed_position
from dsv4kit.formats.state_cache import allocate_state_cache
from dsv4kit.jit import ArtifactStore, JitMonitor, WarmupReport
from dsv4kit.model.presets import CompressorPreset
from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
from dsv4kit.model.trace import SeqChunk, ServingTrace, Step
from dsv4kit.platform import use_platform
from dsv4kit.testing.compressor_data import kv_values, norm_weight, scores
from dsv4kit.testing.compressor_rule import term_magnitudes

if TYPE_CHECKING:
    from dsv4kit.model.judge import StepComparison

__all__ = [
    "FLOW",
    "SENTINEL",
    "Flow",
    "Pipeline",
    "PipelineReport",
    "StepRecord",
]

WHERE = "Pipeline"
#: Every buffer (caches, states, workspaces) starts as this byte: unwritten bytes stay it (§2.12).
SENTINEL = 0xA5
_SENTINEL_F32 = struct.unpack("<f", bytes([SENTINEL] * 4))[0]


# --------------------------------------------------------------------------- the data-flow table


@dataclass(frozen=True)
class Flow:
    """A family's role in a DSv4 layer, as the pipeline needs it (see :data:`FLOW`).

    ``compressor``: call site -> the compressor (``"main"`` or ``"indexer"``) whose state cache,
    state slots, state block table, ``ape``, kv/score inputs and RMSNorm weights the call takes
    (``"*"``: every site). ``cache``: call site -> the layer cache its ``k_cache`` / ``kv_cache``
    is (``"window"``, ``"main"`` compressed, ``"indexer"``) and whose compressed slots its
    ``kv_slot_mapping`` holds. ``block_table``: ``"state"`` (the compressor's state blocks per
    request of the step) or ``"pages"`` (the cache's pages per prefill request). ``inputs``:
    arguments drawn as seeded per-token inputs. ``judge``: how
    :func:`~dsv4kit.model.judge.compare` judges what the call leaves: ``state`` (state cache,
    BIT-EXACT), ``c4`` / ``chain`` (compressed entries under the compressor rule; terms from the
    pooled window, for ``chain`` through the K7 call that filled its ``compressed_kv``), ``k7``
    (K7's rows, FP32 rule), ``outputs`` (returned tensors, BIT-EXACT), ``gather`` (K3's
    workspace). ``history``: whether an adopted sequence's history runs it (calls that leave
    persistent state; the others only feed attention).
    """

    judge: str
    compressor: Mapping[str, str] = field(default_factory=dict)
    cache: Mapping[str, str] = field(default_factory=dict)
    block_table: str = "state"
    inputs: tuple[str, ...] = ()
    history: bool = True

    def compressor_of(self, site: str) -> str | None:
        return self.compressor.get(site, self.compressor.get("*"))

    def cache_of(self, site: str) -> str | None:
        return self.cache.get(site, self.cache.get("*"))


#: family name -> its data-flow role: the only place this module knows a family (spec §1).
FLOW: dict[str, Flow] = {
    "save_partial_states": Flow(
        "state", compressor={"save_main_state": "main", "save_indexer_state": "indexer"},
        inputs=("kv", "score")),
    "c4_compress_ds_mla": Flow("c4", compressor={"*": "main"}, cache={"*": "main"}),
    "c4_compress_plain": Flow("c4", compressor={"*": "main"}, cache={"*": "main"}),
    "indexer_compress": Flow("c4", compressor={"*": "indexer"}, cache={"*": "indexer"}),
    "c128_compress": Flow("k7", compressor={"*": "main"}),
    "c128_norm_rope_store_ds_mla": Flow("chain", compressor={"*": "main"}, cache={"*": "main"}),
    "c128_norm_rope_store_plain": Flow("chain", compressor={"*": "main"}, cache={"*": "main"}),
    "indexer_q": Flow("outputs", inputs=("index_q", "index_weights"), history=False),
    "dequant_gather": Flow("gather", cache={"gather_window": "window", "*": "main"}, block_table="pages",
                           history=False),
}


# --------------------------------------------------------------------------- block pools


@dataclass
class _Pool:
    """Physical blocks of one cache geometry, shared by every layer with such a cache.

    A block holds ``bs`` entries; an entry is one token (``ratio`` 1: window and state caches) or
    one compressed boundary (``ratio`` R: entry ``p // R`` of the token at ``p``).
    """

    key: str
    bs: int
    ratio: int
    width: int            # blocks a sequence of max_model_len needs (block-table columns)
    free: list[int]
    num_blocks: int

    def blocks_for(self, length: int) -> int:
        entries = length if self.ratio == 1 else length // self.ratio
        return -(-entries // self.bs)


@dataclass
class _Seq:
    seq_id: int
    length: int = 0
    blocks: dict[str, list[int]] = field(default_factory=dict)
    last_used: int = 0


@dataclass
class _Cache:
    """One cache of a layer: its tensor, format kind (for the judges), pool, and fp8 scale."""

    tensor: torch.Tensor
    kind: str                 # "ds" | "plain" | "indexer"
    pool: str
    fp8_scale: torch.Tensor | None = None
    use_fp4: bool = False


@dataclass
class _Layer:
    """What one layer owns: caches, state caches, fixed parameters, and the compressors it has."""

    layer: AttentionLayer
    comps: dict[str, CompressorPreset]
    caches: dict[str, _Cache]
    states: dict[str, torch.Tensor]
    state_pools: dict[str, str]
    ape: dict[str, torch.Tensor]
    norm: dict[str, torch.Tensor]


@dataclass
class _CallRecord:
    family: str
    site: str
    flow: Flow
    args: dict[str, Any]
    result: Any
    history: bool


# --------------------------------------------------------------------------- reports


@dataclass
class StepRecord:
    """One step of a pipeline: what ran, what was written, how long it took.

    ``calls``: (family, site) -> op calls of the step (kernels or references, by the pipeline's
    backend); ``history_calls``: reference calls that prefilled adopted sequences. ``written``:
    (layer, cache) -> entries the step's tokens wrote; ``history_written``: entries the
    adopted histories wrote; ``occupancy``: (layer, cache) -> entries the live sequences hold after
    the step (what the engine's block tables cover): the caches ``window``, ``main``, ``indexer``
    and the state caches ``state:main``, ``state:indexer`` (rows); ``blocks``: pool -> blocks in use.
    """

    index: int
    phase: str
    tokens: int
    padded_tokens: int
    cuda_graph: bool
    calls: Counter = field(default_factory=Counter)
    history_calls: Counter = field(default_factory=Counter)
    history_tokens: int = 0
    adopted: tuple[int, ...] = ()
    evicted: tuple[int, ...] = ()
    written: Counter = field(default_factory=Counter)
    history_written: Counter = field(default_factory=Counter)
    occupancy: dict[tuple[int, str], int] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def family_calls(self) -> Counter:
        """Family -> op calls of the step (its call sites summed; history prefills not included)."""
        out: Counter = Counter()
        for (fam, _), n in self.calls.items():
            out[fam] += n
        return out


@dataclass
class PipelineReport:
    """Per-step, per-family call counts and cache occupancy of one pipeline (for figures), plus the
    warmup and the compiles the monitor saw after it. ``capacity``: (layer, cache) -> entries
    (state caches: rows) the cache holds, the keys of every step's ``occupancy``."""

    backend: str
    warmup: WarmupReport | None
    capacity: dict[tuple[int, str], int]
    steps: list[StepRecord] = field(default_factory=list)
    compile_events: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No compile after warmup (a miss raises in ``error`` mode; this counts what got through)."""
        return not self.compile_events

    def compiles(self) -> Counter:
        """(kernel, source) -> compiles the monitor saw after warmup (source: jit, triton, cutedsl)."""
        return Counter((e.kernel, e.source) for e in self.compile_events)

    def calls(self) -> Counter:
        """(family, site) -> op calls over every step (history prefills not included)."""
        out: Counter = Counter()
        for s in self.steps:
            out.update(s.calls)
        return out

    def written(self) -> Counter:
        """(layer, cache) -> entries the trace's tokens wrote over every step."""
        out: Counter = Counter()
        for s in self.steps:
            out.update(s.written)
        return out

    def occupancy_series(self) -> dict[tuple[int, str], list[int]]:
        """(layer, cache) -> entries held after each step, in step order (state caches: rows)."""
        return {lc: [s.occupancy.get(lc, 0) for s in self.steps] for lc in self.capacity}

    def family_call_series(self) -> dict[str, list[int]]:
        """Family -> op calls in each step, in step order (families that never ran left out)."""
        per_step = [s.family_calls() for s in self.steps]
        names = list(dict.fromkeys(f for c in per_step for f in c))
        return {f: [c.get(f, 0) for c in per_step] for f in names}

    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows for a figure: one per (step, family, site) call count and one per (step, layer,
        cache) occupancy."""
        out: list[dict[str, Any]] = []
        for s in self.steps:
            base = {"step": s.index, "phase": s.phase, "tokens": s.tokens, "padded_tokens": s.padded_tokens}
            for (fam, site), n in sorted(s.calls.items()):
                out.append({**base, "what": "calls", "family": fam, "site": site, "value": n})
            for (layer, cache), n in sorted(s.occupancy.items()):
                out.append({**base, "what": "occupancy", "layer": layer, "cache": cache, "value": n,
                            "written": s.written.get((layer, cache), 0),
                            "history_written": s.history_written.get((layer, cache), 0),
                            "capacity": self.capacity[(layer, cache)]})
        return out

    def summary(self) -> str:
        calls = self.calls()
        lines = [f"{self.backend} pipeline: {len(self.steps)} steps, {sum(calls.values())} op calls, "
                 f"{sum(s.history_tokens for s in self.steps)} history tokens prefilled, "
                 f"{len(self.compile_events)} compile(s) after warmup"]
        lines += [f"  {fam} {site}: {n}" for (fam, site), n in sorted(calls.items())]
        last = self.steps[-1].occupancy if self.steps else {}
        lines += [f"  layer {layer} {cache}: {n} / {self.capacity[(layer, cache)]} entries"
                  for (layer, cache), n in sorted(last.items())]
        return "\n".join(lines)


# --------------------------------------------------------------------------- the pipeline


def _seed(*parts: Any) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _gen(*parts: Any, device: torch.device | None = None) -> torch.Generator:
    return torch.Generator(device=device or "cpu").manual_seed(_seed(*parts))


def _sentinel(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.empty(tuple(shape), dtype=dtype, device=device)
    t.view(torch.uint8).fill_(SENTINEL)
    return t


class Pipeline:
    """An engine-like pipeline of ``stack`` on real tensors (see the module docstring).

    ``seed``: inputs, parameters and block shuffles (two pipelines with one seed, fed the same
    steps, see identical inputs and block tables). ``backend``: None (the kernels the stack
    registered, through the public ops, after a warmup of ``stack.registry``) or ``"reference"``
    (each family's reference). ``terms``: keep the term magnitudes of the compressed entries
    written (what :func:`~dsv4kit.model.judge.compare` reads from the reference side; default: on
    for references). ``debug_checks`` is passed to the ops (default: the op's own, on under the
    CPU interpreter). ``warm``: warm the registry (kernel pipelines); ``store``: from this
    artifact store (hits loaded, misses compiled into it; the warmup report says which per key).
    """

    def __init__(self, stack: DSv4AttentionStack, *, seed: int = 0, backend: str | None = None,
                 terms: bool | None = None, debug_checks: bool | None = None, warm: bool = True,
                 monitor: str = "error", store: ArtifactStore | None = None) -> None:
        if backend not in (None, "reference"):
            raise input_error(WHERE, "backend", "None (the stack's kernels) or 'reference'", repr(backend))
        if stack.block_size < 1:
            raise input_error(WHERE, "stack", "a paged runtime (block size B >= 1)", stack.block_size)
        self.stack = stack
        self.seed = seed
        self.backend = backend
        self.terms = (backend == "reference") if terms is None else bool(terms)
        self.debug_checks = debug_checks
        self.device = torch.device(stack.device)
        self.monitor = JitMonitor(monitor)  # type: ignore[arg-type]
        warmup = None
        if backend is None and warm:
            with use_platform(stack.platform):
                warmup = stack.registry.warmup(progress=False, store=store)
            if not warmup.ok:
                raise RuntimeError(f"{WHERE}: warmup failed:\n{warmup.table()}")
        self._rng = random.Random(_seed(seed, "blocks"))
        self._pools: dict[str, _Pool] = {}
        self._seqs: dict[int, _Seq] = {}
        self._clock = 0
        self._rope: dict[torch.dtype, torch.Tensor] = {}
        self.layers: list[_Layer] = [self._allocate(layer) for layer in stack.layers]
        #: (layer, cache) -> slot -> (m, y) of the entry a kernel (trace token) wrote last, or None
        #: without terms; entries written by adopted histories are identical everywhere: not listed.
        self.entries: dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor] | None]] = {
            (b.layer.index, name): {} for b in self.layers for name in b.caches if name != "window"}
        #: layer index -> the calls of the last step, with their arguments and results.
        self.last: dict[int, list[_CallRecord]] = {}
        self.steps_run = 0
        capacity = {(b.layer.index, name): c.tensor.shape[0] * c.tensor.shape[1]
                    for b in self.layers for name, c in b.caches.items()}
        capacity.update({(b.layer.index, f"state:{name}"): st.shape[0] * st.shape[1]
                         for b in self.layers for name, st in b.states.items()})
        self.report = PipelineReport(backend or "kernels", warmup, capacity)

    # ------------------------------------------------------------------ allocation
    def _pool(self, key: str, bs: int, ratio: int) -> str:
        if key not in self._pools:
            st = self.stack
            entries = st.max_model_len if ratio == 1 else st.max_model_len // ratio
            width = max(1, -(-entries // bs))
            total = width * st.max_num_seqs
            free = list(range(total))
            self._rng.shuffle(free)
            self._pools[key] = _Pool(key, bs, ratio, width, free, total)
        return key

    def _kv_cache(self, pages: int, bs: int) -> _Cache:
        kind = self.stack.kv_cache_dtype
        if kind == "fp8_ds_mla":
            return _Cache(allocate_ds_cache(pages, bs, fill=SENTINEL, device=self.device), "ds", "")
        dtype = torch.float8_e4m3fn if kind == "fp8" else torch.bfloat16
        scale = torch.ones(1, dtype=torch.float32, device=self.device) if kind == "fp8" else None
        return _Cache(allocate_plain_cache(pages, bs, dtype, fill_byte=SENTINEL, device=self.device),
                      "plain", "", scale)

    def _allocate(self, layer: AttentionLayer) -> _Layer:
        """The layer's buffers (spec §1): every layer a window cache; C4 / C128 layers their main
        compressor's state and compressed cache; C4 layers also the indexer's state and K cache."""
        st, p = self.stack, self.stack.preset
        b, r = st.block_size, layer.compress_ratio
        comps: dict[str, CompressorPreset] = {}
        if r > 1:
            comps["main"] = p.compressor_for_ratio(r)
            if r == p.indexer.ratio:
                comps["indexer"] = p.indexer
        caches: dict[str, _Cache] = {}
        pool = self._pool("window", b, 1)
        c = self._kv_cache(self._pools[pool].num_blocks, b)
        c.pool = pool
        caches["window"] = c
        for name, comp in comps.items():
            bs = p.compressed_block_size(comp.ratio, b)
            pool = self._pool(f"{name}:{comp.ratio}", bs, comp.ratio)
            pages = self._pools[pool].num_blocks
            if name == "main":
                c = self._kv_cache(pages, bs)
            else:
                c = _Cache(allocate_indexer_cache(pages, bs, fill=SENTINEL, device=self.device), "indexer",
                           "", use_fp4=st.indexer_cache_dtype == "mxfp4")
            c.pool = pool
            caches[name] = c
        states, state_pools, ape, norm = {}, {}, {}, {}
        wdtype = NORM_WEIGHT_DTYPES[st.norm_weight_dtype]
        for name, comp in comps.items():
            sbs, sw = comp.state_block_size, comp.state_width
            pool = self._pool(f"state:{name}:{comp.ratio}", sbs, 1)
            state_pools[name] = pool
            states[name] = allocate_state_cache(self._pools[pool].num_blocks, sbs, sw, fill=_SENTINEL_F32,
                                                device=self.device)
            g = _gen(self.seed, "params", layer.index, name)
            ape[name] = (0.5 * torch.randn(comp.ape_shape, generator=g)).to(self.device)
            norm[name] = norm_weight(comp.head_dim, wdtype, "normal", g).to(self.device)
        return _Layer(layer, comps, caches, states, state_pools, ape, norm)

    def _rope_cache(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._rope:
            r = self.stack.preset.compress_rope
            self._rope[dtype] = build_cos_sin_cache(r.max_pos, r.theta, yarn=r.yarn, dtype=dtype,
                                                    device=self.device)
        return self._rope[dtype]

    # ------------------------------------------------------------------ sequences
    def _grow(self, seq: _Seq, length: int) -> None:
        for key, pool in self._pools.items():
            have = seq.blocks.setdefault(key, [])
            need = pool.blocks_for(length)
            while len(have) < need:
                if not pool.free:
                    raise RuntimeError(f"{WHERE}: pool {key} exhausted (sized for max_num_seqs)")
                have.append(pool.free.pop())
        seq.length = length

    def _evict(self, seq_id: int) -> None:
        seq = self._seqs.pop(seq_id)
        for key, ids in seq.blocks.items():
            self._pools[key].free.extend(reversed(ids))

    def _live_entries(self, pool: str) -> int:
        p = self._pools[pool]
        return sum(q.length if p.ratio == 1 else q.length // p.ratio for q in self._seqs.values())

    def seq_blocks(self, seq_id: int) -> dict[str, list[int]]:
        """Pool -> the physical blocks of a live sequence (its block-table row in each pool)."""
        return {k: list(v) for k, v in self._seqs[seq_id].blocks.items()}

    def _admit(self, step: Step, rec: StepRecord) -> None:
        """Check the step against the live sequences, evict, allocate, prefill adopted histories."""
        st = self.stack
        if len(step.seqs) > st.max_num_seqs or step.padded_tokens > st.max_num_batched_tokens:
            raise input_error(WHERE, f"step {step.index}", f"<= {st.max_num_seqs} sequences and <= "
                              f"{st.max_num_batched_tokens} tokens",
                              f"{len(step.seqs)}, {step.padded_tokens}")
        ids = [c.seq_id for c in step.seqs]
        if len(set(ids)) != len(ids):
            raise input_error(WHERE, f"step {step.index}", "each sequence once", ids)
        for c in step.seqs:
            if c.seq_len > st.max_model_len:
                raise input_error(WHERE, f"step {step.index} sequence {c.seq_id}",
                                  f"<= max_model_len ({st.max_model_len}) tokens", c.seq_len)
            seq = self._seqs.get(c.seq_id)
            if seq is not None and seq.length != c.context_len:
                raise input_error(WHERE, f"step {step.index} sequence {c.seq_id}",
                                  f"context {seq.length} (its cached tokens)", c.context_len)
        new = [c for c in step.seqs if c.seq_id not in self._seqs]
        evicted = []
        while len(self._seqs) + len(new) > st.max_num_seqs:
            victim = min((s for s in self._seqs.values() if s.seq_id not in ids), key=lambda s: s.last_used)
            self._evict(victim.seq_id)
            evicted.append(victim.seq_id)
        rec.evicted = tuple(evicted)
        self._clock += 1
        adopted = []
        for c in new:
            seq = self._seqs[c.seq_id] = _Seq(c.seq_id)
            if c.context_len:
                self._grow(seq, c.context_len)
                adopted.append(c.seq_id)
                hist = Step(-1, "history", (SeqChunk(c.seq_id, 0, c.context_len, True),), c.context_len)
                self._run(hist, rec, history=True)
                rec.history_tokens += c.context_len
        rec.adopted = tuple(adopted)
        for c in step.seqs:
            seq = self._seqs[c.seq_id]
            self._grow(seq, c.seq_len)
            seq.last_used = self._clock

    # ------------------------------------------------------------------ per-step metadata
    def _meta(self, step: Step) -> dict[str, Any]:
        """Slots and block tables of the step, per pool (int64 slots, int32 tables, -1 = none)."""
        t = step.padded_tokens
        slots, tables, pages = {}, {}, {}
        prefill = [i for i, c in enumerate(step.seqs) if c.prefill]
        for key, pool in self._pools.items():
            s = torch.full((t,), -1, dtype=torch.int64)
            bt = torch.full((self.stack.max_num_seqs, pool.width), -1, dtype=torch.int32)
            i = 0
            for row, c in enumerate(step.seqs):
                blocks = self._seqs[c.seq_id].blocks[key]
                ids = torch.tensor(blocks, dtype=torch.int64)
                bt[row, :len(blocks)] = ids.to(torch.int32)
                pos = torch.arange(c.context_len, c.seq_len, dtype=torch.int64)
                if pool.ratio == 1:
                    e, keep = pos, torch.ones_like(pos, dtype=torch.bool)
                else:
                    e, keep = pos // pool.ratio, (pos + 1) % pool.ratio == 0
                val = ids[(e // pool.bs).clamp(max=max(len(blocks) - 1, 0))] * pool.bs + e % pool.bs \
                    if blocks else torch.full_like(e, -1)
                s[i:i + c.num_tokens] = torch.where(keep, val, torch.full_like(val, -1))
                i += c.num_tokens
            slots[key] = s.to(self.device)
            tables[key] = bt.to(self.device)
            pages[key] = bt[prefill].contiguous().to(self.device)
        return {"slots": slots, "tables": tables, "pages": pages}

    # ------------------------------------------------------------------ running
    def step(self, step: Step) -> StepRecord:
        """Run ``step`` on every layer (adopting, evicting and allocating first); returns its record."""
        t0 = time.perf_counter()
        rec = StepRecord(step.index, step.phase, step.num_tokens, step.padded_tokens, step.cuda_graph)
        n_events = len(self.monitor.events)
        with use_platform(self.stack.platform), self.monitor:
            self._admit(step, rec)
            self.last = self._run(step, rec, history=False)
        self.report.compile_events += self.monitor.events[n_events:]
        rec.occupancy = {(b.layer.index, name): self._live_entries(c.pool)
                         for b in self.layers for name, c in b.caches.items()}
        rec.occupancy.update({(b.layer.index, f"state:{name}"): self._live_entries(pool)
                              for b in self.layers for name, pool in b.state_pools.items()})
        rec.blocks = {k: p.num_blocks - len(p.free) for k, p in self._pools.items()}
        rec.seconds = time.perf_counter() - t0
        self.report.steps.append(rec)
        self.steps_run += 1
        return rec

    def run(self, trace: ServingTrace | Sequence[Step], compare_with: Pipeline | None = None,
            ) -> list[StepComparison]:
        """Run every step; with ``compare_with`` (a pipeline run alongside), compare after each."""
        from dsv4kit.model.judge import compare

        out = []
        for s in trace:
            self.step(s)
            if compare_with is not None:
                compare_with.step(s)
                out.append(compare(self, compare_with))
        return out

    def _run(self, step: Step, rec: StepRecord, history: bool) -> dict[int, list[_CallRecord]]:
        meta = self._meta(step)
        first = step.seqs[0]
        tag = ("history", first.seq_id, first.num_tokens) if history else ("step", self.steps_run)
        out = {}
        for buf in self.layers:
            out[buf.layer.index] = self._layer(buf, step, meta, tag, rec, history)
        return out

    def _inputs(self, buf: _Layer, t: int, tag: tuple) -> dict[str, torch.Tensor]:
        """The layer's per-token inputs of a step (seeded by the step and layer, never by backend),
        drawn on the pipeline's device: two pipelines on one device see identical inputs, and a GPU
        run does not spend its time in CPU random numbers (6000-token histories x 43 layers)."""
        g = _gen(self.seed, *tag, buf.layer.index, device=self.device)
        p, d = self.stack.preset, self.device
        x = {"window_kv": torch.randn((t, p.head_dim), generator=g, device=d).to(torch.bfloat16)}
        for name, comp in buf.comps.items():
            sw = comp.state_width
            kv_score = torch.empty((t, 2 * sw), dtype=torch.float32, device=d)
            kv_score[:, :sw] = kv_values((t, sw), "normal", g)
            kv_score[:, sw:] = scores((t, sw), "normal", g)
            x[f"kv_score:{name}"] = kv_score
        if "indexer" in buf.comps:
            shape = (t, p.index_n_heads, p.index_head_dim)
            x["index_q"] = torch.randn(shape, generator=g, device=d).to(torch.bfloat16)
            x["index_weights"] = torch.randn((t, p.index_n_heads), generator=g, device=d).to(torch.bfloat16)
        return x

    def _store_window(self, buf: _Layer, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """The sliding-window insert (spec §2.9: E1 of the bf16 row, or E2 / E3): the formats' reference
        store hook in every pipeline, so both see identical window pages."""
        c = buf.caches["window"]
        rows = rows.to(torch.float32).contiguous()
        if c.kind == "ds":
            store_rows_ds(rows, c.tensor, slots)
        else:
            store_rows_plain(rows, c.tensor, slots, c.fp8_scale)

    def _layer(self, buf: _Layer, step: Step, meta: dict[str, Any], tag: tuple, rec: StepRecord,
               history: bool) -> list[_CallRecord]:
        li = buf.layer.index
        x = self._inputs(buf, step.padded_tokens, tag)
        win = buf.caches["window"]
        wslots = meta["slots"][win.pool]
        self._store_window(buf, x["window_kv"], wslots)
        self._note_writes(li, "window", wslots[wslots >= 0], None, rec, history)
        records: list[_CallRecord] = []
        work: dict[str, torch.Tensor] = {}
        for call in self.stack.calls(buf.layer, step):
            flow = FLOW[call.family.name]
            if history and not flow.history:
                continue
            args = self._bind(buf, call, flow, meta, x, work)
            try:
                result = self._launch(call, args, reference=history or self.backend == "reference")
            except Exception as exc:
                if hasattr(exc, "add_note"):
                    exc.add_note(f"pipeline: step {step.index} ({step.phase}), layer {li}, {call.site} of "
                                 f"{call.family.name}")
                raise
            r = _CallRecord(call.family.name, call.site, flow, args, result, history)
            records.append(r)
            (rec.history_calls if history else rec.calls)[(call.family.name, call.site)] += 1
            if flow.judge in ("c4", "chain"):
                self._entries_written(li, r, records, rec)
        return records

    def _launch(self, call: Call, args: dict[str, Any], reference: bool) -> Any:
        fam = call.family
        if reference:
            values, _ = fam.bind(**args)
            variant = values.pop(fam.variant_arg) if fam.variant_arg else DEFAULT_VARIANT
            return fam.variants[variant].reference(**values)
        return fam.op(**args, backend=call.kernel.backend, platform=self.stack.platform,
                      debug_checks=self.debug_checks)

    # ------------------------------------------------------------------ binding call sites
    def _bind(self, buf: _Layer, call: Call, flow: Flow, meta: dict[str, Any], x: dict[str, torch.Tensor],
              work: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The call site's arguments with real tensors for its stand-ins (by argument name; the
        compressor and cache of the site from :data:`FLOW`)."""
        where = f"{WHERE}: {call.family.name} {call.site}"
        comp, cache = flow.compressor_of(call.site), flow.cache_of(call.site)

        def need(kind: str, name: str | None, have: Mapping[str, Any]) -> Any:
            if name is None or name not in have:
                raise RuntimeError(f"{where}: no {kind} {name!r} on layer {buf.layer.index} "
                                   f"({buf.layer.kind})")
            return have[name]

        out: dict[str, Any] = {}
        for name, v in call.args.items():
            if not isinstance(v, TensorSpec):
                out[name] = v
                continue
            if name in ("kv", "score"):
                ks = need("input", f"kv_score:{comp}", x)
                sw = ks.shape[1] // 2
                t = ks[:, :sw] if name == "kv" else ks[:, sw:]
            elif name in flow.inputs:
                t = need("input", name, x)
            elif name == "ape":
                t = need("compressor", comp, buf.ape)
            elif name == "rms_norm_weight":
                t = need("compressor", comp, buf.norm)
            elif name == "state_cache":
                t = need("compressor", comp, buf.states)
            elif name == "slot_mapping":
                t = meta["slots"][need("compressor", comp, buf.state_pools)]
            elif name == "block_table":
                if flow.block_table == "state":
                    t = meta["tables"][need("compressor", comp, buf.state_pools)]
                else:
                    t = meta["pages"][need("cache", cache, buf.caches).pool]
            elif name in ("k_cache", "kv_cache"):
                t = need("cache", cache, buf.caches).tensor
            elif name == "kv_slot_mapping":
                t = meta["slots"][need("cache", cache, buf.caches).pool]
            elif name == "fp8_scale":
                t = need("cache", cache, buf.caches).fp8_scale
                if (t is None) != (v is None):
                    raise RuntimeError(f"{where}: fp8_scale disagrees with the cache format")
            elif name == "cos_sin_cache":
                t = self._rope_cache(v.dtype)
            elif v.values is not None:
                t = v.values().to(self.device)
            elif v.pool is not None:
                key = f"{v.pool}:{v.shape}:{v.dtype}"
                if key not in work:   # one workspace per layer and step, shared by the calls naming it
                    work[key] = _sentinel(v.shape, v.dtype, self.device)
                t = work[key]
            else:
                raise RuntimeError(f"{where}: no rule for argument {name!r}")
            if t is not None:
                self._check_like(where, name, t, v)
            out[name] = t
        return out

    @staticmethod
    def _check_like(where: str, name: str, t: torch.Tensor, spec: TensorSpec) -> None:
        """The real tensor has the stand-in's dtype and rank, and its shape beyond the leading dim
        (caches, states, tables: the hooks' pools hold fewer pages / rows)."""
        bad = t.dtype != spec.dtype or t.dim() != len(spec.shape)
        if name != "block_table":
            bad = bad or tuple(t.shape[1:]) != tuple(spec.shape[1:])
        if bad:
            raise RuntimeError(f"{where}: {name}: real {tuple(t.shape)} {t.dtype}, the model hook says "
                               f"{spec.shape} {spec.dtype}")

    # ------------------------------------------------------------------ entries written
    def _note_writes(self, li: int, cache: str, slots: torch.Tensor, terms: Any, rec: StepRecord,
                     history: bool) -> None:
        s = slots.tolist()
        (rec.history_written if history else rec.written)[(li, cache)] += len(s)
        if cache == "window":
            return
        table = self.entries[(li, cache)]
        for j, slot in enumerate(s):
            if history:
                table.pop(slot, None)
            else:
                table[slot] = None if terms is None else (terms[0][j], terms[1][j])

    def _entries_written(self, li: int, r: _CallRecord, records: list[_CallRecord], rec: StepRecord) -> None:
        """The compressed slots a call wrote and, with ``terms``, their term magnitudes and rows."""
        a, cache = r.args, r.flow.cache_of(r.site)
        if r.flow.judge == "c4":
            idx, terms = _c4_written(r.family, a, self.terms and not r.history)
        else:
            src = next(k for k in reversed(records) if k.flow.judge == "k7"
                       and k.args.get("out") is a["compressed_kv"])
            idx, terms = _chain_written(r.family, src.args, a, self.terms and not r.history)
        self._note_writes(li, cache, a["kv_slot_mapping"][idx].cpu(), terms, rec, r.history)


# --------------------------------------------------------------------------- judges' helpers


def _c4_written(op: str, a: dict[str, Any], terms: bool) -> tuple[torch.Tensor, Any]:
    """Tokens a C4 compressor call wrote (the reference's selection), and (m, y) of their entries
    (the C4 cases' magnitudes: pooled window terms of the call's inputs)."""
    from dsv4kit.kernels.c4_compress.cases import C4Case, _magnitudes
    from dsv4kit.kernels.c4_compress.reference import OPERANDS, check_c4_values

    idx = check_c4_values(op, OPERANDS[op](**a))
    if not terms or not len(idx):
        return idx, None
    m, y = _magnitudes(C4Case(op, a), idx)
    return idx, (m.cpu(), y.cpu())


def _chain_written(op: str, k7: dict[str, Any], a: dict[str, Any], terms: bool) -> tuple[torch.Tensor, Any]:
    """Tokens a K8 call wrote and (m, y) end to end from K7's pooled windows (as the C128 chain judge):
    ``m`` from the window rows, ``y`` from the call's ``compressed_kv`` (the reference K7's rows on
    the reference side)."""
    from dsv4kit.kernels.c128_compress.cases import _windows
    from dsv4kit.kernels.c128_compress.reference import OPERANDS, RATIO, c128_rows, check_c128_values

    ops = OPERANDS[op](**a)
    idx = check_c128_values(op, ops)
    if not terms or not len(idx):
        return idx, None
    k, s = _windows(k7, idx)
    w, eps, cs = a["rms_norm_weight"], a["rms_norm_eps"], a["cos_sin_cache"]
    m = term_magnitudes(k, s, w, eps, cs[compressed_position(a["positions"][idx], RATIO)])
    y = c128_rows(op, ops, eps, idx)
    return idx, (m.cpu(), y.cpu())
