"""``benchmarks/shape_tuning.py`` off the GPU: each target's shape is in force inside its context
and the kit's own shape is back after it (also when the sweep raises), and a shape the kernel
cannot run is refused before anything compiles."""

from __future__ import annotations

import pytest

from dsv4kit.kernels.dequant_gather import cutedsl as k3_cute
from dsv4kit.kernels.dequant_gather import triton as k3
from dsv4kit.kernels.encoders import cutedsl as enc_cute
from dsv4kit.kernels.encoders import triton as enc
from dsv4kit.kernels.encoders.spec import E1, E4, key_encoder
from dsv4kit.platform import cpu_platform
from tests.benchmark_scripts import load_benchmark

tuning = load_benchmark("shape_tuning")


def _key(cls, encoder):
    return next(k for k in cls(cpu_platform()).get_warmup_keys() if key_encoder(k) == encoder)


def test_k3_shape_in_force_and_restored() -> None:
    before = tuning._k3_default()
    with tuning._k3("2x1x8"):
        assert tuning._k3_default() == {"ROWS": 2, "NUM_WARPS": 1, "gpu_rows_per_program": 8}
    assert tuning._k3_default() == before
    with pytest.raises(RuntimeError), tuning._k3("16x8x64"):
        raise RuntimeError("a sweep that fails")
    assert tuning._k3_default() == before and k3.DequantGatherTriton.params["ROWS"].value == k3.ROWS


def test_k3_cute_rows_per_cta() -> None:
    with tuning._k3_cute("8"):
        assert k3_cute.DequantGatherCuTeDSL.rows_per_cta == 8
    assert k3_cute.DequantGatherCuTeDSL.rows_per_cta == k3_cute.ROWS_PER_CTA


def test_store_shape_applies_to_one_encoder() -> None:
    e1, e4 = _key(enc.StoreRowsDsTriton, E1), _key(enc.StoreRowsIndexerTriton, E4)
    k = enc.StoreRowsIndexerTriton(cpu_platform())
    before = (enc.tile_rows(e1), enc.tile_rows(e4), k.launch_options(e4))
    with tuning._store("E4:8x1x2"):
        assert enc.tile_rows(e4) == (8, 1) and k.launch_options(e4) == {"num_warps": 2}
        assert enc.tile_rows(e1) == before[0] and enc.rows_per_program(e4) == 8
    assert (enc.tile_rows(e1), enc.tile_rows(e4), k.launch_options(e4)) == before


def test_store_refuses_two_tiles_for_the_indexer_hooks() -> None:
    with pytest.raises(SystemExit, match="one tile per program"), tuning._store("E5:16x2x4"):
        pass


def test_store_cute_rows_per_warp() -> None:
    before = tuning._store_cute_default()
    with tuning._store_cute("idx:8"):
        assert enc_cute.rows_per_warp(2) == 8 and enc_cute.rows_per_warp(8) == before["rows_per_warp"]["ds"]
    assert tuning._store_cute_default() == before


def test_c4_tuning_writes_through_the_same_writer(tmp_path, capsys) -> None:
    import json

    c4 = load_benchmark("c4_tuning")
    row = {"kernel": "c4_compress_ds_mla", "config": "", "size": 65536, "variant": "kernel (graph replay)",
           "median_us": 160.0, "fraction_of_copy": 0.8}
    assert c4._write(tmp_path, {"runs": {"8x2048": [row]}}) == 0
    assert json.loads((tmp_path / "c4_tuning.json").read_text())["runs"]["8x2048"] == [row]
    assert "80.0 %" in capsys.readouterr().out


def test_iq_decode_shape_in_force_and_restored() -> None:
    from dsv4kit.kernels.indexer_q import triton as iq

    before = tuning._iq_default()
    assert before == {"THREAD_GROUPS": iq.THREAD_GROUPS, "num_warps": 2}
    with tuning._iq("16x4"):
        assert tuning._iq_default() == {"THREAD_GROUPS": 16, "num_warps": 4}
        assert iq.gpu_rows(1) == 16 and iq.gpu_rows(4) == 4 * iq.THREAD_GROUPS_COARSEN_4   # prefill kept
    assert tuning._iq_default() == before
