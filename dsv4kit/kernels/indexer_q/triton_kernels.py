"""Triton kernels for indexer-Q RoPE + quant (spec K1 FP8, K2 MXFP4).

The kernels see ``index_q`` as rows ``r = t * NUM_HEADS + h`` of 128 bf16 dims. One program
handles ``ROWS`` consecutive rows. On the GPU ``ROWS`` divides ``NUM_HEADS``, so a program
never straddles two tokens and loads its token's position and cos/sin row once. Under the
CPU interpreter the launcher may pass a larger ``ROWS`` (several whole tokens per program;
positions are then gathered per row): each row's arithmetic is the same, only fewer
Python-level programs run.

Per row: load 128 bf16 dims, rotate the last 64 (GPT-J pairs, no FMA), round them to bf16
with integer RNE, quantize. No cast ever has to round (see
:mod:`dsv4kit.kernels.triton_numerics`), so the interpreter and the GPU write the same bytes.
Inside a program ``nope`` is ``[ROWS, 64]`` (dims 0..63) and the rope half is split into
even/odd lanes ``[ROWS, 32]`` (dims 64+2i, 65+2i), joined back before stores.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv4kit.kernels.triton_numerics import clog2, e2m1_code, pow2, round_bf16, round_e4m3


@triton.jit
def _load_rotated(q_ptr, pos_ptr, cs_ptr, rows, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr):
    """Load ``rows`` (masked by ``ok``); return (nope [R,64], even [R,32], odd [R,32]) in fp32.

    The rope lanes are RoPE'd and rounded to bf16 values (§K1: bf16 before the amax).
    """
    base = rows.to(tl.int64)[:, None] * 128
    m = ok[:, None]
    nope = tl.load(q_ptr + base + tl.arange(0, 64)[None, :], mask=m, other=0.0).to(tl.float32)
    rope = tl.load(q_ptr + base + 64 + tl.arange(0, 64)[None, :], mask=m, other=0.0).to(tl.float32)
    x_e, x_o = tl.split(tl.reshape(rope, (ROWS, 32, 2)))
    i = tl.arange(0, 32)[None, :]
    if ROWS <= NUM_HEADS:
        # One token per program: one position, one cos/sin row, broadcast over the heads.
        p = tl.load(pos_ptr + tl.min(rows, axis=0) // NUM_HEADS)
        c = tl.load(cs_ptr + p * 64 + i).to(tl.float32)
        s = tl.load(cs_ptr + p * 64 + 32 + i).to(tl.float32)
    else:
        p = tl.load(pos_ptr + rows // NUM_HEADS, mask=ok, other=0)[:, None]
        c = tl.load(cs_ptr + p * 64 + i, mask=m, other=0.0).to(tl.float32)
        s = tl.load(cs_ptr + p * 64 + 32 + i, mask=m, other=0.0).to(tl.float32)
    # Each product and sum rounded separately (launched with enable_fp_fusion=False).
    y_e = round_bf16(x_e * c - x_o * s)
    y_o = round_bf16(x_o * c + x_e * s)
    return nope, y_e, y_o


# Only the row count varies per call and it is never specialized (spec §2.11); the small
# per-token arrays may start anywhere, so their alignment is not specialized either.
_UNSPECIALIZED = dict(do_not_specialize=["num_rows"],
                      do_not_specialize_on_alignment=["pos_ptr", "cs_ptr", "w_ptr", "w_out_ptr"])


@triton.jit(**_UNSPECIALIZED)
def indexer_q_fp8_kernel(
    pos_ptr, q_ptr, cs_ptr, w_ptr, q_out_ptr, w_out_ptr,
    num_rows: tl.int32, softmax_scale: tl.float32, head_scale: tl.float32,
    NUM_HEADS: tl.constexpr, ROWS: tl.constexpr,
):
    """K1: q_out (e4m3fn) and weights_out = w * 2^e * ss * hs, per (token, head)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = rows < num_rows
    nope, y_e, y_o = _load_rotated(q_ptr, pos_ptr, cs_ptr, rows, ok, NUM_HEADS, ROWS)

    amax = tl.maximum(tl.max(tl.abs(nope), axis=1),
                      tl.maximum(tl.max(tl.abs(y_e), axis=1), tl.max(tl.abs(y_o), axis=1)))
    e = clog2(tl.maximum(amax, 1e-4) * (1.0 / 448.0))  # D1: floor first; §2.1: * fl(1/448) == / 448
    inv = pow2(-e)[:, None]                            # exact scaling by a power of two

    base = rows[:, None] * 128
    m = ok[:, None]
    # round_e4m3 lands on the e4m3 grid, so the cast to fp8 is exact (also in the interpreter).
    out_ty = q_out_ptr.dtype.element_ty
    tl.store(q_out_ptr + base + tl.arange(0, 64)[None, :], round_e4m3(nope * inv).to(out_ty), mask=m)
    rope = tl.reshape(tl.join(round_e4m3(y_e * inv), round_e4m3(y_o * inv)), (ROWS, 64))
    tl.store(q_out_ptr + base + 64 + tl.arange(0, 64)[None, :], rope.to(out_ty), mask=m)

    w = tl.load(w_ptr + rows, mask=ok, other=0.0).to(tl.float32)
    tl.store(w_out_ptr + rows, ((w * pow2(e)) * softmax_scale) * head_scale, mask=ok)


