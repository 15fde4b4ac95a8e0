"""Serving traces, their replay against a :class:`~dsv4kit.model.stack.DSv4AttentionStack`, coverage.

A trace is a list of :class:`Step` s, each the batch one forward pass of a serving engine sees:
sequences with the tokens already in their KV cache (``context_len``) and the tokens this step
adds (1 for decode, a chunk for prefill), and the token count as launched (``padded_tokens``:
decode-only batches run as CUDA graphs captured at fixed sizes, the padding entries carry slot
-1). :func:`make_trace` generates seeded traces of four phases:

* ``capture``: one step per CUDA-graph size (what an engine does before serving);
* ``decode``: 1 ... ``max_num_seqs`` sequences of one token, contexts up to the max model length;
* ``prefill``: chunked prefill of long prompts (consecutive chunks of ``max_num_batched_tokens``)
  and batches of fresh prompts;
* ``mixed``: decode sequences plus prefill chunks filling the token budget.

Token counts include the edge values ``1, 2**k - 1, 2**k, 2**k + 1`` and the budget itself.

:func:`replay` walks every layer of the stack over every step and, for each op call, derives the
key with the kernel's own ``dispatch`` on metadata-only :class:`~dsv4kit.jit.Like` stand-ins and
records it through ``kernel._get_or_compile(key)``, the runtime's lookup, with a
:class:`~dsv4kit.jit.JitMonitor` armed (``error`` by default): a key warmup did not compile is
an :class:`~dsv4kit.errors.UnwarmedKeyError`, counted as a miss. With ``launch=True`` it calls
the public ops with real tensors instead (on a GPU; on CPU Triton runs under the interpreter).
:func:`coverage_report` then lists missed keys (with the nearest warmed key and the differing
fields) and dead keys (warmed, never requested, each with a reason).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from dsv4kit.errors import UnwarmedKeyError, format_key, input_error
from dsv4kit.jit import JitKernel, JitMonitor, KeyLedger
from dsv4kit.jit.monitor import key_diff, nearest_key
from dsv4kit.model.stack import DSv4AttentionStack
from dsv4kit.platform import use_platform

__all__ = [
    "PHASES",
    "TRACE_KINDS",
    "CoverageReport",
    "DeadKey",
    "MissedKey",
    "ReplayResult",
    "ReplayStats",
    "SeqChunk",
    "ServingTrace",
    "Step",
    "TraceLimits",
    "coverage_report",
    "edge_counts",
    "make_trace",
    "replay",
]

TRACE = "make_trace"
PHASES = ("capture", "decode", "prefill", "mixed")
#: What ``--trace`` accepts: one phase (decode includes the CUDA-graph capture) or all of them.
TRACE_KINDS = ("decode", "prefill", "mixed", "all")


# --------------------------------------------------------------------------- traces


@dataclass(frozen=True)
class SeqChunk:
    """One sequence in a step: ``num_tokens`` new tokens after ``context_len`` cached ones."""

    seq_id: int
    context_len: int
    num_tokens: int
    prefill: bool

    @property
    def seq_len(self) -> int:
        return self.context_len + self.num_tokens


@dataclass(frozen=True)
class Step:
    """One forward pass: its sequences, the launched token count, and whether it is a CUDA graph."""

    index: int
    phase: str
    seqs: tuple[SeqChunk, ...]
    padded_tokens: int
    cuda_graph: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.seqs)

    @property
    def num_padding(self) -> int:
        return self.padded_tokens - self.num_tokens

    @property
    def prefill_chunks(self) -> tuple[SeqChunk, ...]:
        return tuple(c for c in self.seqs if c.prefill)

    @property
    def max_seq_len(self) -> int:
        return max((c.seq_len for c in self.seqs), default=0)

    def positions(self) -> torch.Tensor:
        """int64 ``[padded_tokens]``: each token's position; padding entries get 0."""
        out = torch.zeros(self.padded_tokens, dtype=torch.int64)
        i = 0
        for c in self.seqs:
            out[i:i + c.num_tokens] = torch.arange(c.context_len, c.seq_len, dtype=torch.int64)
            i += c.num_tokens
        return out

    def slot_mapping(self) -> torch.Tensor:
        """int64 ``[padded_tokens]``: a cache slot per token (sequence s owns slots from s * 2**24
        on); ``-1`` for the padding entries of a CUDA-graph batch."""
        out = torch.full((self.padded_tokens,), -1, dtype=torch.int64)
        i = 0
        for c in self.seqs:
            base = c.seq_id * (1 << 24)
            out[i:i + c.num_tokens] = base + torch.arange(c.context_len, c.seq_len, dtype=torch.int64)
            i += c.num_tokens
        return out


