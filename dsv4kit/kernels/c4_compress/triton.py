"""Triton backend of the C4 compressors K5, K6, K9: one pooling core, the encoders' routine.

Mapping: grid ``(T,)``; program ``t`` handles token t. It loads the token's slot, kv slot and
position; unless it is a live boundary token (slot >= 0, kv slot >= 0, ``(p + 1) % 4 == 0``)
it stops there (no further load, no store). Otherwise it holds the whole window as two
``[8, D]`` fp32 tiles (rows j = 0..7 are positions ``p - 7 + j``; rows 0..3 read half A of
their state row, rows 4..7 half B; rows with a negative position are masked: score -inf,
weight 0, so the first boundary p = 3 pools rows 4..7 only) and computes, per column, the
max-subtracted softmax over the 8 rows and the pooled value (:func:`pool_window`). RMSNorm
follows over the D columns (``sqrt_rn`` and ``div_rn``: IEEE like the reference), then RoPE of the
fp32 normalized values at cos/sin row ``(p // 4) * 4``: the row is viewed as ``[D / 64, 32, 2]``
(64-blocks x GPT-J pairs) and only the last block is rotated. The result ``y [D / 64, 64]`` goes
to :func:`~dsv4kit.kernels.encoders.triton.encode_store` with the key's encoder (E1; E2 / E3;
E4 / E5), the very routine the store hooks run.

Numerics: launched with FMA contraction off; every product and sum rounds separately. exp is
the backend's (``tl.exp``); the reduction order of the softmax sums and the norm is the tile
reduction's, so results follow the compressor rule of §2.12, not bit-exactness (typically equal
to the reference on most elements). The encode step is bit-exact given y.

Every stride, T, the state block size, kv_bs and the page stride are runtime values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.c4_compress.spec import (
    C4CompressDsMlaBase,
    C4CompressPlainBase,
    CompressOperands,
    IndexerCompressBase,
)
from dsv4kit.kernels.encoders.spec import key_encoder
from dsv4kit.kernels.encoders.triton import encode_store

__all__ = [
    "C4CompressDsMlaTriton",
    "C4CompressPlainTriton",
    "IndexerCompressTriton",
    "c4_compress_kernel",
    "norm_rope",
    "pool_window",
]


@triton.jit
def pool_window(state_ptr, bt_ptr, req, p, sbs, block_stride, bt_stride, D: tl.constexpr):
    """The pooled fp32 row c ``[D]`` of the C4 boundary token at position ``p`` of request ``req``."""
    j = tl.arange(0, 8)
    q = p - 7 + j
    inc = q >= 0
    qc = tl.where(inc, q, 0)
    blk = tl.load(bt_ptr + req * bt_stride + qc // sbs, mask=inc, other=0).to(tl.int64)
    # State row = [kv (2D) | score (2D)], each half split [A (D) | B (D)]: rows j >= 4 read B.
    col0 = blk * block_stride + (qc % sbs) * (4 * D) + tl.where(j >= 4, D, 0)
    at = col0[:, None] + tl.arange(0, D)[None, :]
    k = tl.load(state_ptr + at, mask=inc[:, None], other=0.0)
    s = tl.load(state_ptr + at + 2 * D, mask=inc[:, None], other=float("-inf"))

    m = tl.max(s, axis=0)
    e = tl.exp(s - m[None, :])
    w = tl.div_rn(e, tl.sum(e, axis=0)[None, :])
    return tl.sum(w * k, axis=0)


@triton.jit
def norm_rope(c, nw_ptr, cs_ptr, rope_row, eps, D: tl.constexpr):
    """y ``[D / 64, 64]``: RMSNorm of the fp32 row c ``[D]``, then RoPE of its last 64 dims at cos/sin
    row ``rope_row`` (C4: ``(p // 4) * 4``; C128: ``(p // 128) * 128``). Shared by C4 and C128."""
    rr = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(c * c, axis=0), D * 1.0) + eps))
    n = (c * rr) * tl.load(nw_ptr + tl.arange(0, D)).to(tl.float32)

    # RoPE on the last 64 dims (block D/64 - 1), GPT-J pairs.
    NB: tl.constexpr = D // 64
    x_e, x_o = tl.split(tl.reshape(n, (NB, 32, 2)))
    i = tl.arange(0, 32)[None, :]
    row = rope_row * 64
    cos = tl.load(cs_ptr + row + i)
    sin = tl.load(cs_ptr + row + 32 + i)
    last = tl.arange(0, NB)[:, None] == NB - 1
    y_e = tl.where(last, x_e * cos - x_o * sin, x_e)
    y_o = tl.where(last, x_o * cos + x_e * sin, x_o)
    return tl.reshape(tl.join(y_e, y_o), (NB, 64))


