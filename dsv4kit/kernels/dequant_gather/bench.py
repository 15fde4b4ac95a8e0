"""K3 in ``dsv4kit bench``: the bytes model, the sweep's inputs and plan (:mod:`dsv4kit.bench`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsv4kit.bench import Point, SweepPlan

__all__ = ["DEQUANT_KEYS", "DEQUANT_NREQ", "PLANS", "dequant_gather_bytes", "dequant_gather_inputs"]

#: K3 keys swept: (block size, has gather_lens), and the requests a point's rows are spread over.
DEQUANT_KEYS = ((256, True), (64, False), (2, False))
DEQUANT_NREQ = 16


def dequant_gather_bytes(nreq: int, rows_per_request: int, block_size: int, has_gather_lens: bool) -> int:
    """K3: per gathered row 448 code + 128 rope + 7 scale bytes read, 1024 bytes written; one
    4-byte block-table entry per page touched (a window call touches one page more)."""
    pages = nreq * (-(-rows_per_request // block_size) + (1 if has_gather_lens else 0))
    return nreq * rows_per_request * (448 + 128 + 7 + 1024) + 4 * pages


def dequant_gather_inputs(nreq: int, rows: int, bs: int, with_g: bool, device: str, seed: int = 0
                          ) -> dict[str, Any]:
    """K3 arguments of one point (the inputs the recorded K3 sweeps were timed on): ``rows`` rows
    per request of random entries; a window call reads the last ``rows`` of ``rows + 1000`` at
    offset 64, a compressed call all ``rows`` at offset 0."""
    from dsv4kit.formats.ds_mla import allocate_ds_cache, ds_page_regions

    gen = torch.Generator(device=device).manual_seed(seed)
    length = rows + 1000 if with_g else rows
    blocks = -(-length // bs)
    num_pages = nreq * blocks + 1
    cache = allocate_ds_cache(num_pages, bs, fill=0xA5, device=device)
    data, scales = ds_page_regions(cache)

    def ints(lo: int, hi: int, n: int) -> torch.Tensor:
        return torch.randint(lo, hi, (num_pages, bs, n), generator=gen, device=device, dtype=torch.int32)

    data[:, :, :448] = (ints(0, 0x7F, 448) | (ints(0, 2, 448) << 7)).to(torch.uint8)
    data[:, :, 448:] = ints(0, 256, 128).to(torch.uint8)
    scales[:, :, :7] = ints(105, 255, 7).to(torch.uint8)
    scales[:, :, 7] = 0
    perm = torch.randperm(num_pages, generator=gen, device=device)[: nreq * blocks]
    offset = 64 if with_g else 0
    return {"out": torch.empty((nreq, offset + rows, 512), dtype=torch.bfloat16, device=device),
            "k_cache": cache, "seq_lens": torch.full((nreq,), length, dtype=torch.int32, device=device),
            "gather_lens": torch.full((nreq,), rows, dtype=torch.int32, device=device) if with_g else None,
            "block_table": perm.view(nreq, blocks).to(torch.int32).contiguous(), "block_size": bs,
            "offset": offset}


def _points(rows: int) -> list[Point]:
    nreq = min(DEQUANT_NREQ, rows)
    per = rows // nreq

    def build(bs: int, with_g: bool) -> Callable[[str], dict[str, Any]]:
        def make(device: str) -> dict[str, Any]:
            return dequant_gather_inputs(nreq, per, bs, with_g, device, seed=nreq * 7 + per)

        return make

    return [Point("dequant_gather", "dequant_gather",
                  f"block_size={bs} {'gather_lens' if g else 'no gather_lens'} nreq={nreq}", nreq * per,
                  dequant_gather_bytes(nreq, per, bs, g), build(bs, g)) for bs, g in DEQUANT_KEYS]


PLANS: tuple[SweepPlan, ...] = (
    SweepPlan("dequant_gather", ("dequant_gather",), (2048, 16384, 65536, 262144, 1048576), _points,
              size_axis="rows gathered (16 requests)", hash_family="dequant_gather"),
)
