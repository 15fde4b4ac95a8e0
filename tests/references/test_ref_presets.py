"""DSv4 presets: the spec §1 constants and the warmup-relevant derived values of §2.11."""

from __future__ import annotations

import dataclasses

import pytest

from dsv4kit.model.presets import DSV4_FLASH, DSV4_PRO, PRESETS, dsv4_compress_ratios


def test_flash_dims_and_heads() -> None:
    f = DSV4_FLASH
    assert (f.head_dim, f.rope_dim, f.nope_dim, f.nope_quant_block) == (512, 64, 448, 64)
    assert (f.index_head_dim, f.index_rope_dim, f.index_n_heads) == (128, 64, 64)
    assert (f.sliding_window, f.index_topk, f.c128_selection_width) == (128, 512, 8192)
    assert f.c128_selection_width == 1_048_576 // 128
    assert f.fp8_max == 448.0 and f.rms_norm_eps == 1e-6 and f.model_dtype == "bfloat16"
    assert f.indexer_softmax_scale == 128**-0.5 and f.indexer_head_scale == 0.125
    assert f.attention_scale == 512**-0.5


def test_flash_layers_and_ratios() -> None:
    r = DSV4_FLASH.compress_ratios
    assert len(r) == DSV4_FLASH.num_layers == 43
    assert r[:4] == (0, 0, 4, 128) and r[42] == 4
    assert r.count(4) == 21 and r.count(128) == 20
    assert DSV4_FLASH.ratios_present() == {4, 128}
    assert dsv4_compress_ratios(5) == (0, 0, 4, 128, 4)


def test_flash_rope_and_yarn() -> None:
    f = DSV4_FLASH
    assert f.rope.theta == 10_000.0 and f.rope.yarn is None and f.rope.correction_range() is None
    cr = f.compress_rope
    assert cr.theta == 160_000.0 and cr.max_pos == 1_048_576
    assert (cr.yarn.factor, cr.yarn.original_max_position_embeddings) == (16.0, 65536)
    assert (cr.yarn.beta_fast, cr.yarn.beta_slow) == (32.0, 1.0)
    assert cr.correction_range() == (15, 25)


def test_flash_compressors_and_state_configs() -> None:
    f = DSV4_FLASH
    assert (f.c4.window, f.c4.coff, f.c4.state_width, f.c4.kv_score_width, f.c4.ape_shape) == (
        8,
        2,
        1024,
        2048,
        (4, 1024),
    )
    assert (f.c128.window, f.c128.coff, f.c128.state_width, f.c128.kv_score_width) == (128, 1, 512, 1024)
    assert f.c128.ape_shape == (128, 512)
    assert (f.indexer.state_width, f.indexer.kv_score_width, f.indexer.ape_shape) == (256, 512, (4, 256))
    assert (f.c4.state_block_size, f.c128.state_block_size, f.indexer.state_block_size) == (4, 8, 4)
    # K4 warmup keys (SW, R, sbs) for DSv4-Flash (§2.11)
    assert f.state_configs() == ((1024, 4, 4), (512, 128, 8), (256, 4, 4))
    assert f.compressor_for_ratio(128) is f.c128


@pytest.mark.parametrize(("b", "c4", "c128", "stride128"), [(256, 64, 2, 1728), (64, 16, 1, 1152)])
def test_flash_page_geometry(b: int, c4: int, c128: int, stride128: int) -> None:
    f = DSV4_FLASH
    assert f.compressed_block_size(4, b) == c4 and f.compressed_block_size(128, b) == c128
    assert f.ds_mla_page_stride(128, b) == stride128  # K8a warmup key (kv_bs, stride)
    assert f.cache_block_size == 256 and f.ds_mla_page_stride(4) == 37440


def test_pro_differs_only_in_index_topk() -> None:
    assert DSV4_PRO.index_topk == 1024
    diff = {
        fld.name
        for fld in dataclasses.fields(DSV4_PRO)
        if getattr(DSV4_PRO, fld.name) != getattr(DSV4_FLASH, fld.name)
    }
    assert diff == {"name", "index_topk", "assumed"}
    # every field the spec does not state for Pro is marked as assumed
    assert set(DSV4_PRO.assumed) == {f.name for f in dataclasses.fields(DSV4_PRO)} - {
        "name",
        "index_topk",
        "assumed",
    }
    assert DSV4_FLASH.assumed == ()
    assert set(PRESETS) == {"DSv4-Flash", "DSv4-Pro"}


def test_presets_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DSV4_FLASH.index_topk = 1  # type: ignore[misc]
