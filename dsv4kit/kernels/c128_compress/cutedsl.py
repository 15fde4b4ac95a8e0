"""CuTeDSL backend of the C128 compressors: K7 (pool 128 rows) and K8a / K8b (norm, RoPE, store).

K7 mapping. CTAs of :data:`K7_WARPS` = 16 warps (512 threads), one per state block of the
window; 1-D grid of ``ceil(T / GROUP) * slices * NCHUNK`` CTAs, CTA ``b``: column chunk
``c = b % NCHUNK`` (the 8 chunks of a token are neighbours, so they share the metadata and
block-table lines in L2), token group ``g`` and slice ``s`` from ``b // NCHUNK = g * slices + s``.

1. Scan. Thread ``i < GROUP`` (warps 0..3; :data:`GROUP` = 128) loads token ``g * 128 + i``'s
   state slot, position and request row (three independent loads, one round trip). A boundary
   token (slot >= 0, ``p % 128 == 127``) gets its rank among the group's boundary tokens (warp
   ballots, the 4 warp counts through shared memory). Rank ``r`` belongs to slice ``r % slices``
   and becomes item ``r // slices`` of that CTA: token, position and request row go to a shared
   list; a CTA without items falls through after the scan (non-boundary tokens cost one 20-byte
   read per chunk CTA, nothing else, and their ``out`` rows are never written).
2. Per item (a CTA-uniform loop, not unrolled): warp ``w`` reads block-table entry
   ``bt[req, (p - 127) / 8 + w] = bt[req, 16 (p >> 7) + w]`` (one broadcast load), i.e. window
   rows ``8 w .. 8 w + 7`` = state rows 0..7 of that block, at element offset
   ``blk * block_stride + j * 1024`` (kv at ``[0, 512)``, score at ``[512, 1024)``; §2.8 with
   SW = D = 512, no overlap). Lane ``l`` owns columns ``64 c + 2 l, + 1``: 8 rows x (score, kv)
   = 16 loads of 8 bytes (``ld.global.v2``, a warp load = 256 contiguous bytes) when
   ``block_stride`` is even (always, in practice: the base is 16-byte aligned and every other
   offset even); element loads otherwise (a warp-uniform runtime branch). Two columns per lane,
   not four with 16-byte loads: that keeps 32 data registers per thread (< 64 registers), so
   two 512-thread CTAs share an SM and one's loads overlap the other's arithmetic.
3. Softmax with the window's true maximum: per column the warp's max over its 8 rows to shared
   memory (``sMax[w][64]``), barrier, every lane the max ``M`` over the 16 warps (max is exact,
   order-free); then ``e_j = exp(s_j - M)``, ``S_w = sum_j e_j``, ``A_w = sum_j fl(e_j * k_j)``
   (rows in order from +0) to shared memory, barrier; threads ``0 .. 63`` (warps 0, 1) sum
   the 16 partials in warp order and write ``out[t, 64 c + i] = div.rn(A, S)`` (256 contiguous
   bytes). Shared memory per CTA: 3 x 4 KiB partials + the 2 KiB item list + 16 bytes. The next
   item's first barrier orders its writes after this item's reads, so one buffer suffices.

Host: ``slices = max(1, min(T, 32 // groups))`` (:func:`k7_slices`): prefill (groups >= 32, about
one boundary token per group) runs one CTA per (group, chunk), 4096 CTAs at T = 65536 each
reading 64 KiB of state; small T launches ``min(T, 32)`` slices x 8 chunks (at most 256 CTAs,
one wave at two per SM), so that even a step where every token is a boundary (requests in
lockstep) spreads over the SMs instead of queueing in 8 CTAs, while a step without boundary
tokens costs one scan per CTA. Registers (sm_90a / sm_100a): 63 / 64, no spills.

K8a / K8b mapping. CTAs of :data:`K8_WARPS` = 4 warps; warp ``w`` of CTA ``b`` scans the
``tpw`` consecutive tokens ``t0 = (4 b + w) tpw ..`` (lane ``i < tpw`` loads token ``t0 + i``'s
position, slot, kv slot; ``tpw = clamp(T // 2048, 1, 32)``, :func:`k8_tokens_per_warp`: about
2048 warps at prefill, one token per warp at decode). A ballot marks the boundary tokens (slot
>= 0, kv slot >= 0, ``p % 128 == 127``) and the warp handles them one after the other: lane
``l`` loads dims ``[16 l, 16 l + 16)`` of ``compressed_kv[t]`` (element loads: the contract does
not promise a 16-byte aligned ``compressed_kv``), then :func:`~dsv4kit.kernels.c4_compress.
cutedsl.norm_rope` (RMSNorm: ordered lane sums, butterfly, ``rr = div.rn(1, sqrt.rn(fl(sum /
512) + eps))``, ``n = fl(fl(c * rr) * w)``; RoPE of lanes 28..31, GPT-J pairs, cos/sin row
``(p // 128) * 128``: the C4 kernels' code with ratio 128) and
:func:`~dsv4kit.kernels.encoders.cutedsl.encode_store` by the whole warp (E1 for K8a, E2 / E3
for K8b, picked by :func:`~dsv4kit.kernels.encoders.spec.key_encoder`). K8a passes the key's
``kv_cache_block_size`` and ``kv_block_stride`` as constants (compile-time page addresses, spec
K8a; the runtime values are passed too, equal by dispatch, and ignored); K8b passes them at
runtime.

Numerics. Every product and sum is an ``.rn`` instruction (never contracted into an FMA);
``exp`` is :func:`~dsv4kit.kernels.cute_numerics.exp_f32`, Triton's ``tl.exp``
(``ex2.approx.f32`` of ``fl(x log2 e)``: the spec allows approximate exp2 in K7; it replaced a
25-instruction exact exp); the one division per column is ``div.rn.f32``. K7 follows the FP32
rule: the pooled value ``fl(A / S)`` differs from the reference's ``sum_j fl(e_j / S) k_j`` by
rounding (about 24 roundings on terms bounded by ``max_j |k_j|``) and by the exp's error (2 ulp,
plus ``|x| 2^-24`` relative from rounding ``x log2 e``: a weighted mean of ``|x|`` of a few units
times ``2^-24``), both far inside ``1e-5 max_j |k_j|``. K8 computes
exactly the reference's sequence except the order of the sum of squares (compressor rule); the
encode step is the store hooks' routine, bit-exact given y.

One compile per key serves every T, request count, block-table width, state pool (blocks,
block stride) and, for K8b, every cache geometry; K8a's page geometry is the key's.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, Uint8

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.errors import input_error
from dsv4kit.kernels.c4_compress.cutedsl import norm_rope, state_fakes, warp_tokens
from dsv4kit.kernels.c128_compress.spec import (
    C128CompressBase,
    C128StoreDsMlaBase,
    C128StorePlainBase,
)
from dsv4kit.kernels.compressor.contract import LaunchOperands, flat, unit
from dsv4kit.kernels.cute_numerics import add_rn, div_rn, exp_f32, mul_rn, sub_rn
from dsv4kit.kernels.encoders.cutedsl import cache_align, encode_store
from dsv4kit.kernels.encoders.spec import E1, key_encoder

__all__ = ["GROUP", "K7_WARPS", "K8_WARPS", "NCHUNK", "C128CompressCuTeDSL", "C128StoreDsMlaCuTeDSL",
           "C128StorePlainCuTeDSL", "c128_compress_host", "c128_store_host", "k7_slices",
           "k8_tokens_per_warp"]

_D = 512                     # head = state width (C128: coff 1)
_ROW = 2 * _D                # state row: [kv (512) | score (512)]
_RATIO = 128
_SBS = 8                     # state block size (trap 5): the window is 16 whole blocks
_LOG2_RATIO = 7

#: K7: warps per CTA, one per state block of the 128-row window.
K7_WARPS = _RATIO // _SBS
#: K7: columns per lane and per CTA; column chunks per token.
_LANE_COLS = 2
_COLS = 32 * _LANE_COLS
NCHUNK = _D // _COLS
#: K7: tokens scanned per CTA (one per thread of warps 0..3).
GROUP = 128
#: K7: about this many token-group slices in flight for small T (times NCHUNK CTAs).
_SLICE_TARGET = 32

#: K8: warps per CTA; at most 32 tokens per warp (one per lane).
K8_WARPS = 4
_K8_WARPS_TARGET = 2048

_NORM_DTYPES = {"bfloat16": BFloat16, "float32": Float32}


def k7_slices(t: int) -> int:
    """Slices per token group for a K7 call of ``t`` tokens (module docstring)."""
    groups = -(-t // GROUP)
    return max(1, min(t, _SLICE_TARGET // groups))


def k8_tokens_per_warp(t: int) -> int:
    """Tokens each K8 warp scans for a call of ``t`` tokens (module docstring)."""
    return max(1, min(32, t // _K8_WARPS_TARGET))


# --------------------------------------------------------------------------- K7


@cute.jit
def _load_block(mState: cute.Tensor, base: Int64, sc: cute.Tensor, kv: cute.Tensor, vec: cutlass.Constexpr):
    """Scores and kv of the block's 8 rows at the lane's 2 columns (``base``: row 0, first column)."""
    for j in cutlass.range_constexpr(_SBS):
        at = base + Int64(j * _ROW)
        if cutlass.const_expr(vec):
            score = mState.iterator + cute.assume(at + Int64(_D), divby=2)
            cute.autovec_copy(cute.make_tensor(score, cute.make_layout(_LANE_COLS)), sc[None, j])
            value = mState.iterator + cute.assume(at, divby=2)
            cute.autovec_copy(cute.make_tensor(value, cute.make_layout(_LANE_COLS)), kv[None, j])
        else:
            for e in cutlass.range_constexpr(_LANE_COLS):
                sc[e, j] = mState[at + Int64(_D + e)]
                kv[e, j] = mState[at + Int64(e)]


@cute.jit
def _pair(buf: cute.Tensor, off: Int32) -> cute.Tensor:
    """The lane's 2 consecutive fp32 of a shared buffer (``off`` even: one 8-byte access)."""
    return cute.make_tensor(buf.iterator + cute.assume(off, divby=2), cute.make_layout(_LANE_COLS))


