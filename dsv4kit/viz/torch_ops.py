"""Figures and tables for notebook 07: a DSv4 attention step as torch ops (issue 37).

:func:`step_markdown` lists a step's calls (spec name, public op, its torch op, what it writes),
:func:`plot_step` draws the bytes each call reads and writes, and :func:`find_record` /
:func:`record_markdown` show the recorded GPU run of ``benchmarks/torch_ops_gpu.py`` (eager vs
Inductor vs CUDA graphs), labelled as recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import torch

from dsv4kit import results
from dsv4kit.family import FamilySpec
from dsv4kit.family.torch_op import NAMESPACE
from dsv4kit.kernels import families

__all__ = ["CallBytes", "call_bytes", "find_record", "plot_step", "record_markdown", "step_markdown"]

#: Where ``benchmarks/torch_ops_gpu.py --out`` records go, under the results directory.
RECORD_GLOB = "torch_ops_*/torch_ops_gpu.json"
# Stages of the GPU script, in its order, with their column labels.
_STAGES = {"eager": "eager", "compiled": "Inductor", "reduce_overhead": "Inductor + CUDA graphs",
           "cuda_graph": "CUDAGraph of eager"}


@dataclass(frozen=True)
class CallBytes:
    """One call of a step: its family ``spec``, and the bytes of its tensor arguments it only reads
    (``read``) and those it writes in place (``written``: the spec's ``mutates``)."""

    spec: FamilySpec
    read: int
    written: int


def _spec_of(op: Any) -> FamilySpec:
    by_name = {s.op_name: s for s in families()}
    return by_name[op.__name__]


def call_bytes(ops: Sequence[Any], args: Sequence[Mapping[str, Any]]) -> list[CallBytes]:
    """:class:`CallBytes` of every call (``ops[i]`` with ``args[i]``), in call order."""
    rows = []
    for op, a in zip(ops, args, strict=True):
        spec = _spec_of(op)
        sizes = {n: v.numel() * v.element_size() for n, v in a.items() if isinstance(v, torch.Tensor)}
        written = sum(b for n, b in sizes.items() if n in spec.mutates)
        rows.append(CallBytes(spec, sum(sizes.values()) - written, written))
    return rows


def step_markdown(ops: Sequence[Any], args: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of a step's calls: spec name, public op, torch op, written arguments."""
    rows = ["| # | spec name | public op | torch op | writes in place |", "|---|---|---|---|---|"]
    for i, (op, a) in enumerate(zip(ops, args, strict=True)):
        spec = _spec_of(op)
        writes = ", ".join(f"`{n}`" for n in spec.mutates if a.get(n) is not None) or "nothing (returns new)"
        rows.append(f"| {i} | {spec.spec_id} | `{spec.op_name}` | `torch.ops.{NAMESPACE}.{spec.op_name}` "
                    f"| {writes} |")
    return "\n".join(rows)


def plot_step(ops: Sequence[Any], args: Sequence[Mapping[str, Any]],
              ax: plt.Axes | None = None) -> plt.Figure:
    """One bar per call, in call order: the KiB it reads and writes, labelled with its spec name.
    The figure's ``calls`` attribute holds the :class:`CallBytes` drawn."""
    rows = call_bytes(ops, args)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.6))
    x = range(len(rows))
    read = [r.read / 1024 for r in rows]
    written = [r.written / 1024 for r in rows]
    ax.bar(x, read, color="#9ecae1", label="read only")
    ax.bar(x, written, bottom=read, color="#e6550d", label="written in place (whole tensor)")
    ax.set_xticks(list(x), [r.spec.spec_id for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("KiB of tensor arguments")
    ax.set_title("One attention step, call by call: what a compiled graph must carry")
    ax.legend(loc="upper right")
    fig = ax.figure
    fig.calls = rows  # type: ignore[attr-defined]
    fig.tight_layout()
    return fig


def find_record() -> results.Recorded | None:
    """The newest recorded run of ``benchmarks/torch_ops_gpu.py`` (by folder name), or None."""
    root = results.results_dir()
    found = sorted(root.glob(RECORD_GLOB)) if root is not None else []
    return results.Recorded.from_path(found[-1]) if found else None


def _cell(stage: Mapping[str, Any] | None) -> str:
    if not stage:
        return "-"
    if "error" in stage:
        return "failed"
    us = f"{stage['us']:.0f} µs" if "us" in stage else "-"
    return us if stage.get("equal", True) else f"{us} (bytes differ)"


def record_markdown(data: Mapping[str, Any]) -> str:
    """The recorded step times per backend and decode size, one column per stage, from the script's
    JSON (``bytes differ`` marks a stage whose results were not eager's)."""
    head = "| backend | size | " + " | ".join(_STAGES.values()) + " | graph breaks |"
    rows = [head, "|" + "---|" * (len(_STAGES) + 3)]
    for res in data.get("results", []):
        for r in res.get("per_size", []):
            cells = " | ".join(_cell(r.get(s)) for s in _STAGES)
            breaks = (r.get("compiled") or {}).get("graph_breaks", "-")
            rows.append(f"| {res.get('backend')} | {r.get('size')} | {cells} | {breaks} |")
    return "\n".join(rows)
