"""What the C4 and C128 case makers share (:mod:`dsv4kit.kernels.c4_compress.cases`,
:mod:`dsv4kit.kernels.c128_compress.cases`): the case record, the state pool of a batch of
requests, the kv slots of its boundary tokens, a sentinel-filled cache.

Every routine draws from the caller's generator in a fixed order, so a seed gives the same case
on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from dsv4kit.formats.ds_mla import allocate_ds_cache
from dsv4kit.formats.indexer_cache import allocate_indexer_cache
from dsv4kit.formats.plain_row import allocate_plain_cache
from dsv4kit.formats.state_cache import allocate_state_cache
from dsv4kit.testing.compressor_data import SENTINEL, kv_values, request_regime, scores

__all__ = ["CompressorCase", "Requests", "assert_args_match_fakes", "boundary_kv_slots", "clone_strided",
           "requests", "sentinel_cache"]


@dataclass
class CompressorCase:
    """One call of ``op``: ``args`` are the op's arguments (its written one sentinel-filled)."""

    op: str
    args: dict[str, Any]
    label: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    #: The family's operand records, op -> type (:data:`...reference.OPERANDS`).
    OPERANDS: ClassVar[dict[str, type]]

    @property
    def ops(self) -> Any:
        """The call's operand record (what the checks and the reference take)."""
        return self.OPERANDS[self.op](**self.args)

    @property
    def output_arg(self) -> str:
        """The argument the op writes: ``out`` (K7), else its cache (``k_cache`` or ``kv_cache``)."""
        return next(n for n in ("out", "kv_cache", "k_cache") if n in self.args)

    @property
    def output(self) -> torch.Tensor:
        return self.args[self.output_arg]

    def fresh(self, device: torch.device | str | None = None) -> Any:
        """A copy whose output is a new sentinel-filled buffer (same strides), on ``device``."""
        dev = torch.device(device) if device is not None else self.output.device
        args = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in self.args.items()}
        for name in (self.output_arg, "state_cache"):
            if name in self.args:
                args[name] = clone_strided(self.args[name], dev)
        return replace(self, args=args)


def clone_strided(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` copied with its strides and storage offset (the bytes around it too), on ``device``."""
    full = x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)
    raw = full.view(torch.uint8).to(device, copy=True)
    return raw.view(x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())


@dataclass(frozen=True)
class Requests:
    """A batch's state pool and tokens: ``state`` [nsb, sbs, 2 * width] (shuffled blocks, padded
    block stride), ``block_table`` [requests, columns], and per token (interleaved across requests)
    ``token_to_req``, ``positions`` and ``slot_mapping`` (padding tokens: -1)."""

    state: torch.Tensor
    block_table: torch.Tensor
    token_to_req: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor


def requests(lens: tuple[int, ...], starts: tuple[int, ...], first: list[int], sbs: int, width: int,
             kv_regime: str, score_regime: str, padding: bool, g: torch.Generator) -> Requests:
    """Requests of ``lens`` new tokens from positions ``starts``; the state holds the rows from
    ``first`` (per request: the first row a window reads) on, in blocks shuffled in a pool of
    stride ``sbs * 2 * width + 4`` floats (not a multiple of the row: kernels must use the real
    block stride), one spare block."""
    top = max(s + n for s, n in zip(starts, lens, strict=True))
    cols = -(-top // sbs)
    need = [sorted({q // sbs for q in range(f, s + n)}) for f, s, n in zip(first, starts, lens, strict=True)]
    nsb = sum(len(c) for c in need) + 1
    state = allocate_state_cache(nsb, sbs, width, block_stride=sbs * 2 * width + 4, fill=float("nan"))
    perm = torch.randperm(nsb, generator=g).to(torch.int32)
    bt = torch.full((len(lens), cols), -1, dtype=torch.int32)
    used = 0
    for r, c in enumerate(need):
        bt[r, c] = perm[used : used + len(c)]
        used += len(c)
    for r, (f, s, n) in enumerate(zip(first, starts, lens, strict=True)):
        q = torch.arange(f, s + n)
        kv = kv_values((len(q), width), request_regime(kv_regime, r), g)
        rows = torch.cat((kv, scores((len(q), width), score_regime, g)), dim=1)
        state[bt[r, q // sbs].long(), q % sbs] = rows
    req = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(lens)])
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    order = torch.randperm(len(pos), generator=g)
    req, pos = req[order].contiguous(), pos[order].contiguous()
    t = len(pos)
    slot = (bt[req.long(), (pos // sbs)].long() * sbs + pos % sbs).contiguous()
    if padding and t > 2:
        slot[torch.randperm(t, generator=g)[: max(1, t // 6)]] = -1
    return Requests(state, bt, req, pos, slot)


def boundary_kv_slots(boundary: torch.Tensor, kv_bs: int, padding: bool,
                      g: torch.Generator) -> tuple[torch.Tensor, int]:
    """``(kv_slot_mapping, pages)``: shuffled distinct slots of ``pages`` pages of ``kv_bs`` for the
    ``boundary`` tokens (3 spare entries), -1 elsewhere; with ``padding`` (and more than 2
    boundaries) the first boundary token skips its entry."""
    t = boundary.shape[0]
    nb = int(boundary.sum())
    pages = max(1, -(-(nb + 3) // kv_bs))
    kv_slots = torch.full((t,), -1, dtype=torch.int64)
    kv_slots[boundary] = torch.randperm(pages * kv_bs, generator=g)[:nb]
    if padding and nb > 2:
        kv_slots[torch.nonzero(boundary).flatten()[0]] = -1
    return kv_slots, pages


def sentinel_cache(kind: str, pages: int, kv_bs: int, page_stride: int | None,
                   fp8_scale: float | None) -> torch.Tensor:
    """A cache filled with the sentinel byte: ``kind`` ``"ds"`` (fp8_ds_mla), ``"plain"`` (e4m3 when
    ``fp8_scale`` is given, else bf16) or ``"indexer"`` (the indexer K cache)."""
    if kind == "ds":
        return allocate_ds_cache(pages, kv_bs, page_stride=page_stride, fill=SENTINEL)
    if kind == "plain":
        dtype = torch.bfloat16 if fp8_scale is None else torch.float8_e4m3fn
        return allocate_plain_cache(pages, kv_bs, dtype, page_stride=page_stride, fill_byte=SENTINEL)
    return allocate_indexer_cache(pages, kv_bs, page_stride=page_stride, fill=SENTINEL)


_CUTE_DTYPES = {torch.float32: "Float32", torch.int32: "Int32", torch.int64: "Int64", torch.uint8: "Uint8",
                torch.bfloat16: "BFloat16"}


def assert_args_match_fakes(args: tuple[Any, ...], fakes: tuple[Any, ...], n_const: int) -> None:
    """A CuTeDSL kernel's runtime arguments line up with its fake (warmup) inputs: the count (the
    fakes end with the stream and ``n_const`` constexprs), 1-D unit-stride tensors of the fakes'
    dtypes and fixed sizes, scalars where the fakes have scalars."""
    assert len(args) == len(fakes) - 1 - n_const
    for arg, fake in zip(args, fakes, strict=False):
        if isinstance(arg, torch.Tensor):
            assert arg.dim() == 1 and arg.stride() == (1,) and len(fake.shape) == 1
            assert _CUTE_DTYPES[arg.dtype] == str(fake.element_type)
            if isinstance(fake.shape[0], int):
                assert arg.shape[0] == fake.shape[0]
        else:
            assert isinstance(arg, int | float) and not isinstance(fake, torch.Tensor)
