"""benchmarks/sanitize_cases.py: its case table covers every family, and every entry builds on CPU."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load_benchmark

from dsv4kit.kernels import families


@pytest.fixture(scope="module")
def script():
    return load_benchmark("sanitize_cases")


def test_the_table_covers_every_family(script) -> None:
    assert [s.name for s in script.check_table()] == [s.name for s in families()]
    assert set(script.CASES) == {s.name for s in families()}


def test_a_missing_family_fails_loudly(script, monkeypatch) -> None:
    monkeypatch.delitem(script.CASES, "rowquant")
    with pytest.raises(SystemExit, match="missing \\['rowquant'\\]"):
        script.check_table()


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_every_entry_builds_inputs_on_cpu(script, quick: bool) -> None:
    for spec in families():
        cases = script.CASES[spec.name](quick)
        assert cases, spec.name
        names = {a.name for a in spec.args}
        for c in cases:
            assert set(c.kwargs) <= names, (spec.name, set(c.kwargs) - names)
            assert all(t.device.type == "cpu" for t in c.kwargs.values() if isinstance(t, torch.Tensor))


def test_the_quick_dry_run_runs_every_reference(script) -> None:
    counts = script.dry_run(True)
    assert set(counts) == {s.name for s in families()}


def test_the_check_catches_a_wrong_byte(script) -> None:
    spec = next(s for s in families() if s.name == "store_rows_ds")
    case = script.CASES[spec.name](True)[0]
    pristine, ret, ref_args = script.reference_call(spec, case)
    ok, _ = script.compare(spec, case, pristine, ret, ref_args, ret, ref_args)
    assert ok
    got = {k: script.clone_storage(v, "cpu") for k, v in ref_args.items()}
    got["k_cache"].view(torch.uint8).view(-1)[3] ^= 1
    ok, detail = script.compare(spec, case, pristine, ret, ref_args, ret, got)
    assert not ok and "k_cache" in detail
