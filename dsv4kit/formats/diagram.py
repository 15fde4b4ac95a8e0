"""Byte diagrams for docs/formats.md, produced by *running* the encoders (so they cannot drift).

Each diagram encodes recognisable rows, stores them with the reference store helpers into a
sentinel-filled cache, and then reports where the bytes actually landed.
"""

from __future__ import annotations

import torch

from dsv4kit.formats.bits import bf16_to_bytes
from dsv4kit.formats.ds_mla import (
    DS_ENTRY_BYTES,
    DS_NOPE_DIM,
    DS_TOKEN_BYTES,
    allocate_ds_cache,
    ds_min_page_stride,
    enc_ds,
    store_rows_ds,
)
from dsv4kit.formats.mxfp4 import pack_nibbles, q4_quantize, scale_bytes_to_int32

__all__ = ["ds_mla_page_diagram", "mxfp4_packing_diagram"]

_SENTINEL = 0xA5


def _find_runs(page: torch.Tensor, images: list[tuple[str, torch.Tensor]]) -> list[tuple[int, int, str]]:
    """Locate each labelled byte image inside ``page``; returns sorted ``(start, end, label)``."""
    found = []
    raw = bytes(page.tolist())
    for label, img in images:
        pat = bytes(img.tolist())
        pos = raw.find(pat)
        assert pos >= 0, f"{label} not found in page"
        assert raw.find(pat, pos + 1) < 0, f"{label} is ambiguous in page"
        found.append((pos, pos + len(pat), label))
    return sorted(found)


def ds_mla_page_diagram(bs: int = 2) -> str:
    """Byte map of one fp8_ds_mla page of ``bs`` tokens (minimal stride), discovered by encoding.

    Each token t gets a distinct row (nope scaled by ``t + 1`` with a distinct amax so its bytes
    are unique), is stored at slot t, and the page is then searched for each token's nope bytes,
    rope bytes and scale bytes; the pad byte and the untouched tail are read back as well.
    """
    stride = ds_min_page_stride(bs)
    cache = allocate_ds_cache(1, bs, fill=_SENTINEL)
    gen = torch.Generator().manual_seed(1234)
    rows = torch.randn((bs, 512), generator=gen)
    rows[:, :DS_NOPE_DIM] *= torch.arange(1, bs + 1, dtype=torch.float32)[:, None] * 3.0
    store_rows_ds(rows, cache, torch.arange(bs, dtype=torch.int64))
    page = cache.as_strided((stride,), (1,))
    entry = enc_ds(rows)
    images: list[tuple[str, torch.Tensor]] = []
    for t in range(bs):
        images.append((f"token {t}: 448 x e4m3 nope (7 blocks of 64)", entry.nope[t]))
        images.append((f"token {t}: 64 x bf16 rope, little-endian", bf16_to_bytes(entry.rope[t])))
        images.append((f"token {t}: 7 x ue8m0 scale (block i -> dims [64i, 64i+64))", entry.scales[t]))
    runs = _find_runs(page, images)
    lines = [
        f"fp8_ds_mla page, bs = {bs}, page stride P = round_up(bs*584, 576) = {stride} bytes",
        f"(tensor view uint8 [num_pages, {bs}, {DS_ENTRY_BYTES}]; only stride(0) is meaningful)",
        "",
        "  byte range        size  content",
    ]
    # The pad byte of every token is the byte right after its 7 scale bytes; read it back.
    pads = [
        (end, end + 1, f"{label.split(':')[0]}: pad byte (= {int(page[end])})")
        for _, end, label in runs
        if "ue8m0" in label
    ]
    spans = sorted(runs + pads)
    last = max(e for _, e, _ in spans)
    untouched = bool((page[last:] == _SENTINEL).all()) if last < stride else True
    if last < stride:
        spans.append((last, stride, f"unused ({'untouched' if untouched else 'WRITTEN'})"))
    for start, end, label in spans:
        lines.append(f"  [{start:5d}, {end:5d})  {end - start:4d}  {label}")
    lines.append("")
    lines.append(f"  data region   = [0, bs*576)        = [0, {bs * DS_TOKEN_BYTES})")
    lines.append(f"  scale region  = [bs*576, bs*584)   = [{bs * DS_TOKEN_BYTES}, {bs * DS_ENTRY_BYTES})")
    return "\n".join(lines)


def mxfp4_packing_diagram() -> str:
    """How one 32-element block is coded and packed (even element in the low nibble) and how four
    scale bytes read as one little-endian int32; built by running ``q4_quantize``/``pack_nibbles``.
    """
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    vals = torch.tensor([*grid, *(-v for v in grid)] * 2, dtype=torch.float32)  # amax 6 -> byte 127
    codes, sbytes = q4_quantize(vals)
    packed = pack_nibbles(codes)
    lines = [
        "MXFP4 block of 32 (amax 6 -> scale byte "
        f"{int(sbytes[0])} = 2^{int(sbytes[0]) - 127}), first 8 elements:",
        "",
    ]
    lines.append("  element  value  code")
    for i in range(8):
        lines.append(f"  {i:7d}  {vals[i].item():5.1f}  {int(codes[i]):#04x}")
    lines.append("")
    lines.append("  packed byte k = code[2k] | code[2k+1] << 4")
    for k in range(4):
        lines.append(
            f"  byte {k}: {int(packed[k]):#04x} = code[{2 * k}] {int(codes[2 * k]):#x} (low nibble)"
            f" | code[{2 * k + 1}] {int(codes[2 * k + 1]):#x} (high nibble)"
        )
    row = torch.tensor([1.0] * 32 + [8.0] * 32 + [0.25] * 32 + [96.0] * 32, dtype=torch.float32)
    _, rb = q4_quantize(row)
    word = int(scale_bytes_to_int32(rb))
    lines.append("")
    lines.append("  4 scale bytes of a 128-dim row (blocks with amax 1, 8, 0.25, 96):")
    lines.append(
        "  bytes " + " ".join(f"{int(b):3d}" for b in rb) + f"  ->  int32 {word} = {word & 0xFFFFFFFF:#010x}"
        " (block 0 = low byte)"
    )
    return "\n".join(lines)


if __name__ == "__main__":  # regenerate the blocks pasted into docs/formats.md
    print(ds_mla_page_diagram(2))
    print()
    print(mxfp4_packing_diagram())