@cute.kernel
def _c128_compress_kernel(mState: cute.Tensor, mReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
                          mBT: cute.Tensor, mOut: cute.Tensor, block_stride: Int64, bt_stride: Int64,
                          slices: Int32):
    """The state pool, per-token arrays and block table as the C4 kernels take them
    (:func:`~dsv4kit.kernels.c4_compress.cutedsl.c4_compress_host`); ``mOut``: fp32 ``[*]`` out rows
    (stride 512), only boundary rows written."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = cute.arch.lane_idx()
    warp = tidx // 32
    n = mPos.shape[0]
    chunk = bidx % NCHUNK
    gs = bidx // NCHUNK
    g = gs // slices
    s = gs % slices

    smem = cutlass.memory.SmemAllocator()
    sCnt = smem.allocate_tensor(Int32, cute.make_layout(GROUP // 32), byte_alignment=16)
    sPos = smem.allocate_tensor(Int64, cute.make_layout(GROUP), byte_alignment=16)
    sTok = smem.allocate_tensor(Int32, cute.make_layout(GROUP), byte_alignment=16)
    sReq = smem.allocate_tensor(Int32, cute.make_layout(GROUP), byte_alignment=16)
    sMax = smem.allocate_tensor(Float32, cute.make_layout(_COLS * K7_WARPS), byte_alignment=16)
    sSum = smem.allocate_tensor(Float32, cute.make_layout(_COLS * K7_WARPS), byte_alignment=16)
    sAcc = smem.allocate_tensor(Float32, cute.make_layout(_COLS * K7_WARPS), byte_alignment=16)

    # 1. Scan the group: thread i < GROUP reads token g * GROUP + i.
    t = g * GROUP + tidx
    p = Int64(0)
    req = Int32(0)
    live = cutlass.Boolean(False)
    if tidx < GROUP and t < n:
        slot = mSlot[t]
        p = mPos[t]
        req = mReq[t]
        if slot >= Int64(0) and (p & Int64(_RATIO - 1)) == Int64(_RATIO - 1):
            live = cutlass.Boolean(True)
    ballot = cute.arch.vote_ballot_sync(live)
    if lane == 0 and warp < GROUP // 32:
        sCnt[warp] = cute.arch.popc(ballot)
    cute.arch.sync_threads()
    before = Int32(0)
    total = Int32(0)
    for w in cutlass.range_constexpr(GROUP // 32):
        cnt = sCnt[w]
        before = before + cutlass.select_(warp > w, cnt, Int32(0))
        total = total + cnt
    rank = before + cute.arch.popc(ballot & Int32(cute.arch.lanemask_lt()))
    if live and rank % slices == s:
        item = rank // slices
        sTok[item] = t
        sPos[item] = p
        sReq[item] = req
    cute.arch.sync_threads()
    nitems = Int32(0)
    if total > s:
        nitems = (total - s + slices - Int32(1)) // slices

    # 2./3. The CTA's items: warp w pools window rows 8w .. 8w + 7 at the chunk's columns.
    col = chunk * _COLS + lane * _LANE_COLS
    mine = warp * _COLS + lane * _LANE_COLS            # the lane's pair in a partials buffer
    vec_ok = (block_stride & Int64(1)) == Int64(0)
    for it in cutlass.range(nitems, unroll=1):
        ti = sTok[it]
        pi = sPos[it]
        ri = sReq[it]
        blk = mBT[Int64(ri) * bt_stride + ((pi >> Int64(_LOG2_RATIO)) << Int64(4)) + Int64(warp)]
        base = Int64(blk) * block_stride + Int64(col)
        sc = cute.make_rmem_tensor((_LANE_COLS, _SBS), Float32)
        kv = cute.make_rmem_tensor((_LANE_COLS, _SBS), Float32)
        if vec_ok:
            _load_block(mState, base, sc, kv, True)
        else:
            _load_block(mState, base, sc, kv, False)

        part = cute.make_rmem_tensor(_LANE_COLS, Float32)
        for e in cutlass.range_constexpr(_LANE_COLS):
            m = sc[e, 0]
            for j in cutlass.range_constexpr(1, _SBS):
                m = cute.arch.fmax(m, sc[e, j])
            part[e] = m
        cute.autovec_copy(part, _pair(sMax, mine))
        cute.arch.sync_threads()
        mx = cute.make_rmem_tensor(_LANE_COLS, Float32)
        cute.autovec_copy(_pair(sMax, lane * _LANE_COLS), mx)
        for w in cutlass.range_constexpr(1, K7_WARPS):
            cute.autovec_copy(_pair(sMax, w * _COLS + lane * _LANE_COLS), part)
            for e in cutlass.range_constexpr(_LANE_COLS):
                mx[e] = cute.arch.fmax(mx[e], part[e])

        ssum = cute.make_rmem_tensor(_LANE_COLS, Float32)
        acc = cute.make_rmem_tensor(_LANE_COLS, Float32)
        for e in cutlass.range_constexpr(_LANE_COLS):
            se = Float32(0.0)
            ae = Float32(0.0)
            for j in cutlass.range_constexpr(_SBS):
                x = exp_f32(sub_rn(sc[e, j], mx[e]))
                se = add_rn(se, x)
                ae = add_rn(ae, mul_rn(x, kv[e, j]))
            ssum[e] = se
            acc[e] = ae
        cute.autovec_copy(ssum, _pair(sSum, mine))
        cute.autovec_copy(acc, _pair(sAcc, mine))
        cute.arch.sync_threads()
        if tidx < _COLS:
            tot_s = Float32(0.0)
            tot_a = Float32(0.0)
            for w in cutlass.range_constexpr(K7_WARPS):
                tot_s = add_rn(tot_s, sSum[w * _COLS + tidx])
                tot_a = add_rn(tot_a, sAcc[w * _COLS + tidx])
            mOut[Int64(ti) * Int64(_D) + Int64(chunk * _COLS + tidx)] = div_rn(tot_a, tot_s)


@cute.jit
def c128_compress_host(
    mState: cute.Tensor,
    mReq: cute.Tensor,
    mPos: cute.Tensor,
    mSlot: cute.Tensor,
    mBT: cute.Tensor,
    mOut: cute.Tensor,
    block_stride: Int64,
    bt_stride: Int64,
    slices: Int32,
    stream: Any,
):
    """Launch K7: ``ceil(T / GROUP) * slices * NCHUNK`` CTAs of 512 threads (module docstring)."""
    n = mPos.shape[0]
    groups = (n + GROUP - 1) // GROUP
    _c128_compress_kernel(mState, mReq, mPos, mSlot, mBT, mOut, block_stride, bt_stride, slices).launch(
        grid=[groups * slices * NCHUNK, 1, 1], block=[32 * K7_WARPS, 1, 1], stream=stream)


class C128CompressCuTeDSL(C128CompressBase, CuTeDSLJitKernel["C128CompressBase.CompileKey"]):
    """K7 on CuTeDSL (compiles anywhere, runs on CUDA); see the module docstring."""

    jit_fn = c128_compress_host

    def warmup_inputs(self, key: Any) -> tuple[Any, ...]:
        # Every size is a symbol: T, the state / block-table / out spans are runtime values.
        return (
            *state_fakes(sym(symbol="T")),
            fake_tensor(Float32, (sym(symbol="out_elems", width=64),), align=4),
            Int64(0), Int64(0), Int32(1),
            fake_stream(self.tvm_ffi),
        )

    def launch_args(self, key: Any, ops: Any, run: LaunchOperands) -> tuple[Any, ...]:
        t, out = run.t, ops.out
        flat_out = out.as_strided((out.shape[0] * _D,), (1,))                  # strides (512, 1) (checked)
        return (run.state, unit(ops.token_to_req, t), unit(ops.positions, t), unit(ops.slot_mapping, t),
                flat(ops.block_table, run.bt_stride), flat_out, run.block_stride, run.bt_stride, k7_slices(t))


# --------------------------------------------------------------------------- K8a / K8b


@cute.kernel
def _c128_store_kernel(
    mKV: cute.Tensor,        # fp32 [T * 512] compressed_kv rows (4-byte aligned)
    mPos: cute.Tensor,       # int64 [T]
    mSlot: cute.Tensor,      # int64 [T] state slots (< 0: padding)
    mKvSlot: cute.Tensor,    # int64 [T] compressed-cache slots (< 0: skip)
    mNW: cute.Tensor,        # bf16 / fp32 [512] norm weight
    mCS: cute.Tensor,        # fp32 [max_pos * 64] cos/sin rows
    mCache: cute.Tensor,     # uint8 [*]: the cache from its first page (StoreOperands.cache)
    mScale: cute.Tensor,     # fp32 [1]: fp8_scale (E3), otherwise never read
    eps: Float32,
    kv_bs: Int32,
    page_stride: Int64,
    tpw: Int32,
    enc: cutlass.Constexpr,
    geom_bs: cutlass.Constexpr,
    geom_stride: cutlass.Constexpr,
):
    lane, _, first = warp_tokens(K8_WARPS, tpw)
    n = mPos.shape[0]

    t = first + lane
    p = Int64(0)
    kv_slot = Int64(-1)
    live = cutlass.Boolean(False)
    if lane < tpw and t < n:
        p = mPos[t]
        kv_slot = mKvSlot[t]
        slot = mSlot[t]
        if slot >= Int64(0) and kv_slot >= Int64(0) and (p & Int64(_RATIO - 1)) == Int64(_RATIO - 1):
            live = cutlass.Boolean(True)
    todo = cute.arch.vote_ballot_sync(live)
    for i in cutlass.range(tpw, unroll=1):
        if ((todo >> i) & Int32(1)) != Int32(0):                  # warp-uniform
            ti_p = cute.arch.shuffle_sync(p, i)
            ti_slot = cute.arch.shuffle_sync(kv_slot, i)
            row = Int64(first + i) * Int64(_D) + Int64(lane * 16)
            y = cute.make_rmem_tensor(16, Float32)
            for k in cutlass.range_constexpr(16):
                y[k] = mKV[row + Int64(k)]
            norm_rope(y, mNW, mCS, ti_p, eps, _D, _LOG2_RATIO)
            if cutlass.const_expr(geom_bs > 0):
                encode_store(y, mCache, mScale, ti_slot, Int32(geom_bs), Int64(geom_stride), enc, _D // 64)
            else:
                encode_store(y, mCache, mScale, ti_slot, kv_bs, page_stride, enc, _D // 64)


@cute.jit
def c128_store_host(
    mKV: cute.Tensor,
    mPos: cute.Tensor,
    mSlot: cute.Tensor,
    mKvSlot: cute.Tensor,
    mNW: cute.Tensor,
    mCS: cute.Tensor,
    mCache: cute.Tensor,
    mScale: cute.Tensor,
    eps: Float32,
    kv_bs: Int32,
    page_stride: Int64,
    tpw: Int32,
    stream: Any,
    enc: cutlass.Constexpr,
    geom_bs: cutlass.Constexpr,
    geom_stride: cutlass.Constexpr,
):
    """Launch K8a / K8b: ``ceil(T / (K8_WARPS * tpw))`` CTAs of 128 threads (module docstring).
    ``geom_bs > 0``: the page geometry ``(geom_bs, geom_stride)`` is compile time (K8a)."""
    n = mPos.shape[0]
    per_cta = K8_WARPS * tpw
    _c128_store_kernel(mKV, mPos, mSlot, mKvSlot, mNW, mCS, mCache, mScale, eps, kv_bs, page_stride, tpw,
                       enc, geom_bs, geom_stride).launch(
        grid=[(n + per_cta - 1) // per_cta, 1, 1], block=[32 * K8_WARPS, 1, 1], stream=stream)


class _C128StoreCuTeDSL:
    """What K8a and K8b share (a mixin): the fakes and the runtime arguments."""

    jit_fn = c128_store_host
    name: str
    tvm_ffi: bool

    @staticmethod
    def _geometry(key: Any) -> tuple[int, int]:
        """K8a's compile-time ``(kv_bs, page stride)``; ``(0, 0)`` (runtime) for K8b."""
        bs = getattr(key, "kv_cache_block_size", None)
        return (0, 0) if bs is None else (bs, key.kv_block_stride)

    def warmup_inputs(self, key: Any) -> tuple[Any, ...]:
        # Every size is a symbol: T, the cos-sin and cache spans (and K8b's geometry) are runtime.
        if key.norm_weight_dtype not in _NORM_DTYPES:
            raise input_error(self.name, "norm_weight_dtype", f"one of {list(_NORM_DTYPES)}",
                              key.norm_weight_dtype)
        enc = key_encoder(key)
        geom = self._geometry(key)
        if (geom[0] > 0) != (enc == E1):
            raise input_error(self.name, "key", "page geometry in the key iff the encoder is E1", key)
        t = sym(symbol="T")
        nw = _NORM_DTYPES[key.norm_weight_dtype]
        return (
            fake_tensor(Float32, (sym(symbol="kv_elems", width=64),), align=4),
            fake_tensor(Int64, (t,), align=8),
            fake_tensor(Int64, (t,), align=8),
            fake_tensor(Int64, (t,), align=8),
            fake_tensor(nw, (key.head_size,), align=nw.width // 8),
            fake_tensor(Float32, (sym(symbol="cos_sin_elems", width=64),), align=4),
            fake_tensor(Uint8, (sym(symbol="cache_bytes", width=64),), align=cache_align(enc)),
            fake_tensor(Float32, (1,), align=4),
            Float32(0.0), Int32(0), Int64(0), Int32(1),
            fake_stream(self.tvm_ffi),
            enc,
            *geom,
        )

    def launch_args(self, key: Any, ops: Any, run: LaunchOperands) -> tuple[Any, ...]:
        st, t = run.store, run.t
        kv = ops.compressed_kv.as_strided((t * _D,), (1,))                  # strides (512, 1) (checked)
        scale = st.scale.as_strided((1,), (1,))      # fp8_scale [1], or the stand-in's first element
        return (kv, unit(ops.positions, t), unit(ops.slot_mapping, t), unit(ops.kv_slot_mapping, t),
                unit(ops.rms_norm_weight, ops.rms_norm_weight.shape[0]), flat(ops.cos_sin_cache), st.cache,
                scale, run.eps, st.kv_bs, st.page_stride, k8_tokens_per_warp(t))


class C128StoreDsMlaCuTeDSL(_C128StoreCuTeDSL, C128StoreDsMlaBase,
                            CuTeDSLJitKernel["C128StoreDsMlaBase.CompileKey"]):
    """K8a on CuTeDSL: E1, page geometry from the key (compile time)."""


class C128StorePlainCuTeDSL(_C128StoreCuTeDSL, C128StorePlainBase,
                            CuTeDSLJitKernel["C128StorePlainBase.CompileKey"]):
    """K8b on CuTeDSL: E2 / E3, page geometry at runtime."""
