"""CuTeDSL kernels for indexer-Q RoPE + quant (spec K1 FP8, K2 MXFP4).

``index_q`` is seen as rows ``r = t * 64 + h`` of 128 bf16. A CTA has 4 warps; a warp owns
consecutive rows of one token in slots of :data:`SLOT_ROWS` = 4 rows, issues all their loads
first, fetches the token's position and then its cos/sin once, then computes. The key's
``coarsen`` sets the slots per warp (:func:`slots_per_warp`): :data:`SPLIT_SLOTS` = 4 for the
prefill key (coarsen 4, T >= 512: 16 rows a warp, a CTA one token), 1 for the decode key
(coarsen 1: 4 rows a warp, four times the warps for a decode step's few rows). The arithmetic per
element is the same, so the results do not depend on ``coarsen`` (spec K1).

Mapping: slot ``j`` is rows ``first + 4j + g`` with ``g = lane // 8``: lane ``8g + k`` holds dims
``8k .. 8k+7`` (nope) and ``64+8k .. 64+8k+7`` (rope) of its row, two 16-byte loads, and each
warp-wide load covers 4 rows' halves (4 x 128 contiguous bytes). Every lane rotates 4 GPT-J pairs
(``4k .. 4k+3``), so no rotation is computed and thrown away, and the position and 8 cos/sin values
are loaded once per warp. The FP8 row amax is a max over the lane's 16 values and a butterfly over
its 8 lanes (3 shuffles; two slots share one bf16x2 word). In K2 lanes ``8g .. 8g+3`` hold blocks 0
(nope) and 2 (rope), lanes ``8g+4 .. 8g+7`` blocks 1 and 3: one bf16x2 word carries both of a
lane's block maxima through a 4-lane butterfly (2 shuffles). Codes are stored as two 8-byte (K1) or
4-byte (K2) words per slot. Lane ``8g + k`` (``k`` below the slot count) stores the weight of row
``first + 4k + g`` and, in K2, that row's scale as one int32 (its bytes plus those of lane ``8g + k
+ 4``, one shuffle).

Why: the earlier row layout (a lane 4 dims of one row, 8-byte loads) spent half of every rope
instruction on discarded lanes, 2.5 shuffles a row, and a position and cos/sin round trip, index
math and a weight per 4 rows. Static SASS (``benchmarks/sass_mix.py``, sm_90a), instructions per
model byte at T = 65536: 5.26 -> 2.46 (K1) and 6.92 -> 3.92 (K2); the decode key kept the row
layout until 2026-12-06 (9.1 / 11.8 instructions per model byte at T = 256, issue-bound in the
static pipe model, 3.3-3.4 us over an empty kernel on the H100). The cost is registers (48 and 42
at 4 slots: theoretical occupancy 0.62) with 64-128 bytes of loads in flight per thread; the
Triton twins run a whole token per 4-warp program and reach the copy rate.

Every product/sum is an ``.rn`` instruction (no FMA contraction). Rope values are rounded to
bf16 by the hardware RNE ``cvt.rn.bf16x2.f32`` (spec §2.1 rule 3), e4m3 (K1) by the hardware
RNE conversion. MXFP4 (K2): a lane's values stay packed bf16x2 words through the amax, the
scaling and the E2M1 rounding (two elements per instruction: the recipes
:func:`~dsv4kit.kernels.cute_numerics.mx_scale_byte` and
:func:`~dsv4kit.kernels.cute_numerics.mxfp4_lane`, shared with the encoder E5). Row offsets
are int32, as before (``R * 32`` < 2^31: T below 2^20 tokens).
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int16, Int32, Int64, Uint8, Uint32, Uint64

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.errors import input_error
from dsv4kit.kernels.cute_numerics import (
    add_rn,
    bf16x2_op,
    bf16x2_rn,
    clog2,
    e4m3x4,
    mul_rn,
    mx_scale_byte,
    mxfp4_lane,
    pow2,
    prmt,
    select,
    sub_rn,
)
from dsv4kit.kernels.indexer_q.spec import IndexerQBase

__all__ = ["IndexerQFp8CuTeDSL", "IndexerQMxfp4CuTeDSL"]

WARPS_PER_CTA = 4
NUM_HEADS = 64
HEAD_SHIFT = 6
assert NUM_HEADS == 1 << HEAD_SHIFT
_WORDS_PER_ROW = 32          # a row of 128 bf16 as 64-bit words: 32, and as int32 output words
#: Rows a slot holds: one 16-byte load per lane covers 4 rows (8 lanes a row, nope and rope halves).
SLOT_ROWS = 4
#: Slots per warp of the prefill key (SLOT_ROWS * SPLIT_SLOTS rows of one token).
SPLIT_SLOTS = 4


@cute.jit
def _unpack2(w: Uint32):
    """The two bf16 of a bf16x2 word (low half first) as exact fp32 values."""
    return (w << Uint32(16)).bitcast(Float32), (w & Uint32(0xFFFF0000)).bitcast(Float32)


def slots_per_warp(coarsen: int) -> int:
    """Slots (of :data:`SLOT_ROWS` rows) a warp owns: :data:`SPLIT_SLOTS` for the prefill key
    (coarsen 4), 1 for the decode key (coarsen 1: four times the warps for the few rows)."""
    return SPLIT_SLOTS if coarsen >= SLOT_ROWS else 1


def rows_per_warp(coarsen: int) -> int:
    """Rows (heads of one token) a warp owns. It divides 64: a warp never straddles two tokens."""
    rows = SLOT_ROWS * slots_per_warp(coarsen)
    assert NUM_HEADS % rows == 0, rows
    return rows


def rows_per_cta(coarsen: int) -> int:
    """Rows a CTA covers (the host functions' grid is ``cdiv(num_rows, rows_per_cta(coarsen))``)."""
    return WARPS_PER_CTA * rows_per_warp(coarsen)


def _words(v: cute.Tensor) -> list:
    """The 4 bf16x2 words of a 16-byte register tensor of two int64 (8 dims, low half first)."""
    out = []
    for i in range(2):
        u = Uint64(v[i])
        out += [Uint32(u & Uint64(0xFFFFFFFF)), Uint32(u >> Uint64(32))]
    return out


@cute.jit
def _load8(mQ: cute.Tensor, off: Int32) -> cute.Tensor:
    """8 bf16 of ``mQ`` (int64 words) from word ``off`` (even, so 16-byte aligned): one 16-byte load."""
    v = cute.make_rmem_tensor(2, Int64)
    cute.autovec_copy(cute.make_tensor(mQ.iterator + cute.assume(off, divby=2), cute.make_layout(2)), v)
    return v


@cute.jit
def _store_words(mOut: cute.Tensor, off: Int32, vals: list, elems: cutlass.Constexpr):
    """Store ``len(vals)`` 32-bit words at element ``off`` of ``mOut`` (``elems`` elements of it a
    word; ``off`` a multiple of ``elems * len(vals)``): one 4- or 8-byte store."""
    n = len(vals)
    w = cute.make_rmem_tensor(n, Int32)
    for i in cutlass.range_constexpr(n):
        w[i] = vals[i].bitcast(Int32)
    ptr = cute.recast_ptr(mOut.iterator + cute.assume(off, divby=elems * n), dtype=Int32)
    cute.autovec_copy(w, cute.make_tensor(ptr, cute.make_layout(n)))


@cute.jit
def _cos_sin8(mPos, mCS, first, k):
    """cos and sin (4 each, fp32) of GPT-J pairs ``4k .. 4k+3`` at the token of ``first``."""
    p = Int64(mPos[first >> HEAD_SHIFT])         # first >= 0: a shift, not a signed division
    i = k * 4
    return ([mCS[p, i + m].to(Float32) for m in range(4)],
            [mCS[p, 32 + i + m].to(Float32) for m in range(4)])


def _rope8(xs: list, cs) -> list:
    """The 4 rope words of a lane (pairs 4k+m, dims 64+8k+2m | 65+8k+2m) rotated (no FMA) and
    rounded by the hardware RNE cvt (the bf16x2 word of dims 2m | 2m + 1, low half first)."""
    out = []
    for m in range(4):
        x0, x1 = _unpack2(xs[m])
        c, s = cs[0][m], cs[1][m]
        out.append(bf16x2_rn(add_rn(mul_rn(x1, c), mul_rn(x0, s)), sub_rn(mul_rn(x0, c), mul_rn(x1, s))))
    return out


def _absmax_word(ws: list) -> Uint32:
    """Per half, the max of |bf16| over the words ``ws`` (a bf16x2 word, both halves a partial max)."""
    ms = [w & Uint32(0x7FFF7FFF) for w in ws]
    while len(ms) > 1:
        ms = [bf16x2_op("max", ms[i], ms[i + 1]) for i in range(0, len(ms), 2)]
    return ms[0]


def _fold_pair(a: Uint32, b: Uint32) -> Uint32:
    """``max(a.lo, a.hi)`` in the low half, ``max(b.lo, b.hi)`` in the high half (bf16x2)."""
    return bf16x2_op("max", prmt(a, b, 0x5410), prmt(a, b, 0x7632))


def _bfly_max(m: Uint32, lanes: int) -> Uint32:
    """bf16x2 max over ``lanes`` consecutive aligned lanes (a butterfly)."""
    offset = lanes // 2
    while offset >= 1:
        m = bf16x2_op("max", m, cute.arch.shuffle_sync_bfly(m, offset=offset))
        offset //= 2
    return m


def _lane_coords(slots: int) -> tuple:
    """The lane's coordinates: ``(g, k, first)``, lane ``8g + k`` of the warp whose first row is
    ``first`` (``SLOT_ROWS * slots`` rows a warp, :data:`WARPS_PER_CTA` warps a CTA)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane = tidx % 32
    first = (bidx * WARPS_PER_CTA + tidx // 32) * (SLOT_ROWS * slots)
    return lane // 8, lane % 8, first


def _slot_loads(mPos, mQ, mCS, g, k, first, slots: int) -> tuple:
    """Every load of a lane, issued up front: per slot j its row's (nope, rope) 16-byte
    pairs (row ``first + 4j + g``, dims 8k.. and 64 + 8k..), and the token's cos / sin of dims 8k.."""
    at = (first + g) * 32 + k * 2                       # int64 word of the lane's first nope dim, slot 0
    vals = [(_load8(mQ, at + j * 128), _load8(mQ, at + j * 128 + 16)) for j in range(slots)]
    return vals, _cos_sin8(mPos, mCS, first, k)


@cute.kernel
def _fp8_kernel(mPos, mQ, mCS, mW, mQout, mWout, num_rows: Int32, ss: Float32, hs: Float32,
                      slots: cutlass.Constexpr):
    """K1: slot j of the warp is rows ``first + 4j + g`` (g = lane // 8); lane
    ``8g + k`` holds dims 8k..8k+7 and 64+8k..64+8k+7 of its row (two 16-byte loads), so every
    lane rotates 8 dims and none computes a discarded rotation. The row amax is a max over the
    lane's 16 values and a butterfly over its 8 lanes (two slots share one bf16x2 word). Lane
    ``8g + k`` with ``k < slots`` stores the weight of row ``first + 4k + g``."""
    g, k, first = _lane_coords(slots)
    # num_rows is a multiple of 64 and rows_per_warp divides 64: a warp is all in range, one token.
    if first < num_rows:
        vals, cs = _slot_loads(mPos, mQ, mCS, g, k, first, slots)
        ws = [_words(n) + _rope8(_words(r), cs) for n, r in vals]   # 8 bf16x2 words a slot
        e_mine = Int32(0)                                # lane 8g + k (k < slots): row 4k + g's exponent
        for j0 in cutlass.range_constexpr(0, slots, 2):  # slots in pairs: one word through the butterfly
            lm = [_absmax_word(ws[j]) for j in range(j0, min(j0 + 2, slots))]
            m = _bfly_max(_fold_pair(lm[0], lm[1]) if len(lm) == 2 else lm[0], 8)
            lo, hi = _unpack2(m)
            amaxes = [lo, hi] if len(lm) == 2 else [cute.arch.fmax(lo, hi)]
            for jj in cutlass.range_constexpr(len(lm)):
                j = j0 + jj
                # D1: floor before dividing; multiply by fl(1/448) (§2.1: same clog2 as / 448).
                e = clog2(mul_rn(cute.arch.fmax(amaxes[jj], Float32(1e-4)), Float32(1.0 / 448.0)))
                inv = pow2(-e)
                ys = [y for w in ws[j] for y in _unpack2(w)]
                q = [e4m3x4(mul_rn(ys[i], inv), mul_rn(ys[i + 1], inv), mul_rn(ys[i + 2], inv),
                            mul_rn(ys[i + 3], inv)) for i in range(0, 16, 4)]
                row_at = (first + j * 4 + g) * 32 + k * 2  # int32 words of 4 e4m3 bytes
                _store_words(mQout, row_at, q[0:2], 1)
                _store_words(mQout, row_at + 16, q[2:4], 1)
                e_mine = e if j == 0 else select(k == j, e, e_mine, Int32)
        if k < slots:                                    # one weight store per thread, not per row
            row = first + k * 4 + g
            w = mW[row].to(Float32)
            mWout[row] = mul_rn(mul_rn(mul_rn(w, pow2(e_mine)), ss), hs)


@cute.kernel
def _mxfp4_kernel(mPos, mQ, mCS, mW, mQout, mScale, mWout, num_rows: Int32, ss: Float32,
                        hs: Float32, slots: cutlass.Constexpr):
    """K2 (the layout of :func:`_fp8_kernel`): lanes ``8g .. 8g+3`` hold MXFP4 blocks 0
    (nope) and 2 (rope) of their row, lanes ``8g+4 .. 8g+7`` blocks 1 and 3, so one bf16x2 word
    carries both of a lane's block maxima (nope low, rope high) through a 4-lane butterfly. A
    lane stores its 16 codes as two 4-byte words. The scale word of row ``first + 4k + g`` is
    assembled in lane ``8g + k`` (k < slots) from its bytes and lane ``8g + k + 4``'s (one
    shuffle) and stored as one int32."""
    g, k, first = _lane_coords(slots)
    if first < num_rows:
        vals, cs = _slot_loads(mPos, mQ, mCS, g, k, first, slots)
        sel = k % 4                                      # the slot whose scale bytes this lane gathers
        mine = Uint32(0)
        for j in cutlass.range_constexpr(slots):
            nope = _words(vals[j][0])
            rope = _rope8(_words(vals[j][1]), cs)
            m = _bfly_max(_fold_pair(_absmax_word(nope), _absmax_word(rope)), 4)
            a_nope, a_rope = _unpack2(m)
            b_nope, b_rope = mx_scale_byte(a_nope), mx_scale_byte(a_rope)   # ue8m0 bytes, 1..254
            codes = [prmt(mxfp4_lane(ws[0], ws[1], b), mxfp4_lane(ws[2], ws[3], b), 0x5410)
                     for ws, b in ((nope, b_nope), (rope, b_rope))]     # bytes 4k..4k+3 of a half
            row_at = (first + j * 4 + g) * 32 + k * 2       # int16 words of 2 code bytes
            _store_words(mQout, row_at, codes[0:1], 2)
            _store_words(mQout, row_at + 16, codes[1:2], 2)
            v = b_nope | (b_rope << Uint32(16))             # blocks k // 4 (byte 0), 2 + k // 4 (byte 2)
            mine = v if j == 0 else select(sel == j, v, mine, Uint32)
        other = cute.arch.shuffle_sync_bfly(mine, offset=4)   # lane 8g + k + 4: blocks 1 and 3
        if k < slots:                                    # q_scale as one int32 per row
            row = first + k * 4 + g
            _store_words(mScale, row * 4, [mine | (other << Uint32(8))], 4)
            w = mW[row].to(Float32)
            mWout[row] = mul_rn(mul_rn(w, ss), hs)


def _grid(num_rows: Int32, coarsen: int) -> list:
    per_cta = rows_per_cta(coarsen)
    return [(num_rows + per_cta - 1) // per_cta, 1, 1]


@cute.jit
def launch_fp8(mPos: cute.Tensor, mQ: cute.Tensor, mCS: cute.Tensor, mW: cute.Tensor, mQout: cute.Tensor,
               mWout: cute.Tensor, num_rows: Int32, ss: Float32, hs: Float32, stream: cuda.CUstream,
               coarsen: cutlass.Constexpr):
    """K1. ``mQ`` int64 [R, 32] (4 bf16 each); ``mQout`` int32 [R, 32] (4 e4m3 bytes); weights [R]."""
    kernel = _fp8_kernel(mPos, mQ, mCS, mW, mQout, mWout, num_rows, ss, hs, slots_per_warp(coarsen))
    kernel.launch(grid=_grid(num_rows, coarsen), block=[32 * WARPS_PER_CTA, 1, 1], stream=stream)


@cute.jit
def launch_mxfp4(mPos: cute.Tensor, mQ: cute.Tensor, mCS: cute.Tensor, mW: cute.Tensor, mQout: cute.Tensor,
                 mScale: cute.Tensor, mWout: cute.Tensor, num_rows: Int32, ss: Float32, hs: Float32,
                 stream: cuda.CUstream, coarsen: cutlass.Constexpr):
    """K2. ``mQout`` int16 [R, 32] (2 packed bytes each); ``mScale`` uint8 [R, 4] (the int32 words)."""
    kernel = _mxfp4_kernel(mPos, mQ, mCS, mW, mQout, mScale, mWout, num_rows, ss, hs,
                                 slots_per_warp(coarsen))
    kernel.launch(grid=_grid(num_rows, coarsen), block=[32 * WARPS_PER_CTA, 1, 1], stream=stream)


_CS_DTYPES = {"float32": Float32, "bfloat16": BFloat16}


class _CuteLaunch:
    """Fake inputs shared by the two CuTeDSL variants (a mixin)."""

    name: str
    tvm_ffi: bool

    def _shared_fakes(self, key: IndexerQBase.CompileKey) -> tuple[tuple[Any, ...], Any]:
        t, r, p = sym(symbol="T"), sym(symbol="R"), sym(symbol="max_pos")
        if key.cos_sin_dtype not in _CS_DTYPES:
            raise input_error(self.name, "cos_sin_dtype", f"one of {list(_CS_DTYPES)}", key.cos_sin_dtype)
        return (
            fake_tensor(Int64, (t,), align=8),                              # positions
            fake_tensor(Int64, (r, key.head_dim // 4)),                     # index_q as [R, 32] words
            fake_tensor(_CS_DTYPES[key.cos_sin_dtype], (p, key.rope_dim), align=4),
            fake_tensor(BFloat16, (r,), align=2),                           # index_weights [R]
        ), r

    def _rows(self, out: torch.Tensor) -> int:
        """Rows (token-heads) of the call; the kernels' row offsets are int32 words (module
        docstring): past ``2^31`` words a clear error, not a wrapped address."""
        rows = out.shape[0] * out.shape[1]
        if rows * _WORDS_PER_ROW >= 2**31:
            limit = 2**31 // _WORDS_PER_ROW // NUM_HEADS
            raise input_error(self.name, "index_q", f"fewer than {limit} tokens on the CuTeDSL backend "
                              "(int32 row offsets)", f"{out.shape[0]} tokens")
        return rows


class IndexerQFp8CuTeDSL(_CuteLaunch, IndexerQBase, CuTeDSLJitKernel["IndexerQBase.CompileKey"]):
    """K1 on CuTeDSL: ``q_out`` written as int32 words of 4 e4m3 bytes."""

    cache_format = "fp8"
    jit_fn = launch_fp8

    def warmup_inputs(self, key: IndexerQBase.CompileKey) -> tuple[Any, ...]:
        shared, r = self._shared_fakes(key)
        q_out = fake_tensor(Int32, (r, key.head_dim // 4))
        w_out = fake_tensor(Float32, (r,), align=4)
        return (*shared, q_out, w_out, Int32(0), Float32(0.0), Float32(0.0), fake_stream(self.tvm_ffi),
                key.coarsen)

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_fp8, w_out = outs
        rows = self._rows(q_fp8)
        return (positions, index_q.view(torch.int64).view(rows, -1), cos_sin_cache, index_weights.view(rows),
                q_fp8.view(torch.int32).view(rows, -1), w_out.view(rows), rows, ss, hs)


class IndexerQMxfp4CuTeDSL(_CuteLaunch, IndexerQBase, CuTeDSLJitKernel["IndexerQBase.CompileKey"]):
    """K2 on CuTeDSL: packed codes as int16 words (2 bytes per lane), int32 scale words."""

    cache_format = "mxfp4"
    jit_fn = launch_mxfp4

    def warmup_inputs(self, key: IndexerQBase.CompileKey) -> tuple[Any, ...]:
        shared, r = self._shared_fakes(key)
        q_out = fake_tensor(Int16, (r, key.head_dim // 4))
        scale = fake_tensor(Uint8, (r, key.head_dim // 32))
        w_out = fake_tensor(Float32, (r,), align=4)
        return (*shared, q_out, scale, w_out, Int32(0), Float32(0.0), Float32(0.0),
                fake_stream(self.tvm_ffi), key.coarsen)

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_packed, q_scale, w_out = outs
        rows = self._rows(q_packed)
        return (positions, index_q.view(torch.int64).view(rows, -1), cos_sin_cache, index_weights.view(rows),
                q_packed.view(torch.int16).view(rows, -1), q_scale.view(torch.uint8).view(rows, -1),
                w_out.view(rows), rows, ss,
                hs)
