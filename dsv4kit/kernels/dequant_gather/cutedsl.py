"""CuTeDSL backend of K3: dequantize-and-gather of the fp8_ds_mla K cache (spec K3, §2.5).

Grid ``(splits, nreq)`` as in the Triton kernel: CTA ``(s, b)`` writes output rows
``[s * rows_per_cta, (s + 1) * rows_per_cta) ∩ [0, G)`` of request ``b``. A row is handled by
64 threads: threads 0..55 own 8 nope dims each (an 8-byte load of e4m3 codes as two 32-bit
words, one scale byte, a 16-byte store of 8 bf16 as four words), threads 56..63 own 8 rope dims
each (a 16-byte load and store of bf16 bit patterns). A CTA of ``THREADS`` threads covers
``THREADS // 64`` rows at a time and each thread does ``UNROLL`` rows per step, all loads issued
before any store (bytes in flight).

Numerics are the Triton kernel's (which Triton lowers to the same instructions): each 16-bit
half of a code word goes through one ``cvt.rn.f16x2.e4m3x2`` (two e4m3 bytes to two f16, the
lower byte into the lower half; exact, as every e4m3 value is an f16 value), each f16 is widened
to fp32 exactly and multiplied by the scale ``2**(sb - 127)`` (the fp32 with bits ``sb << 23``) in
one ``mul.rn.f32``, exact for the contract's scale bytes 105..254, so the bf16 bits are the
product's top half: one ``prmt`` packs the two of a pair. The rope is copied as int16. No
instruction rounds in the contract range (outside it, NaN codes and other scale bytes give
unspecified values: the low half is dropped, no fault).

Tensors are passed flat (1-D): ``out`` as int16, the cache as the uint8 span of its pages
(page ``p`` at byte ``p * P``), the block table as its int32 span with a runtime row stride.
Sizes are 64-bit symbols, so caches and workspaces past 2**31 elements work.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int16, Int32, Int64, Uint8, Uint32
from cutlass.cutlass_dsl import T, dsl_user_op

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.formats.ds_mla import DS_ENTRY_BYTES
from dsv4kit.kernels.cute_numerics import inline_ptx
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase

__all__ = ["DequantGatherCuTeDSL", "dequant_gather_host"]

#: Threads per CTA, and rows each thread handles per loop step (the launch configuration).
THREADS = 128
UNROLL = 4
THREADS_PER_ROW = 64
NOPE_THREADS = 56        # 448 dims / 8
ROWS_PER_PASS = THREADS // THREADS_PER_ROW
ROWS_PER_STEP = ROWS_PER_PASS * UNROLL
#: Output rows per CTA on the GPU (a runtime value: changing it compiles nothing). Two steps: on
#: the H200 at 1 M rows 91-94 % of the copy against 88-90 % with four (the kernel waits on memory,
#: and more, shorter CTAs keep more of it in flight; ``benchmarks/results/shape_tuning_h200/``).
ROWS_PER_CTA = 2 * ROWS_PER_STEP


@dsl_user_op
def _dequant_pair(word: Uint32, half: int, scale: Float32, *, loc=None, ip=None) -> Uint32:
    """bf16 bits of ``e4m3_val(b) * scale`` for the two code bytes in half ``half`` (0: bytes 0, 1;
    1: bytes 2, 3) of ``word``, packed as one word (the lower byte's value in the low half).

    ``cvt.rn.f16x2.e4m3x2`` decodes both bytes at once (the lower byte of its 16-bit operand into
    the lower half; every e4m3 value, subnormals included, is an f16 value, so it is exact),
    ``cvt.f32.f16`` widens exactly, one ``mul.rn.f32`` per value scales (exact in the contract
    range), and ``prmt`` packs the two fp32 top halves: the bf16 bits, as the product is a bf16
    value (outside the contract range the low half is truncated: unspecified values).
    """
    body = ("{ .reg .b16 c0, c1, v0, v1; .reg .b32 h; .reg .f32 f0, f1;\n"
            "mov.b32 {c0, c1}, $1;\n"
            f"cvt.rn.f16x2.e4m3x2 h, c{half};\n"
            "mov.b32 {v0, v1}, h;\n"
            "cvt.f32.f16 f0, v0;\n"
            "cvt.f32.f16 f1, v1;\n"
            "mul.rn.f32 f0, f0, $2;\n"
            "mul.rn.f32 f1, f1, $2;\n"
            "prmt.b32 $0, f0, f1, 0x7632; }")
    return Uint32(inline_ptx(T.i32(), [Uint32(word), Float32(scale)], body, "=r,r,f", loc, ip))


@cute.kernel
def _dequant_gather_kernel(
    mOut: cute.Tensor,        # int16 [*] (the bf16 workspace, flat)
    mCache: cute.Tensor,      # uint8 [*] (page p at byte p * page_stride)
    mSeq: cute.Tensor,        # int32 [nreq]
    mGat: cute.Tensor,        # int32 [nreq] (seq_lens again when there are no gather_lens)
    mBT: cute.Tensor,         # int32 [*] (row b at b * bt_stride)
    bt_stride: Int32,
    rows_per_req: Int32,
    offset: Int32,
    page_stride: Int64,
    rows_per_cta: Int32,
    block_size: cutlass.Constexpr,
    has_gather_lens: cutlass.Constexpr,
):
    tidx, _, _ = cute.arch.thread_idx()
    split, b, _ = cute.arch.block_idx()
    seq_len = mSeq[b]
    g = seq_len
    if cutlass.const_expr(has_gather_lens):
        g = mGat[b]
    first = seq_len - g
    start = split * rows_per_cta
    end = cutlass.min(start + rows_per_cta, g)
    sub = tidx // THREADS_PER_ROW          # row within a pass
    t = tidx % THREADS_PER_ROW             # 8-dim slice of the row
    bt_row = Int64(b) * Int64(bt_stride)
    out_req = Int64(b) * Int64(rows_per_req) + Int64(offset)
    page_stride64 = page_stride // Int64(64)   # P is a multiple of 576 = 9 * 64 (checked on the host)

    for step in range(start, end, ROWS_PER_STEP):
        # Phase 1: every load of the step (rows past `end` re-read row end - 1 and store nothing).
        codes = cute.make_rmem_tensor((2, UNROLL), Uint32)       # 8 e4m3 bytes, little-endian
        rope = cute.make_rmem_tensor((8, UNROLL), Int16)
        sbs = cute.make_rmem_tensor(UNROLL, Uint8)
        for u in cutlass.range_constexpr(UNROLL):
            r = cutlass.min(step + u * ROWS_PER_PASS + sub, end - 1)
            tok = first + r
            page = Int64(mBT[bt_row + Int64(tok // block_size)])
            slot = Int64(tok % block_size)
            page_base = page * page_stride64 * Int64(64)
            entry = page_base + slot * Int64(576)
            if t < NOPE_THREADS:
                at = mCache.iterator + cute.assume(entry + Int64(t * 8), divby=8)
                src = cute.make_tensor(cute.recast_ptr(at, dtype=Uint32), cute.make_layout(2))
                cute.autovec_copy(src, codes[None, u])
                sbs[u] = mCache[page_base + Int64(block_size * 576) + slot * Int64(8) + Int64(t // 8)]
            else:
                at = mCache.iterator + cute.assume(entry + Int64(448 + (t - NOPE_THREADS) * 16), divby=16)
                src16 = cute.make_tensor(cute.recast_ptr(at, dtype=Int16), cute.make_layout(8))
                cute.autovec_copy(src16, rope[None, u])
        # Phase 2: decode and store.
        for u in cutlass.range_constexpr(UNROLL):
            r = step + u * ROWS_PER_PASS + sub
            if r < end:
                row = (out_req + Int64(r)) * Int64(512)
                if t < NOPE_THREADS:
                    scale = (Uint32(sbs[u]) << Uint32(23)).bitcast(Float32)   # 2**(sb - 127), exact
                    vals = cute.make_rmem_tensor(4, Uint32)               # 8 bf16, dims 8t .. 8t + 7
                    for j in cutlass.range_constexpr(4):
                        vals[j] = _dequant_pair(codes[j // 2, u], j % 2, scale)
                    at = mOut.iterator + cute.assume(row + Int64(t * 8), divby=8)
                    dst = cute.make_tensor(cute.recast_ptr(at, dtype=Uint32), cute.make_layout(4))
                    cute.autovec_copy(vals, dst)
                else:
                    dst = cute.make_tensor(
                        mOut.iterator + cute.assume(row + Int64(448 + (t - NOPE_THREADS) * 8), divby=8),
                        cute.make_layout(8))
                    cute.autovec_copy(rope[None, u], dst)


@cute.jit
def dequant_gather_host(
    mOut: cute.Tensor,
    mCache: cute.Tensor,
    mSeq: cute.Tensor,
    mGat: cute.Tensor,
    mBT: cute.Tensor,
    bt_stride: Int32,
    rows_per_req: Int32,
    offset: Int32,
    page_stride: Int64,
    rows_per_cta: Int32,
    splits: Int32,
    stream: Any,
    block_size: cutlass.Constexpr,
    has_gather_lens: cutlass.Constexpr,
):
    """Launch K3 on ``(splits, nreq)`` CTAs of ``THREADS`` threads."""
    _dequant_gather_kernel(mOut, mCache, mSeq, mGat, mBT, bt_stride, rows_per_req, offset, page_stride,
                           rows_per_cta, block_size, has_gather_lens).launch(
        grid=[splits, mSeq.shape[0], 1], block=[THREADS, 1, 1], stream=stream)


class DequantGatherCuTeDSL(DequantGatherBase, CuTeDSLJitKernel["DequantGatherBase.CompileKey"]):
    """K3 on CuTeDSL (compiles anywhere, runs on CUDA)."""

    jit_fn = dequant_gather_host
    #: Output rows per CTA (runtime: a different value compiles nothing).
    rows_per_cta: int = ROWS_PER_CTA

    def warmup_inputs(self, key: DequantGatherBase.CompileKey) -> tuple[Any, ...]:
        nreq = sym(symbol="nreq")
        return (
            fake_tensor(Int16, (sym(symbol="out_elems", width=64),)),               # 16-byte aligned
            fake_tensor(Uint8, (sym(symbol="cache_bytes", width=64),), align=32),
            fake_tensor(Int32, (nreq,), align=4),
            fake_tensor(Int32, (nreq,), align=4),
            fake_tensor(Int32, (sym(symbol="bt_elems", width=64),), align=4),
            Int32(0), Int32(0), Int32(0), Int64(0), Int32(0), Int32(0),
            fake_stream(self.tvm_ffi),
            key.block_size,
            key.has_gather_lens,
        )

    def launch_args(self, key, out, k_cache, seq_lens, gather_lens, block_table, offset) -> tuple[Any, ...]:
        num_pages, bs, _ = k_cache.shape
        stride = k_cache.stride(0)
        span = (num_pages - 1) * stride + bs * DS_ENTRY_BYTES if num_pages else 0
        cache = k_cache.as_strided((span,), (1,))
        nreq, mb = block_table.shape
        bt_span = (nreq - 1) * block_table.stride(0) + mb if mb else 0
        bt = block_table.as_strided((max(bt_span, 1),), (1,)) if block_table.numel() else seq_lens
        rows = out.shape[1]
        splits = -(-(rows - offset) // self.rows_per_cta)
        gl = seq_lens if gather_lens is None else gather_lens
        return (out.view(torch.int16).view(-1), cache, seq_lens, gl, bt, block_table.stride(0), rows, offset,
                stride, self.rows_per_cta, splits)
