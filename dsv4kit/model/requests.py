"""Request traces: :class:`Request` and :func:`request_trace`, a simple engine scheduler's steps.

:func:`request_trace` makes traces whose requests advance: chunked prefill under the token
budget, then decode, decode-only steps padded to CUDA-graph sizes (padding tokens: slot -1). A
request with cached context is adopted by the :class:`~dsv4kit.model.pipeline.Pipeline` that
runs the trace (its history prefilled first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsv4kit.errors import input_error
from dsv4kit.model.stack import DSv4AttentionStack
from dsv4kit.model.trace import SeqChunk, ServingTrace, Step, TraceLimits

__all__ = ["Request", "request_trace"]


@dataclass(frozen=True)
class Request:
    """A request of :func:`request_trace`: ``prompt`` tokens to prefill after ``context`` already
    cached ones (``context > 0``: adopted, its history prefilled by the pipeline), then ``decode``
    tokens one per step; it arrives before step ``arrival``."""

    prompt: int
    decode: int = 0
    context: int = 0
    arrival: int = 0


def request_trace(stack: DSv4AttentionStack | TraceLimits, requests: Sequence[Request], *, seed: int = 0,
                  max_steps: int = 10_000) -> ServingTrace:
    """Steps of a simple engine scheduler over ``requests`` (sequence ids = their indices).

    Each step first decodes every running request that finished its prompt (one token each),
    then fills the token budget with prefill chunks of the others in arrival order (chunked
    prefill), at most ``max_num_seqs`` sequences per step. Decode-only steps run as CUDA graphs:
    padded to the smallest captured size (the padding tokens have slot -1). ``seed`` is recorded
    only (the schedule is deterministic).
    """
    lim = TraceLimits.of(stack) if isinstance(stack, DSv4AttentionStack) else stack
    state = [{"done": 0, "decoded": 0} for _ in requests]
    steps: list[Step] = []
    for r in requests:
        if r.prompt < 1 or r.context < 0 or r.decode < 0 \
                or r.context + r.prompt + r.decode > lim.max_model_len:
            raise input_error("request_trace", "requests", f"prompt >= 1 and context + prompt + decode <= "
                              f"max_model_len ({lim.max_model_len})", r)
    while len(steps) < max_steps:
        i = len(steps)
        active = [k for k, r in enumerate(requests) if r.arrival <= i
                  and (state[k]["done"] < r.prompt or state[k]["decoded"] < r.decode)]
        if not active:
            if all(state[k]["done"] >= r.prompt and state[k]["decoded"] >= r.decode
                   for k, r in enumerate(requests)):
                break
            steps.append(Step(i, "idle", (), 0))  # placeholder, removed below
            continue
        seqs: list[SeqChunk] = []
        budget = lim.max_num_batched_tokens
        for k in active:
            r, s = requests[k], state[k]
            if s["done"] >= r.prompt and len(seqs) < lim.max_num_seqs and budget >= 1:
                seqs.append(SeqChunk(k, r.context + r.prompt + s["decoded"], 1, False))
                s["decoded"] += 1
                budget -= 1
        for k in active:
            r, s = requests[k], state[k]
            if s["done"] < r.prompt and len(seqs) < lim.max_num_seqs and budget >= 1:
                n = min(budget, r.prompt - s["done"])
                seqs.append(SeqChunk(k, r.context + s["done"], n, True))
                s["done"] += n
                budget -= n
        n = sum(c.num_tokens for c in seqs)
        decode_only = all(not c.prefill for c in seqs)
        graph = decode_only and bool(lim.cuda_graph_sizes) and n <= lim.cuda_graph_sizes[-1]
        padded = min(g for g in lim.cuda_graph_sizes if g >= n) if graph else n
        phase = "decode" if decode_only else ("prefill" if all(c.prefill for c in seqs) else "mixed")
        steps.append(Step(i, phase, tuple(seqs), padded, graph))
    real = [s for s in steps if s.seqs]
    real = [Step(j, s.phase, s.seqs, s.padded_tokens, s.cuda_graph) for j, s in enumerate(real)]
    top = max((c.seq_len for s in real for c in s.seqs), default=2)
    trace = ServingTrace(real, "requests", seed, lim, max(2, top))
    trace.check(lim)
    return trace
