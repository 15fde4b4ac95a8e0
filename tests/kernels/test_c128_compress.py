"""K7, K8a, K8b (the C128 compressors) on Triton under the CPU interpreter, against the references.

K7 follows the FP32 rule and leaves every other row of ``out`` untouched
(:func:`~dsv4kit.kernels.c128_compress.cases.judge_k7`); K8 follows the compressor rule of §2.12
with every byte the rule does not judge BIT-EXACT (:func:`~dsv4kit.kernels.c128_compress.cases.
judge_store`). Also: the GPU's launch layout (BD-column programs, ``tpp < SCAN`` token blocks) run
under the interpreter, the unaligned-block-stride branch, AOT compiles of every warmup key for
sm_90a (PTX facts), and zero compiles after warmup under the monitor in ``error`` mode. Keys, gates,
traps and the K7 -> K8 chains are in ``test_c128_contract.py``.
"""

from __future__ import annotations

import re

import pytest
import torch

from dsv4kit.formats.ds_mla import read_ds_entries
from dsv4kit.jit import JitMonitor
from dsv4kit.kernels.c128_compress import SPECS, C128CompressConfig
from dsv4kit.kernels.c128_compress.cases import (
    KV_REGIMES,
    LAST_POSITION,
    OPS,
    SCORE_REGIMES,
    judge_k7,
    judge_store,
    make_k7_case,
    make_k8_case,
    random_case,
)
from dsv4kit.kernels.c128_compress.triton import (
    BD_STREAM,
    BD_TILE,
    SCAN,
    STREAM_MIN_TOKENS,
    C128CompressTriton,
    C128StoreDsMlaTriton,
    C128StorePlainTriton,
    k7_plan,
    tokens_per_program,
)
from dsv4kit.platform import cpu_platform

P = cpu_platform("sm_90a")
K7, K8A, K8B = OPS
TOTALS = {"elements": 0, "bit_identical": 0}


def _boundaries(case) -> int:
    a = case.args
    live = (a["slot_mapping"] >= 0) & ((a["positions"] + 1) % 128 == 0)
    if "kv_slot_mapping" in a:
        live &= a["kv_slot_mapping"] >= 0
    return int(live.sum())


def run(case, kernel=None, mode: str = "warn"):
    """The kernel (the op's Triton backend, or ``kernel``) and the reference on fresh copies; judged."""
    got, want = case.fresh(), case.fresh()
    with JitMonitor(mode):
        if kernel is None:
            SPECS[case.op].op(**got.args, backend="triton")
        else:
            kernel(**got.args)
    SPECS[case.op].variants["default"].reference(**want.args)
    if case.op == K7:
        verdict = judge_k7(case, got.args["out"], want.args["out"])
        assert verdict.rows == _boundaries(case)
    else:
        verdict = judge_store(case, got.output, want.output)
        assert verdict.written == _boundaries(case)
    TOTALS["elements"] += verdict.elements
    TOTALS["bit_identical"] += verdict.bit_identical
    return verdict


# --------------------------------------------------------------------------- K7 numerics

#: T in {1, 7, 32, 257, 513}: (lens, starts) over 1-3 requests with 0, 1 or several boundaries,
#: 127, 255 and 1 048 575 among them.
K7_SHAPES = {
    "T1-p127": ((1,), (127,)),
    "T1-none": ((1,), (500,)),
    "T7-127-255": ((4, 3), (124, 253)),
    "T32-none": ((20, 9, 3), (0, 30, 200)),
    "T32-127-255": ((20, 9, 3), (110, 250, 0)),
    "T257-last": ((130, 122, 5), (0, LAST_POSITION + 1 - 122, 1000)),
    "T513-four": ((300, 200, 13), (0, 100, 250)),
}


@pytest.mark.parametrize("shape", K7_SHAPES)
def test_k7_spec_token_counts(shape: str) -> None:
    lens, starts = K7_SHAPES[shape]
    case = make_k7_case(lens=lens, starts=starts, seed=len(shape))
    verdict = run(case)
    verdict.assert_ok()
    if "none" in shape:
        assert verdict.rows == 0


@pytest.mark.parametrize("kv", KV_REGIMES)
def test_k7_kv_and_score_regimes(kv: str) -> None:
    for score in SCORE_REGIMES:
        case = make_k7_case(lens=(130, 7), starts=(0, 250), kv_regime=kv, score_regime=score, seed=5)
        run(case).assert_ok()


@pytest.mark.parametrize("i", range(4))
def test_k7_random_cases(i: int) -> None:
    run(random_case(K7, i)).assert_ok()


