"""The judge of two pipelines: :func:`compare` and the verdicts it returns.

:func:`compare` judges a kernel :class:`~dsv4kit.model.pipeline.Pipeline` against a reference
pipeline after each step (spec §2.12): state caches, the window cache and K1/K2 outputs BIT-EXACT;
K3 workspaces BIT-EXACT against the reference gather replayed on the pipeline's own caches, and
equal to the reference pipeline's outside the gathered compressed rows; compressed caches (K5/K6,
K9, K8) by the compressor rule over every entry a kernel wrote so far, with term magnitudes from
the reference pipeline's inputs, every other byte identical; K7's rows by the FP32 rule. Each
verdict counts its bit-identical elements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import DEFAULT_VARIANT
from dsv4kit.model.pipeline import _Cache, _CallRecord, _sentinel
from dsv4kit.testing.cache_judge import judge_entries, span_view

if TYPE_CHECKING:
    from dsv4kit.model.pipeline import Pipeline

__all__ = ["StepComparison", "TensorVerdict", "compare"]

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class TensorVerdict:
    """One tensor's verdict after a step: ``rule`` is ``bit-exact``, ``compressor`` or ``fp32``."""

    layer: int
    tensor: str
    rule: str
    ok: bool
    elements: int
    bit_identical: int
    detail: str = ""

    def __str__(self) -> str:
        flag = "ok  " if self.ok else "FAIL"
        return (f"{flag} layer {self.layer} {self.tensor} [{self.rule}]: "
                f"{self.bit_identical}/{self.elements} bit-identical"
                + (f"; {self.detail}" if self.detail else ""))


@dataclass
class StepComparison:
    """Every tensor's verdict after one step (kernel pipeline ``a`` against reference pipeline ``b``)."""

    step: int
    verdicts: list[TensorVerdict]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def failures(self) -> list[TensorVerdict]:
        return [v for v in self.verdicts if not v.ok]

    def by_rule(self) -> dict[str, tuple[int, int]]:
        """rule -> (bit-identical elements, elements)."""
        out: dict[str, tuple[int, int]] = {}
        for v in self.verdicts:
            b, n = out.get(v.rule, (0, 0))
            out[v.rule] = (b + v.bit_identical, n + v.elements)
        return out

    def summary(self) -> str:
        head = f"step {self.step}: {'OK' if self.ok else 'FAILED'}, " + ", ".join(
            f"{rule} {b}/{n} bit-identical" for rule, (b, n) in self.by_rule().items())
        return "\n".join([head, *(f"  {v}" for v in self.verdicts)])

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())


