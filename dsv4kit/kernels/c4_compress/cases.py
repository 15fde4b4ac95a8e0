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

from dataclasses import replace

import torch

from dsv4kit.formats.ds_mla import ds_min_page_stride
from dsv4kit.formats.rope import compressed_position
from dsv4kit.formats.state_cache import window_rows
from dsv4kit.kernels.c4_compress.reference import HEAD_DIM, OPERANDS, RATIO, c4_rows
from dsv4kit.kernels.compressor.cases import CompressorCase, boundary_kv_slots, requests, sentinel_cache
from dsv4kit.kernels.compressor.reference import check_values
from dsv4kit.testing.cache_judge import Verdict, cpu_copy, judge_entries
from dsv4kit.testing.compressor_data import (
    EPS,
    KV_REGIMES,
    LAST_POSITION,
    SCORE_REGIMES,
    SENTINEL,
    SMALL_MAX_POS,
    TEST_TOKENS,
    cos_sin,
    norm_weight,
    odd_block_stride,
    split_lens,
)
from dsv4kit.testing.compressor_rule import term_magnitudes

__all__ = ["FORMATS", "KV_REGIMES", "OPS", "PAST_DECODE_T", "SCORE_REGIMES", "SENTINEL", "TEST_TOKENS",
           "C4Case", "Verdict", "cpu_copy", "extended_cases", "in_order", "judge", "large_cases", "make_case",
           "odd_stride", "past_decode", "random_case"]

OPS = ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress")


class C4Case(CompressorCase):
    """One call of ``op``: ``args`` are the op's arguments (the cache among them, sentinel-filled)."""

    OPERANDS = OPERANDS

    @property
    def cache_arg(self) -> str:
        return self.output_arg

    @property
    def cache(self) -> torch.Tensor:
        return self.output


# --------------------------------------------------------------------------- building a case


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
    starts = tuple(starts) if starts is not None else tuple(0 for _ in lens)
    first = [max(0, s - 2 * RATIO + 1) for s in starts]
    top = max(s + n for s, n in zip(starts, lens, strict=True))
    max_pos = max_pos or (SMALL_MAX_POS if top <= SMALL_MAX_POS else LAST_POSITION + 1)
    r = requests(lens, starts, first, sbs, 2 * head, kv_regime, score_regime, padding, g)
    kv_slots, pages = boundary_kv_slots((r.positions + 1) % RATIO == 0, kv_bs, padding, g)
    cache = sentinel_cache(_kind(op), pages, kv_bs, page_stride, fp8_scale)
    scale = None if fp8_scale is None else torch.tensor([fp8_scale], dtype=torch.float32)
    extra = {"c4_compress_plain": dict(fp8_scale=scale), "indexer_compress": dict(use_fp4_cache=use_fp4)}
    weight = norm_weight(head, norm_dtype, kv_regime, g)
    args = OPERANDS[op](r.state, r.token_to_req, r.positions, r.slot_mapping, r.block_table, sbs, weight, EPS,
                        cos_sin(max_pos), cache, kv_slots, **extra.get(op, {}))._asdict()
    w = str(norm_dtype).removeprefix("torch.")
    tail = {"c4_compress_plain": f" fp8_scale={fp8_scale}", "indexer_compress": f" fp4={use_fp4}"}.get(op, "")
    label = (f"{op} T={len(r.positions)} lens={lens} starts={starts} sbs={sbs} kv_bs={kv_bs} P={page_stride} "
             f"w={w} kv={kv_regime} s={score_regime}{tail}")
    return C4Case(op, args, label, dict(kv_regime=kv_regime, score_regime=score_regime))


def random_case(op: str, i: int, *, tokens: tuple[int, ...] = TEST_TOKENS) -> C4Case:
    """The ``i``-th random case of ``op``: T, requests, positions, sbs, kv_bs, strides, dtypes and
    regimes drawn from the spec's test shapes with seed ``i`` (same case on every machine)."""
    g = torch.Generator().manual_seed(1000 + i)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    t = pick(tokens)
    lens = split_lens(t, pick((1, 2, 3)), g)
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


def _kind(op: str) -> str:
    return {"c4_compress_ds_mla": "ds", "c4_compress_plain": "plain"}.get(op, "indexer")


def judge(case: C4Case, got: torch.Tensor, want: torch.Tensor) -> Verdict:
    """Judge the kernel's cache ``got`` against the reference's ``want`` (both from ``case``'s inputs,
    on any device: strided GPU caches are copied with their layout)."""
    a = case.args
    idx = check_values(case.op, case.ops, RATIO, True, HEAD_DIM[case.op])
    slots = a["kv_slot_mapping"][idx]
    m, y = _magnitudes(case, idx) if len(slots) else (None, None)
    return judge_entries(
        case.label,
        _kind(case.op),
        got,
        want,
        slots,
        m,
        y,
        fp8_scale=a.get("fp8_scale"),
        use_fp4=bool(a.get("use_fp4_cache", False)),
    )


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
    y = c4_rows(case.op, case.ops, a["rms_norm_eps"], idx)
    return m, y