def test_k7_without_out_returns_t_rows() -> None:
    case = make_k7_case(lens=(130,), starts=(0,), padding=False)
    a = {**case.fresh().args, "out": None}
    got = SPECS[K7].op(**a, backend="triton")
    want = SPECS[K7].variants["default"].reference(**case.fresh().args)
    assert got.shape == (130, 512)
    (t,) = torch.nonzero(case.args["positions"] == 127).flatten().tolist()  # tokens are shuffled
    assert torch.allclose(got[t], want[t], rtol=0, atol=1e-5 * 8)  # kv normal: |k| < 8
    assert not torch.equal(got[t], want[(t + 1) % 130])


def test_k7_block_stride_not_a_multiple_of_4() -> None:
    """The kernel's other branch (row offsets not provably 16-byte aligned): same results."""
    case = make_k7_case(lens=(140, 20), starts=(120, 240), seed=9)
    sc = case.args["state_cache"]
    nsb, stride = sc.shape[0], 8 * 1024 + 1
    buf = torch.full((nsb * stride + 16,), float("nan"))
    odd = buf.as_strided(sc.shape, (stride, 1024, 1))
    odd.copy_(sc)
    case.args["state_cache"] = odd
    assert odd.stride(0) % 4 == 1 and odd.data_ptr() % 16 == 0
    run(case).assert_ok()


# --------------------------------------------------------------------------- K8 numerics

K8_CASES = [
    (K8A, dict(t=1, boundaries=1, kv_bs=1)),
    (K8A, dict(t=7, boundaries=2, kv_bs=2, page_stride=1728, norm_dtype=torch.float32, kv_regime="tiny")),
    (K8A, dict(t=32, boundaries=4, kv_bs=2, page_stride=2304, kv_regime="large")),  # 127 .. 1 048 575
    (K8A, dict(t=257, boundaries=0, kv_bs=1, kv_regime="normal")),
    (K8A, dict(t=513, boundaries=3, kv_bs=1, page_stride=1728, norm_dtype=torch.float32, kv_regime="zero")),
    (K8B, dict(t=1, boundaries=1, kv_bs=1, fp8_scale=1.0)),
    (K8B, dict(t=7, boundaries=1, kv_bs=2, kv_regime="tiny")),
    (K8B, dict(t=32, boundaries=3, kv_bs=2, fp8_scale=0.37, norm_dtype=torch.float32, kv_regime="large")),
    (K8B, dict(t=257, boundaries=4, kv_bs=1, page_stride=1 * 512 + 16, norm_dtype=torch.float32)),
    (K8B, dict(t=513, boundaries=2, kv_bs=1, page_stride=512 + 16, fp8_scale=2.0**-4, kv_regime="zero")),
]


def _k8_id(op: str, kw: dict) -> str:
    fmt = "ds" if op == K8A else ("e4m3" if kw.get("fp8_scale") else "bf16")
    return f"{fmt}-T{kw['t']}-b{kw['boundaries']}-bs{kw['kv_bs']}-P{kw.get('page_stride')}"


@pytest.mark.parametrize(("op", "kw"), K8_CASES, ids=[_k8_id(o, k) for o, k in K8_CASES])
def test_k8_spec_shapes(op: str, kw: dict) -> None:
    verdict = run(make_k8_case(op, seed=kw["t"], **kw))
    verdict.assert_ok()
    assert verdict.written == _boundaries(make_k8_case(op, seed=kw["t"], **kw))


@pytest.mark.parametrize("i", range(4))
@pytest.mark.parametrize("op", [K8A, K8B])
def test_k8_random_cases(op: str, i: int) -> None:
    run(random_case(op, i)).assert_ok()


def test_k8a_zero_rows_write_zero_codes_and_the_floor_scale() -> None:
    case = make_k8_case(K8A, t=32, boundaries=4, kv_regime="zero", padding=False)
    got = case.fresh()
    SPECS[K8A].op(**got.args, backend="triton")
    slots = got.args["kv_slot_mapping"]
    entry, pad = read_ds_entries(got.output, slots[slots >= 0])
    assert len(slots[slots >= 0]) == 4
    assert bool((entry.nope == 0).all()) and bool((entry.scales == 105).all()) and bool((pad == 0).all())


def test_most_elements_are_bit_identical() -> None:
    """Printed for the record (K7's pooled sums round in another order than torch's, so fewer of its
    elements are identical; the K8 encoders make most of theirs); K8 held to >= 99 %."""
    before = dict(TOTALS)
    for i in range(4, 6):
        for op in (K8A, K8B):
            run(random_case(op, i)).assert_ok()
    n = TOTALS["elements"] - before["elements"]
    same = TOTALS["bit_identical"] - before["bit_identical"]
    print(f"\nC128 stores (Triton, interpreter): {same}/{n} elements bit-identical; "
          f"whole file so far {TOTALS['bit_identical']}/{TOTALS['elements']}")
    assert n > 0 and same >= 0.99 * n


