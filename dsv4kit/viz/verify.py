"""The verdict of ``dsv4kit verify`` (:mod:`dsv4kit.verify`) as a notebook table.

A notebook runs a small battery of its families through :func:`dsv4kit.verify.run_verify` (the
same code the command runs on a user's GPU) and shows one row per family and backend; the large
batteries live in ``tests/``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsv4kit.kernels import family
from dsv4kit.verify import Row

__all__ = ["verify_markdown"]


def verify_markdown(rows: Sequence[Row]) -> str:
    """One row per family and backend: cases, bit-identical, passed (by the family's rule where it
    is not bit-identity), compiles after warmup, verdict; failures listed under the table."""
    lines = ["| spec name | op | backend | cases | bit-identical | passed | compiles after warmup "
             "| verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spec = family(r.family)
        lines.append(f"| {spec.spec_id} | `{spec.op_name}` | {r.backend} | {r.cases} | {r.bit_identical} "
                     f"| {r.passed} | {r.compiles_after_warmup} | {'pass' if r.ok else '**FAIL**'} |")
    failures = [f"* {r.family} ({r.backend}): {f}" for r in rows for f in r.failures[:3]]
    return "\n".join(lines + ([""] + failures if failures else []))
