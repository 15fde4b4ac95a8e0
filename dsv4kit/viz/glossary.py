"""The names the notebooks borrow from the numeric spec, as tables a reader sees before their first use.

``docs/spec.md`` names kernels (K1..K9), encoders (E1..E5) and the warmup/runtime mismatches it
calls *traps* (§2.11). A notebook shows :func:`kernel_names_markdown` and :func:`traps_markdown`
where it starts to use those names, so nobody needs the spec open to follow it. Both tables are
built from the registered family specs and :data:`dsv4kit.model.drills.TRAPS`: they cannot drift.
"""

from __future__ import annotations

from dsv4kit.kernels import families
from dsv4kit.model.drills import TRAPS
from dsv4kit.model.hooks import model_families

__all__ = ["kernel_names_markdown", "traps_markdown"]


def kernel_names_markdown(*, model_only: bool = False) -> str:
    """A markdown table: each family's spec name, its public op and what it does."""
    rows = ["| spec name | op | what it does |", "|---|---|---|"]
    for s in model_families() if model_only else families():
        rows.append(f"| {s.spec_id} | `{s.op_name}` | {s.summary} |")
    return "\n".join(rows)


def traps_markdown() -> str:
    """A markdown table of the spec's ten traps: ways a warmup can differ from what the runtime asks."""
    rows = ["| trap | the mismatch |", "|---|---|"]
    rows += [f"| {n} | {title} |" for n, title in sorted(TRAPS.items())]
    return "\n".join(rows)
