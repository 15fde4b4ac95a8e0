"""CuTeDSL C4 compressors (K5, K6, K9) on a CPU-only machine.

Every warmup key of the three ops (cache dtypes fp8_ds_mla / fp8 / bfloat16, indexer FP8 /
MXFP4, norm weights bf16 / fp32) compiles for sm_90a, one compile per key holding two kernels
(decode: a CTA per token; prefill: a warp per 4 tokens); the PTX of each has no FMA, no
approximate division / square root / exponential and the documented thread / warp structure; no
spills; the runtime arguments line up with the fake signature; CPU
tensors are refused.

Bytes are compared with the reference only on a GPU: ``dsv4kit verify --extended``.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

pytest.importorskip("cutlass")

from dsv4kit.backends.cutedsl import count_cute_compiles  # noqa: E402
from dsv4kit.errors import KernelInputError  # noqa: E402
from dsv4kit.kernels import cute_numerics  # noqa: E402
from dsv4kit.kernels.c4_compress import SPECS, C4CompressConfig  # noqa: E402
from dsv4kit.kernels.c4_compress import cutedsl as c4_cute  # noqa: E402
from dsv4kit.kernels.c4_compress.cases import OPS, make_case  # noqa: E402
from dsv4kit.kernels.c4_compress.cutedsl import (  # noqa: E402
    C4CompressDsMlaCuTeDSL,
    C4CompressPlainCuTeDSL,
    IndexerCompressCuTeDSL,
)
from dsv4kit.kernels.compressor.cases import assert_args_match_fakes  # noqa: E402
from dsv4kit.kernels.encoders.spec import E1, E2, E3, E4, E5, key_encoder  # noqa: E402
from dsv4kit.platform import cpu_platform  # noqa: E402

CLASSES = {"c4_compress_ds_mla": C4CompressDsMlaCuTeDSL, "c4_compress_plain": C4CompressPlainCuTeDSL,
           "indexer_compress": IndexerCompressCuTeDSL}
CONFIGS = [C4CompressConfig(cache_dtype=d, indexer_cache_dtype=i, norm_weight_dtype=w)
           for d in ("fp8_ds_mla", "fp8", "bfloat16") for i in ("fp8", "mxfp4")
           for w in ("bfloat16", "float32")]

#: Per encoder: the global stores encode_store emits, and its butterfly / idx shuffle counts.
ENCODE = {
    E1: ({"st.global.v4.b32", "st.global.v2.b32"}, 2, 6),
    E2: ({"st.global.v4.b32"}, 0, 0),
    E3: ({"st.global.v4.b32"}, 0, 0),
    E4: ({"st.global.b32"}, 5, 0),
    E5: ({"st.global.b16", "st.global.b32"}, 3, 3),
}

_ARTIFACTS: dict = {}


def _artifact(cls, key):
    """One sm_90a compile per (class, key) for the whole module."""
    if (cls, key) not in _ARTIFACTS:
        _ARTIFACTS[cls, key] = cls(cpu_platform("sm_90a")).compile_for(key, "sm_90a")
    return _ARTIFACTS[cls, key]


def _label(cfg: C4CompressConfig) -> str:
    return f"{cfg.cache_dtype}-{cfg.indexer_cache_dtype}-{cfg.norm_weight_dtype}"


# --------------------------------------------------------------------------- compiles


def _entries(ptx: str) -> dict[str, str]:
    """The PTX of each kernel (from its ``.entry`` to the next), by ``cta`` / ``warp``."""
    starts = [m.start() for m in re.finditer(r"\.visible \.entry|\.entry", ptx)]
    out = {}
    for i, s in enumerate(starts):
        body = ptx[s:starts[i + 1] if i + 1 < len(starts) else len(ptx)]
        out["cta" if "_token_cta_kernel" in body[:200] else "warp"] = body
    return out


def _check_common(ptx: str, key) -> None:
    # §2.1 rule 1: no contraction; no approximate division or square root (the exp is ex2.approx,
    # which the compressors may use: test_exp_is_tritons).
    # E5's fma.rn.bf16x2 (cute_numerics.e2m1_pair) is one rounding of |v| + 64 B, no contraction.
    assert not re.search(r"\bfma\.(?!rn\.bf16x2)", ptx) and not re.search(r"\bmad\.(rn\.)?f32", ptx)
    assert ("fma.rn.bf16x2" in ptx) == (key_encoder(key) == E5), key
    for approx in ("div.full", "div.approx", "rcp.approx", "sqrt.approx", "rsqrt", "lg2.approx"):
        assert approx not in ptx, (key, approx)
    assert "sqrt.rn.f32" in ptx and "mul.rn.f32" in ptx
    stores, _, _ = ENCODE[key_encoder(key)]
    found = set(re.findall(r"st\.global[.\w]*", ptx))
    assert stores <= found, (key, found)
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == (key_encoder(key) in (E1, E3, E4))


def _check_cta_kernel(ptx: str, key) -> None:
    """Decode: a CTA of D threads, thread = column, one barrier, warp 0 encodes."""
    enc = key_encoder(key)
    _, bfly, idx = ENCODE[enc]
    assert f".reqntid {key.head_size}, 1, 1" in ptx
    assert f".minnctapersm {c4_cute.CTA_MIN_CTAS_PER_SM * 512 // key.head_size}" in ptx
    # One IEEE division per column on each path (p >= 7, p = 3); rr; E3's 1 / s. Triton's exp:
    # fl(x log2 e), ex2.approx, for the 8 rows (p >= 7) or 4 (p = 3).
    assert len(re.findall(r"div\.rn\.f32", ptx)) == 1 + 1 + 1 + (enc == E3), key
    assert len(re.findall(r"ex2\.approx\.f32\s", ptx)) == 8 + 4 and "ex2.approx.ftz" not in ptx
    # State loads: one column, score + kv of 8 rows (p >= 7) and of 4 (p = 3), 32-bit each.
    assert len(re.findall(r"ld\.global\.b32", ptx)) >= 2 * (8 + 4)
    assert "vote.sync.ballot" not in ptx and len(re.findall(r"bar\.sync", ptx)) == 1
    # The pooled row goes through shared memory: one column per thread in, EPT per lane out.
    assert "st.shared.b32" in ptx and "ld.shared.v4.b32" in ptx
    # RMSNorm butterfly (5 steps) plus encode_store's; 8 + 4 row offsets (2 x 32 bit each).
    assert len(re.findall(r"shfl\.sync\.bfly", ptx)) == 5 + bfly, key
    assert len(re.findall(r"shfl\.sync\.idx", ptx)) >= 2 * (8 + 4) + idx, key


def _check_warp_kernel(ptx: str, key) -> None:
    """Prefill: 4 warps, a warp per 4 tokens, chunks of 128 columns by 16-byte loads."""
    enc = key_encoder(key)
    _, bfly, idx = ENCODE[enc]
    assert f".reqntid {32 * c4_cute.WARPS}, 1, 1" in ptx
    assert f".minnctapersm {c4_cute.WARP_MIN_CTAS_PER_SM}" in ptx
    # One IEEE division per column: 4 columns per chunk (the chunk loop body once), rr, E3's 1 / s;
    # Triton's exp for 4 columns x 8 rows.
    assert len(re.findall(r"div\.rn\.f32", ptx)) == 4 + 1 + (enc == E3), key
    assert len(re.findall(r"ex2\.approx\.f32\s", ptx)) == 4 * 8 and "ex2.approx.ftz" not in ptx
    # 16-byte vectors (8 rows x score + kv, p >= 7 and p = 3); element loads for a block stride
    # that is not a multiple of 4.
    assert len(re.findall(r"ld\.global\.v4\.b32", ptx)) == 24
    assert re.search(r"ld\.global\.(nc\.)?f32|ld\.global\.b32", ptx)
    # The warp's tokens: one ballot, a loop that is not unrolled, no CTA barrier.
    assert len(re.findall(r"vote\.sync\.ballot", ptx)) == 1 and '.pragma "nounroll"' in ptx
    assert not re.search(r"bar\.sync|barrier\.sync\.aligned", ptx)
    # Head 512 re-lays the pooled row out through shared memory; head 128 does not.
    relayout = key.head_size == 512
    assert ("st.shared.v4.b32" in ptx) == relayout and ("ld.shared.v4.b32" in ptx) == relayout
    # RMSNorm butterfly plus encode_store's; 8 row offsets and the token's fields shuffled.
    assert len(re.findall(r"shfl\.sync\.bfly", ptx)) == 5 + bfly, key
    assert len(re.findall(r"shfl\.sync\.idx", ptx)) >= 16 + 5 + idx, key


@pytest.mark.parametrize("cfg", CONFIGS, ids=_label)
def test_every_warmup_key_compiles_for_sm90a(cfg: C4CompressConfig) -> None:
    keys = []
    for cls in CLASSES.values():
        k = cls(cpu_platform("sm_90a"))
        for key in k.get_warmup_keys(cfg):
            keys.append(key)
            art = _artifact(cls, key)
            ptx = art.text["ptx"]
            assert art.target == "sm_90a" and ".target sm_90a" in ptx
            # One compile, two kernels (decode and prefill); neither spills.
            per = art.info["per_kernel"]
            assert len(art.info["kernels"]) == 2 and set(per) == set(art.info["kernels"])
            for name, res in per.items():
                assert res["spills"] == 0 and res["local_bytes"] == 0 and res["stack_bytes"] == 0, (name, res)
                cap = 64 if "_token_cta_kernel" in name else 80         # 32 / 24 warps per SM
                assert 0 < res["registers"] <= cap, (name, res)
            entries = _entries(ptx)
            assert set(entries) == {"cta", "warp"}
            for body in entries.values():
                _check_common(body, key)
            _check_cta_kernel(entries["cta"], key)
            _check_warp_kernel(entries["warp"], key)
    assert keys or cfg.cache_dtype == "fp8_ds_mla"     # K6 has no key for an fp8_ds_mla cache


def test_warmup_covers_every_encoder_and_weight_dtype() -> None:
    seen = {(cls, key) for cfg in CONFIGS for cls in CLASSES.values()
            for key in cls(cpu_platform("sm_90a")).get_warmup_keys(cfg)}
    assert sorted({key_encoder(key) for _, key in seen}) == [E1, E2, E3, E4, E5]
    assert {key.norm_weight_dtype for _, key in seen} == {"bfloat16", "float32"}
    assert len(seen) == 10        # K5 x 2 weights, K6 x 2 formats x 2, K9 x 2 formats x 2


@pytest.mark.parametrize("op", OPS)
def test_warmup_compiles_once_per_key(op: str) -> None:
    """One compile per key serves every T, request count, block-table width, state pool, sbs,
    kv_bs and page stride (all symbolic in the fakes)."""
    cls = CLASSES[op]
    cls.clear_cache()
    k = cls(cpu_platform("sm_90a"))
    cfg = C4CompressConfig(cache_dtype="bfloat16" if op == "c4_compress_plain" else "fp8_ds_mla")
    keys = k.get_warmup_keys(cfg)
    assert keys
    with count_cute_compiles() as counter:
        reports = k.warmup(cfg)
    assert [r.key for r in reports] == keys and counter.count == len(keys)
    with count_cute_compiles() as counter:
        k.warmup(cfg)
    assert counter.count == len(keys)          # warmup(...) compiles on request; the executor is cached
    assert all(k.artifact(key) is not None for key in keys)
    cls.clear_cache()


def test_flash_keys_compile_for_sm100a() -> None:
    for op, cls in CLASSES.items():
        k = cls(cpu_platform("sm_100a"))
        cfg = C4CompressConfig(cache_dtype="bfloat16" if op == "c4_compress_plain" else "fp8_ds_mla")
        for key in k.get_warmup_keys(cfg):
            art = k.compile_for(key, "sm_100a")
            assert art.target == "sm_100a" and ".target sm_100a" in art.text["ptx"]
            assert art.info["spills"] == 0


def test_family_specs_name_these_classes() -> None:
    for op, cls in CLASSES.items():
        assert SPECS[op].kernel_class(backend="cutedsl") is cls
        assert issubclass(cls, SPECS[op].contract)
        assert cls.jit_fn is c4_cute.c4_compress_host


def test_exp_is_tritons() -> None:
    """exp_f32 is the two instructions Triton's ``tl.exp`` compiles to on the GPU (fl(x log2 e),
    then ex2.approx without flushing subnormals), so both backends weigh a window row alike."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    @triton.jit
    def _exp(x_ptr, y_ptr):
        i = tl.arange(0, 32)
        tl.store(y_ptr + i, tl.exp(tl.load(x_ptr + i)))

    src = triton.compiler.ASTSource(fn=_exp, signature={"x_ptr": "*fp32", "y_ptr": "*fp32"}, constexprs={})
    target = GPUTarget("cuda", 90, 32)
    ptx = triton.compile(src, target=target, options={"enable_fp_fusion": False}).asm["ptx"]
    triton_ops = [ln.split()[0] for ln in ptx.splitlines() if "ex2" in ln or "0f3FB8AA3B" in ln]
    assert triton_ops == ["mul.rn.f32", "ex2.approx.f32"]
    asm = inspect.getsource(cute_numerics.exp_f32)
    assert "mul.rn.f32 t, $1, 0f3FB8AA3B" in asm and "ex2.approx.f32 $0, t" in asm


