"""CuTeDSL backend of K4 save_partial_states (spec K4, §2.8).

Mapping (all from the key): a token's SW columns are ``SW / VEC`` vectors of ``VEC`` fp32
(``VEC = 4``, 16 bytes, when SW % 4 == 0, else 1). CTA ``b`` of :data:`THREADS` threads owns
tokens ``[b * TPC, (b + 1) * TPC) ∩ [0, T)``, ``TPC = max(1, THREADS * ITEMS / (SW / VEC))``
(1 / 2 / 4 tokens for SW 1024 / 512 / 256; ``ITEMS`` = 2). Thread ``x`` handles the items
``i = x + j * THREADS``, ``j < ITEMS``: token ``b * TPC + i // (SW / VEC)``, columns from
``(i % (SW / VEC)) * VEC``, so consecutive threads touch consecutive 16 bytes of one row
(coalesced). Per thread: phase 1 loads the items' slots and positions, phase 2 issues every
kv/score/ape load (items whose slot is < 0 load nothing), phase 3 adds and stores both halves
of the state row. No load waits behind a store.

Operands are the anchors both backends launch with (:func:`~dsv4kit.kernels.save_partial_states.
spec.state_operands`): 1-D fp32 spans that start 16-byte aligned, a lead of 0..3 elements, runtime
int64 strides. With the host's ``vec_ok`` flag (leads 0, strides multiples of 4) each vector is
one 16-byte access; otherwise the same items are moved element by element. One compile per key
serves both, and slices, separate tensors and pooled caches alike.

Numerics: kv is copied bit for bit (loads and stores move bits), the score half is one
``add.rn.f32`` (never contracted, spec §2.1 rule 1).
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.kernels.cute_numerics import add_rn
from dsv4kit.kernels.save_partial_states.spec import GPU_ELEMS, SavePartialStatesBase, state_operands

__all__ = ["SavePartialStatesCuTeDSL", "launch_layout", "save_partial_states_host"]

#: Threads per CTA, and vectors per thread and tensor (THREADS * ITEMS * VEC = GPU_ELEMS columns).
THREADS = 128
ITEMS = GPU_ELEMS // (THREADS * 4)


def launch_layout(sw: int) -> tuple[int, int, int]:
    """``(VEC, TPC, items)`` for state width ``sw``: vector width, tokens per CTA, items per thread."""
    vec = 4 if sw % 4 == 0 else 1
    vpt = sw // vec
    tpc = max(1, THREADS * ITEMS // vpt)
    return vec, tpc, -(-tpc * vpt // THREADS)


def _vector(base: cute.Tensor, off: Int64, vec: int) -> cute.Tensor:
    """``vec`` elements of ``base`` from ``off``, a multiple of ``vec`` (host-checked: ``vec_ok``)."""
    return cute.make_tensor(base.iterator + cute.assume(off, divby=vec), cute.make_layout(vec))


@cute.kernel
def _save_states_kernel(
    mKV: cute.Tensor,       # fp32 [*] anchor: kv row t at kv_lead + t * kv_stride
    mSc: cute.Tensor,       # fp32 [*] anchor of score
    mApe: cute.Tensor,      # fp32 [*] anchor of ape: row r at ape_lead + r * ape_stride
    mPos: cute.Tensor,      # int64 [>= T]
    mState: cute.Tensor,    # fp32 [*] state cache: row (b, o) at b * block_stride + o * 2 SW
    mSlot: cute.Tensor,     # int64 [T]
    T: Int32,
    kv_lead: Int32,
    kv_stride: Int64,
    sc_lead: Int32,
    sc_stride: Int64,
    ape_lead: Int32,
    ape_stride: Int64,
    block_stride: Int64,
    vec_ok: Int32,
    sw: cutlass.Constexpr,
    ratio: cutlass.Constexpr,
    sbs: cutlass.Constexpr,
):
    vec, tpc, items = launch_layout(sw)
    vpt = sw // vec
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    first = bidx * tpc

    # Phase 1: slots and positions of the thread's items (-1: nothing to do).
    slots = cute.make_rmem_tensor(items, Int64)
    poss = cute.make_rmem_tensor(items, Int64)
    for j in cutlass.range_constexpr(items):
        i = tidx + j * THREADS
        tok = first + i // vpt
        slots[j] = Int64(-1)
        poss[j] = Int64(0)
        if i < tpc * vpt and tok < T:
            slots[j] = mSlot[tok]
            poss[j] = mPos[tok]

    # Phase 2: every load.
    kvr = cute.make_rmem_tensor((vec, items), Float32)
    scr = cute.make_rmem_tensor((vec, items), Float32)
    aper = cute.make_rmem_tensor((vec, items), Float32)
    for j in cutlass.range_constexpr(items):
        if slots[j] >= Int64(0):
            item = tidx + j * THREADS
            tok64 = Int64(first + item // vpt)
            col = Int64((item % vpt) * vec)
            arow = poss[j] % Int64(ratio)
            if vec_ok != Int32(0):
                cute.autovec_copy(_vector(mKV, tok64 * kv_stride + col, vec), kvr[None, j])
                cute.autovec_copy(_vector(mSc, tok64 * sc_stride + col, vec), scr[None, j])
                cute.autovec_copy(_vector(mApe, arow * ape_stride + col, vec), aper[None, j])
            else:
                kv_at = Int64(kv_lead) + tok64 * kv_stride + col
                sc_at = Int64(sc_lead) + tok64 * sc_stride + col
                ape_at = Int64(ape_lead) + arow * ape_stride + col
                for e in cutlass.range_constexpr(vec):
                    kvr[e, j] = mKV[kv_at + e]
                    scr[e, j] = mSc[sc_at + e]
                    aper[e, j] = mApe[ape_at + e]

    # Phase 3: fl(score + ape), then both halves of the row.
    for j in cutlass.range_constexpr(items):
        s = slots[j]
        if s >= Int64(0):
            col = Int64(((tidx + j * THREADS) % vpt) * vec)
            at = (s // sbs) * block_stride + (s % sbs) * Int64(2 * sw) + col
            total = cute.make_rmem_tensor(vec, Float32)
            for e in cutlass.range_constexpr(vec):
                total[e] = add_rn(scr[e, j], aper[e, j])
            if vec_ok != Int32(0):
                cute.autovec_copy(kvr[None, j], _vector(mState, at, vec))
                cute.autovec_copy(total, _vector(mState, at + Int64(sw), vec))
            else:
                for e in cutlass.range_constexpr(vec):
                    mState[at + e] = kvr[e, j]
                    mState[at + sw + e] = total[e]


@cute.jit
def save_partial_states_host(
    mKV: cute.Tensor,
    mSc: cute.Tensor,
    mApe: cute.Tensor,
    mPos: cute.Tensor,
    mState: cute.Tensor,
    mSlot: cute.Tensor,
    T: Int32,
    kv_lead: Int32,
    kv_stride: Int64,
    sc_lead: Int32,
    sc_stride: Int64,
    ape_lead: Int32,
    ape_stride: Int64,
    block_stride: Int64,
    vec_ok: Int32,
    stream: Any,
    sw: cutlass.Constexpr,
    ratio: cutlass.Constexpr,
    sbs: cutlass.Constexpr,
):
    """Launch K4 on ``ceil(T / TPC)`` CTAs of ``THREADS`` threads (see the module docstring)."""
    _, tpc, _ = launch_layout(sw)
    _save_states_kernel(mKV, mSc, mApe, mPos, mState, mSlot, T, kv_lead, kv_stride, sc_lead, sc_stride,
                        ape_lead, ape_stride, block_stride, vec_ok, sw, ratio, sbs).launch(
        grid=[(T + tpc - 1) // tpc, 1, 1], block=[THREADS, 1, 1], stream=stream)


class SavePartialStatesCuTeDSL(SavePartialStatesBase, CuTeDSLJitKernel["SavePartialStatesBase.CompileKey"]):
    """K4 on CuTeDSL (compiles anywhere, runs on CUDA); see the module docstring."""

    jit_fn = save_partial_states_host

    def warmup_inputs(self, key: SavePartialStatesBase.CompileKey) -> tuple[Any, ...]:
        # Every size is a symbol: spans, T and the positions' length are runtime values.
        return (
            fake_tensor(Float32, (sym(symbol="kv_elems", width=64),)),        # anchors: 16-byte aligned
            fake_tensor(Float32, (sym(symbol="score_elems", width=64),)),
            fake_tensor(Float32, (sym(symbol="ape_elems", width=64),)),
            fake_tensor(Int64, (sym(symbol="num_positions"),), align=8),
            fake_tensor(Float32, (sym(symbol="state_elems", width=64),)),     # §2.8: data_ptr % 16 == 0
            fake_tensor(Int64, (sym(symbol="T"),), align=8),
            Int32(0), Int32(0), Int64(0), Int32(0), Int64(0), Int32(0), Int64(0), Int64(0), Int32(0),
            fake_stream(self.tvm_ffi),
            key.state_width,
            key.compress_ratio,
            key.state_block_size,
        )

    def launch_args(self, kv, score, ape, positions, state_cache, slot_mapping, t) -> tuple[Any, ...]:
        (kv_a, kv_lead, kv_s, sc_a, sc_lead, sc_s, ape_a, ape_lead, ape_s, state, bstride,
         vec_ok) = state_operands(self.name, kv, score, ape, state_cache, t)
        return (kv_a, sc_a, ape_a, positions, state, slot_mapping, t, kv_lead, kv_s, sc_lead, sc_s, ape_lead,
                ape_s, bstride, vec_ok)
