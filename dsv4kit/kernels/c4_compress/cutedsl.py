"""CuTeDSL backend of the C4 compressors K5, K6, K9: one pooling core, the encoders' routine.

Mapping. CTAs of ``D`` threads (head 512: 16 warps, head 128: 4 warps), thread ``x`` owns state
column ``x``; CTA ``b`` scans the ``G`` consecutive tokens ``b * G .. b * G + G - 1`` (< T), ``G`` a
runtime argument (:func:`tokens_per_cta`: 1 at decode sizes, so that every boundary token gets a
CTA of its own; :data:`TOKENS_PER_CTA` in prefill, about four boundary tokens per CTA). In every
warp lane ``i < G`` loads token ``i``'s position, state slot and kv slot and a ballot marks the
live boundary tokens (slot >= 0, kv slot >= 0, ``(p + 1) % 4 == 0``): the same mask in all warps,
so the token loops and the barrier are CTA-uniform (tokens that are not live cost no further load
and no store). ``D * MAX_TOKENS_PER_CTA`` fp32 of shared memory: one pooled row per live token.

Phase 1, the whole CTA, for each live token in turn (no barrier in between):

1. Window rows (:func:`_row_offsets`). In each warp lane ``l`` computes row ``j = l % 8``'s offset
   (position ``q = p - 7 + j``): its state row ``bt[req, q // sbs] * block_stride + (q % sbs) *
   4D``, plus D for rows j >= 4 (half B); every load shuffles its row's offset from lane j. Rows
   with q < 0 (only rows 0..3, only at p = 3) are not read: score -inf, so their weight is
   exactly 0, and they are left out of the sum (adding their +0 products to the +0 start would
   change no bit).
2. Pooling (:func:`pool_column`): thread ``x`` issues its column's 8 score and 8 kv loads at
   once (a warp load is 128 contiguous bytes, a CTA's 16 loads are the window's whole 32 D bytes
   in flight), then ``m = max_j s_j``, ``e_j = exp(s_j - m)``, ``S = sum_j e_j``, ``w_j = fl(e_j /
   S)``, ``c = sum_j w_j * k_j`` (sums in row order j = 0..7 from +0), into ``sBuf[x, k]`` for
   the k-th live token.

One CTA barrier, then phase 2: warp ``k % (D / 32)`` takes the k-th live token and reads its row
back so that lane ``l`` holds dims ``[l * EPT, (l + 1) * EPT)`` (``EPT = D / 32``), the calling
convention of ``encode_store``, and runs 3.-5.; the warps without a token exit, and the SM's other
CTAs stream their windows meanwhile.

3. RMSNorm: each lane sums its squares in order, a butterfly over the warp gives every lane the
   same total; ``rr = div.rn(1, sqrt.rn(fl(sum / D) + eps))``, ``n_d = fl(fl(c_d * rr) * w_d)``.
4. RoPE on the lanes that hold the last 64 dims (28..31 for head 512, 16..31 for head 128),
   GPT-J pairs within the lane, cos/sin row ``(p // 4) * 4``.
5. ``encode_store`` with the key's encoder (E1; E2 / E3; E4 / E5), the very routine the store
   hooks run, by that one warp.

Numerics: every product and sum is an ``.rn`` instruction (never contracted into an FMA), the
weights ``div.rn.f32`` (IEEE division, :data:`IEEE_WEIGHTS`) and the norm ``sqrt.rn.f32`` /
``div.rn.f32``, as the reference computes them. ``exp`` is :func:`exp_f32`, written out with
``.rn`` operations (no ``ex2.approx``): Cody-Waite reduction and a degree-7 polynomial, at most
1 ulp from the exact value (about 90 % correctly rounded, subnormal results included); 2^k is
applied with one integer add and one multiply. The 8-row sums run in the reference's order
(j = 0..7, as PyTorch's CPU reduction); the norm's sum of squares (lane order, then a butterfly)
and exp may differ from the reference in the last bit, so results follow the compressor rule of
§2.12 (typically bit-identical on nearly every encoded element). The encode step is bit-exact
given y.

One compile per key serves every T, number of requests, block-table width, state pool (blocks,
block stride, sbs), cache (pages, kv_bs, page stride) and norm weight of the key's dtype.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, Int64, Uint8, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.errors import input_error
from dsv4kit.kernels.c4_compress.spec import (
    C4CompressDsMlaBase,
    C4CompressPlainBase,
    CompressOperands,
    IndexerCompressBase,
)
from dsv4kit.kernels.cute_numerics import add_rn, mul_rn, sub_rn
from dsv4kit.kernels.encoders.cutedsl import cache_align, div_rn, elems_per_lane, encode_store
from dsv4kit.kernels.encoders.spec import key_encoder

__all__ = ["IEEE_WEIGHTS", "MAX_TOKENS_PER_CTA", "MIN_CTAS_PER_SM", "TOKENS_PER_CTA",
           "C4CompressDsMlaCuTeDSL", "C4CompressPlainCuTeDSL", "IndexerCompressCuTeDSL", "c4_compress_host",
           "exp_f32", "norm_rope", "pool_column", "sqrt_rn", "tokens_per_cta"]

#: Softmax weights by IEEE division ``div.rn(e_j, S)``, as the reference (else ``fl(e_j * fl(1 / S))``,
#: 8 divisions fewer per column; also within the compressor rule). A compile-time choice.
IEEE_WEIGHTS = True

#: Consecutive tokens a CTA scans above :data:`_ONE_TOKEN_UP_TO` tokens (:func:`tokens_per_cta`), and
#: the most any launch may ask for: the shared buffer holds one pooled row per token (any token of
#: the G may be a boundary token: a batch of one-token requests), ``512 * 16 * 4`` = 32 KiB at most.
TOKENS_PER_CTA = 16
MAX_TOKENS_PER_CTA = 16
_ONE_TOKEN_UP_TO = 1024
#: Launch bound (``.minnctapersm``) for head 512 (16 warps per CTA); head 128 (4 warps) asks for 4x
#: as many CTAs, the same warps per SM.
MIN_CTAS_PER_SM = 2

_ROWS = 8                    # the C4 window: 4 previous rows (half A) + 4 current rows (half B)
_NORM_DTYPES = {"bfloat16": BFloat16, "float32": Float32}

# exp_f32 constants (fp32 by their bits).
_LOG2E_BITS = 0x3FB8AA3B     # fl(log2(e))
_MAGIC_BITS = 0x4B400000     # 1.5 * 2^23: x + MAGIC rounds x to an integer (|x| < 2^22)
_EXP_BIAS = 64               # exp_f32 builds v * 2^(k + 64) (normal for every k >= -150), then * 2^-64
_MAGIC_K_BITS = _MAGIC_BITS + _EXP_BIAS     # fl(x + MAGIC + 64) has the bits MAGIC + k + 64
_L2U_BITS = 0x3F317200       # 0.693145751953125: ln 2 to 15 bits (k * L2U exact for |k| <= 255)
_L2L_BITS = 0x35BFBE8E       # fl(ln 2 - L2U)
_EXP_MIN = -104.0            # exp(x) rounds to 0 below this (and at it)
#: Minimax coefficients of (exp(r) - 1 - r) / r^2 on |r| <= ln(2) / 2, highest first (SLEEF's expf).
_EXP_POLY = (0x39502BDA, 0x3AB696C9, 0x3C0888A6, 0x3D2AAA7A, 0x3E2AAAAB, 0x3F000000)


def _f32(bits: int) -> Float32:
    return Uint32(bits).bitcast(Float32)


@dsl_user_op
def sqrt_rn(a: Float32, *, loc=None, ip=None) -> Float32:
    """``fl(sqrt(a))``: ``sqrt.rn.f32``, the correctly rounded IEEE square root."""
    return Float32(
        llvm.inline_asm(
            T.f32(),
            [Float32(a).ir_value(loc=loc, ip=ip)],
            "sqrt.rn.f32 $0, $1;",
            "=f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
            loc=loc,
            ip=ip,
        )
    )


@cute.jit
def exp_f32(x: Float32) -> Float32:
    """``exp(x)`` for ``x <= 0`` (-inf included) from ``.rn`` operations only; within 1 ulp.

    ``k = rint(x log2 e)``, ``r = fl(fl(x - k L2U) - fl(k L2L))`` (the first difference is exact),
    ``v = 1 + fl(r + r^2 u(r))`` (SLEEF's polynomial, evaluated without FMA), then ``fl(v * 2^k)``:
    ``v * 2^(k + 64)`` by adding ``(k + 64) << 23`` to the bits of ``v`` (exact: normal for every
    ``k >= -150``), times ``2^-64`` (one rounding: subnormal results are correctly rounded from
    ``v``). ``x <= -104``: 0. The integer ``k + 64`` comes with the rounding itself: ``x log2 e +
    (MAGIC + 64)`` has the bits ``MAGIC + k + 64``, and ``MAGIC << 23`` is 0 in 32 bits, so one shift-add
    (LEA) forms the product's bits. The same values as ``v * 2^max(k, -125) * 2^(k - max(k, -125))``.
    """
    xc = cute.arch.fmax(x, Float32(_EXP_MIN))
    t = add_rn(mul_rn(xc, _f32(_LOG2E_BITS)), _f32(_MAGIC_K_BITS))
    kf = sub_rn(t, _f32(_MAGIC_K_BITS))
    r = sub_rn(sub_rn(xc, mul_rn(kf, _f32(_L2U_BITS))), mul_rn(kf, _f32(_L2L_BITS)))
    u = _f32(_EXP_POLY[0])
    for c in _EXP_POLY[1:]:
        u = add_rn(mul_rn(u, r), _f32(c))
    v = add_rn(Float32(1.0), add_rn(r, mul_rn(mul_rn(r, r), u)))
    scaled = (v.bitcast(Uint32) + (t.bitcast(Uint32) << Uint32(23))).bitcast(Float32)
    return mul_rn(scaled, _f32((127 - _EXP_BIAS) << 23))


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
def _pool_rows(mState: cute.Tensor, mine: Int64, col: Int64, j0: cutlass.Constexpr, D: cutlass.Constexpr,
               ieee: cutlass.Constexpr) -> Float32:
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
    for j in cutlass.range_constexpr(_ROWS):
        sv[j] = exp_f32(sub_rn(sv[j], m))
        total = add_rn(total, sv[j])
    inv = Float32(0.0)
    if cutlass.const_expr(not ieee):
        inv = div_rn(Float32(1.0), total)
    c = Float32(0.0)
    for j in cutlass.range_constexpr(j0, _ROWS):
        w = div_rn(sv[j], total) if cutlass.const_expr(ieee) else mul_rn(sv[j], inv)
        c = add_rn(c, mul_rn(w, kv[j]))
    return c


@cute.jit
def pool_column(mState: cute.Tensor, mine: Int64, col: Int64, full: cutlass.Boolean, D: cutlass.Constexpr,
                ieee: cutlass.Constexpr) -> Float32:
    """The pooled value of column ``col`` of the boundary token whose row offsets ``mine`` holds
    (:func:`_row_offsets`): ``sum_j fl(w_j * k_j)`` in row order from +0 with ``w_j = div.rn(e_j, S)``
    (``ieee``) or ``fl(e_j * div.rn(1, S))``. ``full``: ``p >= 7`` (else rows 0..3 do not exist)."""
    c = Float32(0.0)
    if full:
        c = _pool_rows(mState, mine, col, 0, D, ieee)
    else:
        c = _pool_rows(mState, mine, col, 4, D, ieee)
    return c


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


@cute.kernel
def _c4_compress_kernel(
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
    sbs: Int32,
    block_stride: Int64,
    bt_stride: Int64,
    eps: Float32,
    kv_bs: Int32,
    page_stride: Int64,
    G: Int32,                # tokens per CTA (<= MAX_TOKENS_PER_CTA)
    D: cutlass.Constexpr,
    enc: cutlass.Constexpr,
    ieee: cutlass.Constexpr,
):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = cute.arch.lane_idx()
    warp = tidx // 32
    n = mPos.shape[0]
    first = bidx * G
    ept = elems_per_lane(D // 64)

    smem = cutlass.memory.SmemAllocator()
    sBuf = smem.allocate_tensor(Float32, cute.make_layout((D, MAX_TOKENS_PER_CTA)), byte_alignment=16)

    # The CTA's tokens: in every warp lane i < G reads token first + i, so the ballot (the live
    # boundary tokens) is the same in all warps: the token loops and the barrier are CTA-uniform.
    t = first + lane
    live = cutlass.Boolean(False)
    if lane < G and t < n:
        p = mPos[t]
        if mSlot[t] >= Int64(0) and mKvSlot[t] >= Int64(0) and (p & Int64(3)) == Int64(3):
            live = cutlass.Boolean(True)
    todo = cute.arch.vote_ballot_sync(live)

    # Phase 1, the whole CTA: the k-th live token's pooled row into sBuf[:, k], no barrier between.
    count = Int32(0)
    for i in cutlass.range(G, unroll=1):
        if ((todo >> i) & Int32(1)) != Int32(0):
            ti = first + i
            ti_p = mPos[ti]
            mine = _row_offsets(mBT, mReq[ti], ti_p, sbs, block_stride, bt_stride, D)
            sBuf[tidx, count] = pool_column(mState, mine, Int64(tidx), ti_p >= Int64(_ROWS - 1), D, ieee)
            count += Int32(1)
    cute.arch.sync_threads()

    # Phase 2, warp k % (D / 32): the k-th live token's norm, RoPE and encode, from sBuf[:, k].
    k = Int32(0)
    for i in cutlass.range(G, unroll=1):
        if ((todo >> i) & Int32(1)) != Int32(0):
            if warp == k % Int32(D // 32):                          # warp-uniform
                ti = first + i
                y = cute.make_rmem_tensor(ept, Float32)
                src = cute.make_tensor(sBuf.iterator + cute.assume(k * D + lane * ept, divby=4),
                                       cute.make_layout(ept))
                cute.autovec_copy(src, y)
                norm_rope(y, mNW, mCS, mPos[ti], eps, D, 2)
                encode_store(y, mCache, mScale, mKvSlot[ti], kv_bs, page_stride, enc, D // 64)
            k += Int32(1)


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
    G: Int32,
    stream: Any,
    D: cutlass.Constexpr,
    enc: cutlass.Constexpr,
    ieee: cutlass.Constexpr = True,
):
    """Launch K5 / K6 / K9: ``ceil(T / G)`` CTAs of ``D`` threads (module docstring)."""
    n = mPos.shape[0]
    _c4_compress_kernel(mState, mReq, mPos, mSlot, mBT, mNW, mCS, mKvSlot, mCache, mScale, sbs, block_stride,
                        bt_stride, eps, kv_bs, page_stride, G, D, enc, ieee).launch(
        grid=[(n + G - 1) // G, 1, 1], block=[D, 1, 1], stream=stream,
        # An explicit carveout (-1: the driver's default) keeps the DSL from querying a device for
        # one when min_blocks_per_mp > 1 (compiles run without a GPU).
        min_blocks_per_mp=MIN_CTAS_PER_SM * 512 // D, preferred_smem_carveout=-1)


def tokens_per_cta(t: int) -> int:
    """Tokens each CTA scans (``G``): 1 up to :data:`_ONE_TOKEN_UP_TO` tokens (decode: every boundary
    token gets a CTA of its own), :data:`TOKENS_PER_CTA` above (prefill: about 4 boundary tokens per
    CTA, one token in four being one, so that up to 4 warps encode at once while the CTA's other
    warps and the SM's other CTA stream the next windows)."""
    return 1 if t <= _ONE_TOKEN_UP_TO else TOKENS_PER_CTA


def _unit(x: torch.Tensor, n: int) -> torch.Tensor:
    """A 1-D unit-stride view of the first ``n`` elements (a size-1 tensor may carry any stride)."""
    return x if x.stride(0) == 1 else x.as_strided((n,), (1,))


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
            fake_tensor(Float32, (sym(symbol="state_elems", width=64),)),        # §2.8: data_ptr % 16 == 0
            fake_tensor(Int32, (t,), align=4),
            fake_tensor(Int64, (t,), align=8),
            fake_tensor(Int64, (t,), align=8),
            fake_tensor(Int32, (sym(symbol="bt_elems", width=64),), align=4),
            fake_tensor(nw, (key.head_size,), align=nw.width // 8),
            fake_tensor(Float32, (sym(symbol="cos_sin_elems", width=64),), align=4),
            fake_tensor(Int64, (t,), align=8),
            fake_tensor(Uint8, (sym(symbol="cache_bytes", width=64),), align=cache_align(enc)),
            fake_tensor(Float32, (1,), align=4),
            Int32(0), Int64(0), Int64(0), Float32(0.0), Int32(0), Int64(0), Int32(0),
            fake_stream(self.tvm_ffi),
            key.head_size,
            enc,
            IEEE_WEIGHTS,
        )

    def launch_args(self, key, token_to_req, positions, slot_mapping, block_table, rms_norm_weight,
                    cos_sin_cache, kv_slot_mapping, ops: CompressOperands, t) -> tuple[Any, ...]:
        st = ops.store
        nreq, width = block_table.shape
        bt_span = (nreq - 1) * ops.bt_stride + width if nreq and width else 0
        bt = block_table.as_strided((bt_span,), (1,))
        cs = cos_sin_cache.as_strided((cos_sin_cache.numel(),), (1,))          # contiguous (checked)
        nw = _unit(rms_norm_weight, rms_norm_weight.shape[0])
        scale = st.scale.as_strided((1,), (1,))      # fp8_scale [1], or the stand-in's first element
        return (ops.state, _unit(token_to_req, t), _unit(positions, t), _unit(slot_mapping, t), bt, nw, cs,
                _unit(kv_slot_mapping, t), st.cache, scale, ops.sbs, ops.block_stride, ops.bt_stride, ops.eps,
                st.kv_bs, st.page_stride, tokens_per_cta(t))


class C4CompressDsMlaCuTeDSL(_C4CompressCuTeDSL, C4CompressDsMlaBase,
                             CuTeDSLJitKernel["C4CompressDsMlaBase.CompileKey"]):
    """K5 on CuTeDSL (compiles anywhere, runs on CUDA); see the module docstring."""


class C4CompressPlainCuTeDSL(_C4CompressCuTeDSL, C4CompressPlainBase,
                             CuTeDSLJitKernel["C4CompressPlainBase.CompileKey"]):
    """K6 on CuTeDSL."""


class IndexerCompressCuTeDSL(_C4CompressCuTeDSL, IndexerCompressBase,
                             CuTeDSLJitKernel["IndexerCompressBase.CompileKey"]):
    """K9 on CuTeDSL."""
