"""Seeded cases of the C128 compressors (K7, K8a, K8b) and their judges (spec §2.12).

:func:`make_k7_case` builds one K7 call: requests of given lengths at given start positions
(so the boundaries 127, 255 and 1 048 575 occur), the 16 state blocks of every window shuffled
in a pool with a padded block stride, padding tokens (slot -1), and an ``out`` larger than T
filled with the sentinel byte 0xA5. :func:`make_k8_case` builds one K8a / K8b call: T tokens of
which 0..4 are boundaries, ``compressed_kv`` of the spec's regimes, skipped kv slots, a
sentinel-filled cache with any page geometry. :func:`make_chain_case` joins the two (K7's
output feeds K8). :func:`judge_k7` applies the FP32 rule and checks that no other row of
``out`` changed; :func:`judge_store` and :func:`judge_chain` the compressor rule (term
magnitudes from ``compressed_kv``, or from the pooled rows end to end). Tests, the notebook and
the GPU script use the same cases.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from dsv4kit.formats.ds_mla import ds_min_page_stride
from dsv4kit.formats.rope import compressed_position
from dsv4kit.formats.state_cache import window_rows
from dsv4kit.kernels.c128_compress.reference import (
    CACHE_ARG,
    OPERANDS,
    RATIO,
    STATE_BLOCK_SIZE,
    STORE_OPS,
    c128_compress_reference,
    c128_rows,
    check_k7,
    check_k8,
)
from dsv4kit.kernels.compressor.cases import CompressorCase, boundary_kv_slots, requests, sentinel_cache
from dsv4kit.kernels.compressor.reference import check_values
from dsv4kit.testing import compressor_data as data
from dsv4kit.testing.cache_judge import Verdict, cpu_copy, judge_entries
from dsv4kit.testing.compressor_data import KV_REGIMES, LAST_POSITION, SCORE_REGIMES, SENTINEL, TEST_TOKENS
from dsv4kit.testing.compressor_rule import Fp32Report, check_fp32_rule, rope_magnitudes, term_magnitudes

__all__ = ["DECODE_SIZES", "KV_REGIMES", "LAST_POSITION", "OPS", "PACKED_STRIDE", "SCORE_REGIMES", "SENTINEL",
           "STORE_FORMATS", "TEST_TOKENS", "C128Case", "ChainCase", "K7Verdict", "Verdict", "chain_case",
           "cpu_copy", "decode_case", "in_order", "judge_chain", "judge_k7", "judge_store", "kernel_launch",
           "large_chains", "make_chain_case", "make_k7_case", "make_k8_case", "odd_stride", "packed_cases",
           "random_case"]

OPS = ("c128_compress", *STORE_OPS)
_D = 512
#: Boundary positions the K8 cases draw from, in order (127, 255, and the last one, 1 048 575, at 4).
_BOUNDARIES = (127, 255, 383, LAST_POSITION, 1023, 4095, 2047)


def _sentinel_like(x: torch.Tensor) -> torch.Tensor:
    x.view(torch.uint8).fill_(SENTINEL)
    return x


class C128Case(CompressorCase):
    """One call of ``op``: ``args`` are the op's arguments (K7: ``out``; K8: the cache,
    sentinel-filled)."""

    OPERANDS = OPERANDS


# --------------------------------------------------------------------------- K7 cases


def make_k7_case(
    *,
    lens: tuple[int, ...] = (130, 7),
    starts: tuple[int, ...] | None = None,
    kv_regime: str = "normal",
    score_regime: str = "normal",
    padding: bool = True,
    extra_rows: int = 3,
    seed: int = 0,
) -> C128Case:
    """One K7 call over requests of ``lens`` new tokens starting at ``starts`` (default 0).

    The state holds every row a window reads (from the 128-aligned start of each request's first
    window); blocks are shuffled in a pool of stride ``8 * 1024 + 4`` floats (not a multiple of the
    row: kernels must use the real block stride). Tokens are interleaved across requests.
    """
    g = torch.Generator().manual_seed(seed)
    starts = tuple(starts) if starts is not None else tuple(0 for _ in lens)
    first = [(s // RATIO) * RATIO for s in starts]
    r = requests(lens, starts, first, STATE_BLOCK_SIZE, _D, kv_regime, score_regime, padding, g)
    t = len(r.positions)
    out = _sentinel_like(torch.empty((t + extra_rows, _D), dtype=torch.float32))
    args = dict(state_cache=r.state, token_to_req=r.token_to_req, positions=r.positions,
                slot_mapping=r.slot_mapping, block_table=r.block_table, out=out)
    label = f"c128_compress T={t} lens={lens} starts={starts} kv={kv_regime} s={score_regime}"
    return C128Case("c128_compress", args, label, dict(kv_regime=kv_regime, score_regime=score_regime))


@dataclass
class K7Verdict:
    """K7's judgement: the FP32 rule on written rows, and every other row of ``out`` unchanged."""

    label: str
    report: Fp32Report
    rows: int
    other_rows_equal: bool

    @property
    def ok(self) -> bool:
        return self.other_rows_equal and self.report.ok

    @property
    def bit_identical(self) -> int:
        return self.report.bit_identical

    @property
    def elements(self) -> int:
        return self.report.n

    def summary(self) -> str:
        exact = "other rows untouched" if self.other_rows_equal else "OTHER ROWS CHANGED"
        return f"{self.label}: {self.rows} rows; {exact}; {self.report.summary()}"

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())


