"""``dsv4kit verify``: every family's battery on this device, one verdict (CPU: Triton interpreter)."""

from __future__ import annotations

import json

import pytest
import torch
from cli_run import run_main

from dsv4kit import verify
from dsv4kit.kernels import FAMILY_NAMES, family
from dsv4kit.platform import current_platform


def test_verify_rowquant_and_indexer_q_json(capsys) -> None:
    rc, out, err = run_main(capsys, "verify", "--families", "rowquant,indexer_q", "--json", "-")
    assert rc == 0, err
    doc = json.loads(out)                                   # stdout is the JSON alone
    assert doc["pass"] is True and doc["device"] == "cpu"
    rows = {(r["family"], r["backend"]): r for r in doc["rows"]}
    assert set(rows) == {("rowquant", "triton"), ("indexer_q", "triton")}
    for r in rows.values():
        assert r["cases"] > 0 and r["bit_identical"] == r["passed"] == r["cases"]
        assert r["compiles_after_warmup"] == 0 and r["pass"] is True
    assert "ALL PASS" in err and "rowquant" in err          # the one-screen verdict, on stderr here
    prov = doc["provenance"]                                 # the record says where it came from
    assert prov["commit"] and prov["torch"] and prov["dsv4kit"]["kernel_source_hash"]["rowquant"]


def test_every_family_has_a_battery() -> None:
    assert list(verify.BATTERIES) == list(FAMILY_NAMES)


def test_a_compile_after_warmup_fails_the_family(monkeypatch) -> None:
    """Without the warmup, the first call compiles under JitMonitor('error'): the verdict is FAIL."""
    monkeypatch.setattr(verify, "_warm", lambda *a: None)
    for v in family("rowquant").variants.values():
        v.kernel_class("triton").clear_cache()
    row = verify.verify_family("rowquant", "triton", device="cpu", platform=current_platform(), cases=1,
                               small=True)
    assert row.compiles_after_warmup == 1 and not row.ok and "compile after warmup" in row.failures[0]


def test_a_case_that_differs_fails_the_family(monkeypatch) -> None:
    """A reference that disagrees with the kernel (one flipped byte) is a failed, non-identical case."""
    real = verify._reference

    def off_by_one(spec, args):
        q, scale = real(spec, args)
        q.view(torch.uint8).view(-1)[0] ^= 1
        return q, scale

    monkeypatch.setattr(verify, "_reference", off_by_one)
    row = verify.verify_family("rowquant", "triton", device="cpu", platform=current_platform(), cases=2,
                               small=True)
    assert row.cases == 2 and row.bit_identical == row.passed == 0 and not row.ok
    assert "differs from the reference" in row.failures[0]
    table = verify.verdict_table([row], current_platform())
    assert "FAIL" in table and "1 of 1 FAIL" in table


def test_unknown_family_is_a_command_line_error(capsys) -> None:
    rc, _, err = run_main(capsys, "verify", "--families", "nope")
    assert rc == 2 and "unknown families ['nope']" in err


@pytest.mark.parametrize("backends", ["cuda", "triton,x"])
def test_unknown_backend_is_a_command_line_error(capsys, backends: str) -> None:
    rc, _, err = run_main(capsys, "verify", "--families", "rowquant", "--backends", backends)
    assert rc == 2 and "--backends" in err
