"""CuTeDSL C128 compressors (K7, K8a, K8b) on a CPU-only machine.

Every warmup key the brief names compiles for sm_90a (K7 (512, 512, 8); K8a with page geometry
(2, 1728), (1, 1152), (2, 2304), (67, 39168) and bf16 / fp32 norm weights; K8b e4m3 and bf16),
one compile per key, and the default keys for sm_100a. The PTX has no FMA, no approximate
division / square root / exponential, the documented loads, barriers and shuffles; registers
allow the intended occupancy, no spills; the runtime arguments line up with the fakes; CPU
tensors are refused. A Python model of K7's work partition and index arithmetic (the kernel's
formulas, its summation order) reproduces the reference within the FP32 rule and writes no
other row.

Bytes and numbers are compared with the reference only on a GPU: ``dsv4kit verify --extended``.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

pytest.importorskip("cutlass")

from dsv4kit.backends.cutedsl import count_cute_compiles  # noqa: E402
from dsv4kit.errors import KernelInputError  # noqa: E402
from dsv4kit.kernels.c128_compress import SPECS, C128CompressConfig  # noqa: E402
from dsv4kit.kernels.c128_compress import cutedsl as c128  # noqa: E402
from dsv4kit.kernels.c128_compress.cases import (  # noqa: E402
    KV_REGIMES,
    SCORE_REGIMES,
    judge_k7,
    make_k7_case,
    make_k8_case,
)
from dsv4kit.kernels.c128_compress.cutedsl import (  # noqa: E402
    C128CompressCuTeDSL,
    C128StoreDsMlaCuTeDSL,
    C128StorePlainCuTeDSL,
)
from dsv4kit.kernels.c128_compress.reference import (  # noqa: E402
    c128_compress_reference,
)
from dsv4kit.kernels.compressor.cases import assert_args_match_fakes  # noqa: E402
from dsv4kit.kernels.encoders.spec import E1, E2, E3, key_encoder  # noqa: E402
from dsv4kit.platform import cpu_platform  # noqa: E402

K7, K8A, K8B = "c128_compress", "c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain"
CLASSES = {K7: C128CompressCuTeDSL, K8A: C128StoreDsMlaCuTeDSL, K8B: C128StorePlainCuTeDSL}
GEOMETRIES = ((2, 1728), (1, 1152), (2, 2304), (67, 39168))
WEIGHTS = ("bfloat16", "float32")

#: Per encoder: the global stores encode_store emits, and its butterfly / idx shuffle counts.
ENCODE = {E1: ({"st.global.v4.b32", "st.global.v2.b32"}, 2, 6), E2: ({"st.global.v4.b32"}, 0, 0),
          E3: ({"st.global.v4.b32"}, 0, 0)}
_APPROX = ("div.full", "div.approx", "rcp.approx", "sqrt.approx", "rsqrt", "lg2.approx")

_ARTIFACTS: dict = {}


def _artifact(cls, key, arch: str = "sm_90a"):
    """One compile per (class, key, arch) for the whole module."""
    if (cls, key, arch) not in _ARTIFACTS:
        _ARTIFACTS[cls, key, arch] = cls(cpu_platform(arch)).compile_for(key, arch)
    return _ARTIFACTS[cls, key, arch]


def _keys(op: str, **cfg) -> list:
    return CLASSES[op](cpu_platform("sm_90a")).get_warmup_keys(C128CompressConfig(**cfg))


def _k8a_keys() -> list:
    return [k for g in GEOMETRIES for w in WEIGHTS
            for k in _keys(K8A, k_cache_geometry=g, norm_weight_dtype=w)]


def _k8b_keys() -> list:
    # The weight dtype only changes one load (K8a compiles both); K8b: both formats, bf16 weights.
    return [k for d in ("fp8", "bfloat16") for k in _keys(K8B, cache_dtype=d)]


def _count(pattern: str, ptx: str) -> int:
    return len(re.findall(pattern, ptx))


def _common_ptx_facts(art, arch: str = "sm_90a", exp2: bool = False) -> str:
    ptx = art.text["ptx"]
    assert art.target == arch and f".target {arch}" in ptx
    assert art.info["spills"] == 0 and art.info["local_bytes"] == 0, art.info
    assert len(art.info["kernels"]) == 1
    # §2.1 rule 1 (and the FP32 rule's .rn arithmetic): no contraction; nothing approximate but
    # K7's exp (``exp2``: ex2.approx, which the spec allows in K7).
    assert not re.search(r"\bfma\.", ptx) and not re.search(r"\bmad\.(rn\.)?f32", ptx)
    for approx in _APPROX:
        assert approx not in ptx, approx
    assert ("ex2.approx" in ptx) == exp2
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
    return ptx


# --------------------------------------------------------------------------- compiles


def test_k7_key_compiles_for_sm90a() -> None:
    (key,) = _keys(K7)
    assert (key.head_size, key.state_width, key.state_block_size) == (512, 512, 8)
    art = _artifact(C128CompressCuTeDSL, key)
    ptx = _common_ptx_facts(art, exp2=True)
    # <= 64 registers: two 512-thread CTAs per SM (the design's overlap of loads and arithmetic).
    assert 0 < art.info["registers"] <= 64, art.info
    # One IEEE division per column (A / S); exp_f32 16 times (2 columns x 8 rows: Triton's exp,
    # fl(x log2 e) then ex2.approx): one exp per (row, column), none to rescale partial sums.
    assert _count(r"div\.rn\.f32", ptx) == 1 and "sqrt" not in ptx
    assert _count(r"mul\.rn\.f32\s+%?\w+, %?\w+, 0f3FB8AA3B", ptx) == 16
    assert _count(r"ex2\.approx\.f32\s", ptx) == 16 and "ex2.approx.ftz" not in ptx
    assert _count(r"sub\.rn\.f32", ptx) >= 16
    # State: 8 rows x (score, kv) as 8-byte vectors at immediate row offsets (j * 4096 bytes,
    # scores + 2048); the element path (odd block stride) as 32 scalar loads.
    vec = re.findall(r"ld\.global\.v2\.b32\s+\{%r\d+, %r\d+\}, \[%rd\d+(?:\+(\d+))?\]", ptx)
    assert sorted(int(o or 0) for o in vec) == sorted(j * 4096 + h for j in range(8) for h in (0, 2048))
    assert "ld.global.v4" not in ptx
    assert _count(r"ld\.global\.b32\s+%r\d+, \[%rd\d+\+\d+\]", ptx) >= 30
    # Scan: one ballot, popc, lanemask; 2 barriers for the scan, 2 per item; the item loop is
    # not unrolled. Partials through shared memory (3 pair stores, 16 pair loads of maxima).
    assert _count(r"vote\.sync\.ballot", ptx) == 1 and "popc" in ptx and "%lanemask_lt" in ptx
    assert _count(r"bar\.sync", ptx) == 4 and '.pragma "nounroll"' in ptx
    assert _count(r"st\.shared\.v2\.b32", ptx) == 3 and _count(r"ld\.shared\.v2\.b32", ptx) == 16
    # The only global store: one fp32 of a written out row.
    assert re.findall(r"st\.global[.\w]*", ptx) == ["st.global.b32"]


@pytest.mark.parametrize("key", _k8a_keys() + _k8b_keys(), ids=lambda k: "-".join(
    str(v) for v in (getattr(k, "kv_cache_block_size", None), getattr(k, "kv_block_stride", None),
                     getattr(k, "store_full_fp8", None), k.norm_weight_dtype) if v is not None))
def test_k8_keys_compile_for_sm90a(key) -> None:
    ds = hasattr(key, "kv_cache_block_size")
    cls = C128StoreDsMlaCuTeDSL if ds else C128StorePlainCuTeDSL
    enc = key_encoder(key)
    assert enc == (E1 if ds else (E3 if key.store_full_fp8 else E2))
    art = _artifact(cls, key)
    ptx = _common_ptx_facts(art)
    assert 0 < art.info["registers"] <= 96, art.info
    # rr = div.rn(1, sqrt.rn(...)); E3 adds fl(1 / fp8_scale).
    assert _count(r"div\.rn\.f32", ptx) == 1 + (enc == E3) and _count(r"sqrt\.rn\.f32", ptx) == 1
    # compressed_kv: element loads (no 16-byte alignment is promised), no vector loads.
    assert "ld.global.v" not in ptx and _count(r"ld\.global\.b32", ptx) >= 16
    # The warp's tokens: one ballot, a loop that is not unrolled; norm butterfly (5) plus the
    # encoder's; position and kv slot (2 x 32 bit each) shuffled from their lanes, plus E1's scales.
    stores, bfly, idx = ENCODE[enc]
    assert _count(r"vote\.sync\.ballot", ptx) == 1 and '.pragma "nounroll"' in ptx
    assert _count(r"shfl\.sync\.bfly", ptx) == 5 + bfly
    assert _count(r"shfl\.sync\.idx", ptx) == 4 + idx
    assert stores <= set(re.findall(r"st\.global[.\w]*", ptx))
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == (enc in (E1, E3))
    assert "bar.sync" not in ptx and ".shared" not in ptx
    # K8a: page geometry is compile time (constant division by kv_bs, no 64-bit division);
    # K8b divides by the runtime kv_bs, unsigned (slot >= 0), the remainder from the quotient.
    assert ("div.u64" in ptx) == (not ds) and not re.search(r"div\.s64|rem\.[su]64", ptx)


def test_warmup_keys_cover_the_briefs_set() -> None:
    assert {(k.kv_cache_block_size, k.kv_block_stride, k.norm_weight_dtype) for k in _k8a_keys()} == {
        (b, s, w) for b, s in GEOMETRIES for w in WEIGHTS}
    assert {(k.store_full_fp8, k.norm_weight_dtype) for k in _k8b_keys()} == {(True, "bfloat16"),
                                                                              (False, "bfloat16")}


@pytest.mark.parametrize("op", [K7, K8A, K8B])
def test_warmup_compiles_once_per_key(op: str) -> None:
    """One compile per key serves every T, request count, block-table width, state pool and (K8b)
    cache geometry: all symbolic or runtime in the fakes."""
    cls = CLASSES[op]
    cls.clear_cache()
    k = cls(cpu_platform("sm_90a"))
    cfg = C128CompressConfig(cache_dtype="bfloat16" if op == K8B else "fp8_ds_mla")
    keys = k.get_warmup_keys(cfg)
    assert len(keys) == 1
    with count_cute_compiles() as counter:
        reports = k.warmup(cfg)
    assert [r.key for r in reports] == keys and counter.count == len(keys)
    assert all(k.artifact(key) is not None for key in keys)
    # A call's key (dispatched from real tensors) is the warmed one: its executor, zero compiles.
    a = (make_k7_case() if op == K7 else make_k8_case(op, t=9)).args
    key = k.dispatch(**{n: a[n] for n in SPECS[op].contract._dispatch_program.params})
    with count_cute_compiles() as counter:
        k._get_or_compile(key)
    assert key in keys and counter.count == 0
    cls.clear_cache()


def test_flash_keys_compile_for_sm100a() -> None:
    for op, cls in CLASSES.items():
        k = cls(cpu_platform("sm_100a"))
        for key in k.get_warmup_keys(C128CompressConfig(cache_dtype="fp8" if op == K8B else "fp8_ds_mla")):
            art = _artifact(cls, key, "sm_100a")
            _common_ptx_facts(art, "sm_100a", exp2=op == K7)
            assert art.info["registers"] <= (64 if op == K7 else 96), art.info


def test_family_specs_name_these_classes() -> None:
    for op, cls in CLASSES.items():
        assert SPECS[op].kernel_class(backend="cutedsl") is cls
        assert issubclass(cls, SPECS[op].contract)
    assert C128CompressCuTeDSL.jit_fn is c128.c128_compress_host
    assert C128StoreDsMlaCuTeDSL.jit_fn is C128StorePlainCuTeDSL.jit_fn is c128.c128_store_host


# --------------------------------------------------------------------------- launch configuration


def test_mapping_constants() -> None:
    assert c128.K7_WARPS == 16 and c128.K7_WARPS * 32 <= 1024                 # one warp per state block
    assert c128.NCHUNK * 64 == 512 and c128.GROUP == 128 <= 32 * c128.K7_WARPS
    assert c128.K8_WARPS * 32 <= 1024


@pytest.mark.parametrize("t", [1, 2, 8, 64, 127, 128, 129, 256, 512, 1000, 3968, 3969, 4096, 65536, 2**20])
def test_slices_and_tokens_per_warp(t: int) -> None:
    s = c128.k7_slices(t)
    groups = -(-t // c128.GROUP)
    assert 1 <= s <= min(t, c128.GROUP)
    assert groups * s <= max(32, groups)                      # about 32 x 8 CTAs for small T
    if groups >= 32:
        assert s == 1                                          # prefill: one CTA per (group, chunk)
    tpw = c128.k8_tokens_per_warp(t)
    assert 1 <= tpw <= 32 and (t < 4096 or tpw >= 2)


# --------------------------------------------------------------------------- a model of K7


def _k7_model(case, slices: int | None = None, pool: bool = True) -> tuple[torch.Tensor, Counter]:
    """K7 as the kernel computes it, in Python: the grid (CTA b -> chunk, group, slice), the scan
    (boundary ranks, items of this slice), each warp's block-table entry and state offsets (from
    the flat operands the kernel gets), the window maximum, per-warp partial sums in row order,
    their sum in warp order, one division. ``torch.exp`` stands in for exp_f32 (within 2 ulp
    and the rounding of ``x log2 e``). Returns ``out`` and how often each (token, chunk) was
    pooled (``pool=False``: only that)."""
    k = C128CompressCuTeDSL(cpu_platform("sm_90a"))
    key, ops, run = k.prepare(**{**case.args, "out": case.args["out"].clone()})
    t = run.t
    (state, req, pos, slot, bt, out, block_stride, bt_stride, s_arg) = k.launch_args(key, ops, run)
    slices = s_arg if slices is None else slices
    groups = -(-t // c128.GROUP)
    seen: Counter = Counter()
    cols = torch.arange(64, dtype=torch.int64)
    for b in range(groups * slices * c128.NCHUNK):
        chunk, gs = b % c128.NCHUNK, b // c128.NCHUNK
        g, s = gs // slices, gs % slices
        toks = torch.arange(g * c128.GROUP, min(t, (g + 1) * c128.GROUP))
        live = toks[(slot[toks] >= 0) & ((pos[toks] & 127) == 127)]
        items = live[s::slices]
        total = len(live)
        assert len(items) == ((total - s + slices - 1) // slices if total > s else 0) <= c128.GROUP
        for ti in items.tolist():
            seen[ti, chunk] += 1
            if not pool:
                continue
            p, r = int(pos[ti]), int(req[ti])
            sc, kv = [], []
            for w in range(c128.K7_WARPS):
                blk = int(bt[r * bt_stride + ((p >> 7) << 4) + w])
                base = blk * block_stride + chunk * 64 + cols
                for j in range(8):
                    kv.append(state[base + j * 1024])
                    sc.append(state[base + j * 1024 + 512])
            sc, kv = torch.stack(sc).view(16, 8, 64), torch.stack(kv).view(16, 8, 64)
            m = sc.amax(dim=(0, 1))
            ssum, acc = torch.zeros(64), torch.zeros(64)
            for w in range(c128.K7_WARPS):
                sw, aw = torch.zeros(64), torch.zeros(64)
                for j in range(8):
                    e = torch.exp(sc[w, j] - m)
                    sw = sw + e
                    aw = aw + e * kv[w, j]
                ssum, acc = ssum + sw, acc + aw
            out[ti * 512 + chunk * 64 + cols] = acc / ssum
    return out.view(-1, 512), seen


def _boundary_tokens(case) -> set[int]:
    a = case.args
    return set(torch.nonzero((a["slot_mapping"] >= 0) & ((a["positions"] + 1) % 128 == 0)).flatten().tolist())


@pytest.mark.parametrize(("kv", "score"), [*zip(KV_REGIMES, SCORE_REGIMES, strict=True),
                                           ("large", "saturating"), ("normal", "huge")])
def test_k7_model_follows_the_fp32_rule(kv: str, score: str) -> None:
    """The kernel's index arithmetic and summation order, against the reference: every boundary
    row within the FP32 rule (NaN-filled unused state rows would show a wrong row), every other row
    of ``out`` untouched, every (boundary token, chunk) pooled exactly once."""
    case = make_k7_case(lens=(256, 130), starts=(0, 1001), kv_regime=kv, score_regime=score, padding=True,
                        seed=len(kv) * 7 + len(score))
    got, seen = _k7_model(case)
    want = case.args["out"].clone()
    c128_compress_reference(**{**case.args, "out": want})
    assert set(seen.values()) <= {1}
    assert {ti for ti, _ in seen} == _boundary_tokens(case) and len(seen) == 8 * len(_boundary_tokens(case))
    verdict = judge_k7(case, got, want)
    verdict.assert_ok()
    assert verdict.rows == len(_boundary_tokens(case))


@pytest.mark.parametrize(("lens", "starts", "slices"), [
    ((1,) * 40, None, None), ((1,) * 40, None, 3), ((300,), (127,), None), ((5, 129, 7), (123, 0, 250), 2)])
def test_k7_partition_covers_every_boundary_once(lens, starts, slices) -> None:
    """Dense decode (every request at a boundary, requests in lockstep), prefill, mixed: each
    (boundary token, chunk) is pooled by exactly one CTA for any slice count."""
    if starts is None:
        starts = tuple(127 + 128 * i for i in range(len(lens)))
    case = make_k7_case(lens=lens, starts=starts, padding=False, kv_regime="zero", score_regime="uniform")
    _, seen = _k7_model(case, slices, pool=False)
    bounds = _boundary_tokens(case)
    assert bounds and set(seen.values()) == {1} and set(seen) == {(ti, c) for ti in bounds for c in range(8)}


def test_k8_warps_cover_every_token_once() -> None:
    for t in (1, 7, 32, 257, 4096, 5000, 65536, 70001):
        tpw = c128.k8_tokens_per_warp(t)
        per_cta = c128.K8_WARPS * tpw
        grid = -(-t // per_cta)
        toks = [(b * c128.K8_WARPS + w) * tpw + i for b in range(grid) for w in range(c128.K8_WARPS)
                for i in range(tpw)]
        assert sorted(x for x in toks if x < t) == list(range(t))


# --------------------------------------------------------------------------- runtime arguments

def test_k7_launch_args_match_the_fakes() -> None:
    k = C128CompressCuTeDSL(cpu_platform("sm_90a"))
    case = make_k7_case(lens=(200, 9), starts=(100, 0))
    a = case.args
    key, rec, ops = k.prepare(**a)
    t = ops.t
    args = k.launch_args(key, rec, ops)
    assert_args_match_fakes(args, k.warmup_inputs(key), 0)
    state, req, pos, slot, bt, out, bstride, bt_stride, slices = args
    sc = a["state_cache"]
    assert state is ops.state and state.data_ptr() % 16 == 0 and bstride == sc.stride(0) and bstride % 2 == 0
    for got, want in ((req, a["token_to_req"]), (pos, a["positions"]), (slot, a["slot_mapping"])):
        assert got.data_ptr() == want.data_ptr() and got.numel() == t
    btab = a["block_table"]
    assert bt.data_ptr() == btab.data_ptr() and bt_stride == btab.stride(0)
    assert torch.equal(bt.as_strided(btab.shape, (bt_stride, 1)), btab)
    assert out.data_ptr() == a["out"].data_ptr() and out.numel() == a["out"].numel() > t * 512
    assert slices == c128.k7_slices(t)


@pytest.mark.parametrize(("op", "fmt"), [(K8A, {}), (K8A, {"page_stride": 2304}), (K8B, {}),
                                         (K8B, {"fp8_scale": 0.37})], ids=str)
@pytest.mark.parametrize("norm", [torch.bfloat16, torch.float32], ids=str)
def test_k8_launch_args_match_the_fakes(op: str, fmt: dict, norm: torch.dtype) -> None:
    k = CLASSES[op](cpu_platform("sm_90a"))
    case = make_k8_case(op, t=33, boundaries=3, kv_bs=2, norm_dtype=norm, **fmt)
    a = case.args
    cache = case.output
    key, rec, ops = k.prepare(**a)
    t, eps = ops.t, ops.eps
    args = k.launch_args(key, rec, ops)
    fakes = k.warmup_inputs(key)
    assert_args_match_fakes(args, fakes, 3)
    geom = (key.kv_cache_block_size, key.kv_block_stride) if op == K8A else (0, 0)
    assert fakes[-3:] == (key_encoder(key), *geom)
    kv, pos, slot, kvs, nw, cs, cbytes, scale, eps_arg, kv_bs, page_stride, tpw = args
    assert kv.data_ptr() == a["compressed_kv"].data_ptr() and kv.numel() == t * 512
    for got, want in ((pos, a["positions"]), (slot, a["slot_mapping"]), (kvs, a["kv_slot_mapping"])):
        assert got.data_ptr() == want.data_ptr() and got.numel() == t
    assert nw.data_ptr() == a["rms_norm_weight"].data_ptr() and nw.dtype == norm and nw.numel() == 512
    assert cs.data_ptr() == a["cos_sin_cache"].data_ptr() and cs.numel() == a["cos_sin_cache"].numel()
    assert cbytes is ops.store.cache and cbytes.dtype == torch.uint8
    raw = cache.view(torch.uint8)
    assert (kv_bs, page_stride) == (2, raw.stride(0))
    if op == K8A:
        assert geom == (kv_bs, page_stride)                     # the key's constants = the runtime cache
    fp8 = a.get("fp8_scale")
    assert scale.shape == (1,) and scale.dtype == torch.float32
    assert scale.data_ptr() == (fp8 if fp8 is not None else a["compressed_kv"]).data_ptr()
    assert eps_arg == eps and isinstance(eps_arg, float) and tpw == c128.k8_tokens_per_warp(t)


def test_single_token_views_are_made_unit_stride() -> None:
    """A size-1 tensor may carry any stride; the fakes' strides are static, so the host fixes it."""
    k = C128CompressCuTeDSL(cpu_platform("sm_90a"))
    case = make_k7_case(lens=(1,), starts=(127,), padding=False)
    a = dict(case.args)
    for name in ("positions", "slot_mapping", "token_to_req"):
        a[name] = torch.stack([a[name], a[name]], dim=1)[:, 1]
        assert a[name].stride(0) == 2
    args = k.launch_args(*k.prepare(**a))
    for i, name in ((1, "token_to_req"), (2, "positions"), (3, "slot_mapping")):
        assert args[i].stride() == (1,) and args[i].numel() == 1 and int(args[i][0]) == int(a[name][0])


@pytest.mark.parametrize("op", [K7, K8A, K8B])
def test_cpu_tensors_are_refused(op: str) -> None:
    k = SPECS[op].kernel_class(backend="cutedsl")(cpu_platform("sm_90a"))
    case = make_k7_case() if op == K7 else make_k8_case(op, t=5)
    arg = "state_cache" if op == K7 else "compressed_kv"
    with pytest.raises(KernelInputError, match=f"{arg}: expected a cuda tensor"):
        k(**case.args)
