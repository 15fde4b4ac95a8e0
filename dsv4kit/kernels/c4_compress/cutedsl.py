"""CuTeDSL backend of the C4 compressors K5, K6, K9: one pooling core, the encoders' routine.

Two kernels in one compile per key; the host function picks one from T at run time (the key is
not involved: :func:`cta_per_token`).

Decode, T <= :data:`CTA_PER_TOKEN_UP_TO` (:func:`_token_cta_kernel`): a CTA of ``D`` threads per
token (head 512: 16 warps, head 128: 4 warps), thread ``x`` owns state column ``x``, so that one
boundary token has its whole window (32 D bytes) in flight at once. Every thread reads the
token's position, state slot and kv slot (broadcast loads): a CTA-uniform test of a live boundary
token (slot >= 0, kv slot >= 0, ``(p + 1) % 4 == 0``); other CTAs exit. Then:

1. Window rows (:func:`_row_offsets`). In each warp lane ``l`` computes row ``j = l % 8``'s offset
   (position ``q = p - 7 + j``): its state row ``bt[req, q // sbs] * block_stride + (q % sbs) *
   4D``, plus D for rows j >= 4 (half B); every load shuffles its row's offset from lane j. Rows
   with q < 0 (only rows 0..3, only at p = 3) are not read: score -inf, so their weight is
   exactly 0, and they are left out of the sum (adding their +0 products to the +0 start would
   change no bit).
2. Pooling (:func:`pool_column`): thread ``x`` issues its column's 8 score and 8 kv loads at once,
   then ``m = max_j s_j``, ``e_j = exp(s_j - m)``, ``S = sum_j e_j``, ``A = sum_j fl(e_j k_j)``
   (sums in row order j = 0..7 from +0), ``c = div.rn(A, S)``, into shared memory (``D`` fp32).
3. One barrier; warp 0 reads the row back so that lane ``l`` holds dims ``[l * EPT, (l + 1) *
   EPT)`` (``EPT = D / 32``), the calling convention of ``encode_store``, and runs steps 4.-6.

Prefill, T > :data:`CTA_PER_TOKEN_UP_TO` (:func:`_token_warp_kernel`): CTAs of :data:`WARPS` = 4
warps (``ceil(T / 16)`` CTAs; 8 KiB of shared memory each for head 512, none for head 128); warp
``w`` of CTA ``b`` owns the :data:`TOKENS_PER_WARP` (4) consecutive tokens ``t0 = (b * WARPS + w) *
4 .. t0 + 3`` (< T). Lane ``i < 4`` loads token ``t0 + i``'s fields, a warp ballot marks the live
boundary tokens and the warp pools, norms and encodes them one after the other (a warp-uniform
loop that reads the token's fields again, L1 hits). Consecutive tokens of a request hold
consecutive positions, so a warp usually has one boundary token. Launch bound
:data:`WARP_MIN_CTAS_PER_SM` = 6: at most 80 registers, 24 warps per SM. Per live token
(:func:`pool_norm_rope`):

1. Window rows as above (:func:`_row_offsets`).
2. Pooling, in chunks of 128 columns (D / 128 = 4 chunks for head 512, 1 for head 128): lane
   ``l`` owns columns ``128 c + 4 l .. + 3`` of chunk c, so every warp load is 512 contiguous
   bytes (16-byte vectors when ``block_stride % 4 == 0``, the usual case, since the state base
   is 16-byte aligned and all other row offsets are multiples of 4 elements; element loads
   otherwise, a warp-uniform runtime branch). Per chunk: the 8 x 4 scores, then per column the
   same softmax and weighted sum as above; kv rows 0..3 are loaded before the exps are summed
   and accumulated, then rows 4..7 (at most 32 exps + 16 kv live: what fits the 80 registers).
3. Head 512: the chunks' pooled values go through shared memory (2 KiB per warp) so that lane
   ``l`` ends up holding dims ``[16 l, 16 l + 16)``. Head 128: the chunk is already that layout.

Why two: a CTA per token puts a decode step's few windows in flight at once (K5 3.3 us over an
empty kernel at T = 1 on the H200, against 11.7 us for a warp per token), but in prefill its one
encoding warp per token leaves the CTA's other warps idle (head 512 at T = 65536: 400 us against
164 us for a warp per token); the crossover, each kernel forced at every T, is recorded in
``benchmarks/results/c4_split_h200/``.

Then, both kernels, by one warp per token:

4. RMSNorm: each lane sums its squares in order, a butterfly over the warp gives every lane the
   same total; ``rr = div.rn(1, sqrt.rn(fl(sum / D) + eps))``, ``n_d = fl(fl(c_d * rr) * w_d)``.
5. RoPE on the lanes that hold the last 64 dims (28..31 for head 512, 16..31 for head 128),
   GPT-J pairs within the lane, cos/sin row ``(p // 4) * 4``.
6. ``encode_store`` with the key's encoder (E1; E2 / E3; E4 / E5), the very routine the store
   hooks run.

Numerics, the same in both kernels and the same as the Triton kernels': every product and sum is an
``.rn`` instruction (never contracted into an FMA); ``exp`` is
:func:`~dsv4kit.kernels.cute_numerics.exp_f32`, Triton's ``tl.exp`` (``ex2.approx.f32`` of ``fl(x
log2 e)``: the spec allows approximate exp2 in the compressors); one IEEE division per column, ``c =
div.rn(sum_j fl(e_j k_j), S)``, where the reference divides each weight ``e_j / S`` (another
rounding of the same value); the norm ``sqrt.rn.f32`` / ``div.rn.f32`` as the reference. The 8-row
sums run in the reference's order (j = 0..7, as PyTorch's CPU reduction). So the pooled value
differs from the reference's by a few fp32 roundings and results follow the compressor rule of §2.12
(its allowance, ``2^-16`` of the term magnitude, holds: ``ex2.approx`` is within 2 ulp, and rounding
``x log2 e`` moves a weight by at most ``|x| 2^-24`` relative, under ``2^-17`` for every ``x`` above
the exp's underflow). Why not exact: a Cody-Waite exp from ``.rn`` operations (about 25
instructions) and an IEEE division per weight (8 per column) were more than half of the kernels'
instructions (static SASS per thread, ``benchmarks/sass_mix.py``: K5 at T = 262144 5300 -> 2180, K9
1727 -> 831). The encode step is bit-exact given y.

One compile per key serves every T, number of requests, block-table width, state pool (blocks,
block stride, sbs), cache (pages, kv_bs, page stride) and norm weight of the key's dtype.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, Uint8

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.errors import input_error
from dsv4kit.kernels.c4_compress.spec import C4CompressDsMlaBase, C4CompressPlainBase, IndexerCompressBase
from dsv4kit.kernels.compressor.contract import LaunchOperands, flat, unit
from dsv4kit.kernels.cute_numerics import add_rn, div_rn, exp_f32, mul_rn, sqrt_rn, sub_rn
from dsv4kit.kernels.encoders.cutedsl import cache_align, elems_per_lane, encode_store
from dsv4kit.kernels.encoders.spec import key_encoder

__all__ = ["CTA_MIN_CTAS_PER_SM", "CTA_PER_TOKEN_UP_TO", "TOKENS_PER_WARP", "WARPS",
           "WARP_MIN_CTAS_PER_SM", "C4CompressDsMlaCuTeDSL", "C4CompressPlainCuTeDSL",
           "IndexerCompressCuTeDSL", "c4_compress_host", "cta_per_token", "launch_grid", "norm_rope",
           "pool_column", "pool_norm_rope", "state_fakes", "warp_tokens"]

#: The decode kernel (a CTA per token) runs up to this many tokens, the prefill kernel above. Measured
#: on the H200 (``benchmarks/results/c4_split_h200``): the decode kernel wins up to T = 2048 (head 512:
#: 12 vs 20 us), ties at 4096 (21.6 vs 21.5 us), loses from 8192 (54 vs 30 us).
CTA_PER_TOKEN_UP_TO = 4096
#: Decode kernel's launch bound (``.minnctapersm``) for head 512 (16 warps per CTA): 64 registers;
#: head 128 (4 warps) asks for 4x as many CTAs, the same warps per SM.
CTA_MIN_CTAS_PER_SM = 2

#: Prefill kernel: warps per CTA, and consecutive tokens per warp.
WARPS = 4
TOKENS_PER_WARP = 4
#: Prefill kernel's launch bound: 6 CTAs = 24 warps per SM, so ptxas fits it in 80 registers
#: (65536 / (6 * 128) = 85, allocated in steps of 8); the pooling chunk is written so that it needs
#: no more (no spills, no stack). 8 (64 registers, occupancy 0.5) spills to the stack.
WARP_MIN_CTAS_PER_SM = 6

_ROWS = 8                    # the C4 window: 4 previous rows (half A) + 4 current rows (half B)
_CHUNK = 128                 # prefill: columns per pooling chunk, 32 lanes x 4
_NORM_DTYPES = {"bfloat16": BFloat16, "float32": Float32}


@cute.jit
def _row_offsets(mBT: cute.Tensor, req: Int32, p: Int64, sbs: Int32, block_stride: Int64, bt_stride: Int64,
                 D: cutlass.Constexpr) -> Int64:
    """Lane ``l``'s share of the window's row offsets: row ``j = l % 8`` (position ``q = p - 7 + j``)
    at ``bt[req, q // sbs] * block_stride + (q % sbs) * 4D``, plus ``D`` for rows ``j >= 4`` (half B);
    0 for ``q < 0`` (never read). Every warp computes its own (the block-table reads are L1 hits)."""
    j = cute.arch.lane_idx() % _ROWS
    q = p - Int64(_ROWS - 1) + Int64(j)
    mine = Int64(0)
    if q >= Int64(0):
        q32 = Int32(q)
        blk = mBT[Int64(req) * bt_stride + Int64(q32 // sbs)]
        mine = Int64(blk) * block_stride + Int64(q32 % sbs) * Int64(4 * D) + Int64(j // 4) * Int64(D)
    return mine


@cute.jit
def _pool_rows(mState: cute.Tensor, mine: Int64, col: Int64, j0: cutlass.Constexpr,
               D: cutlass.Constexpr) -> Float32:
    """Column ``col`` pooled over window rows ``j0 .. 7`` (rows below ``j0`` have score -inf, weight
    exactly 0: neither read nor summed, since their +0 products would change no bit of the +0 start).
    Every score and kv load of the column is issued before the first use (16 loads in flight)."""
    sv = cute.make_rmem_tensor(_ROWS, Float32)
    kv = cute.make_rmem_tensor(_ROWS, Float32)
    for j in cutlass.range_constexpr(j0):
        sv[j] = Float32(float("-inf"))
    for j in cutlass.range_constexpr(j0, _ROWS):
        at = cute.arch.shuffle_sync(mine, j) + col
        sv[j] = mState[at + Int64(2 * D)]
        kv[j] = mState[at]
    m = sv[0]
    for j in cutlass.range_constexpr(1, _ROWS):
        m = cute.arch.fmax(m, sv[j])
    total = Float32(0.0)
    acc = Float32(0.0)
    for j in cutlass.range_constexpr(j0, _ROWS):          # rows below j0: exp = +0, a +0 term
        sv[j] = exp_f32(sub_rn(sv[j], m))
        total = add_rn(total, sv[j])
    for j in cutlass.range_constexpr(j0, _ROWS):
        acc = add_rn(acc, mul_rn(sv[j], kv[j]))
    return div_rn(acc, total)


@cute.jit
def pool_column(mState: cute.Tensor, mine: Int64, col: Int64, full: cutlass.Boolean,
                D: cutlass.Constexpr) -> Float32:
    """The pooled value of column ``col`` of the boundary token whose row offsets ``mine`` holds
    (:func:`_row_offsets`): ``div.rn(sum_j fl(e_j * k_j), S)``, sums in row order from +0.
    ``full``: ``p >= 7`` (else rows 0..3 do not exist)."""
    c = Float32(0.0)
    if full:
        c = _pool_rows(mState, mine, col, 0, D)
    else:
        c = _pool_rows(mState, mine, col, 4, D)
    return c


@cute.jit
def _load_rows(mState: cute.Tensor, mine: Int64, col: Int64, dst: cute.Tensor, off: cutlass.Constexpr,
               j0: cutlass.Constexpr, j1: cutlass.Constexpr, d0: cutlass.Constexpr, vec: cutlass.Constexpr):
    """Rows ``j0 .. j1 - 1`` of one half (element offset ``off`` in the row: ``2 D`` scores, 0 kv)
    at the lane's columns ``col .. col + 3`` into ``dst[:, j - d0]``: 16-byte loads when ``vec``
    (every offset is then a multiple of 4 elements), else element loads. Row ``j``'s offset is
    lane ``j``'s ``mine``, shuffled here (the 8 offsets are not kept live across the math)."""
    for j in cutlass.range_constexpr(j0, j1):
        at = cute.arch.shuffle_sync(mine, j) + col + Int64(off)
        if cutlass.const_expr(vec):
            src = mState.iterator + cute.assume(at, divby=4)
            cute.autovec_copy(cute.make_tensor(src, cute.make_layout(4)), dst[None, j - d0])
        else:
            for e in cutlass.range_constexpr(4):
                dst[e, j - d0] = mState[at + Int64(e)]


@cute.jit
def _load_vec_or_elems(mState: cute.Tensor, mine: Int64, col: Int64, vec_ok: cutlass.Boolean,
                       dst: cute.Tensor, off: cutlass.Constexpr, j0: cutlass.Constexpr, j1: cutlass.Constexpr,
                       d0: cutlass.Constexpr):
    """:func:`_load_rows` by vectors or by elements (a warp-uniform branch)."""
    if vec_ok:
        _load_rows(mState, mine, col, dst, off, j0, j1, d0, True)
    else:
        _load_rows(mState, mine, col, dst, off, j0, j1, d0, False)


@cute.jit
def _accumulate(c: cute.Tensor, e: cute.Tensor, k: cute.Tensor, j0: cutlass.Constexpr):
    """``c_i = fl(c_i + fl(e[i, j] * k[i, j - j0]))`` for rows ``j = j0 .. j0 + 3``, in row order."""
    for i in cutlass.range_constexpr(4):
        for j in cutlass.range_constexpr(j0, j0 + 4):
            c[i] = add_rn(c[i], mul_rn(e[i, j], k[i, j - j0]))


@cute.jit
def _pool_chunk(mState: cute.Tensor, mine: Int64, col: Int64, full: cutlass.Boolean,
                vec_ok: cutlass.Boolean, out: cute.Tensor, D: cutlass.Constexpr):
    """Pool the lane's 4 columns ``col .. col + 3`` over the window into ``out``: ``div.rn(sum_j
    fl(e_j * k_j), S)`` per column. ``mine``: the state offset of row ``lane % 8``.

    Registers (occupancy): kv comes 4 rows at a time, so that at most 32 scores / exps + 16 kv
    are live, never 32 scores + 32 kv: the scores first, then kv rows 0..3 (in flight during the
    exps), then rows 4..7 once rows 0..3 are summed. At p = 3 the first kv load takes rows
    4..7 and rows 0..3 (score -inf, weight 0) are neither read nor summed: their products would add
    +0 to the +0 start, so every value is the same, bit for bit.
    """
    sv = cute.make_rmem_tensor((4, _ROWS), Float32)
    kv = cute.make_rmem_tensor((4, 4), Float32)
    for j in cutlass.range_constexpr(4):
        for e in cutlass.range_constexpr(4):
            sv[e, j] = Float32(float("-inf"))
    if full:
        _load_vec_or_elems(mState, mine, col, vec_ok, sv, 2 * D, 0, _ROWS, 0)
    else:
        _load_vec_or_elems(mState, mine, col, vec_ok, sv, 2 * D, 4, _ROWS, 0)
    if full:
        _load_vec_or_elems(mState, mine, col, vec_ok, kv, 0, 0, 4, 0)
    else:
        _load_vec_or_elems(mState, mine, col, vec_ok, kv, 0, 4, _ROWS, 4)
    total = cute.make_rmem_tensor(4, Float32)
    for i in cutlass.range_constexpr(4):
        m = sv[i, 0]
        for j in cutlass.range_constexpr(1, _ROWS):
            m = cute.arch.fmax(m, sv[i, j])
        total[i] = Float32(0.0)
        for j in cutlass.range_constexpr(_ROWS):
            sv[i, j] = exp_f32(sub_rn(sv[i, j], m))
            total[i] = add_rn(total[i], sv[i, j])
    c = cute.make_rmem_tensor(4, Float32)
    for i in cutlass.range_constexpr(4):
        c[i] = Float32(0.0)
    if full:
        _accumulate(c, sv, kv, 0)
        _load_vec_or_elems(mState, mine, col, vec_ok, kv, 0, 4, _ROWS, 4)
    _accumulate(c, sv, kv, 4)
    for i in cutlass.range_constexpr(4):
        out[i] = div_rn(c[i], total[i])


@cute.jit
def pool_norm_rope(mState: cute.Tensor, mBT: cute.Tensor, mNW: cute.Tensor, mCS: cute.Tensor,
                   sRow: cute.Tensor, req: Int32, p: Int64, sbs: Int32, block_stride: Int64,
                   bt_stride: Int64, eps: Float32, D: cutlass.Constexpr):
    """The fp32 row y of the boundary token at position ``p`` of request ``req``, in the
    calling convention of ``encode_store``: lane ``l`` holds dims ``[l * EPT, (l + 1) * EPT)``
    (``EPT = D / 32``). Called by the whole warp (``p``, ``req`` warp-uniform). ``sRow``: the
    warp's ``D`` fp32 of shared memory (head 512; None for head 128)."""
    ept = elems_per_lane(D // 64)
    nchunks = D // _CHUNK
    lane = cute.arch.lane_idx()

    mine = _row_offsets(mBT, req, p, sbs, block_stride, bt_stride, D)     # 1. row lane % 8's offset
    full = p >= Int64(_ROWS - 1)
    vec_ok = (block_stride & Int64(3)) == Int64(0)

    # 2./3. Pooling, chunk by chunk; head 512 re-lays the row out through shared memory.
    y = cute.make_rmem_tensor(ept, Float32)
    if cutlass.const_expr(nchunks == 1):
        _pool_chunk(mState, mine, Int64(lane * 4), full, vec_ok, y, D)
    else:
        cute.arch.sync_warp()                    # the previous token's reads of sRow are done
        for ch in cutlass.range(nchunks, unroll=1):
            cvals = cute.make_rmem_tensor(4, Float32)
            col = ch * _CHUNK + lane * 4
            _pool_chunk(mState, mine, Int64(col), full, vec_ok, cvals, D)
            dst = cute.make_tensor(sRow.iterator + cute.assume(col, divby=4), cute.make_layout(4))
            cute.autovec_copy(cvals, dst)
        cute.arch.sync_warp()
        src = cute.make_tensor(sRow.iterator + cute.assume(lane * ept, divby=4), cute.make_layout(ept))
        cute.autovec_copy(src, y)

    # 4./5. RMSNorm, RoPE at cos/sin row (p // 4) * 4.
    norm_rope(y, mNW, mCS, p, eps, D, 2)
    return y


@cute.jit
def norm_rope(y: cute.Tensor, mNW: cute.Tensor, mCS: cute.Tensor, p: Int64, eps: Float32,
              D: cutlass.Constexpr, log2_ratio: cutlass.Constexpr):
    """RMSNorm, then RoPE of the last 64 dims, in place on a warp-held row ``y`` (lane ``l``:
    dims ``[l * EPT, (l + 1) * EPT)``, the ``encode_store`` convention); the whole warp calls it.

    Norm: lane sums of squares in order, a 5-step butterfly (every lane the same total),
    ``rr = div.rn(1, sqrt.rn(fl(sum / D) + eps))``, ``y_d = fl(fl(y_d * rr) * w_d)``. RoPE: GPT-J
    pairs within the lanes that hold dims ``[D - 64, D)``, cos/sin row ``(p >> log2_ratio) <<
    log2_ratio`` (the compressed position of a ratio-``2^log2_ratio`` boundary token).
    """
    ept = elems_per_lane(D // 64)
    lane = cute.arch.lane_idx()
    ss = Float32(0.0)
    for i in cutlass.range_constexpr(ept):
        ss = add_rn(ss, mul_rn(y[i], y[i]))
    for sh in cutlass.range_constexpr(5):
        ss = add_rn(ss, cute.arch.shuffle_sync_bfly(ss, 16 >> sh))
    rr = div_rn(Float32(1.0), sqrt_rn(add_rn(mul_rn(ss, Float32(1.0 / D)), eps)))
    for i in cutlass.range_constexpr(ept):
        y[i] = mul_rn(mul_rn(y[i], rr), mNW[lane * ept + i].to(Float32))

    if lane * ept >= D - 64:
        row = (p >> Int64(log2_ratio)) * Int64((1 << log2_ratio) * 64)
        pair0 = Int64((lane * ept - (D - 64)) // 2)
        for k in cutlass.range_constexpr(ept // 2):
            cs = mCS[row + pair0 + k]
            sn = mCS[row + Int64(32) + pair0 + k]
            xe = y[2 * k]
            xo = y[2 * k + 1]
            y[2 * k] = sub_rn(mul_rn(xe, cs), mul_rn(xo, sn))
            y[2 * k + 1] = add_rn(mul_rn(xo, cs), mul_rn(xe, sn))


@cute.jit
def warp_tokens(warps: cutlass.Constexpr, per_warp: Any) -> tuple[Any, Any, Any]:
    """``(lane, warp, first)`` of a kernel whose CTAs hold ``warps`` warps of ``per_warp`` tokens
    each: warp ``w`` of CTA ``b`` takes tokens ``first .. first + per_warp - 1``,
    ``first = (b * warps + w) * per_warp``."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = cute.arch.lane_idx()
    warp = tidx // 32
    return lane, warp, (bidx * warps + warp) * per_warp


@cute.kernel
def _token_cta_kernel(
    mState: cute.Tensor,     # fp32 [*]: the state cache from its first block (16-byte aligned)
    mReq: cute.Tensor,       # int32 [T] token_to_req
    mPos: cute.Tensor,       # int64 [T]
    mSlot: cute.Tensor,      # int64 [T] state slots (< 0: padding)
    mBT: cute.Tensor,        # int32 [*] block table: row r at r * bt_stride
    mNW: cute.Tensor,        # bf16 / fp32 [D] norm weight
    mCS: cute.Tensor,        # fp32 [max_pos * 64] cos/sin rows
    mKvSlot: cute.Tensor,    # int64 [T] compressed-cache slots (< 0: skip)
    mCache: cute.Tensor,     # uint8 [*]: the cache from its first page (StoreOperands.cache)
    mScale: cute.Tensor,     # fp32 [1]: fp8_scale (E3), otherwise never read
    sbs: Int32, block_stride: Int64, bt_stride: Int64, eps: Float32, kv_bs: Int32, page_stride: Int64,
    D: cutlass.Constexpr, enc: cutlass.Constexpr,
):
    """Decode: CTA ``b`` pools token ``b`` (thread = column), warp 0 norms and encodes it."""
    tidx, _, _ = cute.arch.thread_idx()
    t, _, _ = cute.arch.block_idx()
    lane = cute.arch.lane_idx()
    ept = elems_per_lane(D // 64)

    smem = cutlass.memory.SmemAllocator()
    sRow = smem.allocate_tensor(Float32, cute.make_layout(D), byte_alignment=16)

    p = mPos[t]                      # every thread reads the token (broadcast): a CTA-uniform test
    req = mReq[t]                    # before the test, not after it: one dependent round trip less
    if mSlot[t] >= Int64(0) and mKvSlot[t] >= Int64(0) and (p & Int64(3)) == Int64(3):
        mine = _row_offsets(mBT, req, p, sbs, block_stride, bt_stride, D)
        sRow[tidx] = pool_column(mState, mine, Int64(tidx), p >= Int64(_ROWS - 1), D)
        cute.arch.sync_threads()
        if tidx < 32:
            y = cute.make_rmem_tensor(ept, Float32)
            src = cute.make_tensor(sRow.iterator + cute.assume(lane * ept, divby=4), cute.make_layout(ept))
            cute.autovec_copy(src, y)
            norm_rope(y, mNW, mCS, p, eps, D, 2)
            encode_store(y, mCache, mScale, mKvSlot[t], kv_bs, page_stride, enc, D // 64)


@cute.kernel
def _token_warp_kernel(
    mState: cute.Tensor, mReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor, mBT: cute.Tensor,
    mNW: cute.Tensor, mCS: cute.Tensor, mKvSlot: cute.Tensor, mCache: cute.Tensor, mScale: cute.Tensor,
    sbs: Int32, block_stride: Int64, bt_stride: Int64, eps: Float32, kv_bs: Int32, page_stride: Int64,
    D: cutlass.Constexpr, enc: cutlass.Constexpr,
):
    """Prefill: warp ``w`` of CTA ``b`` pools, norms and encodes the live ones of its 4 tokens (the
    parameters are :func:`_token_cta_kernel`'s)."""
    lane, warp, first = warp_tokens(WARPS, TOKENS_PER_WARP)
    n = mPos.shape[0]

    sRow = None                          # head 512 only: the warp's row in shared memory
    if cutlass.const_expr(D > _CHUNK):
        smem = cutlass.memory.SmemAllocator()
        sBuf = smem.allocate_tensor(Float32, cute.make_layout((D, WARPS)), byte_alignment=16)
        sRow = sBuf[None, warp]

    # The warp's tokens: lane i < G reads token first + i (its request too, before the boundary test,
    # so that the block-table lookups wait for one round trip, not two); a ballot marks the live
    # boundary ones. A live token's position and kv slot are read again (L1 hits), its request
    # shuffled from lane i, rather than kept in lanes 0..3 across the loop.
    t = first + lane
    live = cutlass.Boolean(False)
    req = Int32(0)
    if lane < TOKENS_PER_WARP and t < n:
        p = mPos[t]
        req = mReq[t]
        if mSlot[t] >= Int64(0) and mKvSlot[t] >= Int64(0) and (p & Int64(3)) == Int64(3):
            live = cutlass.Boolean(True)
    todo = cute.arch.vote_ballot_sync(live)
    for i in cutlass.range(TOKENS_PER_WARP, unroll=1):
        if ((todo >> i) & Int32(1)) != Int32(0):                  # warp-uniform
            ti = first + i
            ti_p = mPos[ti]
            ti_slot = mKvSlot[ti]
            ti_req = cute.arch.shuffle_sync(req, i)
            y = pool_norm_rope(mState, mBT, mNW, mCS, sRow, ti_req, ti_p, sbs, block_stride, bt_stride, eps,
                               D)
            encode_store(y, mCache, mScale, ti_slot, kv_bs, page_stride, enc, D // 64)


@cute.jit
def c4_compress_host(
    mState: cute.Tensor,
    mReq: cute.Tensor,
    mPos: cute.Tensor,
    mSlot: cute.Tensor,
    mBT: cute.Tensor,
    mNW: cute.Tensor,
    mCS: cute.Tensor,
    mKvSlot: cute.Tensor,
    mCache: cute.Tensor,
    mScale: cute.Tensor,
    sbs: Int32,
    block_stride: Int64,
    bt_stride: Int64,
    eps: Float32,
    kv_bs: Int32,
    page_stride: Int64,
    per_token: Int32,
    stream: Any,
    D: cutlass.Constexpr,
    enc: cutlass.Constexpr,
):
    """Launch K5 / K6 / K9: ``per_token`` (:func:`cta_per_token`) 1: ``T`` CTAs of ``D`` threads;
    0: ``ceil(T / 16)`` CTAs of 128 threads (module docstring). Both carveouts are explicit (-1: the
    driver's default): that keeps the DSL from querying a device when min_blocks_per_mp > 1
    (compiles run without a GPU)."""
    n = mPos.shape[0]
    args = (mState, mReq, mPos, mSlot, mBT, mNW, mCS, mKvSlot, mCache, mScale, sbs, block_stride, bt_stride,
            eps, kv_bs, page_stride, D, enc)
    if per_token == Int32(1):
        _token_cta_kernel(*args).launch(grid=[n, 1, 1], block=[D, 1, 1], stream=stream,
                                        min_blocks_per_mp=CTA_MIN_CTAS_PER_SM * 512 // D,
                                        preferred_smem_carveout=-1)
    else:
        per_cta = WARPS * TOKENS_PER_WARP
        _token_warp_kernel(*args).launch(grid=[(n + per_cta - 1) // per_cta, 1, 1], block=[32 * WARPS, 1, 1],
                                         stream=stream, min_blocks_per_mp=WARP_MIN_CTAS_PER_SM,
                                         preferred_smem_carveout=-1)


def cta_per_token(t: int) -> bool:
    """Whether ``T = t`` tokens run the decode kernel (a CTA per token, t <= :data:`CTA_PER_TOKEN_UP_TO`)
    rather than the prefill kernel (a warp per 4 tokens)."""
    return t <= CTA_PER_TOKEN_UP_TO


def launch_grid(t: int, head_size: int) -> tuple[int, int]:
    """``(CTAs, threads per CTA)`` that :func:`c4_compress_host` launches for ``T = t``."""
    if cta_per_token(t):
        return t, head_size
    per_cta = WARPS * TOKENS_PER_WARP
    return -(-t // per_cta), 32 * WARPS


def state_fakes(t: Any) -> tuple[Any, ...]:
    """The fakes of the state pool (fp32, 16-byte aligned: §2.8), ``token_to_req``, ``positions``,
    ``slot_mapping`` (``t`` elements) and the block table, as every pooling kernel takes them (K5,
    K6, K9; K7 in :mod:`dsv4kit.kernels.c128_compress.cutedsl`)."""
    return (
        fake_tensor(Float32, (sym(symbol="state_elems", width=64),)),
        fake_tensor(Int32, (t,), align=4),
        fake_tensor(Int64, (t,), align=8),
        fake_tensor(Int64, (t,), align=8),
        fake_tensor(Int32, (sym(symbol="bt_elems", width=64),), align=4),
    )


class _C4CompressCuTeDSL:
    """What K5, K6 and K9 share (a mixin): the fakes and the runtime arguments."""

    jit_fn = c4_compress_host
    name: str
    tvm_ffi: bool

    def warmup_inputs(self, key: Any) -> tuple[Any, ...]:
        # Every size is a symbol: T, the state / block-table / cos-sin / cache spans are runtime values.
        if key.norm_weight_dtype not in _NORM_DTYPES:
            raise input_error(self.name, "norm_weight_dtype", f"one of {list(_NORM_DTYPES)}",
                              key.norm_weight_dtype)
        enc = key_encoder(key)
        t = sym(symbol="T")
        nw = _NORM_DTYPES[key.norm_weight_dtype]
        return (
            *state_fakes(t),
            fake_tensor(nw, (key.head_size,), align=nw.width // 8),
            fake_tensor(Float32, (sym(symbol="cos_sin_elems", width=64),), align=4),
            fake_tensor(Int64, (t,), align=8),
            fake_tensor(Uint8, (sym(symbol="cache_bytes", width=64),), align=cache_align(enc)),
            fake_tensor(Float32, (1,), align=4),
            Int32(0), Int64(0), Int64(0), Float32(0.0), Int32(0), Int64(0), Int32(0),
            fake_stream(self.tvm_ffi),
            key.head_size,
            enc,
        )

    def launch_args(self, key: Any, ops: Any, run: LaunchOperands) -> tuple[Any, ...]:
        st, t = run.store, run.t
        scale = st.scale.as_strided((1,), (1,))      # fp8_scale [1], or the stand-in's first element
        return (run.state, unit(ops.token_to_req, t), unit(ops.positions, t), unit(ops.slot_mapping, t),
                flat(ops.block_table, run.bt_stride), unit(ops.rms_norm_weight, ops.rms_norm_weight.shape[0]),
                flat(ops.cos_sin_cache), unit(ops.kv_slot_mapping, t), st.cache, scale, run.sbs,
                run.block_stride, run.bt_stride, run.eps, st.kv_bs, st.page_stride, int(cta_per_token(t)))


class C4CompressDsMlaCuTeDSL(_C4CompressCuTeDSL, C4CompressDsMlaBase,
                             CuTeDSLJitKernel["C4CompressDsMlaBase.CompileKey"]):
    """K5 on CuTeDSL (compiles anywhere, runs on CUDA); see the module docstring."""


class C4CompressPlainCuTeDSL(_C4CompressCuTeDSL, C4CompressPlainBase,
                             CuTeDSLJitKernel["C4CompressPlainBase.CompileKey"]):
    """K6 on CuTeDSL."""


class IndexerCompressCuTeDSL(_C4CompressCuTeDSL, IndexerCompressBase,
                             CuTeDSLJitKernel["IndexerCompressBase.CompileKey"]):
    """K9 on CuTeDSL."""
