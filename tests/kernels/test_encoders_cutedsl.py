"""CuTeDSL encoder store hooks (E1..E5) on a CPU-only machine: every warmup key compiles for
sm_90a (one compile per key, no FMA, the documented vector stores and shuffles), the runtime
arguments line up with the fakes, CPU tensors are refused, and a compressor-style kernel can call
:func:`~dsv4kit.kernels.encoders.cutedsl.encode_store` on a row it computed in registers.

Bytes are compared with the reference only on a GPU: ``dsv4kit verify`` (the store hooks' batteries).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("cutlass")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32, Int64, Uint8  # noqa: E402

from dsv4kit.backends.cutedsl import compile_options, count_cute_compiles, fake_tensor, sym  # noqa: E402
from dsv4kit.errors import KernelInputError  # noqa: E402
from dsv4kit.formats.ds_mla import allocate_ds_cache  # noqa: E402
from dsv4kit.formats.indexer_cache import allocate_indexer_cache  # noqa: E402
from dsv4kit.formats.plain_row import allocate_plain_cache  # noqa: E402
from dsv4kit.kernels import cute_numerics  # noqa: E402
from dsv4kit.kernels.cute_numerics import mul_rn  # noqa: E402
from dsv4kit.kernels.encoders import cutedsl as enc_cute  # noqa: E402
from dsv4kit.kernels.encoders.cutedsl import (  # noqa: E402
    StoreRowsDsCuTeDSL,
    StoreRowsIndexerCuTeDSL,
    StoreRowsPlainCuTeDSL,
    elems_per_lane,
    encode_store,
)
from dsv4kit.kernels.encoders.spec import E1, E2, E3, E4, E5, SPECS, cache_operands, key_encoder  # noqa: E402
from dsv4kit.platform import cpu_platform  # noqa: E402

CLASSES = (StoreRowsDsCuTeDSL, StoreRowsPlainCuTeDSL, StoreRowsIndexerCuTeDSL)

#: Per encoder: (global stores that must appear, butterfly shuffle steps, idx shuffles, e4m3 cvt, div.rn).
EXPECT = {
    E1: ({"st.global.v4.b32", "st.global.v2.b32"}, 2, 6, True, False),
    E2: ({"st.global.v4.b32"}, 0, 0, False, False),
    E3: ({"st.global.v4.b32"}, 0, 0, True, True),
    E4: ({"st.global.b32"}, 5, 0, True, False),
    E5: ({"st.global.b16", "st.global.b32"}, 3, 3, False, False),
}


def _kernel(cls):
    cls.clear_cache()
    return cls(cpu_platform("sm_90a"))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_warmup_key_compiles_for_sm90a_once(cls) -> None:
    k = _kernel(cls)
    keys = k.get_warmup_keys()
    with count_cute_compiles() as counter:
        reports = k.warmup()
    assert [r.key for r in reports] == keys
    assert counter.count == len(keys)                 # one compile per key serves every T, kv_bs, stride
    for key in keys:
        enc = key_encoder(key)
        stores, bfly, idx, e4m3, div = EXPECT[enc]
        art = k.artifact(key)
        ptx = art.text["ptx"]
        assert art.target == "sm_90a" and ".target sm_90a" in ptx
        assert art.info["registers"] > 0 and art.info["spills"] == 0
        # §2.1 rule 1 (no contraction of fp32 products); E5's fma.rn.bf16x2 is one rounding of |v| + 64 B
        assert not re.search(r"\bfma\.(?!rn\.bf16x2)", ptx) and not re.search(r"\bmad\.(rn\.)?f32", ptx)
        found = set(re.findall(r"st\.global[.\w]*", ptx))
        assert stores <= found, (key, found)
        assert "ld.global.v4.b32" in ptx                                       # 16-byte row loads
        rpw = enc_cute.rows_per_warp(key.head_size // 64)             # encode_store unrolled per row
        assert len(re.findall(r"shfl\.sync\.bfly", ptx)) == bfly * rpw, key
        assert len(re.findall(r"shfl\.sync\.idx", ptx)) == idx * rpw, key
        assert len(re.findall(r"ld\.global\.v4\.b32", ptx)) == (4 if rpw == 1 else rpw), key
        assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == e4m3, key
        assert ("div.rn.f32" in ptx) == div, key
        assert "div.full" not in ptx and "div.approx" not in ptx and "rcp.approx" not in ptx
        if enc in (E1, E3, E4, E5):
            assert "mul.rn.f32" in ptx
        # E5: the packed MXFP4 recipes of cute_numerics (as K2), not the old per-element magic adds.
        n = rpw if enc == E5 else 0
        assert len(re.findall(r"cvt\.rn\.bf16x2\.f32", ptx)) == 2 * n, key
        assert len(re.findall(r"fma\.rn\.bf16x2", ptx)) == 2 * n, key
        assert len(re.findall(r"mul\.rn\.bf16x2", ptx)) == 2 * n, key
        assert len(re.findall(r"max\.bf16x2", ptx)) == 6 * n, key      # 1 + 3 shuffle steps + 2 in codes
        assert len(re.findall(r"prmt\.b32", ptx)) == 2 * n, key
        if enc == E5:
            assert "add.rn.f32" not in ptx and "sub.rn.f32" not in ptx, key
    k.clear_cache()


def test_warmup_covers_every_encoder() -> None:
    encs = sorted(key_encoder(key) for cls in CLASSES for key in cls(cpu_platform()).get_warmup_keys())
    assert encs == [E1, E2, E3, E4, E5]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_warmup_key_compiles_for_sm100a(cls) -> None:
    k = cls(cpu_platform("sm_100a"))
    for key in k.get_warmup_keys():
        art = k.compile_for(key, "sm_100a")
        assert art.target == "sm_100a" and ".target sm_100a" in art.text["ptx"]
        assert art.info["spills"] == 0


def test_family_specs_name_these_classes() -> None:
    assert SPECS["store_rows_ds"].kernel_class(backend="cutedsl") is StoreRowsDsCuTeDSL
    assert SPECS["store_rows_plain"].kernel_class(backend="cutedsl") is StoreRowsPlainCuTeDSL
    assert SPECS["store_rows_indexer"].kernel_class(backend="cutedsl") is StoreRowsIndexerCuTeDSL
    for name, cls in zip(("store_rows_ds", "store_rows_plain", "store_rows_indexer"), CLASSES, strict=True):
        assert issubclass(cls, SPECS[name].contract)


def test_fp32_constants_are_the_triton_kernels_values() -> None:
    bits = lambda v: int(np.array(v, dtype=np.float32).view(np.uint32))  # noqa: E731
    assert enc_cute._AMAX_FLOOR_BITS == bits(1e-4)
    assert enc_cute._INV448_BITS == bits(1.0 / 448.0)
    assert cute_numerics._INV6_BITS == bits(0.16666666666666666)
    assert cute_numerics._MX_FLOOR_BITS == bits(6.0 * 1.1754943508222875e-38)


def test_lane_mapping_and_encoder_pairs() -> None:
    assert elems_per_lane(8) == 16 and elems_per_lane(2) == 4    # 512 / 32 and 128 / 32
    for enc, nb in ((E1, 8), (E2, 8), (E3, 8), (E4, 2), (E5, 2)):
        assert enc_cute._check_encoder(enc, nb) == 2 * nb
    for enc, nb in ((E1, 2), (E4, 8), (6, 8)):
        with pytest.raises(ValueError, match="encode_store"):
            enc_cute._check_encoder(enc, nb)


# --------------------------------------------------------------------------- runtime arguments


def _case(hook: str, t: int, fmt: bool):
    rows = torch.randn(t, 128 if hook == "store_rows_indexer" else 512)
    slots = torch.randperm(4 * 64)[:t].to(torch.int64)
    slots[0] = -1
    scale = None
    if hook == "store_rows_ds":
        cache = allocate_ds_cache(4, 64, page_stride=39168)
    elif hook == "store_rows_plain":
        dtype = torch.float8_e4m3fn if fmt else torch.bfloat16
        cache = allocate_plain_cache(4, 64, dtype, page_stride=64 * 512 + 16)
        scale = torch.tensor([0.37]) if fmt else None
    else:
        cache = allocate_indexer_cache(4, 64, page_stride=64 * 132 + 12)
    return rows, cache, slots, scale


@pytest.mark.parametrize("hook,fmt", [("store_rows_ds", False), ("store_rows_plain", False),
                                      ("store_rows_plain", True), ("store_rows_indexer", False),
                                      ("store_rows_indexer", True)])
def test_launch_args_match_the_fakes(hook, fmt) -> None:
    cls = SPECS[hook].kernel_class(backend="cutedsl")
    k = cls(cpu_platform("sm_90a"))
    rows, cache, slots, scale = _case(hook, 9, fmt)
    if hook == "store_rows_ds":
        key = k.dispatch(rows)
    elif hook == "store_rows_plain":
        key = k.dispatch(rows, cache)
    else:
        key = k.dispatch(rows, fmt)
    ops = cache_operands(cache, scale, rows)
    args = k.launch_args(key, rows, slots, ops, 9)
    fakes = k.warmup_inputs(key)
    assert len(args) == len(fakes) - 3                      # minus the stream and the two constexprs
    assert fakes[-2:] == (key_encoder(key), key.head_size // 64)
    mrows, mcache, mslot, mscale, kv_bs, page_stride = args
    assert mrows.shape == (9 * rows.shape[1],) and mrows.stride() == (1,)
    assert mrows.data_ptr() == rows.data_ptr()
    assert mcache is ops.cache and mcache.dtype == torch.uint8 and mcache.stride() == (1,)
    assert mcache.numel() == 3 * ops.page_stride + cache.shape[1] * cache.view(torch.uint8).shape[2]
    assert mslot is slots
    assert mscale.shape == (1,) and mscale.stride() == (1,) and mscale.dtype == torch.float32
    assert mscale.data_ptr() == (scale if scale is not None else rows).data_ptr()
    assert (kv_bs, page_stride) == (64, cache.view(torch.uint8).stride(0))


def test_single_row_views_are_made_unit_stride() -> None:
    """A size-1 tensor may carry any stride; the fakes' strides are static, so the host fixes it."""
    k = StoreRowsDsCuTeDSL(cpu_platform("sm_90a"))
    big = torch.randn(3, 1024)
    rows = big[1:2, :512]                                   # contiguous, stride(0) == 1024
    assert rows.is_contiguous() and rows.stride(0) == 1024
    slots = torch.tensor([[5, 6]], dtype=torch.int64)[:, 1]   # [1], stride 2
    assert slots.stride(0) == 2
    cache = allocate_ds_cache(2, 4)
    fp8 = torch.tensor([[2.0, 0.5]])[:, 1]                    # [1], stride 2 (as a stand-in check)
    ops = cache_operands(cache, fp8, rows)
    mrows, _, mslot, mscale, _, _ = k.launch_args(k.dispatch(rows), rows, slots, ops, 1)
    assert mrows.stride() == (1,) and mrows.data_ptr() == rows.data_ptr()
    assert mslot.stride() == (1,) and int(mslot[0]) == 6
    assert mscale.stride() == (1,) and float(mscale[0]) == 0.5