@dataclass(frozen=True)
class TraceLimits:
    """What the scheduler may put in a step (from the stack's runtime settings)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    cuda_graph_sizes: tuple[int, ...] = ()

    @classmethod
    def of(cls, stack: DSv4AttentionStack) -> TraceLimits:
        return cls(stack.max_num_batched_tokens, stack.max_num_seqs, stack.max_model_len,
                   stack.cuda_graph_sizes())


@dataclass
class ServingTrace:
    """A list of steps plus how it was made (kind, seed, limits, longest context)."""

    steps: list[Step]
    kind: str
    seed: int
    limits: TraceLimits
    max_context: int

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def phases(self) -> Counter:
        return Counter(s.phase for s in self.steps)

    def token_counts(self) -> list[int]:
        return [s.padded_tokens for s in self.steps]

    def check(self, limits: TraceLimits) -> None:
        """Raise ``KernelInputError`` naming the first step a scheduler with ``limits`` could not emit."""
        for s in self.steps:
            where = f"trace step {s.index} ({s.phase})"
            if not s.seqs or s.num_tokens < 1:
                raise input_error(where, "seqs", "at least one token", s.num_tokens)
            if len(s.seqs) > limits.max_num_seqs:
                raise input_error(where, "seqs", f"<= max_num_seqs ({limits.max_num_seqs}) sequences",
                                  len(s.seqs))
            if not s.num_tokens <= s.padded_tokens <= limits.max_num_batched_tokens:
                raise input_error(where, "padded_tokens", f"in [{s.num_tokens}, max_num_batched_tokens "
                                  f"({limits.max_num_batched_tokens})]", s.padded_tokens)
            if s.cuda_graph and s.padded_tokens not in limits.cuda_graph_sizes:
                raise input_error(where, "padded_tokens", "a captured CUDA-graph size", s.padded_tokens)
            for c in s.seqs:
                if c.seq_len > limits.max_model_len:
                    raise input_error(where, f"sequence {c.seq_id}",
                                      f"context + new tokens <= max_model_len ({limits.max_model_len})",
                                      c.seq_len)
                if c.num_tokens < 1 or c.context_len < 0 or (not c.prefill and c.num_tokens != 1):
                    raise input_error(where, f"sequence {c.seq_id}", "decode: 1 token; prefill: >= 1 token",
                                      f"{c.num_tokens} tokens after {c.context_len}")

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "seed": self.seed, "limits": asdict(self.limits),
                           "max_context": self.max_context, "steps": [asdict(s) for s in self.steps]})

    @classmethod
    def from_json(cls, text: str) -> ServingTrace:
        d = json.loads(text)
        steps = [Step(s["index"], s["phase"], tuple(SeqChunk(**c) for c in s["seqs"]), s["padded_tokens"],
                      s["cuda_graph"]) for s in d["steps"]]
        lim = d["limits"]
        limits = TraceLimits(lim["max_num_batched_tokens"], lim["max_num_seqs"], lim["max_model_len"],
                             tuple(lim["cuda_graph_sizes"]))
        return cls(steps, d["kind"], d["seed"], limits, d["max_context"])


def edge_counts(limit: int) -> list[int]:
    """``1``, ``limit``, then ``2, 2**k - 1, 2**k, 2**k + 1`` ascending, all within ``[1, limit]``."""
    out = {2}
    k = 2
    while k <= limit:
        out |= {k - 1, k, k + 1}
        k *= 2
    rest = sorted(v for v in out if 1 < v < limit)
    return list(dict.fromkeys([1, limit, *rest]))


class _Gen:
    """Stateful helpers shared by the phase generators."""

    def __init__(self, limits: TraceLimits, max_context: int, seed: int) -> None:
        self.lim = limits
        self.ctx = max_context
        self.rng = random.Random(seed)
        self.steps: list[Step] = []
        self.next_id = 0
        self.long_prompt: tuple[int, int, int] | None = None  # (seq_id, prompt length, done)

    def seq_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def add(self, phase: str, seqs: list[SeqChunk]) -> None:
        n = sum(c.num_tokens for c in seqs)
        graph = phase in ("capture", "decode") and bool(self.lim.cuda_graph_sizes) \
            and n <= self.lim.cuda_graph_sizes[-1]
        padded = min(s for s in self.lim.cuda_graph_sizes if s >= n) if graph else n
        self.steps.append(Step(len(self.steps), phase, tuple(seqs), padded, graph))

    def decode_context(self) -> int:
        """Cached tokens of a decoding sequence (>= 1; one more must fit): often long."""
        hi = self.ctx - 1
        r = self.rng.random()
        if r < 0.15:
            return hi                                           # at the max model length
        if r < 0.35:
            return max(1, hi - self.rng.randint(0, min(hi - 1, 4096)))   # long context
        return self.rng.randint(1, hi)

    def decode_seqs(self, n: int) -> list[SeqChunk]:
        return [SeqChunk(self.seq_id(), self.decode_context(), 1, False) for _ in range(n)]

    def prefill_seqs(self, tokens: int, max_seqs: int) -> list[SeqChunk]:
        """``tokens`` prefill tokens over at most ``max_seqs`` sequences, each fitting the context.

        Mostly a few sequences (at most one of them ending at the max model length, the others
        with log-uniform contexts); sometimes a batch of many short fresh prompts.
        """
        out: list[SeqChunk] = []
        if self.long_prompt is not None and self.rng.random() < 0.5:
            # The next chunk of a long prompt (chunked prefill): context = what was done so far.
            sid, length, done = self.long_prompt
            n = min(tokens, length - done)
            out.append(SeqChunk(sid, done, n, True))
            self.long_prompt = None if done + n >= length else (sid, length, done + n)
            tokens -= n
        elif self.long_prompt is None and tokens == self.lim.max_num_batched_tokens and self.ctx > tokens:
            length = self.rng.randint(tokens + 1, self.ctx)
            sid = self.seq_id()
            out.append(SeqChunk(sid, 0, tokens, True))
            self.long_prompt = (sid, length, tokens)
            tokens = 0
        many = self.rng.random() < 0.2
        limit = max_seqs if many else min(max_seqs, len(out) + 8)
        long_done = False
        while tokens > 0 and len(out) < limit:
            slots = limit - len(out)
            n = tokens if slots == 1 else self.rng.randint(1, tokens)
            n = min(n, self.ctx)
            r = self.rng.random()
            if many or r < 0.4:
                ctx = 0                                          # a fresh prompt
            elif r < 0.6 and not long_done:
                ctx, long_done = self.ctx - n, True              # a chunk ending at the max model length
            else:
                ctx = min(self.ctx - n, int(2 ** self.rng.uniform(0, math.log2(self.ctx - n + 1))))
            out.append(SeqChunk(self.seq_id(), ctx, n, True))
            tokens -= n
        return out


def make_trace(
    kind: str,
    limits: TraceLimits | DSv4AttentionStack,
    *,
    steps: int = 64,
    seed: int = 0,
    max_context: int | None = None,
) -> ServingTrace:
    """A seeded trace of ``kind`` (``decode``, ``prefill``, ``mixed`` or ``all``), ``steps`` steps
    per phase (``all``: each of decode, prefill, mixed), plus the CUDA-graph capture steps for
    ``decode`` and ``all`` when graphs are on. ``max_context``: the longest sequence the trace
    makes (default and maximum: the max model length)."""
    if isinstance(limits, DSv4AttentionStack):
        limits = TraceLimits.of(limits)
    if kind not in TRACE_KINDS:
        raise input_error(TRACE, "kind", f"one of {', '.join(TRACE_KINDS)}", repr(kind))
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise input_error(TRACE, "steps", "an int >= 1", repr(steps))
    ctx = limits.max_model_len if max_context is None else max_context
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 2:
        raise input_error(TRACE, "max_context", "an int >= 2 (decode needs one cached token)", repr(ctx))
    if ctx > limits.max_model_len:
        raise input_error(TRACE, "max_context", f"<= max_model_len ({limits.max_model_len})", ctx)
    g = _Gen(limits, ctx, seed)
    budget, seqs = limits.max_num_batched_tokens, limits.max_num_seqs
    phases = ["decode", "prefill", "mixed"] if kind == "all" else [kind]

    if "decode" in phases:
        for size in limits.cuda_graph_sizes:
            g.add("capture", [SeqChunk(g.seq_id(), 1, 1, False) for _ in range(size)])
        edges = edge_counts(seqs)
        for i in range(steps):
            n = edges[i] if i < len(edges) else g.rng.randint(1, seqs)
            g.add("decode", g.decode_seqs(n))
    if "prefill" in phases:
        edges = edge_counts(budget)
        for i in range(steps):
            t = edges[i] if i < len(edges) else g.rng.choice([budget, g.rng.randint(1, budget)])
            t = min(t, seqs * ctx)
            g.add("prefill", g.prefill_seqs(t, seqs))
    if kind == "mixed" and (budget < 2 or seqs < 2):
        raise input_error(TRACE, "kind", "decode, prefill or all: mixed batches need max_num_seqs >= 2 and "
                          "max_num_batched_tokens >= 2", f"mixed with {seqs} sequence(s), {budget} token(s)")
    if "mixed" in phases and budget >= 2 and seqs >= 2:
        edges = edge_counts(budget)
        for i in range(steps):
            total = max(2, edges[i] if i < len(edges) else g.rng.choice([budget, g.rng.randint(2, budget)]))
            d = g.rng.randint(1, min(seqs - 1, total - 1))
            chunk = g.decode_seqs(d) + g.prefill_seqs(min(total - d, (seqs - d) * ctx), seqs - d)
            g.add("mixed", chunk)
    trace = ServingTrace(g.steps, kind, seed, limits, ctx)
    trace.check(limits)
    return trace


# --------------------------------------------------------------------------- replay


@dataclass
class ReplayStats:
    """What a replay saw: steps per phase, launched token counts, op calls per site."""

    phases: Counter = field(default_factory=Counter)
    tokens: list[int] = field(default_factory=list)
    prefill_steps: int = 0
    cuda_graph_steps: int = 0
    max_seq_len: int = 0
    calls: Counter = field(default_factory=Counter)       # (family, site) -> calls
    keys_by_site: dict[tuple[str, str], Counter] = field(default_factory=dict)

    @property
    def num_calls(self) -> int:
        return sum(self.calls.values())


@dataclass
class ReplayResult:
    """A replay's statistics, its misses (one error per call that needed a compile), the monitor's
    compile events, and how it ran."""

    stats: ReplayStats
    misses: list[UnwarmedKeyError]
    compile_events: list[Any]
    launch: bool
    seconds: float
    steps: int

    @property
    def ok(self) -> bool:
        return not self.misses and not self.compile_events


def replay(
    stack: DSv4AttentionStack,
    trace: ServingTrace,
    *,
    launch: bool = False,
    mode: str = "error",
    ledger: KeyLedger | None = None,
    stop_on_miss: bool = False,
    device: str | torch.device | None = None,
) -> ReplayResult:
    """Replay ``trace`` on every layer of ``stack`` with a :class:`JitMonitor` in ``mode``.

    Dispatch mode (default): for each op call, ``key = family.dispatch(kernel, like_args)`` (the
    kernel's own ``dispatch``), ``kernel.check_key(key)`` and ``kernel._get_or_compile(key)`` as the
    launcher does; nothing runs. ``launch=True``: the public op runs with real tensors on
    ``device`` (default: the platform's). A call the monitor stops is a miss; with
    ``stop_on_miss`` the first one is raised. ``ledger`` (entered here) records the requests.
    """
    trace.check(TraceLimits.of(stack))
    stats = ReplayStats()
    misses: list[UnwarmedKeyError] = []
    dev = torch.device(device or stack.device)
    pools: dict[Any, torch.Tensor] = {}
    t0 = time.perf_counter()
    monitor = JitMonitor(mode)  # type: ignore[arg-type]
    with use_platform(stack.platform), ledger if ledger is not None else nullcontext(), monitor:
        for step in trace:
            stats.phases[step.phase] += 1
            stats.tokens.append(step.padded_tokens)
            stats.prefill_steps += bool(step.prefill_chunks)
            stats.cuda_graph_steps += step.cuda_graph
            stats.max_seq_len = max(stats.max_seq_len, step.max_seq_len)
            for layer in stack.layers:
                for call in stack.calls(layer, step):
                    kernel = call.kernel
                    stats.calls[(call.family.name, call.site)] += 1
                    try:
                        if launch:
                            stack.launch(call, call.real_args(dev, pools))
                            continue
                        key = call.family.dispatch(kernel, call.like_args(dev.type))
                        stats.keys_by_site.setdefault((kernel.name, call.site), Counter())[key] += 1
                        kernel.check_key(key)
                        kernel._get_or_compile(key)
                    except UnwarmedKeyError as err:
                        misses.append(err)
                        if stop_on_miss:
                            raise
                    except Exception as exc:
                        # Name the call (a device fault in launch mode surfaces here, or at a later call).
                        if hasattr(exc, "add_note"):
                            shapes = {k: v.shape for k, v in call.args.items() if hasattr(v, "shape")}
                            exc.add_note(f"replay: step {step.index} ({step.phase}), layer {layer.index}, "
                                         f"{call.site} on {kernel.name}, shapes {shapes}")
                        raise
        if launch and dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return ReplayResult(stats, misses, list(monitor.events), launch, time.perf_counter() - t0, len(trace))


# --------------------------------------------------------------------------- coverage


@dataclass(frozen=True)
class MissedKey:
    """Requested, never warmed: each such call would compile at runtime."""

    kernel: str
    key: Any
    calls: int
    nearest: Any
    diff: dict[str, tuple[Any, Any]]

    def __str__(self) -> str:
        near = ("no key of this kernel was warmed" if self.nearest is None else
                f"nearest warmed {format_key(self.nearest)} differs in "
                + ", ".join(f"{n}: warmed {_s(w)}, requested {_s(r)}" for n, (w, r) in self.diff.items()))
        return f"MISSED {self.kernel} {format_key(self.key)} x{self.calls}: {near}"


@dataclass(frozen=True)
class DeadKey:
    """Warmed, never requested by the replayed trace, with the reason."""

    kernel: str
    key: Any
    reason: str

    def __str__(self) -> str:
        return f"dead   {self.kernel} {format_key(self.key)}: {self.reason}"


def _s(v: Any) -> str:
    return str(v).removeprefix("torch.")


@dataclass
class CoverageReport:
    """Missed and dead keys per kernel after a replay, plus the ledger and the replay result."""

    ledger: KeyLedger
    result: ReplayResult
    missed: list[MissedKey]
    dead: list[DeadKey]

    @property
    def ok(self) -> bool:
        """No missed key and no compile after warmup."""
        return not self.missed and not self.result.compile_events

    def dead_reasons(self) -> dict[tuple[str, Any], str]:
        return {(d.kernel, d.key): d.reason for d in self.dead}

    def summary(self) -> str:
        r = self.result
        phases = ", ".join(f"{n} {p}" for p, n in r.stats.phases.items())
        mode = "launched" if r.launch else "dispatched on metadata stand-ins"
        table = [ln for ln in self.ledger.summary().splitlines() if not ln.startswith("MISSED ")]
        lines = [f"replayed {r.steps} steps ({phases}) on every layer: {r.stats.num_calls} kernel calls "
                 f"{mode}, {r.seconds:.2f} s", *table]
        lines += [str(m) for m in self.missed]
        lines += [str(d) for d in self.dead]
        seen = {(m.kernel, m.key) for m in self.missed}
        extra = {(e.kernel, str(e.key), e.source) for e in r.compile_events if (e.kernel, e.key) not in seen}
        lines += [f"COMPILE after warmup: {k} {key} ({src})" for k, key, src in sorted(extra)]
        verdict = "OK" if self.ok else "FAILED"
        distinct = len({(e.kernel, str(e.key)) for e in r.compile_events})
        lines.append(f"coverage {verdict}: {len(self.missed)} missed key(s), {len(self.dead)} dead key(s), "
                     f"{len(r.compile_events)} call(s) stopped by the monitor ({distinct} distinct key(s))")
        return "\n".join(lines)


def coverage_report(
    stack: DSv4AttentionStack,
    ledger: KeyLedger,
    result: ReplayResult,
    kernels: Mapping[str, JitKernel] | None = None,
) -> CoverageReport:
    """Missed keys (with the nearest warmed key) and dead keys (with a reason) from ``ledger``.

    ``kernels``: kernel name -> object of everything that was warmed (a registry's kernels); the
    stack's own kernels are used where a name is missing. A dead key's reason comes from, in
    order: the kernel not being selected by this runtime (variant, backend), the key not being
    one this runtime configuration registers, then the family's reason for the trace.
    """
    objs = {**stack.kernels(), **(kernels or {})}
    own = {name: set(keys) for name, keys in stack.warmup_keys().items()}
    missed = []
    for name, keys in ledger.missed().items():
        warmed = list(ledger.warmed.get(name, {}))
        for key in keys:
            near = nearest_key(key, warmed)
            missed.append(MissedKey(name, key, ledger.requested[name][key], near,
                                    key_diff(near, key) if near is not None else {}))
    dead = []
    for name, keys in ledger.dead().items():
        for key in keys:
            dead.append(DeadKey(name, key, _dead_reason(stack, objs.get(name), name, key, own, result.stats)))
    return CoverageReport(ledger, result, missed, dead)


def _dead_reason(stack: DSv4AttentionStack, kernel: JitKernel | None, name: str, key: Any,
                 own: Mapping[str, set[Any]], stats: ReplayStats) -> str:
    if name not in stack.kernels():
        # Warmed, but not a kernel this runtime calls: another variant or backend of a family.
        fam = next((f for f in stack.families if kernel is not None and f.owns(kernel)), None)
        if fam is None or kernel is None:
            return f"{name} belongs to no kernel family of this stack"
        why = stack.not_selected(fam, kernel)
        if why is not None:
            return why
        used = sorted({lay.kernels[fam.name].backend for lay in stack.layers if fam.name in lay.kernels})
        return (f"{kernel.backend} backend not selected: this runtime's {fam.name} runs "
                f"{', '.join(used) or 'nothing'} on {stack.platform.device} {stack.platform.arch} (trap 6)")
    if key not in own.get(name, set()):
        return "not a warmup key of this runtime configuration (warmed by a differently configured warmup)"
    family = stack.family_of(name)
    why = stack.explain_dead(family, key, stats) if family is not None else None
    return why or "never requested by this trace"
