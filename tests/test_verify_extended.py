"""``dsv4kit verify --extended``: the compressors' extended cases (once the two GPU check scripts')
on CPU, scaled down, judged by the compressor rule; a broken extended case fails its family.

The GPU sizes are the scripts' own (T = 4200 padding, T = 16384 / 65536, 12 chains, 3 packed-pool
cases, decode steps 1, 8, 64, 256): checked here as values, run only on a GPU.
"""

from __future__ import annotations

import json

import pytest
from cli_run import run_main

from dsv4kit import verify
from dsv4kit.kernels.c4_compress.cases import PAST_DECODE_T, extended_cases
from dsv4kit.platform import current_platform

FAMILIES = "c4_compress_ds_mla,c128_compress,c128_norm_rope_store_plain"


def test_verify_extended_on_cpu_runs_and_passes_the_extended_cases(capsys) -> None:
    rc, out, err = run_main(capsys, "verify", "--extended", "--families", FAMILIES, "--json", "-")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["pass"] is True and doc["device"] == "cpu"
    rows = {r["family"]: r for r in doc["rows"]}
    assert set(rows) == set(FAMILIES.split(","))
    # 3 random cases each, plus: C4 1 odd stride + 2 padded + 1 large; K7 1 odd stride + large (op,
    # executor alone) + 2 decode steps alone; K8b 1 chain + 2 formats x (store, alone, chain) + 2 decode
    assert {f: r["cases"] for f, r in rows.items()} == {
        "c4_compress_ds_mla": 7, "c128_compress": 8, "c128_norm_rope_store_plain": 12}
    for r in rows.values():
        assert r["passed"] == r["cases"] and r["compiles_after_warmup"] == 0 and r["pass"] is True
        assert r["warmed"] and all("registers" in w and "spills" in w for w in r["warmed"])
    ext = doc["extended"]
    assert ext["past_decode_t"] == 64 and ext["large"] == [64] and ext["c128_large"] == [512]
    notes = " ".join(ext["scaled_down"])
    assert "not 4200" in notes and "not 16384, 65536" in notes and "CUDA reference" in notes
    assert "scaled down / skipped" in err and "ALL PASS" in err


def _family(name: str, cases: int = 1) -> verify.Row:
    return verify.verify_family(name, "triton", device="cpu", platform=current_platform(), cases=cases,
                                small=True, extended=verify.CPU_EXTENDED)


def test_an_executor_alone_that_writes_nothing_fails_its_cases(monkeypatch) -> None:
    monkeypatch.setattr(verify, "_launch_alone", lambda *a: None)
    row = _family("c128_compress")
    assert not row.ok and row.cases == 6 and row.passed == 3          # 1 random, 1 odd stride, large op
    assert all(f.startswith("kernel alone: ") for f in row.failures) and len(row.failures) == 3


def test_a_chain_whose_k7_differs_fails_the_chain_cases(monkeypatch) -> None:
    """The reference chain's K7 rows off by one: every chain (and only the chains) fails; the large
    stores fed the reference's rows on both sides still pass."""
    real = verify._reference

    def off(spec, args):
        out = real(spec, args)
        if spec.name == "c128_compress":
            out.add_(1.0)
        return out

    monkeypatch.setattr(verify, "_reference", off)
    row = _family("c128_norm_rope_store_plain")
    assert not row.ok and row.cases == 10 and len(row.failures) == 3, row.failures   # 1 chain + 2 large
    assert all("->" in f for f in row.failures)


def test_the_gpu_sizes_are_the_check_scripts_own() -> None:
    g = verify.GPU_EXTENDED
    assert (g.past_decode_t, g.large, g.large_requests, g.all_formats) == (4200, (16384, 65536), (1, 4), True)
    assert (g.chains, g.packed, g.decode, g.device_reference) == (12, 3, (1, 8, 64, 256), True)
    assert g.c128_large is None                                      # C128's large T: the same
    assert PAST_DECODE_T == 4200 and not g.notes
    cases = extended_cases("c4_compress_plain", 11, large=())    # every 10th odd, every 2nd padded
    assert sum("padded to T=4200" in c.label for c in cases) == 6
    assert sum("block_stride=" in c.label for c in cases) == 4     # 2 odd, each also padded


@pytest.mark.parametrize("large", ["", "128"])
def test_large_replaces_the_large_sizes(large: str) -> None:
    ext = verify.extended_sizes(current_platform(), [int(t) for t in large.split(",") if t])
    assert ext.large == ext.c128_large or ext.c128_large is None
    assert verify._c128_large(ext) == tuple(int(t) for t in large.split(",") if t)
    assert any("--large" in n for n in ext.notes)
