"""Triton backend of K4 save_partial_states (spec K4, §2.8).

Grid ``(cdiv(T, TOK),)``: program ``p`` owns tokens ``[p * TOK, (p + 1) * TOK) ∩ [0, T)`` and
writes each one's whole state row as one ``[TOK, BLOCK]`` tile (``BLOCK`` = SW rounded up to a
power of two, columns ``>= SW`` masked off): ``kv`` into columns ``[0, SW)`` and
``fl(score + ape[pos % R])`` into ``[SW, 2 SW)``. On the GPU ``TOK * BLOCK`` is about
:data:`GPU_ELEMS` elements (4 warps, 8 per thread and tensor, as 16-byte accesses); under the
CPU interpreter a program covers :data:`INTERPRETER_ELEMS` (few Python-level programs). A token
whose slot is < 0 (padding), and a tile row past T, is masked out of every load and store: it
moves no bytes.

Every stride, the row leads and T are runtime arguments (``do_not_specialize``), so column
slices of one ``kv_score`` buffer, separate tensors and pooled state caches share the key's one
compile. Tensors reach the kernel as *anchors* (:func:`flat_span`): the tensor's address rounded
down to 16 bytes (a 1-D view under the interpreter, a bare :class:`Address` on the GPU), plus a
lead of 0..3 elements. Anchors are always
16-byte aligned, so Triton's alignment specialization never changes between calls. When every
lead is 0 and every row stride a multiple of 4 (the ``vec_ok`` flag, the usual case) the kernel
takes a branch whose offsets it can prove 16-byte aligned and vectorizes; otherwise the same
arithmetic runs with 4-byte accesses. Nothing is assumed that the host did not check.

Numerics: ``kv`` is copied as int32 bit patterns, the score half is one fp32 add (launched with
``enable_fp_fusion=False``; exact IEEE on the GPU and in numpy). Offsets are int64.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.save_partial_states.spec import GPU_ELEMS, SavePartialStatesBase, state_operands

__all__ = ["INTERPRETER_ELEMS", "SavePartialStatesTriton", "save_partial_states_kernel"]

NUM_WARPS = 4
#: The same under the CPU interpreter (each program instance costs Python time).
INTERPRETER_ELEMS = 1 << 16



def _block(key: SavePartialStatesBase.CompileKey) -> int:
    return triton.next_power_of_2(key.state_width)


def _tokens(key: SavePartialStatesBase.CompileKey, elems: int) -> int:
    return max(1, elems // _block(key))


@triton.jit
def _store_rows(kv_ptr, score_ptr, ape_ptr, state_ptr, tok, slot, pos, ok, kv_lead, kv_stride, score_lead,
                score_stride, ape_lead, ape_stride, block_stride,
                SW: tl.constexpr, R: tl.constexpr, SBS: tl.constexpr, BLOCK: tl.constexpr):
    """The tile of tokens ``tok`` (live where ``ok``); offsets in elements, int64."""
    cols = tl.arange(0, BLOCK)[None, :]
    m = ok[:, None] & (cols < SW)
    t = tok.to(tl.int64)
    kv_bits = kv_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    # No cache hints: evict_first on kv/score cost 2-3 % of bandwidth on an H200.
    kv = tl.load(kv_bits + (kv_lead + t * kv_stride)[:, None] + cols, mask=m)
    sc = tl.load(score_ptr + (score_lead + t * score_stride)[:, None] + cols, mask=m)
    a = tl.load(ape_ptr + (ape_lead + (pos % R) * ape_stride)[:, None] + cols, mask=m)
    row = (slot // SBS) * block_stride + (slot % SBS) * (2 * SW)
    dst = row[:, None] + cols
    tl.store(state_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + dst, kv, mask=m)
    tl.store(state_ptr + dst + SW, sc + a, mask=m)


@triton.jit(do_not_specialize=["T", "kv_lead", "kv_stride", "score_lead", "score_stride", "ape_lead",
                               "ape_stride", "block_stride", "vec_ok"],
            do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])
def save_partial_states_kernel(
    kv_ptr,             # fp32 anchor of kv: row t at kv_lead + t * kv_stride
    score_ptr,          # fp32 anchor of score
    ape_ptr,            # fp32 anchor of ape: row r at ape_lead + r * ape_stride
    pos_ptr,            # int64 [>= T]
    state_ptr,          # fp32 state cache: row (b, o) at b * block_stride + o * 2 SW
    slot_ptr,           # int64 [T]
    T: tl.int32,
    kv_lead: tl.int32,
    kv_stride: tl.int64,
    score_lead: tl.int32,
    score_stride: tl.int64,
    ape_lead: tl.int32,
    ape_stride: tl.int64,
    block_stride: tl.int64,
    vec_ok: tl.int32,
    SW: tl.constexpr,
    R: tl.constexpr,
    SBS: tl.constexpr,
    BLOCK: tl.constexpr,
    TOK: tl.constexpr,
):
    tok = tl.program_id(0) * TOK + tl.arange(0, TOK)
    live = tok < T
    slot = tl.load(slot_ptr + tok, mask=live, other=-1)
    pos = tl.load(pos_ptr + tok, mask=live, other=0)
    ok = slot >= 0
    if vec_ok != 0:
        # Host-checked: leads 0, strides multiples of 4. Written as (s // 4) * 4 so the compiler
        # sees the divisibility (a fact here, not an assumption) and issues 16-byte accesses.
        _store_rows(kv_ptr, score_ptr, ape_ptr, state_ptr, tok, slot, pos, ok, 0, (kv_stride // 4) * 4, 0,
                    (score_stride // 4) * 4, 0, (ape_stride // 4) * 4, (block_stride // 4) * 4,
                    SW, R, SBS, BLOCK)
    else:
        _store_rows(kv_ptr, score_ptr, ape_ptr, state_ptr, tok, slot, pos, ok, kv_lead, kv_stride, score_lead,
                    score_stride, ape_lead, ape_stride, block_stride, SW, R, SBS, BLOCK)


class SavePartialStatesTriton(SavePartialStatesBase, TritonJitKernel["SavePartialStatesBase.CompileKey"]):
    """K4, Triton backend (GPU, or the interpreter on CPU); see the module docstring."""

    kernel_fn = save_partial_states_kernel
    params = {
        "kv_ptr": Ptr(torch.float32),       # anchors: 16-byte aligned by construction (flat_span)
        "score_ptr": Ptr(torch.float32),
        "ape_ptr": Ptr(torch.float32),
        "pos_ptr": Ptr(torch.int64, aligned=False),
        "state_ptr": Ptr(torch.float32),    # data_ptr % 16 == 0: checked (§2.8)
        "slot_ptr": Ptr(torch.int64, aligned=False),
        "T": Runtime(),
        "kv_lead": Runtime(),
        "kv_stride": Runtime(),
        "score_lead": Runtime(),
        "score_stride": Runtime(),
        "ape_lead": Runtime(),
        "ape_stride": Runtime(),
        "block_stride": Runtime(),
        "vec_ok": Runtime(),
        "SW": FromKey("state_width"),
        "R": FromKey("compress_ratio"),
        "SBS": FromKey("state_block_size"),
        "BLOCK": FromKey(_block),
        "TOK": FromKey(lambda key: _tokens(key, GPU_ELEMS)),
    }

    def launch_options(self, key: SavePartialStatesBase.CompileKey) -> dict[str, Any]:
        return {"num_warps": NUM_WARPS}

    def tokens_per_program(self, key: SavePartialStatesBase.CompileKey) -> int:
        """Tokens one program covers: :data:`GPU_ELEMS` / :data:`INTERPRETER_ELEMS` worth of columns."""
        return _tokens(key, GPU_ELEMS if self.platform.is_cuda else INTERPRETER_ELEMS)

    def interpreter_constexprs(self, key: SavePartialStatesBase.CompileKey) -> dict[str, Any]:
        return {"TOK": _tokens(key, INTERPRETER_ELEMS)}

    def grid(self, key: SavePartialStatesBase.CompileKey, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(args["T"], self.tokens_per_program(key)),)

    def launch_args(self, kv, score, ape, positions, state_cache, slot_mapping, t) -> tuple[Any, ...]:
        # The interpreter reads storages (views needed); a GPU launch only addresses.
        (kv_a, kv_lead, kv_s, sc_a, sc_lead, sc_s, ape_a, ape_lead, ape_s, state, bstride,
         vec_ok) = state_operands(self.name, kv, score, ape, state_cache, t, views=not self.platform.is_cuda)
        return (kv_a, sc_a, ape_a, positions, state, slot_mapping, t, kv_lead, kv_s, sc_lead, sc_s, ape_lead,
                ape_s, bstride, vec_ok)