def test_mapping_constants() -> None:
    # Decode: a CTA is one thread per column (head 512 at most: 1024 threads); prefill: a warp per
    # 4 tokens, lanes 0..3 read them, chunks of 32 lanes x 4 columns.
    assert all(d % 32 == 0 and d <= 1024 for d in (128, 512))
    assert c4_cute.WARPS * 32 <= 1024 and c4_cute.TOKENS_PER_WARP <= 32
    assert c4_cute._CHUNK == 32 * 4 and 512 % c4_cute._CHUNK == 0 and 128 % c4_cute._CHUNK == 0
    up = c4_cute.CTA_PER_TOKEN_UP_TO
    assert all(c4_cute.cta_per_token(t) for t in (1, 8, 64, 256, up))       # decode: a CTA per token
    assert not any(c4_cute.cta_per_token(t) for t in (up + 1, 65536))
    assert c4_cute.launch_grid(256, 512) == (256, 512) and c4_cute.launch_grid(up, 128) == (up, 128)
    assert c4_cute.launch_grid(65536, 512) == (4096, 128)
    assert c4_cute.launch_grid(up + 1, 128) == (-(-(up + 1) // 16), 128)


# --------------------------------------------------------------------------- runtime arguments


def _launch(k, case, t=None):
    """``(launch_args, LaunchOperands)`` of ``case`` as the call builds them (``t``: another T)."""
    key, ops, run = k.prepare(**case.args)
    return k.launch_args(key, ops, run if t is None else run._replace(t=t)), run




@pytest.mark.parametrize(("op", "fmt"), [("c4_compress_ds_mla", {}), ("c4_compress_plain", {}),
                                         ("c4_compress_plain", {"fp8_scale": 0.37}),
                                         ("indexer_compress", {"use_fp4": False}),
                                         ("indexer_compress", {"use_fp4": True})], ids=str)
@pytest.mark.parametrize("norm", [torch.bfloat16, torch.float32], ids=str)
def test_launch_args_match_the_fakes(op: str, fmt: dict, norm: torch.dtype) -> None:
    """The runtime arguments line up with the fake signature, host-side: same count and order,
    dtypes, 1-D unit-stride views of the right spans, scalars from the operands."""
    k = CLASSES[op](cpu_platform("sm_90a"))
    case = make_case(op, lens=(9, 5, 3), starts=(3, 1001, 0), sbs=16, kv_bs=2, norm_dtype=norm, **fmt)
    a = case.args
    key = k.prepare(**a)[0]
    args, ops = _launch(k, case)
    t = ops.t
    fakes = k.warmup_inputs(key)
    assert_args_match_fakes(args, fakes, 2)
    assert fakes[-2:] == (key.head_size, key_encoder(key))
    (state, req, pos, slot, bt, nw, cs, kvs, cache, scale, sbs, bstride, bt_stride, eps, kv_bs,
     page_stride, per_token) = args
    assert per_token == 1 and c4_cute.cta_per_token(t)          # a decode-size case
    sc = a["state_cache"]
    assert state.data_ptr() == sc.data_ptr() and state.data_ptr() % 16 == 0
    assert state.numel() == (sc.shape[0] - 1) * sc.stride(0) + sc.shape[1] * sc.shape[2]
    assert (sbs, bstride) == (16, sc.stride(0)) and bstride % 4 == 0
    for got, want in ((req, a["token_to_req"]), (pos, a["positions"]), (slot, a["slot_mapping"]),
                      (kvs, a["kv_slot_mapping"])):
        assert got.data_ptr() == want.data_ptr() and got.numel() == t
    btab = a["block_table"]
    assert bt.data_ptr() == btab.data_ptr() and bt_stride == btab.stride(0)
    assert bt.numel() == (btab.shape[0] - 1) * btab.stride(0) + btab.shape[1]
    assert torch.equal(bt.as_strided(btab.shape, (bt_stride, 1)), btab)
    assert nw.data_ptr() == a["rms_norm_weight"].data_ptr() and nw.dtype == norm
    assert nw.numel() == key.head_size
    assert cs.data_ptr() == a["cos_sin_cache"].data_ptr() and cs.numel() == a["cos_sin_cache"].numel()
    assert cache is ops.store.cache and cache.dtype == torch.uint8
    assert (kv_bs, page_stride) == (2, case.cache.view(torch.uint8).stride(0))
    fp8 = a.get("fp8_scale")
    assert scale.shape == (1,) and scale.dtype == torch.float32
    assert scale.data_ptr() == (fp8 if fp8 is not None else sc).data_ptr()
    assert eps == ops.eps and isinstance(eps, float)
    big = c4_cute.CTA_PER_TOKEN_UP_TO + 1                     # the same call at a prefill T
    assert _launch(k, case, big)[0][-1] == 0


def test_single_token_views_are_made_unit_stride() -> None:
    """A size-1 tensor may carry any stride; the fakes' strides are static, so the host fixes it."""
    k = C4CompressDsMlaCuTeDSL(cpu_platform("sm_90a"))
    case = make_case("c4_compress_ds_mla", lens=(1,), starts=(7,), padding=False)
    a = dict(case.args)
    for name, dtype in (("positions", torch.int64), ("slot_mapping", torch.int64),
                        ("kv_slot_mapping", torch.int64), ("token_to_req", torch.int32)):
        wide = torch.stack([a[name], a[name]], dim=1)         # [1, 2]
        a[name] = wide[:, 1]                                  # [1], stride 2
        assert a[name].stride(0) == 2 and a[name].dtype == dtype
    args, _ = _launch(k, type(case)(case.op, a, case.label))
    for i, name in ((1, "token_to_req"), (2, "positions"), (3, "slot_mapping"), (7, "kv_slot_mapping")):
        assert args[i].stride() == (1,) and args[i].numel() == 1 and int(args[i][0]) == int(a[name][0])


def test_block_stride_not_a_multiple_of_4_is_passed_as_is() -> None:
    """§2.8 allows any block stride >= sbs * 2SW; the kernel then takes its element-load path."""
    k = IndexerCompressCuTeDSL(cpu_platform("sm_90a"))
    case = make_case("indexer_compress", lens=(12,), padding=False)
    sc = case.args["state_cache"]
    nsb, sbs, row = sc.shape
    buf = torch.zeros(nsb * (sbs * row + 3) + 4)
    odd = buf.as_strided(sc.shape, (sbs * row + 3, row, 1))
    odd.copy_(sc)
    case.args["state_cache"] = odd
    args, ops = _launch(k, case)
    assert ops.block_stride % 4 == 3
    assert args[11] == sbs * row + 3 and args[0].data_ptr() == odd.data_ptr()


@pytest.mark.parametrize("op", OPS)
def test_cpu_tensors_are_refused(op: str) -> None:
    k = SPECS[op].kernel_class(backend="cutedsl")(cpu_platform("sm_90a"))
    case = make_case(op, lens=(5,))
    with pytest.raises(KernelInputError, match="state_cache: expected a cuda tensor"):
        k(**case.args)
