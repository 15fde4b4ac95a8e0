"""Triton encode routines E1..E5 (spec §2.9) and the store-hook kernel that runs them.

:func:`encode_store` is *the* encode step of the Triton backend: the store hooks launch it on
given rows and the C4 compressors (:mod:`dsv4kit.kernels.c4_compress.triton`) call it on the
rows they pool. A row arrives as ``y [NB, 64]`` fp32 (``NB = D / 64``: 8 for head 512, 2 for
the indexer's 128), block ``b`` holding dims ``[64 b, 64 b + 64)``, so the 64-blocks of E1 are
the tile's rows and E4's one block is the whole tile. ``ENC`` (a constexpr encoder id of
:mod:`dsv4kit.kernels.encoders.spec`) picks the branch at compile time.

Addresses are bytes from the cache's first page (:func:`~dsv4kit.kernels.encoders.spec.
cache_operands`): entry ``slot % kv_bs`` of page ``slot // kv_bs`` at ``page * page_stride``;
typed stores go through bit-cast pointers (bf16 rope dims at even offsets, fp32 indexer scales
at multiples of 4: the host checked the page strides). Every rounding is explicit
(:mod:`dsv4kit.kernels.triton_numerics`): each cast receives a value it represents exactly, so
the CPU interpreter writes the GPU's bytes. The reciprocal of ``fp8_scale`` (E3) is ``div_rn``:
a plain ``/`` is not correctly rounded on the GPU.

Store-hook mapping: grid ``(T,)``; program ``t`` encodes row ``t`` when its slot is >= 0 and
does nothing else (no load, no store) otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.encoders.spec import (
    E1,
    E2,
    E3,
    E4,
    E5,
    StoreOperands,
    StoreRowsDsBase,
    StoreRowsIndexerBase,
    StoreRowsPlainBase,
    key_encoder,
)
from dsv4kit.kernels.triton_numerics import clog2, e2m1_code, pow2, round_bf16, round_e4m3

__all__ = ["StoreRowsDsTriton", "StoreRowsIndexerTriton", "StoreRowsPlainTriton", "encode_store",
           "store_rows_kernel"]

# Encoder ids and the layout constants of §2.5-2.7 (bytes), as Triton constants.
_E1, _E2, _E3, _E4, _E5 = (tl.constexpr(e) for e in (E1, E2, E3, E4, E5))
_DS_TOKEN = tl.constexpr(576)
_DS_SCALES = tl.constexpr(8)
_IDX_FP8_TOKEN = tl.constexpr(128)
_IDX_FP4_TOKEN = tl.constexpr(64)


@triton.jit
def _q8_exponent(amax):
    """UE8M0 exponent of a Q8 block (§2.3, D1): clog2(fl(max(amax, 1e-4) / 448))."""
    return clog2(tl.maximum(amax, 1e-4) * (1.0 / 448.0))   # §2.1: * fl(1/448) == / 448 here


@triton.jit
def _mx_exponent(amax):
    """MXFP4 block exponent (§2.4): clog2(fl(max(a, 6 * 2^-126) * fl(1/6))), clamped to [-127, 127]."""
    a = tl.maximum(amax, 6.0 * 1.1754943508222875e-38)
    return tl.minimum(tl.maximum(clog2(a * 0.16666666666666666), -127), 127)


@triton.jit
def encode_store(y, cache_ptr, scale_ptr, slot, kv_bs, page_stride, ENC: tl.constexpr, NB: tl.constexpr):
    """Encode the fp32 row ``y [NB, 64]`` with encoder ``ENC`` and write it at ``slot`` (>= 0)."""
    blk = tl.arange(0, NB)[:, None]
    d = blk * 64 + tl.arange(0, 64)[None, :]
    # Page strides are multiples of 16 bytes (fp8_ds_mla: of 576; plain rows: of 16 elements) or,
    # for the indexer cache, of 4 (host-checked). Written so, the compiler sees it and vectorizes.
    if (ENC == _E4) or (ENC == _E5):
        page_base = (slot // kv_bs) * ((page_stride // 4) * 4)
    else:
        page_base = (slot // kv_bs) * ((page_stride // 16) * 16)
    entry = slot % kv_bs
    f8 = cache_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    b16 = cache_ptr.to(tl.pointer_type(tl.bfloat16), bitcast=True)
    if ENC == _E1:
        # 448 e4m3 | 64 bf16 rope | (scale region) 7 ue8m0 + pad 0. Block 7 is the rope block.
        z = round_bf16(y)
        e = _q8_exponent(tl.max(tl.abs(z), axis=1))
        q = round_e4m3(z * pow2(-e)[:, None])
        tok = page_base + entry * _DS_TOKEN
        tl.store(f8 + tok + d, q.to(tl.float8e4nv), mask=blk < 7)
        tl.store(b16 + (tok + 448) // 2 + (d - 448), z.to(tl.bfloat16), mask=blk == 7)
        i = tl.arange(0, NB)
        sb = tl.where(i < 7, e + 127, 0).to(tl.uint8)
        tl.store(cache_ptr + page_base + kv_bs * _DS_TOKEN + entry * _DS_SCALES + i, sb)
    elif ENC == _E2:
        tl.store(b16 + (page_base + entry * (2 * 64 * NB)) // 2 + d, round_bf16(y).to(tl.bfloat16))
    elif ENC == _E3:
        inv = tl.div_rn(1.0, tl.load(scale_ptr))
        v = tl.minimum(tl.maximum(round_bf16(y) * inv, -448.0), 448.0)
        tl.store(f8 + page_base + entry * (64 * NB) + d, round_e4m3(v).to(tl.float8e4nv))
    elif ENC == _E4:
        # 128 e4m3 | (scale region) the fp32 value 2^e.
        z = round_bf16(y)
        e = _q8_exponent(tl.max(tl.max(tl.abs(z), axis=1), axis=0))
        q = round_e4m3(z * pow2(-e))
        tl.store(f8 + page_base + entry * _IDX_FP8_TOKEN + d, q.to(tl.float8e4nv))
        f32 = cache_ptr.to(tl.pointer_type(tl.float32), bitcast=True)
        tl.store(f32 + (page_base + kv_bs * _IDX_FP8_TOKEN + entry * 4) // 4, pow2(e))
    else:
        tl.static_assert(ENC == _E5)
        # 64 packed E2M1 bytes (even dim in the low nibble) | (scale region) 4 ue8m0 bytes.
        z = tl.reshape(round_bf16(y), (2 * NB, 32))
        e = _mx_exponent(tl.max(tl.abs(z), axis=1))
        codes = e2m1_code(z * pow2(-e)[:, None])
        lo, hi = tl.split(tl.reshape(codes, (64 * NB // 2, 2)))
        tl.store(cache_ptr + page_base + entry * _IDX_FP4_TOKEN + tl.arange(0, 64 * NB // 2),
                 (lo | (hi << 4)).to(tl.uint8))
        tl.store(cache_ptr + page_base + kv_bs * _IDX_FP4_TOKEN + entry * 4 + tl.arange(0, 2 * NB),
                 (e + 127).to(tl.uint8))


@triton.jit(do_not_specialize=["kv_bs", "page_stride"],
            do_not_specialize_on_alignment=["slot_ptr", "scale_ptr"])
def store_rows_kernel(
    rows_ptr,            # fp32 [T, 64 NB], contiguous
    cache_ptr,           # uint8: the cache from its first page (StoreOperands.cache)
    slot_ptr,            # int64 [T]
    scale_ptr,           # fp32 [1]: fp8_scale (E3), otherwise never read
    kv_bs: tl.int32,
    page_stride: tl.int64,
    ENC: tl.constexpr,
    NB: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        d = tl.arange(0, NB)[:, None] * 64 + tl.arange(0, 64)[None, :]
        y = tl.load(rows_ptr + t * (64 * NB) + d)
        encode_store(y, cache_ptr, scale_ptr, slot, kv_bs, page_stride, ENC, NB)


class _StoreRowsTriton:
    """The launch every hook shares (a mixin): one program per row, the key's encoder."""

    kernel_fn = store_rows_kernel
    params = {
        "rows_ptr": Ptr(torch.float32),          # data_ptr % 16 == 0: checked
        "cache_ptr": Ptr(torch.uint8),           # data_ptr % 16 (32 for fp8_ds_mla) == 0: checked
        "slot_ptr": Ptr(torch.int64, aligned=False),
        "scale_ptr": Ptr(torch.float32, aligned=False),
        "kv_bs": Runtime(),
        "page_stride": Runtime(),
        "ENC": FromKey(key_encoder),
        "NB": FromKey(lambda key: key.head_size // 64),
    }

    def launch_options(self, key: Any) -> dict[str, Any]:
        return {"num_warps": 4 if key.head_size > 128 else 1}

    def grid(self, key: Any, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (args["slot_ptr"].shape[0],)

    def launch_args(self, key: Any, rows: torch.Tensor, kv_slot_mapping: torch.Tensor, ops: StoreOperands,
                    t: int) -> tuple[Any, ...]:
        return (rows, ops.cache, kv_slot_mapping, ops.scale, ops.kv_bs, ops.page_stride)


class StoreRowsDsTriton(_StoreRowsTriton, StoreRowsDsBase, TritonJitKernel["StoreRowsDsBase.CompileKey"]):
    """E1 store hook on Triton (GPU, or the interpreter on CPU)."""


class StoreRowsPlainTriton(_StoreRowsTriton, StoreRowsPlainBase,
                           TritonJitKernel["StoreRowsPlainBase.CompileKey"]):
    """E2 / E3 store hook on Triton."""


class StoreRowsIndexerTriton(_StoreRowsTriton, StoreRowsIndexerBase,
                             TritonJitKernel["StoreRowsIndexerBase.CompileKey"]):
    """E4 / E5 store hook on Triton."""
