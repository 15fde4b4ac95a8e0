"""A DSv4 attention step as one function of torch ops, and its check under ``torch.compile`` (issue 37).

A serving step of the model stack is a sequence of op calls, layer by layer (K4, K5, K9, K1, ...).
:func:`step_calls` runs one step eagerly on a :class:`~dsv4kit.model.pipeline.Pipeline` and returns
it as an :class:`AttentionStep` (the calls' public ops, in call order) with the calls' arguments.
Because every public op is also ``torch.ops.dsv4kit.<op>``, Dynamo traces the whole step into one
graph; :func:`check_compiled` compiles it and compares every result and every byte the step writes
(caches included) with the eager run. :func:`small_prefill` builds the 3-layer example the tests
and notebook 07 compile on a CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.family.torch_op import NAMESPACE
from dsv4kit.kernels import family
from dsv4kit.model.drills import build
from dsv4kit.model.pipeline import Pipeline
from dsv4kit.model.presets import DSV4_FLASH, ModelPreset
from dsv4kit.model.requests import Request, request_trace
from dsv4kit.model.trace import Step
from dsv4kit.platform import use_platform

__all__ = [
    "SMALL_LIMITS",
    "TINY3",
    "AttentionStep",
    "CompileCheck",
    "Snapshot",
    "check_compiled",
    "clone_results",
    "run_checked",
    "same_bytes",
    "small_prefill",
    "step_calls",
    "tensors",
]

#: DSv4-Flash cut to 3 layers, one of each kind (sliding window, C4, C128); a short RoPE cache
#: keeps the CPU example small.
TINY3: ModelPreset = dataclasses.replace(
    DSV4_FLASH, name="tiny3", num_layers=3, compress_ratios=(0, 4, 128),
    compress_rope=dataclasses.replace(DSV4_FLASH.compress_rope, max_pos=4096),
)
#: Runtime limits of :func:`small_prefill`: 24 tokens a step, 4 sequences, 16-token cache blocks.
SMALL_LIMITS: dict[str, int] = dict(block_size=16, max_num_batched_tokens=24, max_num_seqs=4,
                                    max_model_len=300)


class AttentionStep:
    """One serving step's op calls on every layer, in call order: ``step(args)`` runs call ``i`` with
    ``args[i]`` through the public ops and returns their results (what the layers would consume)."""

    def __init__(self, ops: Sequence[Callable[..., Any]], backend: str | None = None) -> None:
        self.ops = tuple(ops)
        self.backend = backend

    def __call__(self, args: list[dict[str, Any]]) -> list[Any]:
        calls = zip(self.ops, args, strict=True)
        return [op(**a, backend=self.backend, debug_checks=False) for op, a in calls]


def step_calls(pipe: Pipeline, step: Step) -> tuple[AttentionStep, list[dict[str, Any]]]:
    """Run ``step`` eagerly on ``pipe`` (admitting its sequences, binding real tensors) and return the
    step as an :class:`AttentionStep` of the stack's backend with its calls' arguments."""
    pipe.step(step)
    records = [r for li in sorted(pipe.last) for r in pipe.last[li]]
    ops = [family(r.family).op for r in records]
    return AttentionStep(ops, pipe.stack.backend), [dict(r.args) for r in records]


def small_prefill(seed: int = 3) -> tuple[Pipeline, AttentionStep, list[dict[str, Any]]]:
    """The first step of two requests (30 and 20 new tokens, the second after 116 tokens of context) on
    a warmed :data:`TINY3` stack for the CPU (fp8_ds_mla cache): ``(pipeline, step, its arguments)``.
    Its calls are K4, K5, K9, K1, K3, K7 and K8a, every family this model calls."""
    stack, _ = build(TINY3, **SMALL_LIMITS)
    pipe = Pipeline(stack, seed=seed)
    first = next(iter(request_trace(stack, (Request(30, 4), Request(20, 4, context=116)))))
    step, args = step_calls(pipe, first)
    return pipe, step, args


def tensors(args: list[dict[str, Any]]) -> list[torch.Tensor]:
    """Every distinct tensor argument of a step (by object)."""
    seen: dict[int, torch.Tensor] = {}
    for a in args:
        for v in a.values():
            if isinstance(v, torch.Tensor):
                seen.setdefault(id(v), v)
    return list(seen.values())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same_bytes(a: Any, b: Any) -> bool:
    """Byte equality of results (tensors, tuples, lists, None): NaN payloads and -0.0 count."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and torch.equal(_bytes(a), _bytes(b)))
    if isinstance(a, tuple | list):
        return isinstance(b, tuple | list) and len(a) == len(b) and all(map(same_bytes, a, b))
    return a is None and b is None


