"""Triton kernels for indexer-Q RoPE + quant (spec K1 FP8, K2 MXFP4).

The kernels see ``index_q`` as rows ``r = t * NUM_HEADS + h`` of 128 bf16 dims. One program
handles ``ROWS`` consecutive rows. On the GPU ``ROWS`` divides ``NUM_HEADS``, so a program
never straddles two tokens and loads its token's position and cos/sin row once. Under the
CPU interpreter the launcher may pass a larger ``ROWS`` (several whole tokens per program;
positions are then gathered per row): each row's arithmetic is the same, only fewer
Python-level programs run.

Per row: load 128 bf16 dims, rotate the last 64 (GPT-J pairs, no FMA), round them to bf16,
quantize. Rounding (§2.1): ``HW_CVT`` true (the GPU compile) rounds with the hardware RNE casts
(``cvt.rn.bf16.f32``, K2 ``cvt.rn.bf16x2.f32``; K1's e4m3 ``cvt.rn.satfinite.e4m3x2.f32``, which
never saturates: |z 2^-e| <= 448); the CPU interpreter truncates fp32 -> bf16 and can drop an
fp32 -> fp8 carry, so the backend sets it false there and the integer recipes of
:mod:`dsv4kit.kernels.triton_numerics` round instead, leaving each cast exact. Both are RNE:
the same bytes. K2's E2M1 codes need no cast (fp32 and integer arithmetic,
:func:`~dsv4kit.kernels.triton_numerics.mxfp4_words`, which E5 shares).
K1: inside a program ``nope`` is ``[ROWS, 64]`` (dims 0..63) and the rope half is split into
even/odd lanes ``[ROWS, 32]`` (dims 64+2i, 65+2i), joined back before stores. K2 reads each
row as 64 int32 words of two bf16 and keeps both halves as such words ``[ROWS, 32]`` (nope as
loaded, rope rotated and packed back by one cvt per pair): word k holds dims (2k, 2k+1), the
nibbles of output byte k, so nothing is joined back. Row indices are int32 within a program;
only the two row-base pointers are 64-bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const, FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.triton_numerics import bf16_value, bf16x2_words, clog2, e4m3, mxfp4_words, pow2

__all__ = ["IndexerQFp8Triton", "IndexerQMxfp4Triton"]


@triton.jit
def _cos_sin(pos_ptr, cs_ptr, first, r, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr):
    """cos, sin ([1, 32] or, under the interpreter, [R, 32]) fp32 of rows ``first + r``."""
    i = tl.arange(0, 32)[None, :]
    if ROWS <= NUM_HEADS:
        # One token per program: one position, one cos/sin row, broadcast over the heads.
        p = tl.load(pos_ptr + first // NUM_HEADS)
        c = tl.load(cs_ptr + p * 64 + i).to(tl.float32)
        s = tl.load(cs_ptr + p * 64 + 32 + i).to(tl.float32)
    else:
        m = ok[:, None]
        p = tl.load(pos_ptr + (first + r) // NUM_HEADS, mask=ok, other=0)[:, None]
        c = tl.load(cs_ptr + p * 64 + i, mask=m, other=0.0).to(tl.float32)
        s = tl.load(cs_ptr + p * 64 + 32 + i, mask=m, other=0.0).to(tl.float32)
    return c, s


@triton.jit
def _rope_bf16(x_e, x_o, c, s, HW: tl.constexpr):
    """GPT-J rotation of the (even, odd) pairs, each product and sum rounded separately (launched
    with enable_fp_fusion=False), then rounded to bf16 values (§K1: bf16 before the amax)."""
    return bf16_value(x_e * c - x_o * s, HW), bf16_value(x_o * c + x_e * s, HW)


@triton.jit
def _load_rotated(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr,
                  HW: tl.constexpr):
    """Load rows ``first + r`` (masked by ``ok``); return (nope [R,64], even [R,32], odd [R,32]) fp32.

    ``first`` is the program's first row (an int32 scalar), ``r`` = arange(ROWS). The rope lanes
    are RoPE'd and rounded to bf16 values.
    """
    # The row base is a 64-bit scalar (rows * 128 passes 2^31 from T = 2^18); per-element
    # offsets within the program are int32.
    q_row = q_ptr + first.to(tl.int64) * 128 + r[:, None] * 128
    m = ok[:, None]
    nope = tl.load(q_row + tl.arange(0, 64)[None, :], mask=m, other=0.0).to(tl.float32)
    rope = tl.load(q_row + 64 + tl.arange(0, 64)[None, :], mask=m, other=0.0).to(tl.float32)
    x_e, x_o = tl.split(tl.reshape(rope, (ROWS, 32, 2)))
    c, s = _cos_sin(pos_ptr, cs_ptr, first, r, ok, NUM_HEADS, ROWS)
    y_e, y_o = _rope_bf16(x_e, x_o, c, s, HW)
    return nope, y_e, y_o


@triton.jit
def _load_words(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr,
                HW: tl.constexpr):
    """Rows ``first + r`` as int32 words of two bf16 [R, 32] each (low half = even dim): nope
    (dims 0..63) as loaded, rope (dims 64..127) rotated and rounded to bf16. Word k of a half is
    dims (2k, 2k+1), the nibbles of output byte k."""
    q_row = q_ptr.to(tl.pointer_type(tl.int32)) + first.to(tl.int64) * 64 + r[:, None] * 64
    m = ok[:, None]
    w_nope = tl.load(q_row + tl.arange(0, 32)[None, :], mask=m, other=0)
    x = tl.load(q_row + 32 + tl.arange(0, 32)[None, :], mask=m, other=0)
    x_e, x_o = (x << 16).to(tl.float32, bitcast=True), (x & -65536).to(tl.float32, bitcast=True)
    c, s = _cos_sin(pos_ptr, cs_ptr, first, r, ok, NUM_HEADS, ROWS)
    # GPT-J rotation, each product and sum rounded separately (enable_fp_fusion=False).
    return w_nope, bf16x2_words(x_e * c - x_o * s, x_o * c + x_e * s, HW)


@triton.jit
def _early_weight(w_ptr, first, r, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr):
    """The weights of rows ``first + r`` loaded with the rows, in programs smaller than a token
    (the decode keys); else a placeholder, never read (:func:`_late_weight` loads then). The
    weights may alias the outputs, so a load written after the stores stays there: a dependent
    round trip of its own, the last of a decode launch. In programs of a whole token (coarsen 4)
    an early load costs registers (K1 69 -> 79), so those load late."""
    if ROWS < NUM_HEADS:
        return tl.load(w_ptr + first + r, mask=ok, other=0.0).to(tl.float32)
    return tl.zeros([ROWS], tl.float32)


@triton.jit
def _late_weight(w_early, w_ptr, first, r, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr):
    """``w_early`` when :func:`_early_weight` loaded it, else the weights loaded now."""
    if ROWS < NUM_HEADS:
        return w_early
    return tl.load(w_ptr + first + r, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _program_rows(num_rows, ROWS: tl.constexpr):
    """(first row: int32 scalar, r = arange(ROWS), ok = first + r < num_rows) of this program.

    The grid is cdiv(num_rows, ROWS), so ``first < num_rows`` fits int32 and so does
    ``num_rows - first``: the row mask never needs 64-bit compares.
    """
    first = tl.program_id(0) * ROWS
    r = tl.arange(0, ROWS)
    return first, r, r < num_rows - first


# Only the row count varies per call and it is never specialized (spec §2.11); the small
# per-token arrays may start anywhere, so their alignment is not specialized either.
_UNSPECIALIZED = dict(do_not_specialize=["num_rows"],
                      do_not_specialize_on_alignment=["pos_ptr", "cs_ptr", "w_ptr", "w_out_ptr"])


@triton.jit(**_UNSPECIALIZED)
def indexer_q_fp8_kernel(
    pos_ptr, q_ptr, cs_ptr, w_ptr, q_out_ptr, w_out_ptr,
    num_rows: tl.int32, softmax_scale: tl.float32, head_scale: tl.float32,
    NUM_HEADS: tl.constexpr, ROWS: tl.constexpr,
    HW_CVT: tl.constexpr = True,   # bf16 / e4m3 rounding by the GPU's casts (False: the interpreter)
):
    """K1: q_out (e4m3fn) and weights_out = w * 2^e * ss * hs, per (token, head)."""
    first, r, ok = _program_rows(num_rows, ROWS)
    w = _early_weight(w_ptr, first, r, ok, NUM_HEADS, ROWS)
    nope, y_e, y_o = _load_rotated(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS, ROWS, HW_CVT)

    amax = tl.maximum(tl.max(tl.abs(nope), axis=1),
                      tl.maximum(tl.max(tl.abs(y_e), axis=1), tl.max(tl.abs(y_o), axis=1)))
    e = clog2(tl.maximum(amax, 1e-4) * (1.0 / 448.0))  # D1: floor first; §2.1: * fl(1/448) == / 448
    inv = pow2(-e)[:, None]                            # exact scaling by a power of two

    base = q_out_ptr + first.to(tl.int64) * 128 + r[:, None] * 128
    m = ok[:, None]
    # |z * 2^-e| <= 448 (amax lands in (224, 448]): the RNE cast never saturates.
    tl.store(base + tl.arange(0, 64)[None, :], e4m3(nope * inv, HW_CVT), mask=m)
    rope = tl.reshape(tl.join(e4m3(y_e * inv, HW_CVT), e4m3(y_o * inv, HW_CVT)), (ROWS, 64))
    tl.store(base + 64 + tl.arange(0, 64)[None, :], rope, mask=m)

    w = _late_weight(w, w_ptr, first, r, ok, NUM_HEADS, ROWS)
    tl.store(w_out_ptr + first + r, ((w * pow2(e)) * softmax_scale) * head_scale, mask=ok)


@triton.jit
def _mx_half(w, ROWS: tl.constexpr):
    """Packed E2M1 bytes [R, 32] and exponents [R, 2] of a row half held as bf16 words ``w``
    [R, 32] (two 16-word blocks): :func:`~dsv4kit.kernels.triton_numerics.mxfp4_words`. Byte k =
    code(2k) | code(2k+1) << 4 (§2.4)."""
    byte, e = mxfp4_words(tl.reshape(w, (ROWS, 2, 16)))
    return tl.reshape(byte, (ROWS, 32)).to(tl.uint8), e


@triton.jit(**_UNSPECIALIZED)
def indexer_q_mxfp4_kernel(
    pos_ptr, q_ptr, cs_ptr, w_ptr, q_out_ptr, scale_out_ptr, w_out_ptr,
    num_rows: tl.int32, softmax_scale: tl.float32, head_scale: tl.float32,
    NUM_HEADS: tl.constexpr, ROWS: tl.constexpr,
    HW_CVT: tl.constexpr = True,   # bf16 / e4m3 rounding by the GPU's casts (False: the interpreter)
):
    """K2: packed E2M1 codes [.., 64] bytes, 4 ue8m0 bytes as one int32, unscaled weights.

    Every 32-dim block is 16 words of two bf16, the rope half too: byte k of a row half is word
    k's dims (2k, 2k+1), so the words' halves are exactly the output bytes' nibbles.
    """
    first, r, ok = _program_rows(num_rows, ROWS)
    w = _early_weight(w_ptr, first, r, ok, NUM_HEADS, ROWS)
    w_nope, w_rope = _load_words(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS, ROWS, HW_CVT)
    q_nope, e_nope = _mx_half(w_nope, ROWS)   # blocks 0, 1
    q_rope, e_rope = _mx_half(w_rope, ROWS)   # blocks 2, 3

    out_row = q_out_ptr + first.to(tl.int64) * 64 + r[:, None] * 64
    m = ok[:, None]
    tl.store(out_row + tl.arange(0, 32)[None, :], q_nope, mask=m)
    tl.store(out_row + 32 + tl.arange(0, 32)[None, :], q_rope, mask=m)

    # Scale bytes b = e + 127, little-endian in one int32: block 0 in the low byte. (A tl.sum of
    # shifted bytes is fewer instructions but ptxas then holds far more registers: slower.)
    b0, b1 = tl.split((e_nope + 127).to(tl.uint32))
    b2, b3 = tl.split((e_rope + 127).to(tl.uint32))
    packed = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)
    tl.store(scale_out_ptr + first + r, packed.to(tl.int32, bitcast=True), mask=ok)

    w = _late_weight(w, w_ptr, first, r, ok, NUM_HEADS, ROWS)
    tl.store(w_out_ptr + first + r, (w * softmax_scale) * head_scale, mask=ok)


#: Under the interpreter a program covers 4 whole tokens (256 rows): each row's arithmetic is
#: unchanged (spec K1: results must not depend on coarsen), but 64x fewer Python-level programs.
INTERPRETER_ROWS = 256

#: Thread groups per Triton program, by ``coarsen``. The spec's ``coarsen`` is the heads handled
#: per thread group; one group per program (the deployed mapping) made programs of 1-4 rows whose
#: two dependent loads (position, then cos/sin) left HBM idle: 31% of copy bandwidth on an H200
#: at T = 65536 (benchmarks/results/indexer_q_h200_v1.csv). A program of 8 groups moves 8x the
#: bytes per launch slot. At coarsen 4 (T >= 512) 16 groups make a program one whole token (64
#: rows), which halves the per-row share of the position / cos-sin loads and the index math
#: (H200, T = 65536, one run: K2 88.5 -> 95.5 %, K1 98.2 -> 103.4 % of copy). Results do not
#: depend on it (tests pin this).
THREAD_GROUPS = 8
THREAD_GROUPS_COARSEN_4 = 16


def gpu_rows(coarsen: int) -> int:
    """Rows per program on the GPU: ``coarsen`` heads per thread group times the thread groups
    (16 at coarsen 4, else 8); a divisor of the 64 heads of one token for every valid coarsen."""
    return coarsen * (THREAD_GROUPS_COARSEN_4 if coarsen == 4 else THREAD_GROUPS)


_SHARED_PARAMS = {
    "pos_ptr": Ptr(torch.int64, aligned=False),
    "q_ptr": Ptr(torch.bfloat16),
    "cs_ptr": Ptr("cos_sin_dtype", aligned=False),
    "w_ptr": Ptr(torch.bfloat16, aligned=False),
    "w_out_ptr": Ptr(torch.float32, aligned=False),
    "num_rows": Runtime(),
    "softmax_scale": Runtime(),
    "head_scale": Runtime(),
    "NUM_HEADS": FromKey("num_heads"),
    # Rows (token-heads) per program on the GPU (gpu_rows): a divisor of one token's 64 heads.
    "ROWS": FromKey(lambda key: gpu_rows(key.coarsen)),
    "HW_CVT": Const(True),
}


class _TritonLaunch:
    """Launch shape shared by the two Triton variants (a mixin)."""

    platform: Any
    name: str

    def launch_options(self, key: IndexerQBase.CompileKey) -> dict[str, Any]:
        return {"num_warps": 2 if key.coarsen == 1 else 4}

    def rows_per_program(self, key: IndexerQBase.CompileKey) -> int:
        """:func:`gpu_rows` on the GPU; whole tokens under the CPU interpreter."""
        return gpu_rows(key.coarsen) if self.platform.is_cuda else INTERPRETER_ROWS

    def interpreter_constexprs(self, key: IndexerQBase.CompileKey) -> dict[str, Any]:
        return {"ROWS": INTERPRETER_ROWS}  # whole tokens per program (HW_CVT: the base's)

    def grid(self, key: IndexerQBase.CompileKey, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(args["num_rows"], self.rows_per_program(key)),)


class IndexerQFp8Triton(_TritonLaunch, IndexerQBase, TritonJitKernel["IndexerQBase.CompileKey"]):
    """K1 on Triton: ``q_out`` in e4m3fn, weights folded with the q scale."""

    cache_format = "fp8"
    kernel_fn = indexer_q_fp8_kernel
    params = {**_SHARED_PARAMS, "q_out_ptr": Ptr(torch.float8_e4m3fn)}

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_fp8, w_out = outs
        return (positions, index_q, cos_sin_cache, index_weights, q_fp8, w_out,
                q_fp8.shape[0] * q_fp8.shape[1], ss, hs)


class IndexerQMxfp4Triton(_TritonLaunch, IndexerQBase, TritonJitKernel["IndexerQBase.CompileKey"]):
    """K2 on Triton: packed E2M1 codes, int32 scale words, unscaled weights."""

    cache_format = "mxfp4"
    kernel_fn = indexer_q_mxfp4_kernel
    params = {**_SHARED_PARAMS, "q_out_ptr": Ptr(torch.uint8), "scale_out_ptr": Ptr(torch.int32)}

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_packed, q_scale, w_out = outs
        return (positions, index_q, cos_sin_cache, index_weights, q_packed, q_scale, w_out,
                q_packed.shape[0] * q_packed.shape[1], ss, hs)