# --------------------------------------------------------------------------- paths and launch layouts


class _StreamK7(C128CompressTriton):
    """K7 on its streaming path (the GPU's choice for T > 4096) at the interpreter's small T."""

    def plan(self, t: int, block_stride: int) -> tuple[int, int]:
        return SCAN, 1


class _GpuLayoutK7(C128CompressTriton):
    """K7 with the GPU's launch layout under the interpreter: BD-column programs, token blocks of
    ``tpp`` (< SCAN, so the scan's mask and the block offsets are exercised), the given path."""

    tpp, path = 3, 0

    def interpreter_constexprs(self, key):
        return {}

    def block_cols(self, path: int) -> int:
        return BD_STREAM if path else BD_TILE

    def plan(self, t: int, block_stride: int) -> tuple[int, int]:
        return self.tpp, self.path


class _GpuLayoutK7Stream(_GpuLayoutK7):
    tpp, path = 2, 1


class _GpuLayoutK8a(C128StoreDsMlaTriton):
    def tokens_per_program(self, t: int) -> int:
        return 3


class _GpuLayoutK8b(C128StorePlainTriton):
    def tokens_per_program(self, t: int) -> int:
        return 5


def test_launch_plans() -> None:
    assert [tokens_per_program(t) for t in (1, 8, 64, 255, 256, 4096, 16384, 65536, 10**6)] == [
        1, 1, 1, 1, 2, 32, 128, 128, 128,
    ]
    assert [k7_plan(t, 8192) for t in (1, 31, 64, 256, 4096, 4097, 65536)] == [
        (1, 0), (1, 0), (2, 0), (8, 0), (128, 0), (128, 1), (128, 1),
    ]
    assert k7_plan(65536, 8193) == (128, 0)  # streaming needs 16-byte rows: an odd stride tiles
    assert STREAM_MIN_TOKENS == 4096
    assert max(max(tokens_per_program(t), k7_plan(t, 8192)[0]) for t in range(1, 2**17, 997)) <= SCAN


@pytest.mark.parametrize("kv", KV_REGIMES)
def test_k7_stream_path_regimes(kv: str) -> None:
    """The streaming path (online max / sum, rescaled as the max grows) under every kv regime, with
    the scores that stress the rescaling: one row +60 and the rest -60, and |s| = 1e4."""
    k = _StreamK7(platform=P)
    for score in ("saturating", "huge"):
        case = make_k7_case(lens=(130, 7), starts=(0, 250), kv_regime=kv, score_regime=score, seed=6)
        run(case, kernel=k).assert_ok()


@pytest.mark.parametrize("i", range(3))
def test_k7_stream_path_random_cases(i: int) -> None:
    run(random_case(K7, 10 + i), kernel=_StreamK7(platform=P)).assert_ok()


@pytest.mark.parametrize("cls", [_GpuLayoutK7, _GpuLayoutK7Stream])
def test_k7_gpu_layout_under_the_interpreter(cls) -> None:
    """512 / BD column programs per token block; boundaries in blocks of 2-3 tokens (some blocks
    hold 2)."""
    k = cls(platform=P)
    k.warmup()
    case = make_k7_case(lens=(4, 3, 2), starts=(124, 253, 0), seed=2)
    verdict = run(case, kernel=k, mode="error")
    verdict.assert_ok()
    assert verdict.rows >= 1
    # Two boundaries among 3 tokens: one block holds both.
    case = make_k7_case(lens=(1, 1, 1), starts=(127, 500, 255), padding=False, seed=3)
    assert run(case, kernel=k, mode="error").rows == 2


@pytest.mark.parametrize(("cls", "op", "kw"), [
    (_GpuLayoutK8a, K8A, dict(t=32, boundaries=4, kv_bs=2)),
    (_GpuLayoutK8b, K8B, dict(t=7, boundaries=3, kv_bs=1, fp8_scale=0.37)),
])
def test_k8_gpu_layout_under_the_interpreter(cls, op: str, kw: dict) -> None:
    k = cls(platform=P)
    case = make_k8_case(op, seed=4, **kw)
    k.warmup(keys=[k.dispatch(**{n: case.args[n] for n in ("rms_norm_weight", "cos_sin_cache",
                                                            "k_cache" if op == K8A else "kv_cache")})])
    run(case, kernel=k, mode="error").assert_ok()


# --------------------------------------------------------------------------- compiles


