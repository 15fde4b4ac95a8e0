"""dsv4kit.viz.bench.decode_path_fit: decode time over the static path of one thread.

Synthetic rows built from known coefficients come back as those coefficients (r² 1), a row is
matched to the static record of its own config, a kernel with no static record is left out, and
too few rows say so. Then the recorded pair (``sass_mix_sm90a_decode/`` and the sweeps' decode
rows) fits as ``benchmarks/results/sass_mix_sm90a_decode/sass_mix.md`` says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4kit.bench_schema import CURRENT, DecodeRow, RecordedRun, SassMix, recorded_runs, recorded_sass_mix
from dsv4kit.results import Recorded, results_dir
from dsv4kit.viz.bench import decode_path_fit

STATIC = [("k1", "", 2, 150), ("k2", "a", 3, 400), ("k2", "b", 7, 1300), ("k3", "", 5, 800),
          ("k4", "", 1, 90)]


def _mix(backend: str = "triton") -> list[SassMix]:
    return [SassMix(k, backend, c, 32, 1.0, 1.0, 0.5, "issue", 1.0, n, b) for k, c, b, n in STATIC]


def _run(rows: list[DecodeRow]) -> RecordedRun:
    rec = Recorded(Path("synthetic.json"), {"commit": "0" * 40, "device": "test"})
    return RecordedRun("synthetic.json", "rowquant", rec, None, (), (), decode=tuple(rows))


def _row(kernel: str, config: str, us: float, size: int = 1) -> DecodeRow:
    return DecodeRow(kernel, kernel, "triton", size, us + 0.7, 0.7, us, config)


def test_known_coefficients_come_back() -> None:
    rows = [_row(k, c, 0.12 * b + 0.0015 * n + 0.4) for k, c, b, n in STATIC]
    fit = decode_path_fit(_mix(), [_run(rows + [_row("k1", "", 9.0, size=8)])], size=1)
    assert fit.per_batch_us == pytest.approx(0.12) and fit.per_instruction_ns == pytest.approx(1.5)
    assert fit.fixed_us == pytest.approx(0.4) and fit.r2 == pytest.approx(1.0)
    assert len(fit.points) == 5 and not any(p.current for p in fit.points)   # no kernel hash recorded
    assert all(p.measured_us == pytest.approx(p.model_us) for p in fit.points)
    k2 = {p.config: (p.load_batches, p.path_instructions) for p in fit.points if p.kernel == "k2"}
    assert k2 == {"a": (3, 400), "b": (7, 1300)}        # each row has its own config's path


def test_unmatched_rows_are_left_out_and_too_few_raise() -> None:
    rows = [_row(k, c, 1.0 + b) for k, c, b, n in STATIC[:3]] + [_row("other", "", 5.0)]
    with pytest.raises(ValueError, match="3 decode rows at size 1"):
        decode_path_fit(_mix(), [_run(rows)], size=1)


ROOT = results_dir()


@pytest.mark.skipif(ROOT is None, reason="no recorded results in this install")
def test_the_recorded_decode_rows_follow_one_threads_path() -> None:
    runs = [r for r in recorded_runs(ROOT) if r.name in CURRENT]
    rec, mix = recorded_sass_mix(ROOT, name="sass_mix_sm90a_decode/sass_mix.json")
    assert rec.provenance["size"] == "decode" and len(mix) == 38
    fit = decode_path_fit(mix, runs, size=1)
    assert len(fit.points) == 36 and 0.7 < fit.r2 and fit.r2_instructions_only > fit.r2_batches_only
    assert 1.0 < fit.per_instruction_ns < 2.0 and 0.05 < fit.per_batch_us < 0.25
    c4 = [p for p in fit.points if p.kernel.startswith(("c4_compress", "indexer_compress"))]
    # (The C4 kernels changed after both records, together: their points no longer read "current".)
    assert len(c4) == 10 and all(p.load_batches >= 6 and p.path_instructions > 650 for p in c4)
    assert decode_path_fit(mix, runs, size=256).r2 < fit.r2    # at T = 256 the bytes start to count
