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
from dsv4kit.errors import input_error
from dsv4kit.kernels.save_partial_states.spec import SavePartialStatesBase

__all__ = [
    "GPU_ELEMS",
    "INTERPRETER_ELEMS",
    "Address",
    "SavePartialStatesTriton",
    "flat_span",
    "save_partial_states_kernel",
    "state_operands",
]

#: Elements per tensor a GPU program moves (tokens x columns), and its warps: 8 per thread, two
#: 16-byte accesses per tensor. H200, T = 65536, SW 1024 / 512 / 256: 92.1 / 91.1 / 90.3 % of the
#: copy bandwidth, against 91.7 / 90.8 / 89.4 % with 2048 elements and 92.3 / 90.7 / 89.5 % with 4096.
GPU_ELEMS = 1024
NUM_WARPS = 4
#: The same under the CPU interpreter (each program instance costs Python time).
INTERPRETER_ELEMS = 1 << 16

_INT32_MAX = 2**31 - 1


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


class Address:
    """A bare device address Triton can launch with (it reads only ``data_ptr()`` and ``dtype``).

    The GPU launch passes these instead of anchor views: building four views costs ~20 us of
    host time per call, an address costs nothing. The caller's tensors keep the memory alive.
    """

    __slots__ = ("_ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self._ptr = ptr
        self.dtype = dtype

    def data_ptr(self) -> int:
        return self._ptr

    def __repr__(self) -> str:
        return f"Address({self._ptr:#x}, {self.dtype})"


def _lead(kernel: str, arg: str, x: torch.Tensor) -> int:
    addr = x.data_ptr()
    if addr % 4:
        raise input_error(kernel, arg, "data_ptr % 4 == 0 (fp32 elements)", f"data_ptr % 4 == {addr % 4}")
    lead = (addr % 16) // 4
    if x.storage_offset() < lead:
        raise input_error(kernel, arg, "a storage starting on a 16-byte boundary",
                          f"storage data_ptr % 16 == {x.untyped_storage().data_ptr() % 16}")
    return lead


def flat_span(kernel: str, arg: str, x: torch.Tensor, rows: int, views: bool = True) -> tuple[Any, int]:
    """``(anchor, lead)``: a 1-D view of the first ``rows`` rows of the 2-D fp32 ``x``, starting
    at ``x``'s address rounded down to 16 bytes, and the number of elements rounded off (0..3).

    Row ``r`` of ``x`` is ``anchor[lead + r * x.stride(0):][:x.shape[1]]``. The anchor reaches
    before ``x`` into its own storage only (never past it), so both backends can declare it
    16-byte aligned. Raises if ``x`` is not 4-byte aligned or its storage does not start on a
    16-byte boundary (then no such view exists). ``views=False``: an :class:`Address` instead.
    """
    lead = _lead(kernel, arg, x)
    if not views:
        return Address(x.data_ptr() - 4 * lead, x.dtype), lead
    span = (rows - 1) * x.stride(0) + x.shape[1] if rows else 0
    return x.as_strided((lead + max(span, 1),), (1,), x.storage_offset() - lead), lead


def state_operands(kernel: str, kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                   state_cache: torch.Tensor, t: int, views: bool = True) -> tuple[Any, ...]:
    """The operands both backends launch with (after the spec's checks passed):
    ``(kv, kv_lead, kv_stride, score, score_lead, score_stride, ape, ape_lead, ape_stride,
    state_flat, block_stride, vec_ok)``; tensors are 1-D views, or :class:`Address` es with
    ``views=False``. Guards the int32 range of T (the kernels index tokens in int32); every
    other offset is int64 in the kernels."""
    if t > _INT32_MAX:
        raise input_error(kernel, "slot_mapping", f"at most {_INT32_MAX} tokens", t)
    kv_a, kv_lead = flat_span(kernel, "kv", kv, t, views)
    sc_a, sc_lead = flat_span(kernel, "score", score, t, views)
    ape_a, ape_lead = flat_span(kernel, "ape", ape, ape.shape[0], views)
    s0 = state_cache.stride(0)
    if views:
        nsb, sbs, row = state_cache.shape
        state_span = (nsb - 1) * s0 + sbs * row if nsb else 0
        state = state_cache.as_strided((max(state_span, 1),), (1,))   # data_ptr % 16 == 0: checked (§2.8)
    else:
        state = state_cache
    kv_s, sc_s, ape_s = kv.stride(0), score.stride(0), ape.stride(0)
    vec_ok = int(kv_lead == sc_lead == ape_lead == 0 and (kv_s | sc_s | ape_s | s0) % 4 == 0)
    return (kv_a, kv_lead, kv_s, sc_a, sc_lead, sc_s, ape_a, ape_lead, ape_s, state, s0, vec_ok)


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
