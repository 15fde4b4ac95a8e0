"""Triton backend of the C4 compressors K5, K6, K9: one pooling core, the encoders' routine.

Mapping: tokens go in chunks of ``chunk`` consecutive tokens (:func:`launch_shape`: 1 for
decode-sized batches; from :data:`SHARE_FROM_TOKENS` tokens 8, of which about 2 are boundaries) and
the grid has ``min(chunks, MAX_PROGRAMS)`` programs, program i taking chunks i, i + grid, ... ``D /
128`` warps; each thread holds 4 consecutive columns (16-byte loads). Per chunk, a program loads the
position, slots and request of its tokens in one round trip, and the block-table entries of the two
row groups of every boundary window in a second (the window rows: a third); then, for each live
boundary token among them (slot >= 0, kv slot >= 0, ``(p + 1) % 4 == 0``), pools its window: the
eight state rows (positions ``p - 7 .. p``; rows 0..3 read half A, rows 4..7 half B; rows 0..3 are
absent for the first boundary p = 3) are eight separate ``[D]`` vectors, so the per-column
max-subtracted softmax runs in each thread's registers (:func:`pool_window`). RMSNorm follows over
the D columns (``sqrt_rn`` and ``div_rn``: IEEE like the reference; the one cross-thread reduction),
then RoPE of the fp32 normalized values at cos/sin row ``(p // 4) * 4`` (loaded before the pooling):
the row is viewed as ``[D / 64, 32, 2]`` (64-blocks x GPT-J pairs) and only the last block is
rotated. The result ``y [D / 64, 64]`` goes to :func:`~dsv4kit.kernels.encoders.triton.encode_store`
with the key's encoder (E1; E2 / E3; E4 / E5), the very routine the store hooks run.

Numerics: launched with FMA contraction off; every product and sum rounds separately. exp is
the backend's (``tl.exp``); the softmax sums run in row order and the pooled value is
``(sum_j e_j k_j) / S`` (one IEEE division per column, where the reference divides each weight),
and the norm's sum is the tile reduction's, so results follow the compressor rule of §2.12, not
bit-exactness (equal to the reference on almost every element). The encode step is bit-exact
given y. bf16 / e4m3 round by the GPU's casts (``HW_CVT``: fewer instructions per element, the
same bits); under the interpreter, which truncates those casts, by the integer recipes of
:mod:`~dsv4kit.kernels.triton_numerics` (the backend sets ``HW_CVT`` false there).

Every stride, T, the state block size, kv_bs and the page stride are runtime values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const, FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.c4_compress.spec import C4CompressDsMlaBase, C4CompressPlainBase, IndexerCompressBase
from dsv4kit.kernels.compressor.contract import LaunchOperands
from dsv4kit.kernels.encoders.spec import key_encoder
from dsv4kit.kernels.encoders.triton import encode_store

__all__ = [
    "STATE_POINTERS",
    "C4CompressDsMlaTriton",
    "C4CompressPlainTriton",
    "IndexerCompressTriton",
    "c4_compress_kernel",
    "norm_rope",
    "pool_window",
]


MAX_TOKENS_PER_CHUNK = 8
_MAX_CHUNK = tl.constexpr(MAX_TOKENS_PER_CHUNK)


@triton.jit
def _row_base(bt_row, q, live, sbs, block_stride, D: tl.constexpr):
    """Offset (fp32 elements) of the state row of position ``q``; 0 unless ``live`` (nothing read)."""
    qc = tl.where(live, q, 0)
    blk = tl.load(bt_row + qc // sbs, mask=live, other=0).to(tl.int64)
    return blk * block_stride + (qc % sbs) * (4 * D)


@triton.jit
def _window_row(state_ptr, base, live, HALF: tl.constexpr, MASKED: tl.constexpr, ALIGNED: tl.constexpr,
                D: tl.constexpr):
    """kv and score ``[D]`` of the state row at ``base`` (``HALF`` 0: A, 1: B). ``MASKED``: the row
    may be absent, and unless ``live`` nothing is read: kv 0, score -inf (weight 0). ``ALIGNED``:
    the caller checked block_stride % 4 == 0, so base is a multiple of 4 (16 bytes)."""
    if ALIGNED:
        # An identity there, written so the compiler sees it again (pool_window's branch join loses
        # it; tl.multiple_of on the join's result is dropped): 16-byte row loads.
        base = (base // 4) * 4
    # State row = [kv (2D) | score (2D)], each half split [A (D) | B (D)].
    at = state_ptr + base + HALF * D + tl.arange(0, D)
    if MASKED:
        return tl.load(at, mask=live, other=0.0), tl.load(at + 2 * D, mask=live, other=float("-inf"))
    return tl.load(at), tl.load(at + 2 * D)


@triton.jit
def pool_window(state_ptr, bt_ptr, req, p, sbs, block_stride, bt_stride, a0, b0, ALIGNED: tl.constexpr,
                D: tl.constexpr):
    """The pooled fp32 row c ``[D]`` of the C4 boundary token at position ``p`` of request ``req``;
    ``a0``, ``b0``: the offsets of its rows 0 and 4 (positions p - 7, p - 3), looked up by the caller.

    The eight window rows are separate ``[D]`` vectors, so each thread pools its own columns over
    the rows in registers, with no cross-thread reduction. Rows 4..7 (positions p-3..p, half B)
    always exist; rows 0..3 (p-7..p-4, half A) exist iff p >= 7 (the first boundary, p = 3, pools
    rows 4..7 only). Each group of four starts at a multiple of 4, so with ``sbs % 4 == 0`` (4 in
    production) it lies in one state block: its rows follow row 0 (4), no further lookup.
    """
    bt_row = bt_ptr + req * bt_stride
    prev = p >= 7
    R: tl.constexpr = 4 * D   # elements per state row
    if sbs % 4 == 0:
        a1, a2, a3 = a0 + R, a0 + 2 * R, a0 + 3 * R
        b1, b2, b3 = b0 + R, b0 + 2 * R, b0 + 3 * R
    else:
        a1 = _row_base(bt_row, p - 6, prev, sbs, block_stride, D)
        a2 = _row_base(bt_row, p - 5, prev, sbs, block_stride, D)
        a3 = _row_base(bt_row, p - 4, prev, sbs, block_stride, D)
        b1 = _row_base(bt_row, p - 2, True, sbs, block_stride, D)
        b2 = _row_base(bt_row, p - 1, True, sbs, block_stride, D)
        b3 = _row_base(bt_row, p, True, sbs, block_stride, D)
    k0, s0 = _window_row(state_ptr, a0, prev, 0, True, ALIGNED, D)
    k1, s1 = _window_row(state_ptr, a1, prev, 0, True, ALIGNED, D)
    k2, s2 = _window_row(state_ptr, a2, prev, 0, True, ALIGNED, D)
    k3, s3 = _window_row(state_ptr, a3, prev, 0, True, ALIGNED, D)
    k4, s4 = _window_row(state_ptr, b0, True, 1, False, ALIGNED, D)
    k5, s5 = _window_row(state_ptr, b1, True, 1, False, ALIGNED, D)
    k6, s6 = _window_row(state_ptr, b2, True, 1, False, ALIGNED, D)
    k7, s7 = _window_row(state_ptr, b3, True, 1, False, ALIGNED, D)
    m = tl.maximum(tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3)),
                   tl.maximum(tl.maximum(s4, s5), tl.maximum(s6, s7)))
    e0, e1, e2, e3 = tl.exp(s0 - m), tl.exp(s1 - m), tl.exp(s2 - m), tl.exp(s3 - m)
    e4, e5, e6, e7 = tl.exp(s4 - m), tl.exp(s5 - m), tl.exp(s6 - m), tl.exp(s7 - m)
    # Sums in row order, and one IEEE division per column, (sum_j e_j k_j) / S, where the reference
    # divides eight weights e_j / S: another rounding of the same value, inside §2.12's allowance.
    s = ((((((e0 + e1) + e2) + e3) + e4) + e5) + e6) + e7
    a = (((((((e0 * k0) + e1 * k1) + e2 * k2) + e3 * k3) + e4 * k4) + e5 * k5) + e6 * k6) + e7 * k7
    return tl.div_rn(a, s)


@triton.jit
def norm_rope(c, nw_ptr, cs_ptr, rope_row, eps, D: tl.constexpr):
    """y ``[D / 64, 64]``: RMSNorm of the fp32 row c ``[D]``, then RoPE of its last 64 dims at cos/sin
    row ``rope_row`` (C4: ``(p // 4) * 4``; C128: ``(p // 128) * 128``). Shared by C4 and C128."""
    w, cos, sin = norm_rope_operands(nw_ptr, cs_ptr, rope_row, D)
    return norm_rope_apply(c, w, cos, sin, eps, D)


@triton.jit
def norm_rope_operands(nw_ptr, cs_ptr, rope_row, D: tl.constexpr):
    """The norm weight ``[D]`` (fp32) and the cos, sin ``[1, 32]`` of row ``rope_row``: loads a kernel
    may issue early, before the pooling they do not depend on."""
    i = tl.arange(0, 32)[None, :]
    row = rope_row * 64
    w = tl.load(nw_ptr + tl.arange(0, D)).to(tl.float32)
    return w, tl.load(cs_ptr + row + i), tl.load(cs_ptr + row + 32 + i)


@triton.jit
def norm_rope_apply(c, w, cos, sin, eps, D: tl.constexpr):
    """:func:`norm_rope` given its operands (:func:`norm_rope_operands`)."""
    rr = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(c * c, axis=0), D * 1.0) + eps))
    n = (c * rr) * w

    # RoPE on the last 64 dims (block D/64 - 1), GPT-J pairs.
    NB: tl.constexpr = D // 64
    x_e, x_o = tl.split(tl.reshape(n, (NB, 32, 2)))
    last = tl.arange(0, NB)[:, None] == NB - 1
    y_e = tl.where(last, x_e * cos - x_o * sin, x_e)
    y_o = tl.where(last, x_o * cos + x_e * sin, x_o)
    return tl.reshape(tl.join(y_e, y_o), (NB, 64))