def clone_results(x: Any) -> Any:
    """A copy of a step's results that later in-place writes cannot change."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, tuple | list):
        return [clone_results(v) for v in x]
    return x


class Snapshot:
    """The bytes of a step's tensors: restore them before a run, compare them after."""

    def __init__(self, ts: list[torch.Tensor]) -> None:
        self.ts = ts
        self.saved = [t.clone() for t in ts]

    def restore(self) -> None:
        for t, s in zip(self.ts, self.saved, strict=True):
            t.copy_(s)

    def same_as_now(self) -> bool:
        return all(same_bytes(s, t) for s, t in zip(self.saved, self.ts, strict=True))


def run_checked(fn: Callable[[], Any], snap: Snapshot, want: tuple[Any, Snapshot]) -> bool:
    """Restore the step's inputs, run ``fn``, and compare results and bytes with the eager run."""
    snap.restore()
    got = clone_results(fn())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    results, after = want
    return same_bytes(results, got) and after.same_as_now()


@dataclass(frozen=True)
class CompileCheck:
    """What :func:`check_compiled` saw: Dynamo's ``graph_count`` and ``graph_break_count`` for the
    step, the ``torch.ops.dsv4kit`` ops its graph calls in order (``graph_ops``), whether the
    compiled step's results and written bytes equal the eager ones (``equal``), and the kernel
    compiles the monitor saw after warmup (``compiles``)."""

    graph_count: int
    graph_break_count: int
    graph_ops: tuple[str, ...]
    equal: bool
    compiles: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.graph_count == 1 and self.graph_break_count == 0 and self.equal and not self.compiles


def check_compiled(pipe: Pipeline, step: AttentionStep, args: list[dict[str, Any]],
                   backend: str = "aot_eager") -> CompileCheck:
    """Run ``step`` eagerly, explain it with Dynamo, compile it ``fullgraph`` with ``backend`` and run
    it on the same inputs (restored first); every kernel call under the pipeline's monitor."""
    snap = Snapshot(tensors(args))
    n_events = len(pipe.monitor.events)
    with use_platform(pipe.stack.platform), pipe.monitor:
        want = (clone_results(step(args)), Snapshot(snap.ts))
        explained = torch._dynamo.explain(step.__call__)(args)
        torch._dynamo.reset()  # the compiled run must trace afresh, not reuse explain's graphs
        compiled = torch.compile(step.__call__, fullgraph=True, backend=backend)
        equal = run_checked(lambda: compiled(args), snap, want)
    events = tuple(f"{e.kernel} {e.key}" for e in pipe.monitor.events[n_events:])
    return CompileCheck(explained.graph_count, explained.graph_break_count,
                        _graph_ops(explained.graphs), equal, events)


def _graph_ops(graphs: Sequence[torch.fx.GraphModule]) -> tuple[str, ...]:
    """The ``dsv4kit`` torch ops the graphs call, in order (``namespace::name``)."""
    return tuple(n.target.name() for g in graphs for n in g.graph.nodes
                 if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                 and n.target.namespace == NAMESPACE)
