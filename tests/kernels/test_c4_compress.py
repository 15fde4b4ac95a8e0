"""K5, K6, K9 (the C4 compressors) on Triton under the CPU interpreter, against the references.

Numerics follow the compressor rule of §2.12 (:func:`~dsv4kit.kernels.c4_compress.cases.judge`);
every byte the rule does not judge (pad bytes, unwritten entries, page tails) is BIT-EXACT, and
the bit-identical elements are counted. Also: the keys and gates of §2.11 (traps 3, 8, 9), the
spec's bad inputs, a K4 -> K5 / K9 chain, AOT compiles of every warmup key for sm_90a.
"""

from __future__ import annotations

import re

import pytest
import torch

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.jit import JitMonitor
from dsv4kit.kernels.c4_compress import SPECS, C4CompressConfig
from dsv4kit.kernels.c4_compress.cases import LAST_POSITION, OPS, TEST_TOKENS, judge, make_case, random_case
from dsv4kit.kernels.save_partial_states import save_partial_states
from dsv4kit.platform import cpu_platform

P = cpu_platform("sm_90a")
FORMATS = [
    ("c4_compress_ds_mla", {}),
    ("c4_compress_plain", {}),
    ("c4_compress_plain", {"fp8_scale": 0.37}),
    ("indexer_compress", {"use_fp4": False}),
    ("indexer_compress", {"use_fp4": True}),
]
TOTALS = {"elements": 0, "bit_identical": 0, "cases": 0, "identical_cases": 0}


