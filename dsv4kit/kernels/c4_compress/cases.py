"""Seeded cases of the C4 compressors (K5, K6, K9) and their judge (compressor rule, spec §2.12).

:func:`make_case` builds one call: requests of given lengths at given start positions (so 3,
7, non-boundary tokens and 1 048 575 all occur), shuffled state blocks with a pooled block
stride, padding tokens (slot -1) and skipped kv slots, a cache filled with the sentinel 0xA5,
and the spec's score and kv regimes. :func:`judge` compares a kernel's cache with the
reference's: every byte the rule does not judge (pad bytes, unwritten entries, page tails) must
be identical, the decoded values of the written entries must follow the rule (term magnitudes
from the reference's inputs), and it counts how many elements are bit-identical. Tests, the
notebook and the GPU script use the same cases.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dsv4kit.formats.bits import bytes_to_f32, e4m3_decode, ue8m0_decode
from dsv4kit.formats.ds_mla import allocate_ds_cache, ds_min_page_stride
from dsv4kit.formats.fp8 import q8_exponent
from dsv4kit.formats.indexer_cache import allocate_indexer_cache
from dsv4kit.formats.mxfp4 import q4_dequantize, q4_exponent, unpack_nibbles
from dsv4kit.formats.plain_row import allocate_plain_cache
from dsv4kit.formats.rope import build_cos_sin_cache, compressed_position
from dsv4kit.formats.state_cache import allocate_state_cache, window_rows
from dsv4kit.kernels.c4_compress.reference import HEAD_DIM, RATIO, c4_rows, check_c4_values
from dsv4kit.testing.compressor_rule import (
    RuleReport,
    bf16_ulp,
    boundary_blocks,
    check_compressor_rule,
    e2m1_step,
    e4m3_step,
    term_magnitudes,
)

__all__ = [
    "KV_REGIMES",
    "OPS",
    "SCORE_REGIMES",
    "SENTINEL",
    "TEST_TOKENS",
    "C4Case",
    "Verdict",
    "judge",
    "cpu_copy",
    "make_case",
    "random_case",
]

SENTINEL = 0xA5
OPS = ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress")
KV_REGIMES = ("normal", "zero", "tiny", "large")
SCORE_REGIMES = ("normal", "uniform", "saturating", "huge")
TEST_TOKENS = (1, 7, 32, 257, 513)
EPS = 1e-6
#: The largest position of the compressed layers' RoPE cache (§1): 1 048 575.
LAST_POSITION = 65_536 * 16 - 1
_SMALL_MAX_POS = 4096


@functools.lru_cache(maxsize=2)
def cos_sin(max_pos: int) -> torch.Tensor:
    """The compressed layers' fp32 RoPE cache (θ = 160 000, no YaRN here: data, not a model)."""
    return build_cos_sin_cache(max_pos, 160_000.0, yarn=None)


@dataclass
class C4Case:
    """One call of ``op``: ``args`` are the op's arguments (the cache among them, sentinel-filled)."""

    op: str
    args: dict[str, Any]
    label: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def cache_arg(self) -> str:
        return "kv_cache" if self.op == "c4_compress_plain" else "k_cache"

    @property
    def cache(self) -> torch.Tensor:
        return self.args[self.cache_arg]

    def fresh(self, device: torch.device | str | None = None) -> C4Case:
        """A copy whose cache is a new sentinel-filled buffer (same strides), on ``device``."""
        dev = torch.device(device) if device is not None else self.cache.device
        args = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in self.args.items()}
        args[self.cache_arg] = _clone_strided(self.cache, dev)
        args["state_cache"] = _clone_strided(self.args["state_cache"], dev)
        return replace(self, args=args)


def _storage_bytes(x: torch.Tensor) -> torch.Tensor:
    """A CPU copy of every byte of ``x``'s storage."""
    full = x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)
    return full.view(torch.uint8).to("cpu", copy=True)


def _span_bytes(cache: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the bytes of a paged cache from its first page to its last entry's end (the
    bytes a kernel may address; what lies around the view in its storage is not compared)."""
    b = cache.view(torch.uint8)
    num_pages, kv_bs, width = b.shape
    span = (num_pages - 1) * b.stride(0) + kv_bs * width
    return b.as_strided((span,), (1,), b.storage_offset()).to("cpu", copy=True)


def cpu_copy(x: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``x`` with its strides and storage offset (``x.cpu()`` of a strided GPU view
    is contiguous: a page-strided cache would change layout)."""
    return _clone_strided(x, torch.device("cpu"))