def _ints_view(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(_INT_OF_SIZE[t.element_size()])


def _as_ints(t: torch.Tensor) -> torch.Tensor:
    return _ints_view(t).cpu()


def _exact(layer: int, name: str, got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor | None = None,
           detail: str = "") -> TensorVerdict:
    """BIT-EXACT: every element's bits equal (where ``mask``, if given, is True). Equal tensors are
    told apart where they live, without a copy (on a GPU, gigabytes of caches per step); only a
    difference is counted on the CPU."""
    if (got.device == want.device and got.shape == want.shape and got.dtype == want.dtype
            and torch.equal(_ints_view(got), _ints_view(want))):
        n = got.numel()
        return TensorVerdict(layer, name, "bit-exact", True, n, n, detail)
    a, b = _as_ints(got), _as_ints(want)
    if a.shape != b.shape:
        return TensorVerdict(layer, name, "bit-exact", False, a.numel(), 0, f"shapes {a.shape} vs {b.shape}")
    same = a == b
    ok = bool(same.all()) if mask is None else bool(same[mask.cpu()].all())
    bad = int((~same).sum()) if mask is None else int((~same & mask.cpu()).sum())
    text = detail or (f"{bad} element(s) differ" if bad else "")
    return TensorVerdict(layer, name, "bit-exact", ok, a.numel(), int(same.sum()), text)


def _exact_bytes(layer: int, name: str, got: torch.Tensor, want: torch.Tensor) -> TensorVerdict:
    """BIT-EXACT over a paged cache's addressable bytes (page tails included)."""
    return _exact(layer, name, span_view(got), span_view(want))


# --------------------------------------------------------------------------- compare


def compare(a: Pipeline, b: Pipeline) -> StepComparison:
    """Judge pipeline ``a`` (kernels) against ``b`` (references, run with the same seed on the same
    steps) after the step both ran last (see the module docstring for what is judged how)."""
    if a.steps_run != b.steps_run or a.seed != b.seed or len(a.layers) != len(b.layers):
        raise input_error("compare", "pipelines", "two pipelines of one stack and seed after the same steps",
                          f"steps {a.steps_run} / {b.steps_run}, seeds {a.seed} / {b.seed}")
    if not b.terms:
        raise input_error("compare", "b", "a pipeline keeping term magnitudes (the reference side)",
                          "terms off")
    out: list[TensorVerdict] = []
    for la, lb in zip(a.layers, b.layers, strict=True):
        li = la.layer.index
        for name in la.states:
            out.append(_exact(li, f"state:{name}", la.states[name], lb.states[name]))
        for name, ca in la.caches.items():
            cb = lb.caches[name]
            if name == "window":
                out.append(_exact_bytes(li, f"cache:{name}", ca.tensor, cb.tensor))
            else:
                out.append(_judge_cache(li, name, ca, cb, a.entries[(li, name)], b.entries[(li, name)]))
        out += _judge_step(li, a.last.get(li, []), b.last.get(li, []))
    return StepComparison(a.report.steps[-1].index if a.report.steps else -1, out)


def _judge_cache(li: int, name: str, ca: _Cache, cb: _Cache, ea: Mapping[int, Any],
                 eb: Mapping[int, Any]) -> TensorVerdict:
    """Compressor rule over every entry a kernel wrote so far (terms from ``b``); other bytes exact."""
    label = f"cache:{name}"
    if set(ea) != set(eb):
        return TensorVerdict(li, label, "compressor", False, 0, 0,
                             f"written slots differ: {len(set(ea) ^ set(eb))} not in both")
    slots = sorted(eb)
    if not slots:
        v = _exact_bytes(li, label, ca.tensor, cb.tensor)
        return TensorVerdict(li, label, "compressor", v.ok, v.elements, v.bit_identical, "no entries yet; " +
                             (v.detail or "all bytes identical"))
    m = torch.stack([eb[s][0] for s in slots])
    y = torch.stack([eb[s][1] for s in slots])
    verdict = judge_entries(label, ca.kind, ca.tensor, cb.tensor, torch.tensor(slots, dtype=torch.int64),
                            m, y, fp8_scale=ca.fp8_scale, use_fp4=ca.use_fp4)
    return TensorVerdict(li, label, "compressor", verdict.ok, verdict.elements, verdict.bit_identical,
                         verdict.summary())


def _judge_step(li: int, ra: list[_CallRecord], rb: list[_CallRecord]) -> list[TensorVerdict]:
    """The step's own results: K1/K2 outputs, K7 rows, K3 workspaces."""
    if [(r.family, r.site) for r in ra] != [(r.family, r.site) for r in rb]:
        return [TensorVerdict(li, "calls", "bit-exact", False, 0, 0, "the pipelines made different calls")]
    out: list[TensorVerdict] = []
    gathers: list[tuple[_CallRecord, _CallRecord]] = []
    for x, y in zip(ra, rb, strict=True):
        if x.history:
            continue
        tag = f"{x.family}:{x.site}"
        if x.flow.judge == "outputs":
            for i, (g, w) in enumerate(zip(x.result, y.result, strict=True)):
                out.append(_exact(li, f"{tag}[{i}] {str(g.dtype).removeprefix('torch.')}", g, w))
        elif x.flow.judge == "k7":
            from dsv4kit.kernels.c128_compress.cases import C128Case, judge_k7

            v = judge_k7(C128Case(x.family, y.args, tag), x.args["out"], y.args["out"])
            out.append(TensorVerdict(li, f"{tag} out", "fp32", v.ok, v.elements, v.bit_identical,
                                     v.summary()))
        elif x.flow.judge == "gather":
            gathers.append((x, y))
    if gathers:
        out += _judge_gathers(li, gathers)
    return out


def _judge_gathers(li: int, gathers: list[tuple[_CallRecord, _CallRecord]]) -> list[TensorVerdict]:
    """K3: the kernel workspace equals the reference gather replayed on the kernel pipeline's own
    caches (BIT-EXACT, sentinel rows included); against the reference pipeline's workspace every
    element outside the compressed rows is identical (those rows decode entries the cache judge
    already judged: they are counted, not gated)."""
    from dsv4kit.kernels import family

    by_out: dict[int, list[tuple[_CallRecord, _CallRecord]]] = {}
    for x, y in gathers:
        by_out.setdefault(id(x.args["out"]), []).append((x, y))
    verdicts = []
    for pairs in by_out.values():
        ws_a, ws_b = pairs[0][0].args["out"], pairs[0][1].args["out"]
        replay = _sentinel(ws_a.shape, ws_a.dtype, ws_a.device)
        compressed = torch.zeros(ws_a.shape[:2], dtype=torch.bool)
        for x, _ in pairs:
            spec = family(x.family)
            values, _ = spec.bind(**{**x.args, "out": replay})
            spec.variants[DEFAULT_VARIANT].reference(**values)
            if x.args["gather_lens"] is None:        # the compressed region: rows [offset, offset + L)
                for req, n in enumerate(x.args["seq_lens"].tolist()):
                    compressed[req, x.args["offset"]:x.args["offset"] + n] = True
        sites = "+".join(x.site for x, _ in pairs)
        verdicts.append(_exact(li, f"dequant_gather workspace ({sites}) = reference on own caches", ws_a,
                               replay))
        keep = (~compressed)[..., None].expand(ws_a.shape)
        v = _exact(li, f"dequant_gather workspace ({sites}) vs reference pipeline", ws_a, ws_b, mask=keep)
        verdicts.append(TensorVerdict(li, v.tensor, "bit-exact outside compressed rows", v.ok, v.elements,
                                      v.bit_identical, v.detail))
    return verdicts