def run(case, backend: str = "triton"):
    got, want = case.fresh(), case.fresh()
    with JitMonitor("warn"):
        SPECS[case.op].op(**got.args, backend=backend)
    SPECS[case.op].variants["default"].reference(**want.args)
    verdict = judge(case, got.cache, want.cache)
    TOTALS["elements"] += verdict.elements
    TOTALS["bit_identical"] += verdict.bit_identical
    TOTALS["cases"] += 1
    TOTALS["identical_cases"] += verdict.bit_identical == verdict.elements
    return verdict


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("t", TEST_TOKENS)
@pytest.mark.parametrize(("op", "fmt"), FORMATS, ids=lambda v: str(v))
def test_spec_token_counts(op: str, fmt: dict, t: int) -> None:
    lens = {1: (1,), 7: (4, 3), 32: (20, 9, 3)}.get(t, (t // 2, t - t // 2 - 5, 5))
    verdict = run(make_case(op, lens=lens, starts=tuple(3 * i for i in range(len(lens))), seed=t, **fmt))
    verdict.assert_ok()


@pytest.mark.parametrize("i", range(6))
@pytest.mark.parametrize("op", OPS)
def test_random_cases_follow_the_rule(op: str, i: int) -> None:
    run(random_case(op, i)).assert_ok()


@pytest.mark.parametrize("score", ["normal", "uniform", "saturating", "huge"])
@pytest.mark.parametrize("kv", ["zero", "tiny", "normal", "large"])
def test_regimes(kv: str, score: str) -> None:
    op = "c4_compress_ds_mla" if kv in ("tiny", "large") else "indexer_compress"
    run(make_case(op, lens=(11, 6), kv_regime=kv, score_regime=score, seed=7)).assert_ok()


def test_positions_3_7_and_the_last_row() -> None:
    """p = 3 pools rows 4..7 only, p = 7 the full window, p = 1 048 575 the cache's last row."""
    case = make_case(
        "c4_compress_ds_mla", lens=(8, 4), starts=(0, LAST_POSITION - 3), padding=False, kv_bs=2, sbs=16
    )
    assert {3, 7, LAST_POSITION} <= set(case.args["positions"].tolist())
    verdict = run(case)
    verdict.assert_ok()
    assert verdict.written == 3


def test_zero_kv_writes_zero_codes_and_the_floor_scale() -> None:
    case = make_case("c4_compress_ds_mla", lens=(12,), kv_regime="zero", padding=False)
    got = case.fresh()
    SPECS["c4_compress_ds_mla"].op(**got.args)
    from dsv4kit.formats.ds_mla import read_ds_entries

    entry, pad = read_ds_entries(
        got.cache, torch.tensor([s for s in case.args["kv_slot_mapping"].tolist() if s >= 0])
    )
    assert bool((entry.nope == 0).all()) and bool((entry.scales == 105).all()) and bool((pad == 0).all())


def test_plain_fp8_saturates_at_448() -> None:
    case = make_case("c4_compress_plain", lens=(16,), fp8_scale=2.0**-4, padding=False)
    case.args["rms_norm_weight"] *= 64  # normalized rows are O(1): weights make |y| / s exceed 448
    got = case.fresh()
    SPECS["c4_compress_plain"].op(**got.args)
    codes = got.cache.view(torch.uint8)
    assert bool(((codes == 0x7E) | (codes == 0xFE)).any()), "|bf16(y)| / s > 448 clamps to +-448"
    run(case).assert_ok()


def test_most_elements_are_bit_identical() -> None:
    """Not only rule-conformant: on this suite's cases the kernel equals the reference almost always
    (printed, and held to >= 99.9 % of elements; the rule alone would allow far less)."""
    for i in range(6, 9):
        for op in OPS:
            run(random_case(op, i)).assert_ok()
    frac = TOTALS["bit_identical"] / TOTALS["elements"]
    print(
        f"\nC4 compressors (Triton, interpreter): {TOTALS['bit_identical']}/{TOTALS['elements']} elements "
        f"bit-identical ({frac:.5%}); {TOTALS['identical_cases']}/{TOTALS['cases']} cases entirely"
    )
    assert frac >= 0.999


def test_k4_writes_what_k5_and_k9_read() -> None:
    """The chain of a C4 layer: K4 stores kv / score + ape, then K5 and K9 pool those rows."""
    g = torch.Generator().manual_seed(3)
    for op, head in (("c4_compress_ds_mla", 512), ("indexer_compress", 128)):
        case = make_case(op, lens=(13, 6), padding=False)
        a = case.fresh().args
        state = a["state_cache"]
        state.fill_(float("nan"))
        sw = 2 * head
        pos, slots = a["positions"], a["slot_mapping"]
        # Every row a window reads: the tokens themselves here (requests start at 0).
        kv_score = torch.randn(len(pos), 2 * sw, generator=g)
        ape = torch.randn(4, sw, generator=g)
        save_partial_states(kv_score[:, :sw], kv_score[:, sw:], ape, pos, state, slots, state.shape[1], sw, 4)
        got, want = case.fresh(), case.fresh()
        got.args["state_cache"].copy_(state)
        want.args["state_cache"].copy_(state)
        SPECS[op].op(**got.args)
        SPECS[op].variants["default"].reference(**want.args)
        case.args["state_cache"] = state
        judge(case, got.cache, want.cache).assert_ok()
        assert judge(case, got.cache, want.cache).written > 0


# --------------------------------------------------------------------------- keys and gates


def _keys(op: str, **cfg) -> list:
    return SPECS[op].kernel(platform=P, backend="triton").get_warmup_keys(C4CompressConfig(**cfg))


def test_flash_warmup_keys_and_gates() -> None:
    (k5,) = _keys("c4_compress_ds_mla")
    assert (k5.head_size, k5.state_width, k5.token_stride, k5.norm_weight_dtype) == (
        512,
        1024,
        576,
        "bfloat16",
    )
    assert _keys("c4_compress_plain") == []  # DSv4-Flash: none
    (k9,) = _keys("indexer_compress")
    assert (k9.use_fp4_cache, k9.norm_weight_dtype, k9.quant_block, k9.token_stride) == (
        False,
        "bfloat16",
        128,
        128,
    )
    assert [
        k.store_full_fp8
        for d in ("fp8", "fp8_e4m3", "bfloat16", "auto")
        for k in _keys("c4_compress_plain", cache_dtype=d)
    ] == [True, True, False, False]  # trap 3
    assert _keys("c4_compress_ds_mla", cache_dtype="bf16") == []
    assert _keys("c4_compress_ds_mla", cache_block_size=0) == []
    assert _keys("c4_compress_ds_mla", compress_ratios=(128,)) == []
    assert [k.use_fp4_cache for k in _keys("indexer_compress", indexer_cache_dtype="mxfp4")] == [True]
    assert [k.norm_weight_dtype for k in _keys("c4_compress_ds_mla", norm_weight_dtype="float32")] == [
        "float32"
    ]
    with pytest.raises(KernelInputError, match="cache_dtype: expected one of"):
        C4CompressConfig(cache_dtype="fp8_e5m2")


def test_k9_key_reads_only_the_format_and_the_weight_dtype() -> None:
    """Trap 8: state block size, kv_bs and page stride are runtime (one key for all of them)."""
    k = SPECS["indexer_compress"].kernel(platform=P, backend="triton")
    keys = {
        k.dispatch(
            **{n: c.args[n] for n in ("rms_norm_weight", "state_cache", "cos_sin_cache", "use_fp4_cache")}
        )
        for c in (
            make_case("indexer_compress", sbs=s, kv_bs=b, page_stride=ps)
            for s, b, ps in ((4, 64, None), (16, 1, None), (4, 64, 8448), (16, 64, 8640))
        )
    }
    assert len(keys) == 1


def test_fp32_norm_weights_are_another_key() -> None:
    """Trap 9: a bf16 warmup misses fp32-kept weights; strict mode names the field."""
    k = SPECS["c4_compress_ds_mla"].kernel(platform=P, backend="triton")
    type(k).clear_cache()  # executors are per class: forget earlier tests' compiles
    k.warmup(C4CompressConfig())
    case = make_case("c4_compress_ds_mla", lens=(8,), norm_dtype=torch.float32)
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError, match="norm_weight_dtype"):
        k(**case.fresh().args)


@pytest.mark.parametrize("op", OPS)
def test_every_triton_warmup_key_compiles_for_sm90a(op: str) -> None:
    k = SPECS[op].kernel(platform=P, backend="triton")
    cfgs = [
        C4CompressConfig(cache_dtype=d, indexer_cache_dtype=i, norm_weight_dtype=w)
        for d in ("fp8_ds_mla", "fp8", "bfloat16")
        for i in ("fp8", "mxfp4")
        for w in ("bfloat16", "float32")
    ]
    keys = list(dict.fromkeys(key for c in cfgs for key in k.get_warmup_keys(c)))
    assert keys
    for key in keys:
        art = k.compile_for(key, "sm_90a")
        ptx = art.text["ptx"]
        assert art.target == "sm_90a" and ".target sm_90a" in ptx and art.info["spills"] == 0
        assert not re.search(r"\bfma\.", ptx)  # §2.1 rule 1
        assert "sqrt.rn.f32" in ptx and "div.rn.f32" in ptx  # IEEE norm and softmax
        assert "ld.global.v4" in ptx  # the aligned-state branch


# --------------------------------------------------------------------------- bad inputs


def _bad(op: str, fmt: dict | None = None):
    case = make_case(op, lens=(9,), **(fmt or {}))
    return case.fresh().args


def _misaligned_state(a: dict) -> torch.Tensor:
    sc = a["state_cache"]
    buf = torch.zeros(sc.numel() + sc.shape[0] * 8 + 8)
    return buf[1:].as_strided(sc.shape, sc.stride(), 1)


BAD = [
    ("c4_compress_ds_mla", "state_cache", lambda a: a["state_cache"].double(), "state_cache: expected"),
    ("c4_compress_ds_mla", "state_cache", lambda a: a["state_cache"][:, :, :1024], "state_cache: expected"),
    ("c4_compress_ds_mla", "state_cache", _misaligned_state, "state_cache: expected data_ptr % 16"),
    ("c4_compress_ds_mla", "state_block_size", lambda a: 8, "state_block_size: expected"),
    (
        "c4_compress_ds_mla",
        "cos_sin_cache",
        lambda a: a["cos_sin_cache"].bfloat16(),
        "cos_sin_cache: expected .*float32",
    ),  # trap 1
    (
        "c4_compress_ds_mla",
        "cos_sin_cache",
        lambda a: a["cos_sin_cache"][:, :32].contiguous(),
        "cos_sin_cache: expected shape\\[1\\] == 64",
    ),
    (
        "c4_compress_ds_mla",
        "rms_norm_weight",
        lambda a: a["rms_norm_weight"].half(),
        "rms_norm_weight: expected",
    ),
    (
        "c4_compress_ds_mla",
        "rms_norm_weight",
        lambda a: a["rms_norm_weight"][:128].contiguous(),
        "rms_norm_weight: expected shape \\(512,\\)",
    ),
    ("c4_compress_ds_mla", "rms_norm_eps", lambda a: 0.0, "rms_norm_eps: expected"),
    ("c4_compress_ds_mla", "k_cache", lambda a: a["k_cache"][:, :, :576], "k_cache: expected"),
    (
        "c4_compress_ds_mla",
        "kv_slot_mapping",
        lambda a: a["kv_slot_mapping"][:-1],
        "kv_slot_mapping: expected",
    ),
    ("c4_compress_ds_mla", "token_to_req", lambda a: a["token_to_req"].long(), "token_to_req: expected"),
    ("c4_compress_ds_mla", "slot_mapping", lambda a: a["slot_mapping"][:3], "slot_mapping: expected"),
    (
        "c4_compress_ds_mla",
        "block_table",
        lambda a: a["block_table"].repeat(1, 2)[:, ::2],
        "block_table: expected stride\\(1\\) == 1",
    ),
    (
        "c4_compress_ds_mla",
        "kv_slot_mapping",
        lambda a: torch.where(a["kv_slot_mapping"] >= 0, 10**6, a["kv_slot_mapping"]),
        "kv_slot_mapping: expected values in",
    ),
    ("c4_compress_ds_mla", "token_to_req", lambda a: a["token_to_req"] + 5, "token_to_req: expected values"),
    (
        "c4_compress_ds_mla",
        "block_table",
        lambda a: a["block_table"][:, :1].contiguous(),
        "block_table \\(column q // sbs\\): expected values",
    ),
    (
        "c4_compress_plain",
        "kv_cache",
        lambda a: a["kv_cache"].view(torch.uint8).view(torch.float8_e5m2),
        "kv_cache: expected",
    ),
    (
        "c4_compress_plain",
        "fp8_scale",
        lambda a: torch.ones(1),
        "fp8_scale: expected None for a bfloat16 cache",
    ),
    ("indexer_compress", "state_cache", lambda a: torch.zeros(2, 4, 1024), "state_cache: expected"),
    ("indexer_compress", "k_cache", lambda a: torch.zeros(2, 4, 136, dtype=torch.uint8), "k_cache: expected"),
    (
        "indexer_compress",
        "k_cache",
        lambda a: torch.zeros(1064, dtype=torch.uint8).as_strided((2, 4, 132), (530, 132, 1), 2),
        "k_cache: expected page stride",
    ),
    ("indexer_compress", "use_fp4_cache", lambda a: 1, "use_fp4_cache: expected a bool"),
]


@pytest.mark.parametrize(
    ("op", "arg", "make", "match"), BAD, ids=[f"{o}-{a}-{i}" for i, (o, a, _, _) in enumerate(BAD)]
)
def test_bad_inputs_raise_before_launch(op, arg, make, match) -> None:
    a = _bad(op)
    before = a[SPECS[op].args[9].name].clone()
    with pytest.raises(KernelInputError, match=match):
        SPECS[op].op(**{**a, arg: make(a)}, debug_checks=True)
    assert torch.equal(a[SPECS[op].args[9].name].view(torch.uint8), before.view(torch.uint8))


def test_e4m3_cache_needs_a_scale() -> None:
    a = _bad("c4_compress_plain", {"fp8_scale": 0.5})
    with pytest.raises(KernelInputError, match="fp8_scale: expected a \\[1\\] fp32 tensor for an e4m3 cache"):
        SPECS["c4_compress_plain"].op(**{**a, "fp8_scale": None})
    with pytest.raises(KernelInputError, match="fp8_scale: expected a finite value > 0"):
        SPECS["c4_compress_plain"].op(**{**a, "fp8_scale": torch.tensor([float("inf")])}, debug_checks=True)


def test_empty_batch_returns_without_launch() -> None:
    a = _bad("indexer_compress")
    empty = {**a, **{n: a[n][:0] for n in ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping")}}
    with JitMonitor("error"):
        assert SPECS["indexer_compress"].op(**empty) is None


@pytest.mark.parametrize("sbs", [1, 2, 6, 8])
@pytest.mark.parametrize("op", ["c4_compress_ds_mla", "indexer_compress"])
def test_state_block_sizes_not_a_multiple_of_4(op: str, sbs: int) -> None:
    """The kernel reads each group of four window rows with one block-table entry when sbs % 4 == 0
    and row by row otherwise: both paths, with windows that straddle state blocks."""
    case = make_case(op, lens=(13, 9), starts=(0, 5), sbs=sbs, kv_bs=2, seed=sbs)
    verdict = run(case)
    verdict.assert_ok()
    assert verdict.written >= 2


@pytest.mark.parametrize(("share_from", "chunk", "programs"),
                         [(1, 3, 1 << 20), (1, 8, 2), (1, 5, 3), (40, 8, 2)])
def test_chunks_and_programs(monkeypatch, share_from: int, chunk: int, programs: int) -> None:
    """Prefill programs loop over chunks of several tokens: any chunk size, a last chunk with fewer
    tokens, a grid smaller than the chunks (each program several chunks), and the threshold below
    which every token is its own program, all write what the reference writes."""
    from dsv4kit.kernels.c4_compress import triton as c4_triton

    monkeypatch.setattr(c4_triton, "SHARE_FROM_TOKENS", share_from)
    monkeypatch.setattr(c4_triton, "TOKENS_PER_CHUNK", chunk)
    monkeypatch.setattr(c4_triton, "MAX_PROGRAMS", programs)
    for op, fmt in FORMATS[::2]:
        case = make_case(op, lens=(14, 9, 6), starts=(0, 3, 1001), seed=chunk, **fmt)
        t = case.args["positions"].shape[0]
        want = (chunk, min(-(-t // chunk), programs)) if t >= share_from else (1, min(t, programs))
        assert c4_triton.launch_shape(t) == want
        run(case).assert_ok()


# --------------------------------------------------------------------------- moved from notebook 03


def _k5_scale_bytes(case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K5's stored scale bytes of every written entry, the bf16 block amax of the reference's rows,
    and the boundary blocks (where the rule lets the byte differ)."""
    from dsv4kit.formats.bits import bf16_round
    from dsv4kit.formats.ds_mla import read_ds_entries
    from dsv4kit.formats.fp8 import q8_exponent
    from dsv4kit.kernels.c4_compress.reference import OPERANDS, c4_rows
    from dsv4kit.kernels.compressor.reference import check_values
    from dsv4kit.testing import boundary_blocks

    a = case.args
    run(case).assert_ok()
    got = case.fresh()
    with JitMonitor("error"):
        SPECS[case.op].op(**got.args, backend="triton", platform=P)
    ops = OPERANDS[case.op](**a)
    idx = check_values("k5", ops, 4, True, 512)
    y = c4_rows("k5", ops, a["rms_norm_eps"], idx)
    raw = y[:, :448].abs().reshape(-1, 7, 64).amax(-1)
    entry, _ = read_ds_entries(got.cache, a["kv_slot_mapping"][idx])
    return entry.scales.long(), bf16_round(raw), boundary_blocks(raw, q8_exponent)


def test_k5_stores_the_d1_scale_byte_not_the_deployed_floor() -> None:
    """D1 floors the block amax at 1e-4 before dividing by 448 (smallest byte 105); one deployed
    compressor floors the scale instead (114). Small blocks (norm weights that shrink them, and the
    spec's tiny regime) get D1's byte, a grid up to 2^9 finer than the deployed one."""
    from dsv4kit.viz.compressor import d1_scale_byte, deployed_scale_byte

    shrunk = make_case("c4_compress_ds_mla", lens=(16,), padding=False, seed=11)
    w = shrunk.args["rms_norm_weight"].float()
    for blk, f in ((1, 0.004), (2, 5e-4), (3, 0.02), (4, 2e-5)):
        w[64 * blk: 64 * blk + 64] *= f
    shrunk.args["rms_norm_weight"] = w.to(torch.bfloat16)
    tiny = make_case("c4_compress_ds_mla", lens=(16,), padding=False, kv_regime="tiny", seed=11)
    SPECS["c4_compress_ds_mla"].kernel(platform=P).warmup(C4CompressConfig())
    for name, case in (("shrunk", shrunk), ("tiny", tiny)):
        stored, amax, bnd = _k5_scale_bytes(case)
        deployed = deployed_scale_byte(amax)
        assert torch.equal(stored[~bnd], d1_scale_byte(amax)[~bnd]), name
        small = amax <= 448 * 2.0**-14
        assert small.any() and bool((deployed >= stored).all()), name
        assert bool((deployed[small] > stored[small]).all()), name  # the floors differ below 448 * 2^-14
    assert bool((amax < 1e-4).all()) and bool((stored == 105).all()) and bool((deployed == 114).all())