def _clone_strided(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` copied with its strides and storage offset (the bytes around it too), on ``device``."""
    raw = _storage_bytes(x).to(device)
    return raw.view(x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())


# --------------------------------------------------------------------------- building a case


def _scores(shape: tuple[int, ...], regime: str, g: torch.Generator) -> torch.Tensor:
    if regime == "uniform":
        return torch.full(shape, 0.5)
    if regime == "saturating":  # one row +60, the others -60 (per column: which row varies)
        s = torch.full(shape, -60.0)
        s[torch.rand(shape[:-1], generator=g) < 0.25] = 60.0
        return s
    if regime == "huge":  # |s| = 1e4
        return torch.where(torch.rand(shape, generator=g) < 0.5, -1e4, 1e4)
    return torch.randn(shape, generator=g) * 3


def _kv(shape: tuple[int, ...], regime: str, g: torch.Generator) -> torch.Tensor:
    if regime == "zero":
        return torch.zeros(shape)
    x = torch.randn(shape, generator=g)
    if regime == "tiny":  # magnitudes 2^-60 .. 2^-50
        return x * torch.exp2(-60 + 10 * torch.rand(shape, generator=g))
    if regime == "large":  # up to 2^40 (the state's domain, §2.1)
        return x * torch.exp2(30 + 9 * torch.rand(shape, generator=g))
    return x


def _request_regime(kv_regime: str, r: int) -> str:
    """kv regime of request ``r``: ``tiny`` alternates tiny rows (far below the norm's eps, so
    the rows normalize to ~0: every block at the D1 floor, byte 105) with normal rows, whose tiny
    norm-weight blocks give block amax in (0, 0.0273] (the D1 demonstration)."""
    return "normal" if kv_regime == "tiny" and r % 2 else kv_regime


def _norm_weight(head: int, dtype: torch.dtype, regime: str, g: torch.Generator) -> torch.Tensor:
    w = 1.0 + 0.1 * torch.randn(head, generator=g)
    if regime == "tiny":  # blocks of amax <= 0.0273 after the norm: the D1 demonstration
        w[64:128] *= 0.004
        w[192:256] *= 0.02
    return w.to(dtype)


def make_case(
    op: str,
    *,
    lens: tuple[int, ...] = (21, 9, 3),
    starts: tuple[int, ...] | None = None,
    sbs: int = 4,
    kv_bs: int = 64,
    page_stride: int | None = None,
    norm_dtype: torch.dtype = torch.bfloat16,
    kv_regime: str = "normal",
    score_regime: str = "normal",
    fp8_scale: float | None = None,
    use_fp4: bool = False,
    padding: bool = True,
    seed: int = 0,
    max_pos: int | None = None,
) -> C4Case:
    """One call of ``op`` over requests of ``lens`` new tokens starting at positions ``starts``.

    K6 stores e4m3 when ``fp8_scale`` is given, else bf16. The state holds every row a window
    reads (the 7 before each request's first token too); tokens are interleaved across requests.
    """
    g = torch.Generator().manual_seed(seed)
    head = HEAD_DIM[op]
    sw = 2 * head
    starts = tuple(starts) if starts is not None else tuple(0 for _ in lens)
    first = [max(0, s - 2 * RATIO + 1) for s in starts]
    top = max(s + n for s, n in zip(starts, lens, strict=True))
    max_pos = max_pos or (_SMALL_MAX_POS if top <= _SMALL_MAX_POS else LAST_POSITION + 1)
    cols = -(-top // sbs)
    # Shuffled state blocks, only for the columns a window reads; one spare block.
    need = [sorted({q // sbs for q in range(f, s + n)}) for f, s, n in zip(first, starts, lens, strict=True)]
    nsb = sum(len(c) for c in need) + 1
    state = allocate_state_cache(nsb, sbs, sw, block_stride=sbs * 2 * sw + 4, fill=float("nan"))
    perm = torch.randperm(nsb, generator=g).to(torch.int32)
    bt = torch.full((len(lens), cols), -1, dtype=torch.int32)
    used = 0
    for r, c in enumerate(need):
        bt[r, c] = perm[used : used + len(c)]
        used += len(c)
    for r, (f, s, n) in enumerate(zip(first, starts, lens, strict=True)):
        q = torch.arange(f, s + n)
        kv = _kv((len(q), sw), _request_regime(kv_regime, r), g)
        rows = torch.cat((kv, _scores((len(q), sw), score_regime, g)), dim=1)
        state[bt[r, q // sbs].long(), q % sbs] = rows
    req = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(lens)])
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    order = torch.randperm(len(pos), generator=g)
    req, pos = req[order].contiguous(), pos[order].contiguous()
    t = len(pos)
    slot = (bt[req.long(), (pos // sbs)].long() * sbs + pos % sbs).contiguous()
    if padding and t > 2:
        slot[torch.randperm(t, generator=g)[: max(1, t // 6)]] = -1
    boundary = (pos + 1) % RATIO == 0
    nb = int(boundary.sum())
    pages = max(1, -(-(nb + 3) // kv_bs))
    kv_slots = torch.full((t,), -1, dtype=torch.int64)
    kv_slots[boundary] = torch.randperm(pages * kv_bs, generator=g)[:nb]
    if padding and nb > 2:
        kv_slots[torch.nonzero(boundary).flatten()[0]] = -1
    if op == "c4_compress_ds_mla":
        cache = allocate_ds_cache(pages, kv_bs, page_stride=page_stride, fill=SENTINEL)
    elif op == "c4_compress_plain":
        dtype = torch.bfloat16 if fp8_scale is None else torch.float8_e4m3fn
        cache = allocate_plain_cache(pages, kv_bs, dtype, page_stride=page_stride, fill_byte=SENTINEL)
    else:
        cache = allocate_indexer_cache(pages, kv_bs, page_stride=page_stride, fill=SENTINEL)
    args: dict[str, Any] = dict(
        state_cache=state,
        token_to_req=req,
        positions=pos,
        slot_mapping=slot,
        block_table=bt,
        state_block_size=sbs,
        rms_norm_weight=_norm_weight(head, norm_dtype, kv_regime, g),
        rms_norm_eps=EPS,
        cos_sin_cache=cos_sin(max_pos),
    )
    args["kv_cache" if op == "c4_compress_plain" else "k_cache"] = cache
    args["kv_slot_mapping"] = kv_slots
    if op == "c4_compress_plain":
        args["fp8_scale"] = None if fp8_scale is None else torch.tensor([fp8_scale], dtype=torch.float32)
    if op == "indexer_compress":
        args["use_fp4_cache"] = use_fp4
    label = (
        f"{op} T={t} lens={lens} starts={starts} sbs={sbs} kv_bs={kv_bs} P={page_stride} "
        f"w={str(norm_dtype).removeprefix('torch.')} kv={kv_regime} s={score_regime}"
        + (f" fp8_scale={fp8_scale}" if op == "c4_compress_plain" else "")
        + (f" fp4={use_fp4}" if op == "indexer_compress" else "")
    )
    return C4Case(op, args, label, dict(kv_regime=kv_regime, score_regime=score_regime))


def _lens_for(t: int, nreq: int, g: torch.Generator) -> tuple[int, ...]:
    cuts = sorted(torch.randperm(max(t - 1, 1), generator=g)[: nreq - 1].add(1).tolist()) if t > nreq else []
    bounds = [0, *cuts, t]
    lens = tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False) if b > a)
    return lens or (t,)


def random_case(op: str, i: int, *, tokens: tuple[int, ...] = TEST_TOKENS) -> C4Case:
    """The ``i``-th random case of ``op``: T, requests, positions, sbs, kv_bs, strides, dtypes and
    regimes drawn from the spec's test shapes with seed ``i`` (same case on every machine)."""
    g = torch.Generator().manual_seed(1000 + i)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    t = pick(tokens)
    lens = _lens_for(t, pick((1, 2, 3)), g)
    starts = tuple(pick((0, 0, 3, 5, 1001, 2000)) for _ in lens)
    if i % 17 == 5:
        starts = (LAST_POSITION + 1 - lens[0], *starts[1:])  # reaches 1 048 575
    kv_bs = pick((64, 2, 1))
    head = HEAD_DIM[op]
    if op == "c4_compress_ds_mla":
        stride = pick((None, ds_min_page_stride(kv_bs) + 576))
    elif op == "c4_compress_plain":
        stride = pick((None, kv_bs * head + 16))
    else:
        stride = pick((None, kv_bs * 132 + 8, 8448 if kv_bs == 64 else None))
    return make_case(
        op,
        lens=lens,
        starts=starts,
        sbs=pick((4, 16)),
        kv_bs=kv_bs,
        page_stride=stride,
        norm_dtype=pick((torch.bfloat16, torch.float32)),
        kv_regime=pick(KV_REGIMES),
        score_regime=pick(SCORE_REGIMES),
        fp8_scale=pick((None, 1.0, 2.0**-4, 0.37)),
        use_fp4=bool(i % 2),
        seed=i,
    )


# --------------------------------------------------------------------------- judging


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


def _regions(op: str, use_fp4: bool, kv_bs: int) -> list[tuple[int, int, int]]:
    """Judged byte ranges of one entry ``(entry multiplier, page offset, size)``."""
    if op == "c4_compress_ds_mla":
        return [(576, 0, 576), (8, kv_bs * 576, 7)]  # the pad byte is BIT-EXACT
    if op == "c4_compress_plain":
        return [(1024, 0, 1024)]  # (bytes; e4m3 uses the first 512)
    if use_fp4:
        return [(64, 0, 64), (4, kv_bs * 64, 4)]
    return [(128, 0, 128), (4, kv_bs * 128, 4)]


def judge(case: C4Case, got: torch.Tensor, want: torch.Tensor) -> Verdict:
    """Judge the kernel's cache ``got`` against the reference's ``want`` (both from ``case``'s inputs)."""
    a = case.args
    op = case.op
    head = HEAD_DIM[op]
    cache = a[case.cache_arg]
    got, want = got.cpu(), want.cpu()
    idx = check_c4_values(
        op,
        a["state_cache"],
        a["token_to_req"],
        a["positions"],
        a["slot_mapping"],
        a["block_table"],
        a["cos_sin_cache"],
        cache,
        a["kv_slot_mapping"],
        head,
    )
    slots = a["kv_slot_mapping"][idx]
    kv_bs, esize = cache.shape[1], cache.element_size()
    page_bytes = cache.stride(0) * esize
    fp4 = bool(a.get("use_fp4_cache", False))
    # Bytes the rule does not judge: identical (sentinel where unwritten, pad 0).
    rg, rw = _span_bytes(got), _span_bytes(want)
    judged = torch.zeros_like(rg, dtype=torch.bool)
    base = 0                                   # offsets from the first page
    width = 512 * esize if op == "c4_compress_plain" else None
    for s in slots.tolist():
        page, entry = divmod(s, kv_bs)
        for mult, off, size in _regions(op, fp4, kv_bs):
            size = width if width is not None else size
            mult = width if width is not None else mult
            o = base + page * page_bytes + off + entry * mult
            judged[o : o + size] = True
    other_equal = bool(torch.equal(rg[~judged], rw[~judged]))
    reports: dict[str, RuleReport] = {}
    if len(slots):
        reports = _rule_reports(case, got, want, idx, slots)
    return Verdict(case.label, reports, len(slots), other_equal)


def _magnitudes(case: C4Case, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(term magnitudes m [n, D], reference fp32 rows y [n, D]) of the selected tokens."""
    a = case.args
    head = HEAD_DIM[case.op]
    p = a["positions"][idx]
    k, s, _ = window_rows(
        a["state_cache"], a["block_table"], a["token_to_req"][idx].long(), p, RATIO, True, head
    )
    cs = a["cos_sin_cache"][compressed_position(p, RATIO)]
    m = term_magnitudes(k, s, a["rms_norm_weight"], a["rms_norm_eps"], cs)
    y = c4_rows(
        case.op,
        a["state_cache"],
        a["token_to_req"],
        a["positions"],
        a["block_table"],
        a["rms_norm_weight"],
        a["rms_norm_eps"],
        a["cos_sin_cache"],
        idx,
        head,
    )
    return m, y


def _rule_reports(
    case: C4Case, got: torch.Tensor, want: torch.Tensor, idx: torch.Tensor, slots: torch.Tensor
) -> dict[str, RuleReport]:
    from dsv4kit.formats.ds_mla import decode_ds_entries, read_ds_entries
    from dsv4kit.formats.indexer_cache import read_indexer_entries
    from dsv4kit.formats.plain_row import read_plain_rows

    m, y = _magnitudes(case, idx)
    n = len(slots)
    if case.op == "c4_compress_ds_mla":
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
    if case.op == "c4_compress_plain":
        scale = case.args["fp8_scale"]
        va, vb = read_plain_rows(got, slots, scale), read_plain_rows(want, slots, scale)
        if scale is None:
            return {"rows": check_compressor_rule(va, vb, m, bf16_ulp)}
        s = torch.full_like(va, float(scale[0]))
        return {"rows": check_compressor_rule(va, vb, m, e4m3_step, scale_a=s, scale_b=s)}
    fp4 = bool(case.args["use_fp4_cache"])
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