def _k7_rows(case: C128Case) -> torch.Tensor:
    return check_values(case.op, case.ops, RATIO, False, _D)


def _windows(args: dict[str, Any], idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    req, pos = args["token_to_req"][idx].long(), args["positions"][idx]
    k, s, _ = window_rows(args["state_cache"], args["block_table"], req, pos, RATIO, False, _D)
    return k, s


def judge_k7(case: C128Case, got: torch.Tensor, want: torch.Tensor) -> K7Verdict:
    """Judge K7's ``out`` ``got`` against the reference's ``want`` (both from ``case``'s sentinel ``out``)."""
    got, want = got.cpu(), want.cpu()
    rows = _k7_rows(case)                    # on the case's device: it indexes the case's tensors
    idx = rows.cpu()
    written = torch.zeros(got.shape[0], dtype=torch.bool)
    written[idx] = True
    other = bool(torch.equal(got[~written].view(torch.int32), want[~written].view(torch.int32)))
    k, _ = _windows(case.args, rows)
    report = check_fp32_rule(got[idx], want[idx], k.abs().amax(dim=1).cpu())
    return K7Verdict(case.label, report, len(idx), other)


# --------------------------------------------------------------------------- K8 cases


def _k8_positions(t: int, boundaries: int, g: torch.Generator) -> torch.Tensor:
    """``t`` positions, ``boundaries`` of them boundaries (from :data:`_BOUNDARIES`), shuffled."""
    b = list(_BOUNDARIES[:boundaries])
    other = torch.randint(0, 4096, (t - len(b),), generator=g)
    other = torch.where((other + 1) % RATIO == 0, other + 1, other)
    pos = torch.cat((torch.tensor(b, dtype=torch.int64), other))
    return pos[torch.randperm(t, generator=g)].contiguous()


def _store_args(
    op: str,
    positions: torch.Tensor,
    slot: torch.Tensor,
    kv_bs: int,
    page_stride: int | None,
    norm_dtype: torch.dtype,
    kv_regime: str,
    fp8_scale: float | None,
    padding: bool,
    g: torch.Generator,
) -> dict[str, Any]:
    """K8's arguments besides ``compressed_kv``: kv slots of the boundary tokens, cache, weights."""
    t = len(positions)
    kv_slots, pages = boundary_kv_slots(((positions + 1) % RATIO == 0) & (slot >= 0), kv_bs, padding, g)
    top = int(positions.max()) + 1 if t else 1
    args: dict[str, Any] = dict(
        positions=positions,
        slot_mapping=slot,
        kv_slot_mapping=kv_slots,
        rms_norm_weight=data.norm_weight(_D, norm_dtype, kv_regime, g),
        rms_norm_eps=data.EPS,
        cos_sin_cache=data.cos_sin(data.SMALL_MAX_POS if top <= data.SMALL_MAX_POS else LAST_POSITION + 1),
    )
    args[CACHE_ARG[op]] = sentinel_cache(_kind(op), pages, kv_bs, page_stride, fp8_scale)
    if op == "c128_norm_rope_store_plain":
        args["fp8_scale"] = None if fp8_scale is None else torch.tensor([fp8_scale], dtype=torch.float32)
    return args


def _store_label(
    op: str, kv_bs: int, page_stride: int | None, norm_dtype: torch.dtype, fp8_scale: float | None
) -> str:
    w = str(norm_dtype).removeprefix("torch.")
    return f"kv_bs={kv_bs} P={page_stride} w={w}" + (
        f" fp8_scale={fp8_scale}" if op == "c128_norm_rope_store_plain" else ""
    )


def make_k8_case(
    op: str,
    *,
    t: int = 32,
    boundaries: int = 3,
    kv_bs: int = 2,
    page_stride: int | None = None,
    norm_dtype: torch.dtype = torch.bfloat16,
    kv_regime: str = "normal",
    fp8_scale: float | None = None,
    padding: bool = True,
    seed: int = 0,
) -> C128Case:
    """One K8a / K8b call of ``t`` tokens, ``boundaries`` (0..7, at most t) of them at boundary
    positions; ``compressed_kv`` rows of ``kv_regime`` (``tiny``: tiny and normal rows alternate,
    with the D1 demonstration's norm weights). K8b stores e4m3 when ``fp8_scale`` is given."""
    if op not in STORE_OPS:
        raise ValueError(f"make_k8_case: op must be one of {STORE_OPS}, got {op!r}")
    g = torch.Generator().manual_seed(seed)
    boundaries = min(boundaries, t)
    positions = _k8_positions(t, boundaries, g)
    rows = [data.kv_values((1, _D), data.request_regime(kv_regime, i), g) for i in range(t)]
    ckv = torch.cat(rows).contiguous() if rows else torch.empty((0, _D))
    slot = torch.arange(t, dtype=torch.int64)
    if padding and t > 2:
        slot[torch.randperm(t, generator=g)[: max(1, t // 6)]] = -1
    args = _store_args(op, positions, slot, kv_bs, page_stride, norm_dtype, kv_regime, fp8_scale, padding, g)
    args = {"compressed_kv": ckv, **args}
    label = f"{op} T={t} boundaries={boundaries} " + _store_label(
        op, kv_bs, page_stride, norm_dtype, fp8_scale
    )
    return C128Case(op, args, label + f" kv={kv_regime}", dict(kv_regime=kv_regime))


def _kind(op: str) -> str:
    return "ds" if op == "c128_norm_rope_store_ds_mla" else "plain"


def _store_selection(case: C128Case) -> torch.Tensor:
    return check_values(case.op, case.ops, RATIO, False, _D)


def _judge_cache(
    case: C128Case,
    got: torch.Tensor,
    want: torch.Tensor,
    idx: torch.Tensor,
    m: torch.Tensor | None,
    y: torch.Tensor | None,
) -> Verdict:
    a = case.args
    return judge_entries(
        case.label, _kind(case.op), got, want, a["kv_slot_mapping"][idx], m, y, fp8_scale=a.get("fp8_scale")
    )


def _rr(c: torch.Tensor, eps: float) -> torch.Tensor:
    c64 = c.to(torch.float64)
    return 1.0 / torch.sqrt((c64 * c64).mean(dim=-1, keepdim=True) + eps)


def judge_store(case: C128Case, got: torch.Tensor, want: torch.Tensor) -> Verdict:
    """Judge a K8 cache ``got`` against the reference's ``want`` given the same ``compressed_kv``:
    term magnitudes ``P_d = |compressed_kv[t, d]|`` (§2.12)."""
    a = case.args
    idx = _store_selection(case)
    if not len(idx):
        return _judge_cache(case, got, want, idx, None, None)
    ckv, p = a["compressed_kv"][idx].cpu(), a["positions"][idx].cpu()
    w = a["rms_norm_weight"].cpu()
    n = _rr(ckv, a["rms_norm_eps"]) * w.to(torch.float64).abs() * ckv.to(torch.float64).abs()
    cs = a["cos_sin_cache"].cpu()[compressed_position(p, RATIO)]
    m = rope_magnitudes(n, cs)
    on_cpu = case.ops._replace(compressed_kv=ckv, positions=p, rms_norm_weight=w,
                               cos_sin_cache=a["cos_sin_cache"].cpu())
    y = c128_rows(case.op, on_cpu, a["rms_norm_eps"], torch.arange(len(idx)))
    return _judge_cache(case, got, want, idx, m, y)


# --------------------------------------------------------------------------- K7 -> K8 chains


@dataclass
class ChainCase:
    """K7 then K8 on the same tokens: ``k7`` (its ``out`` feeds K8) and ``store`` (its
    ``compressed_kv`` is replaced by K7's output when run)."""

    k7: C128Case
    store: C128Case

    @property
    def label(self) -> str:
        return f"{self.k7.label} -> {self.store.op} {self.store.label}"

    def fresh(self, device: torch.device | str | None = None) -> ChainCase:
        return ChainCase(self.k7.fresh(device), self.store.fresh(device))


def make_chain_case(op: str, *, lens: tuple[int, ...] = (130, 7), starts: tuple[int, ...] | None = None,
                    kv_bs: int = 2, page_stride: int | None = None, norm_dtype: torch.dtype = torch.bfloat16,
                    kv_regime: str = "normal", score_regime: str = "normal", fp8_scale: float | None = None,
                    padding: bool = True, seed: int = 0) -> ChainCase:
    """K7 over :func:`make_k7_case`'s tokens, then K8 ``op`` on the same positions and slots."""
    k7 = make_k7_case(
        lens=lens, starts=starts, kv_regime=kv_regime, score_regime=score_regime, padding=padding, seed=seed
    )
    g = torch.Generator().manual_seed(seed + 7919)
    a = k7.args
    args = _store_args(op, a["positions"], a["slot_mapping"], kv_bs, page_stride, norm_dtype, kv_regime,
                       fp8_scale, padding, g)
    t = len(a["positions"])
    store = C128Case(
        op,
        {"compressed_kv": torch.zeros((t, _D)), **args},
        _store_label(op, kv_bs, page_stride, norm_dtype, fp8_scale),
        dict(k7.meta),
    )
    return ChainCase(k7, store)


def judge_chain(case: ChainCase, got: torch.Tensor, want: torch.Tensor) -> Verdict:
    """Judge the cache after K7 -> K8 (kernels) against the reference chain's: the compressor rule
    with term magnitudes from the pooled rows (``P_d = sum_j w_j |k_j[d]|``), the reference's rows
    y pooled by the reference K7."""
    s = case.store.args
    idx = _store_selection(case.store)
    if not len(idx):
        return _judge_cache(case.store, got, want, idx, None, None)
    k7 = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in case.k7.args.items()}
    k, sc = _windows(k7, idx)
    p = k7["positions"][idx]
    w, eps = s["rms_norm_weight"].cpu(), s["rms_norm_eps"]
    cs = s["cos_sin_cache"].cpu()
    m = term_magnitudes(k, sc, w, eps, cs[compressed_position(p, RATIO)])
    ckv = c128_compress_reference(**{**k7, "out": None})
    rows = case.store.ops._replace(compressed_kv=ckv, positions=k7["positions"], rms_norm_weight=w,
                                   cos_sin_cache=cs)
    y = c128_rows(case.store.op, rows, eps, idx)
    return _judge_cache(replace(case.store, label=case.label), got, want, idx, m, y)


# --------------------------------------------------------------------------- random cases


def random_case(op: str, i: int, *, tokens: tuple[int, ...] = TEST_TOKENS) -> C128Case:
    """The ``i``-th random case of ``op``: T, requests, positions, strides, dtypes and regimes drawn
    from the spec's test shapes with seed ``i`` (same case on every machine)."""
    g = torch.Generator().manual_seed(5000 + i)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    t = pick(tokens)
    if op == "c128_compress":
        lens = data.split_lens(t, pick((1, 2, 3)), g)
        starts = tuple(pick((0, 100, 127, 250, 255, 1001, 1023)) for _ in lens)
        if i % 11 == 5:
            starts = (LAST_POSITION + 1 - lens[0], *starts[1:])  # reaches 1 048 575
        return make_k7_case(
            lens=lens, starts=starts, kv_regime=pick(KV_REGIMES), score_regime=pick(SCORE_REGIMES), seed=i
        )
    kv_bs = pick((1, 2))
    if op == "c128_norm_rope_store_ds_mla":
        stride = pick((None, ds_min_page_stride(kv_bs) + 576, 2304 if kv_bs == 2 else None))
    else:
        stride = pick((None, kv_bs * _D + 16))
    return make_k8_case(
        op,
        t=t,
        boundaries=pick((0, 1, 2, 3, 4)),
        kv_bs=kv_bs,
        page_stride=stride,
        norm_dtype=pick((torch.bfloat16, torch.float32)),
        kv_regime=pick(KV_REGIMES),
        fp8_scale=pick((None, 1.0, 2.0**-4, 0.37)),
        seed=i,
    )


# --------------------------------------------------------------------------- extended cases
# ``dsv4kit verify --extended``: the cases the GPU check script ran beyond the random ones.

K7, K8A, K8B = OPS
#: Formats of the large K8 cases: (op, make_chain_case keywords, name).
STORE_FORMATS = ((K8A, {}, "E1 fp8_ds_mla"), (K8B, {}, "E2 bf16 rows"),
                 (K8B, {"fp8_scale": 0.37}, "E3 e4m3 rows"))
DECODE_SIZES = (1, 8, 64, 256)
#: (lens, starts) of the chains, cycled: windows crossing 127 and 255, ending at 1 048 575.
CHAIN_WINDOWS = (
    ((130, 7), (0, 0)),
    ((260, 3), (0, 125)),
    ((130,), (LAST_POSITION + 1 - 130,)),
    ((140, 20), (120, 240)),
    ((300,), (0,)),
    ((64, 200, 9), (100, 0, 250)),
    ((1,), (127,)),
    ((257, 2), (1001, 254)),
    ((128,), (LAST_POSITION + 1 - 128,)),
    ((513,), (0,)),
    ((33, 33, 33), (95, 223, 991)),
    ((7, 129), (121, LAST_POSITION + 1 - 129)),
)
#: K8a page strides of the chains (kv_bs 1 and 2 alike; None: the allocator's), trap 4's packed 39168.
DS_STRIDES = (None, 2304, 39168, 1728)
PACKED_STRIDE = 39168


def odd_stride(case: C128Case, extra: int = 3) -> C128Case:
    """K7 ``case`` with its state re-laid at block stride ``stride + extra`` (not a multiple of 4:
    the element-load path; the base stays 16-byte aligned, §2.8 allows any stride >= sbs * 2SW)."""
    odd = data.odd_block_stride(case.args["state_cache"], extra)
    label = f"{case.label} block_stride={odd.stride(0)}"
    return replace(case, args=dict(case.args, state_cache=odd), label=label)


def packed_cases(n: int) -> list[C128Case]:
    """K8a on a packed pool (kv_bs 2, page stride 39168: trap 4's other key)."""
    shapes = ((32, 4, torch.bfloat16), (257, 3, torch.float32), (7, 2, torch.bfloat16))
    return [make_k8_case(K8A, t=t, boundaries=b, kv_bs=2, page_stride=PACKED_STRIDE, norm_dtype=w,
                         kv_regime=KV_REGIMES[i % len(KV_REGIMES)], seed=900 + i)
            for i, (t, b, w) in enumerate(shapes[:n])]


def chain_case(op: str, i: int) -> ChainCase:
    """The ``i``-th chain K7 -> ``op``: windows, kv_bs, page stride, norm dtype, regimes, e4m3 scale."""
    lens, starts = CHAIN_WINDOWS[i % len(CHAIN_WINDOWS)]
    kv_bs = (1, 2)[i % 2]
    if op == K8A:
        stride, fp8_scale = DS_STRIDES[(i // 2) % len(DS_STRIDES)], None
    else:
        stride = (None, kv_bs * 512 + 16, kv_bs * 1024 + 48)[(i // 2) % 3]
        fp8_scale = (None, 0.37, 1.0, 2.0**-4)[i % 4]
    return make_chain_case(
        op, lens=lens, starts=starts, kv_bs=kv_bs, page_stride=stride,
        norm_dtype=(torch.bfloat16, torch.float32)[(i // 3) % 2], kv_regime=KV_REGIMES[i % len(KV_REGIMES)],
        score_regime=SCORE_REGIMES[(3 * i + 1) % len(SCORE_REGIMES)], fp8_scale=fp8_scale,
        padding=i % 3 != 1, seed=300 + i)


def _reorder(args: dict[str, Any], order: torch.Tensor, names: tuple[str, ...]) -> dict[str, Any]:
    out = dict(args)
    for n in names:
        out[n] = args[n][order].contiguous()
    return out


def in_order(chain: ChainCase) -> ChainCase:
    """``chain`` with its tokens sorted by (request, position), the production layout (the cases
    interleave requests): each token's rows and entries are the same, only the token order changes."""
    a = chain.k7.args
    order = torch.argsort(a["token_to_req"].long() * (1 << 40) + a["positions"])
    k7 = replace(chain.k7, args=_reorder(a, order, ("token_to_req", "positions", "slot_mapping")),
                 label=chain.k7.label + " in order")
    names = ("compressed_kv", "positions", "slot_mapping", "kv_slot_mapping")
    store = replace(chain.store, args=_reorder(chain.store.args, order, names))
    return ChainCase(k7, store)


def large_chains(t: int, formats: tuple = STORE_FORMATS) -> list[tuple[str, ChainCase]]:
    """The chains of one large T (4 requests from position 0, tokens in request order, no padding),
    one per store format of ``formats``, sharing one K7 case (same seed, same tokens)."""
    lens = tuple([t // 4] * 3 + [t - 3 * (t // 4)])
    out = []
    k7 = None
    for op, kw, name in formats:
        c = make_chain_case(op, lens=lens, starts=(0, 0, 0, 0), kv_bs=2, padding=False, seed=t, **kw)
        c = in_order(c)
        if k7 is None:
            k7 = c.k7
        else:
            assert torch.equal(c.k7.args["positions"], k7.args["positions"])
            c = ChainCase(k7, c.store)
        c.k7.meta.update(format="fp32 rows", large=True)
        c.store.meta.update(format=name, large=True)
        out.append((name, c))
    return out


def decode_case(op: str, t: int) -> C128Case:
    """A decode step of ``t`` requests, one new token each, exactly one of them a boundary."""
    if op == K7:
        starts = [127 + 128 * 9]
        for r in range(1, t):
            p = 200 + 37 * r
            starts.append(p + 1 if (p + 1) % RATIO == 0 else p)
        case = make_k7_case(lens=(1,) * t, starts=tuple(starts), padding=False, seed=t)
    else:
        case = make_k8_case(op, t=t, boundaries=1, kv_bs=2, padding=False, seed=t)
    case.meta.update(format="fp32 rows" if op == K7 else ("E1 fp8_ds_mla" if op == K8A else "E2 bf16 rows"))
    return case


def kernel_launch(spec: Any, k: Any, a: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
    """The warmed executor of one call of ``spec``'s op on kernel ``k`` and its arguments, built as
    the op builds them (after the op's metadata checks): ``state_operands`` (K7),
    ``NormStoreOperands`` (K8)."""
    from dsv4kit.kernels.c128_compress.spec import NormStoreOperands, state_operands
    from dsv4kit.kernels.encoders.spec import cache_operands

    op, name = spec.name, k.name
    key = spec.dispatch(k, a)
    if op == K7:
        t = check_k7(name, OPERANDS[K7](**a))[0]
        ops = state_operands(name, a["state_cache"], a["block_table"], t)
        launch = k.launch_args(key, a["token_to_req"], a["positions"], a["slot_mapping"], a["block_table"],
                               a["out"], ops, t)
    else:
        cache = a[CACHE_ARG[op]]
        t, eps = check_k8(name, OPERANDS[op](**a))
        ops = NormStoreOperands(eps, cache_operands(cache, a.get("fp8_scale"), a["compressed_kv"]))
        launch = k.launch_args(key, a["compressed_kv"], a["positions"], a["slot_mapping"],
                               a["kv_slot_mapping"], a["rms_norm_weight"], a["cos_sin_cache"], ops, t)
    return k._get_or_compile(key), launch
