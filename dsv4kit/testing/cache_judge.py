"""Judging a compressor's cache against the reference's (spec §2.12), for every cache format.

:func:`judge_entries` takes the two caches after the same call, the kv slots the call wrote and,
per written entry, the reference's fp32 row ``y`` and its term magnitudes ``m``. Every byte the
rule does not judge (pad bytes, unwritten entries, page tails) must be identical; the decoded
values of the written entries must follow the compressor rule; scale bytes follow the
boundary-block rule. Both C4 (K5, K6, K9) and C128 (K8a, K8b) cases use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4kit.formats.bits import bytes_to_f32, e4m3_decode, ue8m0_decode
from dsv4kit.formats.fp8 import q8_exponent
from dsv4kit.formats.mxfp4 import q4_dequantize, q4_exponent, unpack_nibbles
from dsv4kit.testing.compressor_rule import (
    RuleReport,
    bf16_ulp,
    boundary_blocks,
    check_compressor_rule,
    e2m1_step,
    e4m3_step,
)

__all__ = ["CACHE_KINDS", "Verdict", "cpu_copy", "judge_entries", "span_bytes", "span_view"]

#: ``ds``: fp8_ds_mla (E1); ``plain``: bf16 / e4m3 rows (E2 / E3); ``indexer``: FP8 / MXFP4 (E4 / E5).
CACHE_KINDS = ("ds", "plain", "indexer")


@dataclass
class Verdict:
    """The rule's reports per output tensor, and the exact part (bytes the rule does not judge)."""

    label: str
    reports: dict[str, RuleReport]
    written: int
    other_bytes_equal: bool

    @property
    def ok(self) -> bool:
        return self.other_bytes_equal and all(r.ok for r in self.reports.values())

    @property
    def bit_identical(self) -> int:
        return sum(r.bit_identical for r in self.reports.values())

    @property
    def elements(self) -> int:
        return sum(r.n for r in self.reports.values())

    def summary(self) -> str:
        parts = [f"{k}: {r.summary()}" for k, r in self.reports.items()]
        exact = "other bytes identical" if self.other_bytes_equal else "OTHER BYTES DIFFER"
        return f"{self.label}: {self.written} entries; {exact}; " + "; ".join(parts)

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())


def _storage_bytes(x: torch.Tensor) -> torch.Tensor:
    full = x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)
    return full.view(torch.uint8).to("cpu", copy=True)