@triton.jit(
    do_not_specialize=["sbs", "block_stride", "bt_stride", "kv_bs", "page_stride"],
    do_not_specialize_on_alignment=[
        "req_ptr",
        "pos_ptr",
        "slot_ptr",
        "bt_ptr",
        "nw_ptr",
        "cs_ptr",
        "kv_slot_ptr",
        "scale_ptr",
    ],
)
def c4_compress_kernel(
    state_ptr,  # fp32: the state cache from its first block (CompressOperands.state)
    req_ptr,  # int32 [T] token_to_req
    pos_ptr,  # int64 [T]
    slot_ptr,  # int64 [T] state slots (< 0: padding)
    bt_ptr,  # int32 block table: row r at r * bt_stride
    nw_ptr,  # bf16 / fp32 [D] norm weight
    cs_ptr,  # fp32 [max_pos, 64] cos/sin
    kv_slot_ptr,  # int64 [T] compressed-cache slots (< 0: skip)
    cache_ptr,  # uint8: the cache from its first page (StoreOperands.cache)
    scale_ptr,  # fp32 [1] fp8_scale (E3), otherwise never read
    sbs: tl.int32,
    block_stride: tl.int64,
    bt_stride: tl.int64,
    eps: tl.float32,
    kv_bs: tl.int32,
    page_stride: tl.int64,
    D: tl.constexpr,
    ENC: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + t)
    kv_slot = tl.load(kv_slot_ptr + t)
    if (slot >= 0) & (kv_slot >= 0) & ((p + 1) % 4 == 0):
        req = tl.load(req_ptr + t).to(tl.int64)
        if block_stride % 4 == 0:
            # The usual state cache: written so, every row offset is provably 16-byte aligned
            # (a fact checked here, not an assumption) and the tile loads are 16-byte vectors.
            c = pool_window(state_ptr, bt_ptr, req, p, sbs, (block_stride // 4) * 4, bt_stride, D)
        else:
            c = pool_window(state_ptr, bt_ptr, req, p, sbs, block_stride, bt_stride, D)
        y = norm_rope(c, nw_ptr, cs_ptr, (p // 4) * 4, eps, D)
        encode_store(y, cache_ptr, scale_ptr, kv_slot, kv_bs, page_stride, ENC, D // 64)


class _C4CompressTriton:
    """The launch K5, K6 and K9 share (a mixin): one program per token, the key's head and encoder."""

    kernel_fn = c4_compress_kernel
    params = {
        "state_ptr": Ptr(torch.float32),  # data_ptr % 16 == 0: checked (§2.8)
        "req_ptr": Ptr(torch.int32, aligned=False),
        "pos_ptr": Ptr(torch.int64, aligned=False),
        "slot_ptr": Ptr(torch.int64, aligned=False),
        "bt_ptr": Ptr(torch.int32, aligned=False),
        "nw_ptr": Ptr("norm_weight_dtype", aligned=False),
        "cs_ptr": Ptr(torch.float32, aligned=False),
        "kv_slot_ptr": Ptr(torch.int64, aligned=False),
        "cache_ptr": Ptr(torch.uint8),  # data_ptr % 16 (32 for fp8_ds_mla) == 0: checked
        "scale_ptr": Ptr(torch.float32, aligned=False),
        "sbs": Runtime(),
        "block_stride": Runtime(),
        "bt_stride": Runtime(),
        "eps": Runtime(),
        "kv_bs": Runtime(),
        "page_stride": Runtime(),
        "D": FromKey("head_size"),
        "ENC": FromKey(key_encoder),
    }

    def launch_options(self, key: Any) -> dict[str, Any]:
        return {"num_warps": 8 if key.head_size > 128 else 2}

    def grid(self, key: Any, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (args["pos_ptr"].shape[0],)

    def launch_args(
        self,
        key,
        token_to_req,
        positions,
        slot_mapping,
        block_table,
        rms_norm_weight,
        cos_sin_cache,
        kv_slot_mapping,
        ops: CompressOperands,
        t,
    ) -> tuple[Any, ...]:
        st = ops.store
        return (
            ops.state,
            token_to_req,
            positions,
            slot_mapping,
            block_table,
            rms_norm_weight,
            cos_sin_cache,
            kv_slot_mapping,
            st.cache,
            st.scale,
            ops.sbs,
            ops.block_stride,
            ops.bt_stride,
            ops.eps,
            st.kv_bs,
            st.page_stride,
        )


class C4CompressDsMlaTriton(
    _C4CompressTriton, C4CompressDsMlaBase, TritonJitKernel["C4CompressDsMlaBase.CompileKey"]
):
    """K5 on Triton (GPU, or the interpreter on CPU)."""


class C4CompressPlainTriton(
    _C4CompressTriton, C4CompressPlainBase, TritonJitKernel["C4CompressPlainBase.CompileKey"]
):
    """K6 on Triton."""


class IndexerCompressTriton(
    _C4CompressTriton, IndexerCompressBase, TritonJitKernel["IndexerCompressBase.CompileKey"]
):
    """K9 on Triton."""