@pytest.mark.parametrize("hook", ["store_rows_ds", "store_rows_plain", "store_rows_indexer"])
def test_cpu_tensors_are_refused(hook) -> None:
    k = SPECS[hook].kernel_class(backend="cutedsl")(cpu_platform("sm_90a"))
    rows, cache, slots, scale = _case(hook, 3, False)
    extra = (False,) if hook == "store_rows_indexer" else ()
    with pytest.raises(KernelInputError, match="expected a cuda tensor"):
        k(rows, cache, slots, *extra)


# --------------------------------------------------------------------------- a compressor-style caller


@cute.kernel
def _compressor_like(mCache: cute.Tensor, mScale: cute.Tensor, mSlot: cute.Tensor, kv_bs: Int32,
                     page_stride: Int64, enc: cutlass.Constexpr, nb: cutlass.Constexpr):
    """8 warps, each computes "its" row in registers (lane l: dims [l * EPT, (l + 1) * EPT)) and
    encodes it with the one routine, behind a warp-uniform skip."""
    lane = cute.arch.lane_idx()
    warp = cute.arch.warp_idx()
    ept = elems_per_lane(nb)
    y = cute.make_rmem_tensor(ept, Float32)
    for i in cutlass.range_constexpr(ept):
        y[i] = mul_rn(Float32(lane * ept + i), Float32(0.37))
    slot = mSlot[warp]
    if slot >= Int64(0):
        encode_store(y, mCache, mScale, slot, kv_bs, page_stride, enc, nb)


@cute.jit
def _compressor_like_host(mCache: cute.Tensor, mScale: cute.Tensor, mSlot: cute.Tensor, kv_bs: Int32,
                          page_stride: Int64, enc: cutlass.Constexpr, nb: cutlass.Constexpr):
    _compressor_like(mCache, mScale, mSlot, kv_bs, page_stride, enc, nb).launch(
        grid=[1, 1, 1], block=[256, 1, 1])


@pytest.mark.parametrize("enc,nb", [(E1, 8), (E2, 8), (E3, 8), (E4, 2), (E5, 2)])
def test_a_compressor_kernel_can_call_encode_store(enc, nb) -> None:
    compiled = cute.compile(
        _compressor_like_host,
        fake_tensor(Uint8, (sym(symbol="cache_bytes", width=64),), align=enc_cute.cache_align(enc)),
        fake_tensor(Float32, (1,), align=4),
        fake_tensor(Int64, (8,), align=8),
        Int32(0), Int64(0), enc, nb,
        options=compile_options("sm_90a", False))
    assert len(list(compiled.kernel_info)) == 1
