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
K1: inside a program ``nope`` is ``[ROWS, 64]`` (dims 0..63) and the rope half is split into
even/odd lanes ``[ROWS, 32]`` (dims 64+2i, 65+2i), joined back before stores. K2 reads each
row as 64 int32 words of two bf16 and keeps all of it as (even, odd) pairs ``[ROWS, 32]``
(nope: dims 2i, 2i+1; rope: dims 64+2i, 65+2i), which are exactly the nibbles of the output
bytes, so nothing is joined back. Row indices are int32 within a program; only the two
row-base pointers are 64-bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.triton_numerics import clog2, pow2, round_bf16, round_e4m3

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
def _rope_bf16(x_e, x_o, c, s):
    """GPT-J rotation of the (even, odd) pairs, each product and sum rounded separately (launched
    with enable_fp_fusion=False), then rounded to bf16 values (§K1: bf16 before the amax)."""
    return round_bf16(x_e * c - x_o * s), round_bf16(x_o * c + x_e * s)


@triton.jit
def _load_rotated(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr):
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
    y_e, y_o = _rope_bf16(x_e, x_o, c, s)
    return nope, y_e, y_o


@triton.jit
def _bf16_pairs(w):
    """The two bf16 of int32 words ``w`` (low half = even dim) as exact fp32 (even, odd)."""
    return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _load_pairs(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS: tl.constexpr, ROWS: tl.constexpr):
    """Rows ``first + r`` as (even, odd) dim pairs [R, 32] fp32 each: nope (dims 0..63) as loaded,
    rope (dims 64..127) rotated and rounded to bf16 values. Read as int32 words of two bf16, so
    the pairs split with two bit operations and no register shuffles."""
    q_row = q_ptr.to(tl.pointer_type(tl.int32)) + first.to(tl.int64) * 64 + r[:, None] * 64
    m = ok[:, None]
    n_e, n_o = _bf16_pairs(tl.load(q_row + tl.arange(0, 32)[None, :], mask=m, other=0))
    x_e, x_o = _bf16_pairs(tl.load(q_row + 32 + tl.arange(0, 32)[None, :], mask=m, other=0))
    c, s = _cos_sin(pos_ptr, cs_ptr, first, r, ok, NUM_HEADS, ROWS)
    y_e, y_o = _rope_bf16(x_e, x_o, c, s)
    return n_e, n_o, y_e, y_o


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
):
    """K1: q_out (e4m3fn) and weights_out = w * 2^e * ss * hs, per (token, head)."""
    first, r, ok = _program_rows(num_rows, ROWS)
    nope, y_e, y_o = _load_rotated(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS, ROWS)

    amax = tl.maximum(tl.max(tl.abs(nope), axis=1),
                      tl.maximum(tl.max(tl.abs(y_e), axis=1), tl.max(tl.abs(y_o), axis=1)))
    e = clog2(tl.maximum(amax, 1e-4) * (1.0 / 448.0))  # D1: floor first; §2.1: * fl(1/448) == / 448
    inv = pow2(-e)[:, None]                            # exact scaling by a power of two

    base = q_out_ptr + first.to(tl.int64) * 128 + r[:, None] * 128
    m = ok[:, None]
    # round_e4m3 lands on the e4m3 grid, so the cast to fp8 is exact (also in the interpreter).
    out_ty = q_out_ptr.dtype.element_ty
    tl.store(base + tl.arange(0, 64)[None, :], round_e4m3(nope * inv).to(out_ty), mask=m)
    rope = tl.reshape(tl.join(round_e4m3(y_e * inv), round_e4m3(y_o * inv)), (ROWS, 64))
    tl.store(base + 64 + tl.arange(0, 64)[None, :], rope.to(out_ty), mask=m)

    w = tl.load(w_ptr + first + r, mask=ok, other=0.0).to(tl.float32)
    tl.store(w_out_ptr + first + r, ((w * pow2(e)) * softmax_scale) * head_scale, mask=ok)


@triton.jit
def _mx_block_exp(absmax):
    """MXFP4 block exponent (§2.4): clog2(max(a, 6*2^-126) * fl(1/6)), clamped to [-127, 127]."""
    a = tl.maximum(absmax, 6.0 * 1.1754943508222875e-38)
    return tl.minimum(tl.maximum(clog2(a * 0.16666666666666666), -127), 127)


@triton.jit
def _e2m1_mag_sign(v):
    """E2M1 code of ``v`` (|v| <= 6, any fp32), RNE ties to even code (§2.4): int32, sign in bit 3.

    E2M1's binade j (j = 0: 0..1.5, 1: 2..3, 2: 4..6) has step 2^(j-1): ``fl(|v| 2^-j + 2^22 + j)``
    rounds |v| 2^-j to a multiple of 0.5 (the fp32 add is RNE; 2^22 + j sits on an even
    multiple, so ties go to the even code), and its bits minus bits(2^22) are that binade's
    code k_j + 2j. The right binade's code is the smallest of the three (a coarser or finer
    grid never undercuts it; checked on every bf16 |v| <= 6, fp32 subnormals and random fp32),
    and the three sums share one binade, so one 3-way integer min compares them: 3 multiplies
    (exact: powers of two), 3 adds and 2 integer steps instead of a per-element binade.
    """
    a = tl.abs(v)
    k0 = (a + 4194304.0).to(tl.int32, bitcast=True)
    k1 = (a * 0.5 + 4194305.0).to(tl.int32, bitcast=True)
    k2 = (a * 0.25 + 4194306.0).to(tl.int32, bitcast=True)
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 8          # -0 and tiny negatives: 8
    return (tl.minimum(tl.minimum(k0, k1), k2) - 0x4A800000) | sign