def _all_keys(op: str) -> list:
    k = SPECS[op].kernel(platform=P, backend="triton")
    cfgs = [C128CompressConfig(cache_dtype=d, norm_weight_dtype=w, cache_block_size=b)
            for d in ("fp8_ds_mla", "fp8", "bfloat16") for w in ("bfloat16", "float32") for b in (64, 256)]
    return list(dict.fromkeys(key for c in cfgs for key in k.get_warmup_keys(c)))


@pytest.mark.parametrize("op", OPS)
def test_every_triton_warmup_key_compiles_for_sm90a(op: str) -> None:
    k = SPECS[op].kernel(platform=P, backend="triton")
    keys = _all_keys(op)
    assert len(keys) == {K7: 1, K8A: 4, K8B: 4}[op]
    for key in keys:
        art = k.compile_for(key, "sm_90a")
        ptx = art.text["ptx"]
        assert art.target == "sm_90a" and ".target sm_90a" in ptx and art.info["spills"] == 0
        assert not re.search(r"\bfma\.", ptx)  # §2.1 rule 1
        assert "div.rn.f32" in ptx  # IEEE softmax division (K7), norm (K8)
        if op == K7:
            # The streaming path: 16-byte cp.async copies of the state ([8, 64] steps, 3 stages: 8
            # per stage per lane); the tile path: evict-first loads. 1 warp, <= 128 registers and
            # ~8 KiB of shared memory: ~16 resident programs per SM.
            copies = re.findall(r"cp\.async\.cg\.shared\.global[^\n]*, 0x10", ptx)
            assert len(copies) == 24
            assert "ld.global.L1::evict_first" in ptx
            assert art.info["num_warps"] == 1 and art.info["registers"] <= 128
            assert art.info["shared"] <= 9 * 1024
        else:
            assert "sqrt.rn.f32" in ptx
            assert art.info["num_warps"] == 4
        if op == K8A:
            # Page geometry is compile-time: the key's stride appears as an immediate.
            assert str(key.kv_block_stride) in ptx


@pytest.mark.parametrize("op", OPS)
def test_zero_compiles_after_warmup(op: str) -> None:
    """Warm the key of a config, then calls of many T, page geometries and strides: the monitor in
    ``error`` mode sees no compile (every runtime int is unspecialized, every pointer's class fixed)."""
    k = SPECS[op].kernel(platform=P, backend="triton")
    type(k).clear_cache()
    if op == K7:
        k.warmup(C128CompressConfig())
        cases = [random_case(K7, i) for i in range(2)] + [make_k7_case(lens=(1,), starts=(127,))]
    elif op == K8A:
        k.warmup(C128CompressConfig(cache_block_size=256))  # (2, 1728)
        cases = [make_k8_case(K8A, t=t, boundaries=b, kv_bs=2, page_stride=1728, seed=t)
                 for t, b in ((1, 1), (257, 3), (32, 0))]
    else:
        k.warmup(C128CompressConfig(cache_dtype="fp8"))
        cases = [make_k8_case(K8B, t=t, boundaries=b, kv_bs=kv_bs, page_stride=ps, fp8_scale=0.5, seed=t)
                 for t, b, kv_bs, ps in ((1, 1, 1, None), (257, 4, 2, 2 * 512 + 16), (32, 2, 2, None))]
    with JitMonitor("error") as mon:
        for case in cases:
            k(**case.fresh().args)
    assert mon.events == []


# --------------------------------------------------------------------------- moved from notebook 04


@pytest.mark.parametrize("kv", KV_REGIMES)
@pytest.mark.parametrize(("op", "fp8_scale"), [(K8A, None), (K8B, None), (K8B, 0.37)],
                         ids=["ds_mla", "bf16", "e4m3"])
def test_k8_every_kv_regime_in_every_format(op: str, fp8_scale: float | None, kv: str) -> None:
    """K8a and K8b (bf16 and e4m3 rows) on every kv regime of the spec's compressed rows (zero, tiny,
    normal, large), under the compressor rule, no compile after warmup."""
    case = make_k8_case(op, t=16, boundaries=4, kv_regime=kv, fp8_scale=fp8_scale, seed=KV_REGIMES.index(kv))
    w = str(case.args["rms_norm_weight"].dtype).removeprefix("torch.")
    if op == K8A:
        config = C128CompressConfig(norm_weight_dtype=w).with_cache(case.output)
    else:
        config = C128CompressConfig(cache_dtype="fp8" if fp8_scale else "bf16", norm_weight_dtype=w)
    SPECS[op].kernel().warmup(config)
    verdict = run(case, mode="error")
    verdict.assert_ok()
    assert verdict.written > 0  # run() checks it is every live boundary