def cpu_copy(x: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``x`` with its strides and storage offset (``x.cpu()`` of a strided GPU view
    is contiguous: a page-strided cache would change layout). CPU tensors are returned as they are."""
    if x.device.type == "cpu":
        return x
    raw = _storage_bytes(x)
    return raw.view(x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())


def span_view(cache: torch.Tensor) -> torch.Tensor:
    """The bytes of a paged cache from its first page to its last entry's end, as a 1-D uint8 view
    where the cache lives (the bytes a kernel may address; what lies around the view in its storage
    is not compared)."""
    b = cache.view(torch.uint8)
    num_pages, kv_bs, width = b.shape
    span = (num_pages - 1) * b.stride(0) + kv_bs * width
    return b.as_strided((span,), (1,), b.storage_offset())


def span_bytes(cache: torch.Tensor) -> torch.Tensor:
    """A CPU copy of :func:`span_view`."""
    return span_view(cache).to("cpu", copy=True)


def _regions(kind: str, use_fp4: bool, kv_bs: int, esize: int) -> list[tuple[int, int, int]]:
    """Judged byte ranges of one entry ``(entry multiplier, page offset, size)``."""
    if kind == "ds":
        return [(576, 0, 576), (8, kv_bs * 576, 7)]  # the pad byte is BIT-EXACT
    if kind == "plain":
        return [(512 * esize, 0, 512 * esize)]
    if use_fp4:
        return [(64, 0, 64), (4, kv_bs * 64, 4)]
    return [(128, 0, 128), (4, kv_bs * 128, 4)]


def judge_entries(
    label: str,
    kind: str,
    got: torch.Tensor,
    want: torch.Tensor,
    slots: torch.Tensor,
    m: torch.Tensor,
    y: torch.Tensor,
    *,
    fp8_scale: torch.Tensor | None = None,
    use_fp4: bool = False,
) -> Verdict:
    """Judge cache ``got`` against ``want`` (same layout, any device) where the call wrote ``slots``;
    ``m`` and ``y`` ``[len(slots), D]``: term magnitudes and fp32 rows of the reference."""
    got, want = cpu_copy(got), cpu_copy(want)
    kv_bs, esize = got.shape[1], got.element_size()
    page_bytes = got.stride(0) * esize
    rg, rw = span_bytes(got), span_bytes(want)
    judged = torch.zeros_like(rg, dtype=torch.bool)
    page, entry = slots.cpu().div(kv_bs, rounding_mode="floor"), slots.cpu().remainder(kv_bs)
    for mult, off, size in _regions(kind, use_fp4, kv_bs, esize):   # every slot's region bytes at once
        start = page * page_bytes + off + entry * mult
        judged[(start[:, None] + torch.arange(size)).flatten()] = True
    other_equal = bool(torch.equal(rg[~judged], rw[~judged]))
    slots = slots.cpu()
    if not len(slots):
        reports: dict[str, RuleReport] = {}
    elif kind == "ds":
        reports = _ds_reports(got, want, slots, m, y)
    elif kind == "plain":
        reports = _plain_reports(got, want, slots, m, fp8_scale)
    else:
        reports = _indexer_reports(got, want, slots, m, y, use_fp4)
    return Verdict(label, reports, len(slots), other_equal)


def _ds_reports(got: torch.Tensor, want: torch.Tensor, slots: torch.Tensor, m: torch.Tensor,
                y: torch.Tensor) -> dict[str, RuleReport]:
    """fp8_ds_mla entries (E1): the e4m3 nope dims under their ue8m0 block scales, the bf16 rope dims."""
    from dsv4kit.formats.ds_mla import decode_ds_entries, read_ds_entries

    n = len(slots)
    (ea, _), (eb, _) = read_ds_entries(got, slots), read_ds_entries(want, slots)
    da, db = decode_ds_entries(ea), decode_ds_entries(eb)
    sa = ue8m0_decode(ea.scales).repeat_interleave(64, dim=1)
    sb = ue8m0_decode(eb.scales).repeat_interleave(64, dim=1)
    amax = y[:, :448].abs().reshape(n, 7, 64).amax(-1)
    bnd = boundary_blocks(amax, q8_exponent).repeat_interleave(64, dim=1)
    return {
        "nope": check_compressor_rule(
            da[:, :448], db[:, :448], m[:, :448], e4m3_step, scale_a=sa, scale_b=sb, boundary=bnd
        ),
        "rope": check_compressor_rule(da[:, 448:], db[:, 448:], m[:, 448:], bf16_ulp),
    }


def _plain_reports(got: torch.Tensor, want: torch.Tensor, slots: torch.Tensor, m: torch.Tensor,
                   fp8_scale: torch.Tensor | None) -> dict[str, RuleReport]:
    """Plain rows: bf16 (E2), or e4m3 under the per-tensor ``fp8_scale`` (E3)."""
    from dsv4kit.formats.plain_row import read_plain_rows

    scale = None if fp8_scale is None else fp8_scale.cpu()
    va, vb = read_plain_rows(got, slots, scale), read_plain_rows(want, slots, scale)
    if scale is None:
        return {"rows": check_compressor_rule(va, vb, m, bf16_ulp)}
    s = torch.full_like(va, float(scale[0]))
    return {"rows": check_compressor_rule(va, vb, m, e4m3_step, scale_a=s, scale_b=s)}


def _indexer_reports(got: torch.Tensor, want: torch.Tensor, slots: torch.Tensor, m: torch.Tensor,
                     y: torch.Tensor, fp4: bool) -> dict[str, RuleReport]:
    """Indexer K entries: MXFP4 (E5, ue8m0 scales per 32) or FP8 (E4, one fp32 scale per entry)."""
    from dsv4kit.formats.indexer_cache import read_indexer_entries

    n = len(slots)
    (xa, ba), (xb, bb) = read_indexer_entries(got, slots, fp4), read_indexer_entries(want, slots, fp4)
    if fp4:
        va, vb = q4_dequantize(unpack_nibbles(xa), ba), q4_dequantize(unpack_nibbles(xb), bb)
        sa = ue8m0_decode(ba).repeat_interleave(32, dim=1)
        sb = ue8m0_decode(bb).repeat_interleave(32, dim=1)
        amax = y.abs().reshape(n, 4, 32).amax(-1)
        bnd = boundary_blocks(amax, q4_exponent).repeat_interleave(32, dim=1)
        return {"mxfp4": check_compressor_rule(va, vb, m, e2m1_step, scale_a=sa, scale_b=sb, boundary=bnd)}
    fa, fb = bytes_to_f32(ba).reshape(n), bytes_to_f32(bb).reshape(n)
    va, vb = e4m3_decode(xa) * fa[:, None], e4m3_decode(xb) * fb[:, None]
    amax = y.abs().amax(-1, keepdim=True)
    bnd = boundary_blocks(amax, q8_exponent).expand(n, 128)
    return {
        "fp8": check_compressor_rule(
            va,
            vb,
            m,
            e4m3_step,
            scale_a=fa[:, None].expand(n, 128),
            scale_b=fb[:, None].expand(n, 128),
            boundary=bnd,
        )
    }