@triton.jit
def _mx_pack(even, odd, e, ROWS: tl.constexpr):
    """Bytes [R, 32] of the pairs (``even`` low nibble, ``odd`` high) [R, 32], two 16-pair blocks
    with exponents ``e`` [R, 2]. The pairs stay split as loaded: no join/reshape back to dims."""
    inv = pow2(-e)[:, :, None]
    lo = _e2m1_mag_sign(tl.reshape(even, (ROWS, 2, 16)) * inv)
    hi = _e2m1_mag_sign(tl.reshape(odd, (ROWS, 2, 16)) * inv)
    return tl.reshape(lo + hi * 16, (ROWS, 32)).to(tl.uint8)


@triton.jit
def _pair_block_amax(even, odd, ROWS: tl.constexpr):
    """Absmax [R, 2] of the two 32-dim blocks held as 16 (even, odd) pairs each."""
    m = tl.maximum(tl.abs(even), tl.abs(odd))
    return tl.max(tl.reshape(m, (ROWS, 2, 16)), axis=2)


@triton.jit(**_UNSPECIALIZED)
def indexer_q_mxfp4_kernel(
    pos_ptr, q_ptr, cs_ptr, w_ptr, q_out_ptr, scale_out_ptr, w_out_ptr,
    num_rows: tl.int32, softmax_scale: tl.float32, head_scale: tl.float32,
    NUM_HEADS: tl.constexpr, ROWS: tl.constexpr,
):
    """K2: packed E2M1 codes [.., 64] bytes, 4 ue8m0 bytes as one int32, unscaled weights.

    Every 32-dim block is handled as 16 (even, odd) dim pairs, the nope half too: byte k of a
    row is dims (2k, 2k+1), so the pairs are exactly the output bytes' nibbles.
    """
    first, r, ok = _program_rows(num_rows, ROWS)
    n_e, n_o, y_e, y_o = _load_pairs(q_ptr, pos_ptr, cs_ptr, first, r, ok, NUM_HEADS, ROWS)

    e_nope = _mx_block_exp(_pair_block_amax(n_e, n_o, ROWS))   # blocks 0, 1
    e_rope = _mx_block_exp(_pair_block_amax(y_e, y_o, ROWS))   # blocks 2, 3

    out_row = q_out_ptr + first.to(tl.int64) * 64 + r[:, None] * 64
    m = ok[:, None]
    tl.store(out_row + tl.arange(0, 32)[None, :], _mx_pack(n_e, n_o, e_nope, ROWS), mask=m)
    tl.store(out_row + 32 + tl.arange(0, 32)[None, :], _mx_pack(y_e, y_o, e_rope, ROWS),
             mask=m)

    # Scale bytes b = e + 127, little-endian in one int32: block 0 in the low byte.
    b_nope = (e_nope + 127).to(tl.uint32)
    b_rope = (e_rope + 127).to(tl.uint32)
    b0, b1 = tl.split(b_nope)
    b2, b3 = tl.split(b_rope)
    packed = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)
    tl.store(scale_out_ptr + first + r, packed.to(tl.int32, bitcast=True), mask=ok)

    w = tl.load(w_ptr + first + r, mask=ok, other=0.0).to(tl.float32)
    tl.store(w_out_ptr + first + r, (w * softmax_scale) * head_scale, mask=ok)


#: Under the interpreter a program covers 4 whole tokens (256 rows): each row's arithmetic is
#: unchanged (spec K1: results must not depend on coarsen), but 64x fewer Python-level programs.
INTERPRETER_ROWS = 256

#: Thread groups per Triton program. The spec's ``coarsen`` is the heads handled per thread
#: group; one group per program (the deployed mapping) made programs of 1-4 rows whose two
#: dependent loads (position, then cos/sin) left HBM idle: 31% of copy bandwidth on an H200
#: at T = 65536 (benchmarks/results/indexer_q_h200_v1.csv). A program of 8 groups moves 8x
#: the bytes per launch slot; results do not depend on it (tests pin this).
THREAD_GROUPS = 8

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
    # Rows (token-heads) per program on the GPU: `coarsen` heads per thread group, GROUPS
    # thread groups (see THREAD_GROUPS); always a divisor of the 64 heads of one token.
    "ROWS": FromKey(lambda key: key.coarsen * THREAD_GROUPS),
}


class _TritonLaunch:
    """Launch shape shared by the two Triton variants (a mixin)."""

    platform: Any
    name: str

    def launch_options(self, key: IndexerQBase.CompileKey) -> dict[str, Any]:
        return {"num_warps": 2 if key.coarsen == 1 else 4}

    def rows_per_program(self, key: IndexerQBase.CompileKey) -> int:
        """``coarsen * THREAD_GROUPS`` on the GPU; whole tokens under the CPU interpreter."""
        return key.coarsen * THREAD_GROUPS if self.platform.is_cuda else INTERPRETER_ROWS

    def interpreter_constexprs(self, key: IndexerQBase.CompileKey) -> dict[str, Any]:
        return {"ROWS": INTERPRETER_ROWS}

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
