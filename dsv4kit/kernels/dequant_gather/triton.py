"""Triton backend of K3: dequantize-and-gather of the fp8_ds_mla K cache (spec K3, §2.5).

Grid ``(splits, nreq)``: program ``(s, b)`` writes output rows ``[s * rows_per_prog,
(s + 1) * rows_per_prog) ∩ [0, G)`` of request ``b`` (at ``out[b, offset + i]``), in tiles of
``ROWS`` rows. ``rows_per_prog`` is a runtime argument, so the same compiled code serves the GPU
(a few tiles per program, many programs) and the CPU interpreter (one program per request, where
every program instance costs Python time).

Per row (entry ``tok = L - G + i`` at page ``block_table[b, tok // BS]``, slot ``o = tok % BS``):

* nope: a ``[ROWS, 8, 64]`` tile of e4m3 bytes (block 7 masked off: 448 = 7 x 64), the 8 scale
  bytes of the entry (the 8th, the pad, is never used), and the product
  ``e4m3_val(byte) * 2**(sb - 127)`` in fp32. The byte is decoded by the cast
  ``byte.to(float8e4nv, bitcast=True).to(float32)``: on sm_90 Triton lowers it to the hardware
  ``cvt.rn.f16x2.e4m3x2`` (two bytes per instruction) and an f16 -> f32 widening, both exact (every
  e4m3 value, subnormals included, is an f16 value); the interpreter decodes the same bits exactly
  in numpy (the exhaustive byte x scale-byte table test checks both). The scale is the fp32 with
  bits ``sb << 23``, and the one fp32 multiply is exact for the contract's scale bytes 105..254
  (the product has at most 4 significant bits and is a normal bf16 value, or overflows to ±inf).
  So its bf16 bits are the fp32 bits' top half, stored through an int16 view: no cast rounds
  (outside the contract range, NaN codes and other scale bytes give unspecified values: the low
  half is dropped, no fault).
* rope: 64 bf16 copied as int16 bit patterns.

All addresses are int64 (``page * P`` exceeds 2**31 in a large cache). Only block-table entries
``[ (L - G) // BS, ceil(L / BS) )`` are read, so padding entries (-1) never are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const, FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.triton_numerics import bits, from_bits

__all__ = ["DequantGatherTriton", "dequant_gather_kernel"]

#: Rows per tile and warps per program on the GPU (the launch configuration of every key). One
#: warp, one 4-row tile per program (``gpu_rows_per_program``): the kernel waits on memory (long
#: scoreboard 75-79 % of warp cycles), and many small programs keep more of it in flight than a
#: few that loop; on the H200 at 1 M rows 92-94 % of the copy against 87-89 % with 4 warps and
#: 4 tiles of 8 rows (``benchmarks/results/shape_tuning_h200/``).
ROWS = 4
NUM_WARPS = 1

NOPE: tl.constexpr = tl.constexpr(448)
TOKEN_BYTES: tl.constexpr = tl.constexpr(576)
HEAD: tl.constexpr = tl.constexpr(512)


@triton.jit
def _dequant_bits(codes, scale):
    """bf16 bits (int16) of ``e4m3_val(codes) * scale``: a hardware decode (exact), one exact fp32
    multiply in the contract range, and the product's top half."""
    val = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale
    return (bits(val) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit(
    do_not_specialize=["bt_stride", "rows_per_req", "offset", "page_stride", "rows_per_prog"],
    do_not_specialize_on_alignment=["seq_lens_ptr", "gather_lens_ptr", "block_table_ptr"],
)
def dequant_gather_kernel(
    out_ptr,            # bf16 [>= nreq, rows_per_req, 512], contiguous (written as int16 bits)
    cache_ptr,          # uint8 fp8_ds_mla pages, page p at byte p * page_stride
    seq_lens_ptr,       # int32 [nreq]
    gather_lens_ptr,    # int32 [nreq] (a placeholder when HAS_GATHER_LENS is false)
    block_table_ptr,    # int32 [nreq, *], unit column stride
    bt_stride: tl.int32,
    rows_per_req: tl.int32,
    offset: tl.int32,
    page_stride: tl.int64,
    rows_per_prog: tl.int32,
    BLOCK_SIZE: tl.constexpr,
    HAS_GATHER_LENS: tl.constexpr,
    ROWS: tl.constexpr,
):
    split = tl.program_id(0)
    b = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    if HAS_GATHER_LENS:
        g = tl.load(gather_lens_ptr + b)
    else:
        g = seq_len
    first = seq_len - g                 # entry of output row 0
    start = split * rows_per_prog
    end = tl.minimum(start + rows_per_prog, g)

    cache16 = cache_ptr.to(tl.pointer_type(tl.int16), bitcast=True)
    out16 = out_ptr.to(tl.pointer_type(tl.int16), bitcast=True)
    # P is a multiple of 576 = 9 * 64 (§2.5, checked on the host): page bases are built as
    # page * (P / 64) * 64 so that the compiler sees 64-byte alignment and vectorizes.
    page_stride64 = page_stride // 64
    bt_row = block_table_ptr + b.to(tl.int64) * bt_stride

    r = tl.arange(0, ROWS)
    blk = tl.arange(0, 8)
    lane = tl.arange(0, 64)
    nope_mask = (blk < 7)[None, :, None]
    col = blk[:, None] * 64 + lane[None, :]                        # [8, 64] dims (block 7: unused)

    r0 = start
    while r0 < end:  # (a while loop: the interpreter cannot range() over loaded scalars)
        i = r0 + r
        ok = i < end
        tok = first + i
        page = tl.load(bt_row + tok // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        slot = (tok % BLOCK_SIZE).to(tl.int64)
        page64 = page * page_stride64
        entry = page64 * 64 + slot * TOKEN_BYTES                   # byte offset of the 576 data bytes
        scale_at = page64 * 64 + BLOCK_SIZE * TOKEN_BYTES + slot * 8
        rope_at = page64 * 32 + slot * (TOKEN_BYTES // 2) + NOPE // 2   # int16 units
        out_row = ((b.to(tl.int64) * rows_per_req + offset + i) * HEAD)   # element offset of the row

        m3 = ok[:, None, None] & nope_mask
        codes = tl.load(cache_ptr + entry[:, None, None] + col[None, :, :], mask=m3, other=0)
        # All 8 bytes; the 8th is the pad byte and scales block 7, which is never stored. (On
        # sm_90a they come as byte loads, not one 8-byte load: benchmarks/results/sass_mix_sm90a.)
        sb = tl.load(cache_ptr + scale_at[:, None] + blk[None, :], mask=ok[:, None], other=127)
        # The rope row with the codes: loaded after the nope stores it would wait for them (a
        # load does not move above a store Triton cannot prove apart), one round trip more.
        rope = tl.load(cache16 + rope_at[:, None] + lane[None, :], mask=ok[:, None])
        scale = from_bits(sb.to(tl.uint32) << 23)                   # 2**(sb - 127), exact
        vals = _dequant_bits(codes, scale[:, :, None])
        tl.store(out16 + out_row[:, None, None] + col[None, :, :], vals, mask=m3)
        tl.store(out16 + out_row[:, None] + NOPE + lane[None, :], rope, mask=ok[:, None])
        r0 += ROWS


class DequantGatherTriton(DequantGatherBase, TritonJitKernel["DequantGatherBase.CompileKey"]):
    """K3, Triton backend (GPU, or the interpreter on CPU)."""

    kernel_fn = dequant_gather_kernel
    params = {
        "out_ptr": Ptr(torch.bfloat16),            # 16-byte aligned: checked (spec K3)
        "cache_ptr": Ptr(torch.uint8),             # 32-byte aligned: checked (§2.10)
        "seq_lens_ptr": Ptr(torch.int32, aligned=False),
        "gather_lens_ptr": Ptr(torch.int32, aligned=False),
        "block_table_ptr": Ptr(torch.int32, aligned=False),
        "bt_stride": Runtime(),
        "rows_per_req": Runtime(),
        "offset": Runtime(),
        "page_stride": Runtime(),
        "rows_per_prog": Runtime(),
        "BLOCK_SIZE": FromKey("block_size"),
        "HAS_GATHER_LENS": FromKey("has_gather_lens"),
        "ROWS": Const(ROWS),
    }

    #: Output rows one GPU program covers (``ROWS``-row tiles); a runtime value, so no recompile.
    gpu_rows_per_program: int = ROWS

    def launch_options(self, key: DequantGatherBase.CompileKey) -> dict[str, Any]:
        return {"num_warps": NUM_WARPS}

    def grid(self, key: DequantGatherBase.CompileKey, args: Mapping[str, Any]) -> tuple[int, ...]:
        free_rows = args["rows_per_req"] - args["offset"]   # >= max G (offset + G <= M)
        return (triton.cdiv(free_rows, args["rows_per_prog"]), args["seq_lens_ptr"].shape[0])

    def launch_args(self, key, out, k_cache, seq_lens, gather_lens, block_table, offset) -> tuple[Any, ...]:
        rows = out.shape[1]
        # One program per request under the interpreter (each program instance costs Python time).
        per_prog = self.gpu_rows_per_program if self.platform.is_cuda else max(rows - offset, 1)
        return (out, k_cache, seq_lens, seq_lens if gather_lens is None else gather_lens, block_table,
                block_table.stride(0), rows, offset, k_cache.stride(0), per_prog)