@triton.jit
def _compress_chunks(state_ptr, req_ptr, pos_ptr, slot_ptr, bt_ptr, nw_ptr, cs_ptr, kv_slot_ptr, cache_ptr,
                     scale_ptr, sbs, block_stride, bt_stride, eps, kv_bs, page_stride, T, chunk,
                     ALIGNED: tl.constexpr, D: tl.constexpr, ENC: tl.constexpr, HW: tl.constexpr):
    """Every chunk of ``chunk`` tokens with index = program id (mod the grid): see the module docstring."""
    R: tl.constexpr = 4 * D   # elements per state row
    lane = tl.arange(0, _MAX_CHUNK)
    n_chunks = (T + chunk - 1) // chunk
    c = tl.program_id(0).to(tl.int64)
    while c < n_chunks:
        # The chunk's per-token words in one round trip (the request too, for every token: masked by
        # the boundary test it waited for that test's loads), then the block-table entries of its
        # windows' two row groups (rows 0 and 4) in a second one (H200: 3-6 points faster than each
        # window looking its own up once the grid is capped; benchmarks/results/c4_tuning_h200).
        tok = c * chunk + lane
        inb = (lane < chunk) & (tok < T)
        pv = tl.load(pos_ptr + tok, mask=inb, other=0)
        kvv = tl.load(kv_slot_ptr + tok, mask=inb, other=-1)
        rv = tl.load(req_ptr + tok, mask=inb, other=0).to(tl.int64)
        live = (tl.load(slot_ptr + tok, mask=inb, other=-1) >= 0) & (kvv >= 0) & ((pv + 1) % 4 == 0)
        prev = live & (pv >= 7)
        qa = tl.where(prev, pv - 7, 0)
        qb = tl.where(live, pv - 3, 0)
        row = bt_ptr + rv * bt_stride
        ga = tl.load(row + qa // sbs, mask=prev, other=0).to(tl.int64) * block_stride + (qa % sbs) * R
        gb = tl.load(row + qb // sbs, mask=live, other=0).to(tl.int64) * block_stride + (qb % sbs) * R
        live_bits = tl.sum(tl.where(live, 1 << lane, 0), axis=0)
        for i in range(_MAX_CHUNK):
            if ((live_bits >> i) & 1) != 0:
                pick = lane == i
                p = tl.sum(tl.where(pick, pv, 0), axis=0)
                w, cos, sin = norm_rope_operands(nw_ptr, cs_ptr, (p // 4) * 4, D)
                req = tl.sum(tl.where(pick, rv, 0), axis=0)
                a0 = tl.sum(tl.where(pick, ga, 0), axis=0)
                b0 = tl.sum(tl.where(pick, gb, 0), axis=0)
                cr = pool_window(state_ptr, bt_ptr, req, p, sbs, block_stride, bt_stride, a0, b0, ALIGNED, D)
                y = norm_rope_apply(cr, w, cos, sin, eps, D)
                encode_store(y, cache_ptr, scale_ptr, tl.sum(tl.where(pick, kvv, 0), axis=0), kv_bs,
                             page_stride, ENC, D // 64, HW)
        c += tl.num_programs(0)


@triton.jit(
    do_not_specialize=["sbs", "block_stride", "bt_stride", "kv_bs", "page_stride", "T", "chunk"],
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
    T: tl.int64,  # tokens
    chunk: tl.int32,  # tokens per chunk (launch_shape), <= MAX_TOKENS_PER_CHUNK
    D: tl.constexpr,
    ENC: tl.constexpr,
    HW_CVT: tl.constexpr = True,  # bf16 / e4m3 rounding by the GPU's casts (False: the interpreter)
):
    if block_stride % 4 == 0:
        # The usual state cache: written so, every row offset is provably 16-byte aligned (a fact
        # checked here, not an assumption) and the row loads are 16-byte vectors.
        _compress_chunks(state_ptr, req_ptr, pos_ptr, slot_ptr, bt_ptr, nw_ptr, cs_ptr, kv_slot_ptr,
                         cache_ptr, scale_ptr, sbs, (block_stride // 4) * 4, bt_stride, eps, kv_bs,
                         page_stride, T, chunk, True, D, ENC, HW_CVT)
    else:
        _compress_chunks(state_ptr, req_ptr, pos_ptr, slot_ptr, bt_ptr, nw_ptr, cs_ptr, kv_slot_ptr,
                         cache_ptr, scale_ptr, sbs, block_stride, bt_stride, eps, kv_bs, page_stride, T,
                         chunk, False, D, ENC, HW_CVT)


# Below SHARE_FROM_TOKENS tokens every token is its own chunk and program (decode: the latency of
# one window). From there, chunks of TOKENS_PER_CHUNK tokens (one in four is a boundary) and at most
# MAX_PROGRAMS programs, each looping over chunks: the grid the H200 measured fastest
# (benchmarks/c4_tuning.py; more tokens per program cut the programs that only read and exit).
SHARE_FROM_TOKENS = 4096
TOKENS_PER_CHUNK = 8
MAX_PROGRAMS = 2048
#: ptxas register cap (``maxnreg``; None: ptxas chooses): more programs per SM against spills.
MAX_REGISTERS: int | None = None


def launch_shape(t: int) -> tuple[int, int]:
    """``(tokens per chunk, programs)`` for ``t`` tokens."""
    chunk = TOKENS_PER_CHUNK if t >= SHARE_FROM_TOKENS else 1
    assert 1 <= chunk <= MAX_TOKENS_PER_CHUNK
    return chunk, max(1, min(triton.cdiv(t, chunk), MAX_PROGRAMS))


#: The pointers to the state pool and the per-token arrays every pooling kernel reads (K5, K6, K9; K7
#: in :mod:`dsv4kit.kernels.c128_compress.triton`), in its parameter order.
STATE_POINTERS = {
    "state_ptr": Ptr(torch.float32),  # data_ptr % 16 == 0: checked (§2.8)
    "req_ptr": Ptr(torch.int32, aligned=False),
    "pos_ptr": Ptr(torch.int64, aligned=False),
    "slot_ptr": Ptr(torch.int64, aligned=False),
    "bt_ptr": Ptr(torch.int32, aligned=False),
}


class _C4CompressTriton:
    """The launch K5, K6 and K9 share (a mixin): chunks of tokens per program, the key's head and encoder."""

    kernel_fn = c4_compress_kernel
    params = {
        **STATE_POINTERS,
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
        "T": Runtime(),
        "chunk": Runtime(),
        "D": FromKey("head_size"),
        "ENC": FromKey(key_encoder),
        "HW_CVT": Const(True),
    }

    def launch_options(self, key: Any) -> dict[str, Any]:
        # One warp per 128 columns: each thread holds 4 consecutive columns of a row (16-byte loads).
        opts: dict[str, Any] = {"num_warps": key.head_size // 128}
        if MAX_REGISTERS is not None:
            opts["maxnreg"] = MAX_REGISTERS
        return opts

    def grid(self, key: Any, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (launch_shape(args["T"])[1],)

    def launch_args(self, key: Any, ops: Any, run: LaunchOperands) -> tuple[Any, ...]:
        st = run.store
        return (
            run.state,
            ops.token_to_req,
            ops.positions,
            ops.slot_mapping,
            ops.block_table,
            ops.rms_norm_weight,
            ops.cos_sin_cache,
            ops.kv_slot_mapping,
            st.cache,
            st.scale,
            run.sbs,
            run.block_stride,
            run.bt_stride,
            run.eps,
            st.kv_bs,
            st.page_stride,
            run.t,
            launch_shape(run.t)[0],
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