# --------------------------------------------------------------------------- extended cases
# ``dsv4kit verify --extended``: the cases the GPU check script ran beyond the random ones.

#: Formats of the large-T cases: (op, make_case keywords, label).
FORMATS = (("c4_compress_ds_mla", {}, "E1 fp8_ds_mla"), ("c4_compress_plain", {}, "E2 bf16 rows"),
           ("c4_compress_plain", {"fp8_scale": 0.37}, "E3 e4m3 rows"),
           ("indexer_compress", {"use_fp4": False}, "E4 indexer FP8"),
           ("indexer_compress", {"use_fp4": True}, "E5 indexer MXFP4"))

#: T of the padded copies of the random cases: past the CuTeDSL decode kernel's
#: ``CTA_PER_TOKEN_UP_TO`` (4096), so that its prefill kernel sees every awkward case too.
PAST_DECODE_T = 4200


def odd_stride(case: C4Case, extra: int = 3) -> C4Case:
    """``case`` with its state re-laid at block stride ``stride + extra`` (not a multiple of 4 for
    extra = 1..3; the base stays 16-byte aligned, §2.8 allows any stride >= sbs * 2SW)."""
    odd = odd_block_stride(case.args["state_cache"], extra)
    label = f"{case.label} block_stride={odd.stride(0)}"
    return replace(case, args=dict(case.args, state_cache=odd), label=label)


def in_order(case: C4Case) -> C4Case:
    """``case`` with its tokens sorted by (request, position): the production layout (make_case
    interleaves requests); each token's entry is the same, only the token order changes."""
    a = case.args
    key = a["token_to_req"].long() * (1 << 40) + a["positions"]
    order = torch.argsort(key)
    args = dict(a)
    for n in ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping"):
        args[n] = a[n][order].contiguous()
    return replace(case, args=args, label=case.label + " in order")


def past_decode(case: C4Case, t: int = PAST_DECODE_T) -> C4Case:
    """``case`` with padding tokens (slot and kv slot -1, boundary positions) shuffled in up to ``t``
    tokens: the same live tokens and expected cache, at a prefill-size T."""
    a = case.args
    n = a["positions"].shape[0]
    extra = max(0, t - n)
    g = torch.Generator().manual_seed(n)
    order = torch.randperm(n + extra, generator=g)
    args = dict(a)
    pads = {"token_to_req": torch.zeros(extra, dtype=a["token_to_req"].dtype),
            "positions": torch.full((extra,), 7, dtype=a["positions"].dtype),
            "slot_mapping": torch.full((extra,), -1, dtype=a["slot_mapping"].dtype),
            "kv_slot_mapping": torch.full((extra,), -1, dtype=a["kv_slot_mapping"].dtype)}
    for name, pad in pads.items():
        args[name] = torch.cat((a[name], pad))[order].contiguous()
    return replace(case, args=args, label=f"{case.label} padded to T={n + extra}")


def large_cases(sizes: tuple[int, ...] | list[int], formats: tuple = FORMATS,
                nreqs: tuple[int, ...] = (1, 4)) -> list[C4Case]:
    """Production-layout cases of every T in ``sizes``: one and four requests from position 0,
    tokens in order, sbs 4, kv_bs 64, no padding, per format of ``formats``."""
    out = []
    for t in sizes:
        for op, kw, name in formats:
            for nreq in nreqs:
                lens = (t,) if nreq == 1 else tuple([t // 4] * 3 + [t - 3 * (t // 4)])
                c = make_case(op, lens=lens, starts=tuple(0 for _ in lens), sbs=4, kv_bs=64, padding=False,
                              seed=t + nreq, **kw)
                c = in_order(c)
                c.meta.update(format=name, large=True, requests=nreq)
                out.append(c)
    return out


def extended_cases(op: str, n: int, *, tokens: tuple[int, ...] = TEST_TOKENS,
                   past_decode_t: int = PAST_DECODE_T, large: tuple[int, ...] = (16384, 65536),
                   all_formats: bool = True, nreqs: tuple[int, ...] = (1, 4)) -> list[C4Case]:
    """The extended cases of ``op`` over its first ``n`` random cases (those themselves not
    included): every 10th at an odd state block stride, every 2nd (the odd-stride copy where there
    is one) padded to ``past_decode_t`` tokens, and the production-layout cases of ``large`` (every
    format of ``op``, or its first with ``all_formats`` off; ``nreqs`` requests)."""
    out = []
    for i in range(n):
        case = random_case(op, i, tokens=tokens)
        if i % 10 == 0:
            case = odd_stride(case)
            out.append(case)
        if i % 2 == 0:
            out.append(past_decode(case, past_decode_t))
    formats = tuple(f for f in FORMATS if f[0] == op)
    return out + large_cases(large, formats if all_formats else formats[:1], nreqs)