@triton.jit
def _mx_block_exp(absmax):
    """MXFP4 block exponent (§2.4): clog2(max(a, 6*2^-126) * fl(1/6)), clamped to [-127, 127]."""
    a = tl.maximum(absmax, 6.0 * 1.1754943508222875e-38)
    return tl.minimum(tl.maximum(clog2(a * 0.16666666666666666), -127), 127)


@triton.jit
def _mx_pack(vals, e, ROWS: tl.constexpr):
    """Codes of ``vals`` [R, 64] (two 32-blocks with exponents ``e`` [R, 2]) packed to [R, 32] bytes."""
    v = tl.reshape(vals, (ROWS, 2, 32)) * pow2(-e)[:, :, None]
    codes = tl.reshape(e2m1_code(v), (ROWS, 64))
    lo, hi = tl.split(tl.reshape(codes, (ROWS, 32, 2)))
    return (lo | (hi << 4)).to(tl.uint8)


@triton.jit(**_UNSPECIALIZED)
def indexer_q_mxfp4_kernel(
    pos_ptr, q_ptr, cs_ptr, w_ptr, q_out_ptr, scale_out_ptr, w_out_ptr,
    num_rows: tl.int32, softmax_scale: tl.float32, head_scale: tl.float32,
    NUM_HEADS: tl.constexpr, ROWS: tl.constexpr,
):
    """K2: packed E2M1 codes [.., 64] bytes, 4 ue8m0 bytes as one int32, unscaled weights."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = rows < num_rows
    nope, y_e, y_o = _load_rotated(q_ptr, pos_ptr, cs_ptr, rows, ok, NUM_HEADS, ROWS)
    rope = tl.reshape(tl.join(y_e, y_o), (ROWS, 64))

    e_nope = _mx_block_exp(tl.max(tl.abs(tl.reshape(nope, (ROWS, 2, 32))), axis=2))   # blocks 0, 1
    e_rope = _mx_block_exp(tl.max(tl.abs(tl.reshape(rope, (ROWS, 2, 32))), axis=2))   # blocks 2, 3

    out_row = rows[:, None] * 64
    m = ok[:, None]
    tl.store(q_out_ptr + out_row + tl.arange(0, 32)[None, :], _mx_pack(nope, e_nope, ROWS), mask=m)
    tl.store(q_out_ptr + out_row + 32 + tl.arange(0, 32)[None, :], _mx_pack(rope, e_rope, ROWS), mask=m)

    # Scale bytes b = e + 127, little-endian in one int32: block 0 in the low byte.
    b_nope = (e_nope + 127).to(tl.uint32)
    b_rope = (e_rope + 127).to(tl.uint32)
    b0, b1 = tl.split(b_nope)
    b2, b3 = tl.split(b_rope)
    packed = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)
    tl.store(scale_out_ptr + rows, packed.to(tl.int32, bitcast=True), mask=ok)

    w = tl.load(w_ptr + rows, mask=ok, other=0.0).to(tl.float32)
    tl.store(w_out_ptr + rows, (w * softmax_scale) * head_scale, mask=ok)
