"""K7, K8a, K8b: keys and gates (§2.11), the traps of the C128 compressor (3, 4, 5, 9), and the
chains K7 -> K8 and K4 -> K7 -> K8 against the reference pipeline (Triton under the interpreter).

Trap 4: K8a's page geometry is compile-time, read from the real cache on every call, so a packed
pool is another key: a guard hit naming ``kv_block_stride`` in ``error`` mode, never a silent
mis-store; warming from the bound cache (``C128CompressConfig.with_cache``) covers it. Trap 5: a
state cache whose block size is not 8 raises before dispatch. Trap 3: ``fp8_e5m2`` is refused when
the configuration is made.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.formats.ds_mla import allocate_ds_cache
from dsv4kit.formats.state_cache import allocate_state_cache
from dsv4kit.jit import JitMonitor
from dsv4kit.kernels.c128_compress import SPECS, C128CompressConfig
from dsv4kit.kernels.c128_compress.cases import (
    C128Case,
    ChainCase,
    judge_chain,
    judge_store,
    make_chain_case,
    make_k7_case,
    make_k8_case,
)
from dsv4kit.kernels.save_partial_states import save_partial_states
from dsv4kit.model.presets import DSV4_FLASH, CompressorPreset
from dsv4kit.model.stack import DSv4AttentionStack
from dsv4kit.platform import cpu_platform

P = cpu_platform("sm_90a")
K7, K8A, K8B = "c128_compress", "c128_norm_rope_store_ds_mla", "c128_norm_rope_store_plain"


def _keys(op: str, config: C128CompressConfig | None = None, **cfg) -> list:
    return SPECS[op].kernel(platform=P, backend="triton").get_warmup_keys(config or C128CompressConfig(**cfg))


# --------------------------------------------------------------------------- keys and gates


def test_flash_keys_are_the_spec_table() -> None:
    """§2.11, DSv4-Flash (B = 256, fp8_ds_mla, bf16): K7 (512, 512, 8), K8a (2, 1728, bf16), K8b none."""
    (k7,) = _keys(K7)
    assert (k7.head_size, k7.state_width, k7.state_block_size) == (512, 512, 8)
    (k8a,) = _keys(K8A)
    assert (k8a.kv_cache_block_size, k8a.kv_block_stride, k8a.norm_weight_dtype) == (2, 1728, "bfloat16")
    assert (k8a.token_stride, k8a.scale_dim, k8a.compress_ratio) == (576, 8, 128)
    assert _keys(K8B) == []


def test_keys_follow_b_the_cache_dtype_and_the_weights() -> None:
    (b64,) = _keys(K8A, cache_block_size=64)
    assert (b64.kv_cache_block_size, b64.kv_block_stride) == (1, 1152)        # max(1, 64 // 128)
    (b1024,) = _keys(K8A, cache_block_size=1024)
    assert (b1024.kv_cache_block_size, b1024.kv_block_stride) == (8, 5184)   # round_up(8 * 584, 576)
    assert [k.norm_weight_dtype for k in _keys(K8A, norm_weight_dtype="float32")] == ["float32"]  # trap 9
    assert [k.store_full_fp8 for d in ("fp8", "fp8_e4m3", "bfloat16", "auto")
            for k in _keys(K8B, cache_dtype=d)] == [True, True, False, False]                   # trap 3
    assert _keys(K8A, cache_dtype="bfloat16") == []
    for op in (K7, K8A, K8B):
        assert _keys(op, compress_ratios=(4,)) == []


def test_fp8_e5m2_is_refused_when_configured() -> None:
    """Trap 3: an unknown cache dtype string fails at configuration time, not at the first call."""
    with pytest.raises(KernelInputError, match="cache_dtype: expected one of"):
        C128CompressConfig(cache_dtype="fp8_e5m2")
    from dsv4kit.model.stack import DSv4AttentionStack

    with pytest.raises(KernelInputError, match="cache_dtype"):
        DSv4AttentionStack(platform="sm_90a", cache_dtype="fp8_e5m2")


def test_a_bound_cache_sets_the_geometry() -> None:
    packed = allocate_ds_cache(3, 2, page_stride=39_168)
    cfg = C128CompressConfig().with_cache(packed)
    assert cfg.page_geometry == (2, 39_168)
    (k,) = _keys(K8A, cfg)
    assert (k.kv_cache_block_size, k.kv_block_stride) == (2, 39_168)
    with pytest.raises(KernelInputError, match="k_cache_geometry"):
        C128CompressConfig(k_cache_geometry=(2, 1000))                        # not a multiple of 576


# --------------------------------------------------------------------------- trap 4: packed pools


def _k8a_case(page_stride: int | None) -> C128Case:
    return make_k8_case(K8A, t=9, boundaries=3, kv_bs=2, page_stride=page_stride, padding=False, seed=4)


def test_a_packed_pool_is_a_guard_hit_naming_the_stride() -> None:
    k = SPECS[K8A].kernel(platform=P, backend="triton")
    type(k).clear_cache()
    k.warmup(C128CompressConfig())                                            # (2, 1728): the allocator's
    case = _k8a_case(39_168)
    got = case.fresh()
    before = got.output.clone()
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError, match="kv_block_stride") as exc:
        k(**got.args)
    assert "1728" in str(exc.value) and "39168" in str(exc.value)
    assert torch.equal(got.output, before)                                    # nothing was stored


def test_warming_from_the_bound_cache_covers_the_packed_pool() -> None:
    k = SPECS[K8A].kernel(platform=P, backend="triton")
    type(k).clear_cache()
    case = _k8a_case(39_168)
    k.warmup(C128CompressConfig().with_cache(case.output))
    got, want = case.fresh(), case.fresh()
    with JitMonitor("error"):
        k(**got.args)
    SPECS[K8A].variants["default"].reference(**want.args)
    v = judge_store(case, got.output, want.output)
    v.assert_ok()
    assert v.written == 3


# --------------------------------------------------------------------------- trap 5


def test_a_state_block_size_other_than_8_raises() -> None:
    case = make_k7_case(lens=(3,), starts=(126,), seed=2)
    for sbs in (4, 16):
        bad = dict(case.args, state_cache=allocate_state_cache(64, sbs, 512))
        with pytest.raises(KernelInputError, match=r"state_cache: expected shape\[1\] \(state block size\) "
                                                   rf"== 8, got shape \(64, {sbs}, 1024\)"):
            SPECS[K7].op(**bad)


def test_a_model_with_another_c128_state_block_size_is_refused_when_configured() -> None:
    """Trap 5 at model level: K4 would write 16-row blocks that K7 cannot pool; the stack refuses
    the preset while it is built, naming the field, instead of failing at the first boundary."""
    c128 = CompressorPreset(ratio=128, head_dim=512, state_block_size=16)
    preset = dataclasses.replace(DSV4_FLASH, c128=c128)
    with pytest.raises(KernelInputError,
                       match=r"C128CompressConfig: state_block_size: expected 8 .*trap 5.*, got 16"):
        DSv4AttentionStack(preset, cpu_platform("sm_90a"))
    with pytest.raises(KernelInputError, match="state_block_size"):
        C128CompressConfig(state_block_size=4)
    assert C128CompressConfig().state_block_size == 8


# --------------------------------------------------------------------------- chains


def _run_chain(case: ChainCase, kernel: bool) -> torch.Tensor:
    c = case.fresh()
    k7 = SPECS[K7].op if kernel else SPECS[K7].variants["default"].reference
    k8 = SPECS[case.store.op].op if kernel else SPECS[case.store.op].variants["default"].reference
    ckv = k7(**c.k7.args)
    k8(**{**c.store.args, "compressed_kv": ckv})
    return c.store.output


@pytest.mark.parametrize(("op", "kw"), [
    (K8A, dict(lens=(260, 3), starts=(0, 125), kv_bs=1, page_stride=2304, kv_regime="normal")),
    (K8B, dict(lens=(130,), starts=(1_048_576 - 130,), kv_bs=2, norm_dtype=torch.float32,
               kv_regime="large", score_regime="saturating", fp8_scale=0.37)),
    (K8B, dict(lens=(140, 20), starts=(120, 240), kv_bs=1, kv_regime="tiny", score_regime="uniform")),
])
def test_k7_then_k8_follows_the_rule_end_to_end(op: str, kw: dict) -> None:
    case = make_chain_case(op, seed=11, **kw)
    with JitMonitor("warn"):
        got = _run_chain(case, kernel=True)
    want = _run_chain(case, kernel=False)
    v = judge_chain(case, got, want)
    v.assert_ok()
    assert v.written >= 1


def test_k4_then_k7_then_k8a() -> None:
    """A C128 layer's chain: K4 stores kv / score + ape for a prefill crossing two boundaries, then
    K7 pools those rows and K8a stores them; state, rows and cache against the reference chain."""
    g = torch.Generator().manual_seed(5)
    chain = make_chain_case(K8A, lens=(300,), padding=False, seed=6)
    a = chain.k7.args
    state = a["state_cache"]
    pos, slots = a["positions"], a["slot_mapping"]
    kv_score = torch.randn(len(pos), 1024, generator=g)
    ape = torch.randn(128, 512, generator=g)
    states = []
    for fn in (save_partial_states, _k4_reference()):
        s = state.clone().fill_(float("nan"))
        fn(kv_score[:, :512], kv_score[:, 512:], ape, pos, s, slots, 8, 512, 128)
        states.append(s)
    assert torch.equal(states[0].view(torch.int32), states[1].view(torch.int32))   # K4 is bit-exact
    a["state_cache"] = states[0]
    got, want = _run_chain(chain, kernel=True), _run_chain(chain, kernel=False)
    v = judge_chain(chain, got, want)
    v.assert_ok()
    assert v.written == 2                                                     # boundaries 127 and 255


def _k4_reference():
    from dsv4kit.kernels.save_partial_states import SPEC

    return SPEC.variants["default"].reference


# --------------------------------------------------------------------------- the spec's bad inputs


def _k7_args() -> dict:
    return make_k7_case(lens=(3,), starts=(126,), seed=3).fresh().args


def _k8_args(op: str, **kw) -> dict:
    return make_k8_case(op, t=5, boundaries=2, seed=3, **kw).fresh().args


BAD = [
    # K7 (spec K7, "Edge cases & bad inputs")
    (K7, lambda: {**_k7_args(), "state_cache": allocate_state_cache(40, 8, 256)}, "state_cache",
     r"shape\[2\] == 1024"),
    (K7, lambda: {**_k7_args(), "state_cache": allocate_state_cache(40, 8, 512).double()}, "state_cache",
     "dtype float32"),
    (K7, lambda: {**_k7_args(), "out": torch.zeros(2, 512)}, "out", r"shape \[>= 3, 512\]"),
    (K7, lambda: {**_k7_args(), "out": torch.zeros(3, 1024)[:, :512]}, "out", r"strides \(512, 1\)"),
    (K7, lambda: {**_k7_args(), "out": torch.zeros(3, 512, dtype=torch.bfloat16)}, "out", "dtype float32"),
    (K7, lambda: {**_k7_args(), "positions": torch.zeros(3, dtype=torch.int32)}, "positions", "int64"),
    (K7, lambda: {**_k7_args(), "token_to_req": torch.zeros(2, dtype=torch.int32)}, "token_to_req", ""),
    # K8a / K8b (spec K8: as K5/K6 for the shared arguments, plus compressed_kv)
    (K8A, lambda: {**_k8_args(K8A), "compressed_kv": torch.zeros(5, 1024)[:, :512]}, "compressed_kv",
     r"strides \(512, 1\)"),
    (K8A, lambda: {**_k8_args(K8A), "compressed_kv": torch.zeros(4, 512)}, "compressed_kv",
     r"shape \[5, 512\]"),
    (K8A, lambda: {**_k8_args(K8A), "compressed_kv": torch.zeros(5, 512, dtype=torch.bfloat16)},
     "compressed_kv", "dtype float32"),
    (K8A, lambda: {**_k8_args(K8A), "cos_sin_cache": torch.zeros(4096, 64, dtype=torch.bfloat16)},
     "cos_sin_cache", "dtype float32"),
    (K8A, lambda: {**_k8_args(K8A), "rms_norm_weight": torch.ones(448)}, "rms_norm_weight",
     r"shape \(512,\)"),
    (K8A, lambda: {**_k8_args(K8A), "rms_norm_eps": 0.0}, "rms_norm_eps", ""),
    (K8A, lambda: {**_k8_args(K8A), "k_cache": torch.zeros(4 * 1200, dtype=torch.uint8)
                   .as_strided((4, 2, 584), (1200, 584, 1))}, "k_cache", "576"),    # page stride % 576
    (K8B, lambda: {**_k8_args(K8B), "kv_cache": torch.zeros(4, 2, 512, dtype=torch.float8_e5m2)},
     "kv_cache", "dtype"),
    (K8B, lambda: {**_k8_args(K8B, fp8_scale=0.5), "fp8_scale": None}, "fp8_scale", "e4m3"),
    (K8B, lambda: {**_k8_args(K8B), "fp8_scale": torch.ones(1)}, "fp8_scale", ""),
    (K8B, lambda: {**_k8_args(K8B, fp8_scale=0.5), "fp8_scale": torch.ones(2)}, "fp8_scale", "shape"),
]


@pytest.mark.parametrize(("op", "make", "arg", "match"), BAD, ids=[f"{o}-{a}-{i}" for i, (o, _, a, _) in
                                                                   enumerate(BAD)])
def test_the_spec_bad_inputs_raise_before_launch(op: str, make, arg: str, match: str) -> None:
    args = make()
    out = args.get("out", args.get("k_cache", args.get("kv_cache")))
    before = out.clone() if isinstance(out, torch.Tensor) else None
    with pytest.raises(KernelInputError, match=rf"{arg}: expected.*{match}"):
        SPECS[op].op(**args)
    if before is not None:
        assert torch.equal(out.view(torch.uint8), before.view(torch.uint8))   # nothing was written
