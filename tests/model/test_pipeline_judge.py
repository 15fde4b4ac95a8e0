"""The pipeline's BIT-EXACT judge: equal tensors are judged where they live without a copy; a
difference is still found and counted, a mask still excludes what it excludes."""

from __future__ import annotations

import torch

from dsv4kit.formats.ds_mla import allocate_ds_cache
from dsv4kit.model.judge import _exact, _exact_bytes


def test_equal_tensors_pass_with_every_element_counted() -> None:
    a = torch.randn(4, 33)
    v = _exact(3, "x", a, a.clone(), detail="kept")
    assert v.ok and v.elements == v.bit_identical == a.numel() and v.detail == "kept"


def test_one_flipped_bit_is_found_and_counted() -> None:
    a = torch.randn(4, 33)
    b = a.clone()
    b.view(torch.int32)[2, 7] ^= 1
    v = _exact(0, "x", a, b)
    assert not v.ok and v.bit_identical == a.numel() - 1 and v.detail == "1 element(s) differ"
    mask = torch.ones(4, 33, dtype=torch.bool)
    mask[2, 7] = False
    assert _exact(0, "x", a, b, mask=mask).ok                      # outside the mask: not judged


def test_a_strided_view_and_a_negative_zero_are_bits_not_values() -> None:
    a = torch.zeros(8, 6)[:, ::2]
    b = a.clone()
    b[1, 1] = -0.0                                                  # equal as a value, not as bits
    assert not _exact(0, "x", a, b).ok
    assert _exact(0, "x", a, a.contiguous()).ok


def test_paged_cache_bytes_page_tails_included() -> None:
    a = allocate_ds_cache(3, 2, page_stride=3 * 576, fill=0xA5)        # 1728 > 2 * 584: a tail
    b = allocate_ds_cache(3, 2, page_stride=3 * 576, fill=0xA5)
    assert _exact_bytes(0, "cache", a, b).ok
    tail = b.view(torch.uint8).as_strided((1,), (1,), b.storage_offset() + 2 * 584)  # page 0's tail
    tail.fill_(0)
    v = _exact_bytes(0, "cache", a, b)
    assert not v.ok and v.elements - v.bit_identical == 1
