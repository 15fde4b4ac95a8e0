"""The notebooks' explorer (dsv4kit.viz.explorer) on every registered family: a call is built from the
family's cases, its key found, its grid recorded and its bytes compared with the reference."""

from __future__ import annotations

import pytest

from dsv4kit.kernels import FAMILY_NAMES, family
from dsv4kit.viz.explorer import CASE_BUILDERS, probe, probes_markdown


def test_every_family_folder_has_a_case_builder() -> None:
    assert {family(n).folder or n for n in FAMILY_NAMES} <= set(CASE_BUILDERS)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_probe_runs_and_matches_the_reference(name: str) -> None:
    spec = family(name)
    for variant in spec.variants:
        p = probe(spec, 7, variant)
        assert p.error is None and p.bit_exact, p.verdict()
        assert p.grid and p.key.startswith("(") and p.kernel.endswith("Triton")
        assert f"| {variant} | 7 | {p.kernel} |" in probes_markdown([p])


def test_probe_without_running_names_the_key_when_dispatch_reads_op_arguments() -> None:
    p = probe(family("indexer_q"), 600, "fp8", run=False)
    assert "coarsen=4" in p.key and p.diffs == {} and p.grid is None
