"""K3 test cases: paged fp8_ds_mla caches with known content, block tables, poisoned outputs.

Shared by the tests, the notebook and the GPU benchmark so that all three exercise the same
inputs. Everything that a kernel must not touch is poisoned with the byte ``0xA5`` (§2.12):
the output workspace, the cache's stride padding and every page no request uses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dsv4kit.formats.ds_mla import (
    DS_ENTRY_BYTES,
    DS_HEAD_DIM,
    DS_NOPE_DIM,
    DS_TOKEN_BYTES,
    allocate_ds_cache,
    ds_page_regions,
    store_rows_ds,
)

__all__ = [
    "SENTINEL",
    "GatherCase",
    "E4M3_FINITE_CODES",
    "fill_random_bytes",
    "make_case",
    "TraceCall",
    "prefill_trace",
    "same_bits",
    "table_case",
]

SENTINEL = 0xA5
#: The 254 non-NaN e4m3fn codes (0x7F and 0xFF are NaN).
E4M3_FINITE_CODES = tuple(c for c in range(256) if c & 0x7F != 0x7F)


@dataclass
class GatherCase:
    """The arguments of one K3 call (``out`` poisoned with 0xA5) and how it was built."""

    out: torch.Tensor
    k_cache: torch.Tensor
    seq_lens: torch.Tensor
    gather_lens: torch.Tensor | None
    block_table: torch.Tensor
    block_size: int
    offset: int
    label: str = ""

    def args(self, out: torch.Tensor | None = None) -> tuple:
        """Positional arguments of the op / the reference (optionally with another ``out``)."""
        return (self.out if out is None else out, self.k_cache, self.seq_lens, self.gather_lens,
                self.block_table, self.block_size, self.offset)

    def fresh_out(self) -> torch.Tensor:
        """A new output of the same shape, poisoned with the sentinel byte."""
        out = torch.empty_like(self.out)
        out.view(torch.uint8).fill_(SENTINEL)
        return out

    def to(self, device: torch.device | str) -> GatherCase:
        """The same case on another device (the cache keeps its page stride)."""
        kc = self.k_cache
        flat = kc.as_strided((kc.shape[0] * kc.stride(0),), (1,))
        new = flat.to(device).as_strided(kc.shape, kc.stride())
        return replace(self, out=self.out.to(device), k_cache=new, seq_lens=self.seq_lens.to(device),
                       gather_lens=None if self.gather_lens is None else self.gather_lens.to(device),
                       block_table=self.block_table.to(device))

    @property
    def rows_written(self) -> int:
        """Output rows the call writes (sum of G)."""
        g = self.seq_lens if self.gather_lens is None else self.gather_lens
        return int(g.sum())

    def written_mask(self) -> torch.Tensor:
        """bool ``[out.shape[0], M]``: rows ``[offset, offset + G_b)`` of each request."""
        nreq = self.seq_lens.shape[0]
        g = (self.seq_lens if self.gather_lens is None else self.gather_lens).to(torch.int64).cpu()
        rows = torch.arange(self.out.shape[1])
        mask = torch.zeros(self.out.shape[:2], dtype=torch.bool)
        mask[:nreq] = (rows[None, :] >= self.offset) & (rows[None, :] < self.offset + g[:, None])
        return mask


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of two tensors (NaN payloads and the sign of zero included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def fill_random_bytes(k_cache: torch.Tensor, slots: torch.Tensor, gen: torch.Generator,
                      scale_range: tuple[int, int] = (105, 254)) -> None:
    """Write entries of random bytes at ``slots``: non-NaN e4m3 codes, scale bytes in ``scale_range``
    (inclusive), pad byte 0, and arbitrary rope bit patterns (NaN payloads included)."""
    n = slots.numel()
    if n == 0:
        return
    data, scales = ds_page_regions(k_cache)
    bs = k_cache.shape[1]
    codes = torch.tensor(E4M3_FINITE_CODES, dtype=torch.uint8)
    nope = codes[torch.randint(0, len(codes), (n, DS_NOPE_DIM), generator=gen)]
    rope = torch.randint(0, 256, (n, DS_TOKEN_BYTES - DS_NOPE_DIM), generator=gen).to(torch.uint8)
    sb = torch.randint(scale_range[0], scale_range[1] + 1, (n, 7), generator=gen).to(torch.uint8)
    sc = torch.cat((sb, torch.zeros((n, 1), dtype=torch.uint8)), dim=1)
    dev = k_cache.device
    page, off = (slots // bs).to(dev), (slots % bs).to(dev)
    data[page, off] = torch.cat((nope, rope), dim=1).to(dev)
    scales[page, off] = sc.to(dev)


def make_case(
    seq_lens: list[int],
    gather_lens: list[int] | None = None,
    *,
    offset: int = 0,
    block_size: int = 64,
    page_stride: int | None = None,
    content: str = "encoded",
    seed: int = 0,
    spare_pages: int = 3,
    pad_blocks: int = 2,
    extra_rows: int = 3,
    extra_requests: int = 1,
    shuffle_pages: bool = True,
    free_window_pages: bool = True,
    device: torch.device | str = "cpu",
) -> GatherCase:
    """Build a K3 call: each request's entries on its own pages, in random physical order.

    ``content``: ``"encoded"`` (random rows of magnitudes 2**-20..2**20 through the reference
    encoder, §2.9) or ``"bytes"`` (random non-NaN codes, scale bytes 105..254, any rope bits).
    Block tables are padded with -1 (``pad_blocks`` columns past the longest request); with
    ``free_window_pages`` the blocks before a request's first gathered entry are -1 as well (a
    sliding window whose old pages were freed). ``out`` has ``extra_rows`` rows past
    ``offset + max G`` and ``extra_requests`` requests past nreq; all of it, the stride padding
    and the spare pages hold the 0xA5 sentinel.
    """
    gen = torch.Generator().manual_seed(seed)
    content_gen = torch.Generator().manual_seed(seed + 1_000_003)  # independent of the page order
    nreq = len(seq_lens)
    glens = list(seq_lens) if gather_lens is None else list(gather_lens)
    bs = block_size
    need = [-(-n // bs) for n in seq_lens]
    num_pages = max(sum(need) + spare_pages, 1)
    k_cache = allocate_ds_cache(num_pages, bs, page_stride=page_stride, fill=SENTINEL)
    order = torch.randperm(num_pages, generator=gen) if shuffle_pages else torch.arange(num_pages)
    max_blocks = max(need + [0]) + pad_blocks
    bt = torch.full((nreq, max_blocks), -1, dtype=torch.int32)
    slots = []
    used = 0
    for b, n in enumerate(need):
        pages = order[used : used + n]
        used += n
        bt[b, :n] = pages.to(torch.int32)
        length, g = seq_lens[b], glens[b]
        if free_window_pages and g < length:
            bt[b, : (length - g) // bs] = -1
        tok = torch.arange(length - g, length)
        slots.append(pages[tok // bs].to(torch.int64) * bs + tok % bs)
    slot_t = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
    if content == "encoded":
        n = slot_t.numel()
        mag = torch.exp2(torch.randint(-20, 21, (n, 1), generator=content_gen).to(torch.float32))
        rows = torch.randn((n, DS_HEAD_DIM), generator=content_gen) * mag
        if n:
            store_rows_ds(rows, k_cache, slot_t)
    elif content == "bytes":
        fill_random_bytes(k_cache, slot_t, content_gen)
    else:
        raise ValueError(f"make_case: content: expected 'encoded' or 'bytes', got {content!r}")
    rows_m = offset + max(glens + [0]) + extra_rows
    out = torch.empty((nreq + extra_requests, rows_m, DS_HEAD_DIM), dtype=torch.bfloat16)
    out.view(torch.uint8).fill_(SENTINEL)
    case = GatherCase(
        out, k_cache, torch.tensor(seq_lens, dtype=torch.int32),
        None if gather_lens is None else torch.tensor(glens, dtype=torch.int32), bt, bs, offset,
        label=f"L={seq_lens} G={gather_lens} off={offset} bs={bs} P={k_cache.stride(0)} {content}",
    )
    return case if torch.device(device).type == "cpu" else case.to(device)


def table_case(scale_bytes: tuple[int, ...] = (105, 127, 200, 254)) -> GatherCase:
    """The exhaustive table test of spec K3: every non-NaN e4m3 byte under every scale byte.

    One entry per (scale byte, rotation): entry ``(s, r)`` has all 7 block scales equal to
    ``s`` and its 448 nope bytes are the 254 finite codes rotated by ``r`` (so each code sits
    in every block at least once over the rotations); a last entry per scale mixes the four
    scale bytes across its blocks. bs 2, one request gathering every entry.
    """
    codes = torch.tensor(E4M3_FINITE_CODES, dtype=torch.uint8)
    rotations = (0, 64, 128, 192)
    n_entries = len(scale_bytes) * (len(rotations) + 1)
    bs = 2
    num_pages = -(-n_entries // bs)
    k_cache = allocate_ds_cache(num_pages, bs, fill=SENTINEL)
    data, scales = ds_page_regions(k_cache)
    gen = torch.Generator().manual_seed(7)
    t = 0
    for s in scale_bytes:
        for r in (*rotations, None):
            rot = torch.roll(codes, -(r or 0))
            nope = torch.cat((rot, rot))[:DS_NOPE_DIM]
            sb = torch.full((7,), s, dtype=torch.uint8)
            if r is None:  # mixed scales across the blocks of one entry
                mixed = [scale_bytes[(i + t) % len(scale_bytes)] for i in range(7)]
                sb = torch.tensor(mixed, dtype=torch.uint8)
            rope = torch.randint(0, 256, (DS_TOKEN_BYTES - DS_NOPE_DIM,), generator=gen).to(torch.uint8)
            data[t // bs, t % bs] = torch.cat((nope, rope))
            scales[t // bs, t % bs] = torch.cat((sb, torch.zeros(1, dtype=torch.uint8)))
            t += 1
    out = torch.empty((2, n_entries + 2, DS_HEAD_DIM), dtype=torch.bfloat16)
    out.view(torch.uint8).fill_(SENTINEL)
    bt = torch.full((1, num_pages + 1), -1, dtype=torch.int32)
    bt[0, :num_pages] = torch.arange(num_pages, dtype=torch.int32)
    assert DS_ENTRY_BYTES * bs <= k_cache.stride(0)
    return GatherCase(out, k_cache, torch.tensor([n_entries], dtype=torch.int32), None, bt, bs, 1,
                      label=f"exhaustive table, scale bytes {scale_bytes}")


@dataclass(frozen=True)
class TraceCall:
    """One K3 call of a replayed prefill step: which layer kind asked, for what, and the inputs."""

    step: int
    layer: str        # "SWA" (sliding-window only), "C4" or "C128"
    role: str         # "compressed" (offset 0, no gather_lens) or "window" (the last G tokens)
    case: GatherCase


def prefill_trace(
    config: object = None,
    *,
    steps: int = 3,
    max_len: int = 600,
    max_requests: int = 3,
    window: int = 128,
    seed: int = 0,
) -> list[TraceCall]:
    """K3 calls a serving engine makes during ``steps`` prefill batches (spec K3 "Purpose").

    Each batch has 1..``max_requests`` requests of context length 1..``max_len``. Per layer kind
    (one call stands for every layer of that kind): a compressed layer of ratio R gathers its
    ``N // R`` compressed entries into rows ``[0, N // R)`` (cache block size ``max(1, B // R)``),
    then the last ``min(N, window)`` tokens of the sliding-window cache (block size B) at
    ``offset`` = the batch's largest compressed count; a sliding-window-only layer gathers
    the window at offset 0. Inputs are small random-byte caches (see :func:`make_case`).
    """
    from dsv4kit.kernels.dequant_gather.spec import config_fields

    b, ratios, dtype = config_fields(config)
    if b == 0 or dtype != "fp8_ds_mla":
        return []
    rnd = torch.Generator().manual_seed(seed)
    calls: list[TraceCall] = []
    for step in range(steps):
        nreq = int(torch.randint(1, max_requests + 1, (1,), generator=rnd))
        lens = torch.randint(1, max_len + 1, (nreq,), generator=rnd).tolist()
        glens = [min(n, window) for n in lens]
        s = seed * 1000 + step * 10
        calls.append(TraceCall(step, "SWA", "window",
                               make_case(lens, glens, offset=0, block_size=b, content="bytes", seed=s)))
        for i, r in enumerate(ratios):
            comp = [n // r for n in lens]
            calls.append(TraceCall(step, f"C{r}", "compressed",
                                   make_case(comp, None, offset=0, block_size=max(1, b // r), content="bytes",
                                             seed=s + 2 * i + 1)))
            calls.append(TraceCall(step, f"C{r}", "window",
                                   make_case(lens, glens, offset=max(comp), block_size=b, content="bytes",
                                             seed=s + 2 * i + 2)))
    return calls
