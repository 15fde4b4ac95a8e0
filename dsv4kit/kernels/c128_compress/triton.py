"""Triton backend of the C128 compressors K7, K8a, K8b: a token-block scan, the C4 norm-RoPE core and
the encoders' routine.

Why a scan: only 1 token in 128 of a prefill is a boundary, so one program per token would start
127 programs that load three ints and exit for every one that works. Instead a program owns a
block of ``tpp`` consecutive tokens (``tpp <= SCAN``; :func:`k7_plan`, :func:`tokens_per_program`:
host choices from T alone, so the grid needs no device read). It loads the block's positions and
slots as one vector, marks the live boundary tokens (slot >= 0, K8 also kv slot >= 0, ``(p + 1) % 128 == 0``),
ranks them with ``tl.cumsum`` and loops over their count; the k-th is extracted with masked sums
(rank == k). (A ``while`` loop: the interpreter cannot take a tensor as a ``range`` bound.)

K7 mapping: 1-D grid of ``cdiv(T, tpp) * (512 // BD)`` programs of 1 warp; program
``b * (512 // BD) + c`` pools columns ``[c BD, c BD + BD)`` of every boundary token of block b (the
chunk fastest: a block's chunk programs run together and share in L2 the sectors two chunks touch
and the block's metadata). The window ``p - 127 .. p`` is
128-aligned (16 whole state blocks of 8): row j is position ``p - 127 + j``, state row
``block_table[req, (p - 127) // 8 + j // 8]``, row ``j % 8`` of that block; kv at columns ``[0, 512)``,
score at ``[512, 1024)`` of the state row (``window_rows`` with overlap False). Two pooling paths,
chosen on the host from T (:func:`k7_plan`, a runtime int: one compile):

* path 0, *tile* (T <= 4096, and any block stride): BD = 8; both ``[128, 8]`` tiles loaded at once,
  ``m = max_j s_j``, ``e_j = exp(s_j - m)``, ``c = div_rn(sum_j e_j k_j, sum_j e_j)``: the
  reference's two-pass softmax with its division moved after the sum (one IEEE division per
  column, not 128). Shortest latency: 64 programs per boundary, one dependent load round.
* path 1, *stream* (T > 4096 and ``block_stride % 4 == 0``): BD = 64; the window streamed in 16
  steps of ``[8, 64]`` through a 3-stage cp.async pipeline (16-byte copies: the stride is written
  ``(block_stride // 4) * 4``, which the host guarantees), online max / sum
  (``den = den * exp(m - m') + sum e``, same for ``acc``), then ``div_rn(acc, den)``. Most bytes in
  flight per SM: ~16 resident 1-warp programs (128 registers), each with 3 steps outstanding.

The fp32 row goes to ``out[t, cols]``; rows of other tokens are never written. Measured on an
H200 (CUDA-graph replays; copy bandwidth 4.24-4.27 TB/s read + written; bytes = 512 KiB per
boundary; two runs): prefill T = 8192 / 16 384 / 65 536 / 131 072: 81 / 80-81 / 93-95 / 95-98 % of
copy bandwidth (65 536: 67-68 us); T = 2048 / 4096: 4.8-5.2 / 7.0-8.6 us; decode T = 1 / 8 / 64 /
256: 3.3 / 3.3 / 3.9-4.0 / 3.8 us (launch floor ~2.5 us); worst decode, every token a boundary:
T = 64 15 us, T = 256 49 us (65 %). Rejected after measuring: one 4-warp ``[128, 32]`` tile path
for all T (77-85 % at 65 536, 3.9 us at T = 1, but 38 us when all 256 decode tokens are
boundaries); the per-element division of the reference (-8 % bandwidth); wider tiles (BD 64 / 128
with 8 warps: 52 / 38 %); a 16-byte-aligned copy of the tile path (0.6 us slower in decode).
Under the CPU interpreter a program takes all 512 columns and SCAN tokens
(``interpreter_constexprs``: the same per-element arithmetic, far fewer interpreted programs); the
path follows the same rule.

K8 mapping: grid ``(cdiv(T, tpp),)``, 4 warps; per boundary token of the block: load
``compressed_kv[t]`` (512 fp32), RMSNorm with the fp32 norm weight (``sqrt_rn``, ``div_rn``: IEEE
like the reference), RoPE of the last 64 dims of the fp32 normalized values at cos/sin row
``(p // 128) * 128`` (:func:`~dsv4kit.kernels.c4_compress.triton.norm_rope`, the C4 compressors'
core), then :func:`~dsv4kit.kernels.encoders.triton.encode_store` with the key's encoder (K8a E1;
K8b E2 / E3), the very routine the store hooks run. Measured: 2.4-4.4 us for every T up to 65 536
(the launch floor; a few KiB per boundary).

Numerics: launched with FMA contraction off (every product and sum rounds separately); exp is the
backend's ``tl.exp``; results follow the FP32 rule (K7) and the compressor rule (K8); the encode
step is bit-exact given y. K8 rounds bf16 / e4m3 by the GPU's casts (``HW_CVT``: fewer
instructions per element, the same bits); under the interpreter, which truncates those casts, by
the encoders' integer recipes (the backend sets ``HW_CVT`` false there), so it writes the GPU's bytes.

Compile-time vs runtime: K7's key is fixed, so one compile; T, ``tpp``, the path, the block stride
and the block-table stride are runtime. K8a's page geometry (kv_bs, page stride) is compile-time (key fields
``kv_cache_block_size``, ``kv_block_stride``: slot // kv_bs and the page offsets fold to constants);
K8b's is runtime; T, ``tpp`` and eps are runtime in both. ``out`` and ``compressed_kv`` may have
any alignment (2 KiB per boundary: not worth a rule the spec does not make).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from dsv4kit.backends.triton import Const, FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.kernels.c4_compress.triton import STATE_POINTERS, norm_rope
from dsv4kit.kernels.c128_compress.spec import C128CompressBase, C128StoreDsMlaBase, C128StorePlainBase
from dsv4kit.kernels.compressor.contract import LaunchOperands
from dsv4kit.kernels.encoders.spec import key_encoder
from dsv4kit.kernels.encoders.triton import encode_store

__all__ = [
    "BD_STREAM",
    "BD_TILE",
    "SCAN",
    "STREAM_MIN_TOKENS",
    "STREAM_ROWS",
    "STREAM_STAGES",
    "C128CompressTriton",
    "C128StoreDsMlaTriton",
    "C128StorePlainTriton",
    "c128_compress_kernel",
    "c128_store_ds_kernel",
    "c128_store_plain_kernel",
    "k7_plan",
    "tokens_per_program",
]

#: Tokens a program can scan (the width of its index vector); ``tpp <= SCAN``.
SCAN = 128
#: K7 on the GPU: columns per program of the tile path (decode, small T) and of the streaming path
#: (large T), rows per streamed step, pipeline stages. The interpreter takes all 512 columns.
BD_TILE, BD_STREAM, STREAM_ROWS, STREAM_STAGES = 8, 64, 8, 3
#: K7 streams (path 1) above this many tokens (and only with a block stride % 4 == 0).
STREAM_MIN_TOKENS = 4096
HEAD = 512  # head size and state width (K7 / K8 keys: fixed)
_HEAD = tl.constexpr(HEAD)


def tokens_per_program(t: int) -> int:
    """K8's tokens per program on the GPU: ``T // 128`` clamped to [1, SCAN] (about one boundary per
    program in a prefill; a decode step, T <= 255, one token per program)."""
    return min(SCAN, max(1, t // 128))


def k7_plan(t: int, block_stride: int) -> tuple[int, int]:
    """K7's ``(tpp, path)`` on the GPU for T tokens: ``tpp = T // 32`` clamped to [1, SCAN] (fewer,
    fuller token blocks than K8: K7 launches 512 / BD programs per block); path 1 (stream) iff
    ``T > STREAM_MIN_TOKENS`` and the block stride is a multiple of 4 (the streaming path assumes
    16-byte rows), else path 0 (tile)."""
    stream = t > STREAM_MIN_TOKENS and block_stride % 4 == 0
    return min(SCAN, max(1, t // 32)), int(stream)


# --------------------------------------------------------------------------- K7


@triton.jit
def _pool_tile(state_ptr, bt_row, out_row, block_stride, chunk, BD: tl.constexpr):
    """Path 0: columns ``[c BD, c BD + BD)`` (c = chunk) of one window as two ``[128, BD]``
    tiles loaded at once: the shortest latency (decode)."""
    cols = chunk * BD + tl.arange(0, BD)
    j = tl.arange(0, 128)
    # Row j = position p - 127 + j: block column j // 8 of the window, row j % 8 of that block.
    blk = tl.load(bt_row + j // 8).to(tl.int64)
    at = (blk * block_stride + (j % 8) * (2 * _HEAD))[:, None] + cols[None, :]
    # Read once: evict_first keeps the stream from pushing the small arrays out of L2.
    kv = tl.load(state_ptr + at, eviction_policy="evict_first")
    s = tl.load(state_ptr + at + _HEAD, eviction_policy="evict_first")
    m = tl.max(s, axis=0)
    e = tl.exp(s - m[None, :])
    # sum_j (e_j / S) k_j as (sum_j e_j k_j) / S: one IEEE division per column, not 128.
    tl.store(out_row + cols, tl.div_rn(tl.sum(e * kv, axis=0), tl.sum(e, axis=0)))


@triton.jit
def _pool_stream(state_ptr, bt_row, out_row, block_stride, chunk, BD: tl.constexpr, R: tl.constexpr,
                 NS: tl.constexpr):
    """Path 1: the same columns streamed in ``128 / R`` steps of ``[R, BD]`` (NS-stage cp.async
    pipeline) with an online max / sum: the most bytes in flight per SM (large T)."""
    cols = chunk * BD + tl.arange(0, BD)
    j = tl.arange(0, R)
    m = tl.full([BD], float("-inf"), tl.float32)
    den = tl.zeros([BD], tl.float32)
    acc = tl.zeros([BD], tl.float32)
    for r in tl.range(0, 128 // R, num_stages=NS):
        blk = tl.load(bt_row + r * (R // 8) + j // 8).to(tl.int64)
        at = (blk * block_stride + (j % 8) * (2 * _HEAD))[:, None] + cols[None, :]
        kv = tl.load(state_ptr + at)
        s = tl.load(state_ptr + at + _HEAD)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)  # 0 at the first step (m = -inf); e <= 1 always: no overflow
        e = tl.exp(s - m_new[None, :])
        den = den * alpha + tl.sum(e, axis=0)
        acc = acc * alpha + tl.sum(e * kv, axis=0)
        m = m_new
    tl.store(out_row + cols, tl.div_rn(acc, den))


@triton.jit(
    do_not_specialize=["n_tok", "tpp", "block_stride", "bt_stride", "path"],
    do_not_specialize_on_alignment=["req_ptr", "pos_ptr", "slot_ptr", "bt_ptr", "out_ptr"],
)
def c128_compress_kernel(
    state_ptr,  # fp32: the state cache from its first block (LaunchOperands.state), 16-byte aligned
    req_ptr,  # int32 [T] token_to_req
    pos_ptr,  # int64 [T]
    slot_ptr,  # int64 [T] state slots (< 0: padding)
    bt_ptr,  # int32 block table: row r at r * bt_stride
    out_ptr,  # fp32 [>= T, 512], strides (512, 1); any alignment (2 KiB per boundary: not worth a rule)
    n_tok: tl.int32,
    tpp: tl.int32,
    block_stride: tl.int64,
    bt_stride: tl.int64,
    path: tl.int32,  # 0: tile, 1: stream (k7_plan: only with block_stride % 4 == 0)
    BD_TILE: tl.constexpr,
    BD_STREAM: tl.constexpr,
    STREAM_ROWS: tl.constexpr,
    STREAM_STAGES: tl.constexpr,
    SCAN: tl.constexpr,
):
    # 1-D grid, the column chunk fastest: a token block's chunk programs run side by side, so the
    # sectors two chunks share (rows not 32-byte aligned) and the block's metadata are read from
    # DRAM once (the chunk-slow 2-D grid measured DRAM bytes 1.08 x the model under ncu).
    pid = tl.program_id(0)
    if path == 1:
        chunk = pid % (_HEAD // BD_STREAM)
        blk_id = pid // (_HEAD // BD_STREAM)
    else:
        chunk = pid % (_HEAD // BD_TILE)
        blk_id = pid // (_HEAD // BD_TILE)
    first = blk_id.to(tl.int64) * tpp
    i = tl.arange(0, SCAN)
    tok = first + i
    live = (i < tpp) & (tok < n_tok)
    p = tl.load(pos_ptr + tok, mask=live, other=0)
    slot = tl.load(slot_ptr + tok, mask=live, other=-1)
    reqs = tl.load(req_ptr + tok, mask=live, other=0)  # with the scan: one dependent load less
    hit = live & (slot >= 0) & ((p + 1) % 128 == 0)
    rank = tl.cumsum(hit.to(tl.int32), axis=0)  # the k-th boundary of the block has rank k
    n = tl.sum(hit.to(tl.int32), axis=0)
    k = 0
    # A while loop, not range(n): the interpreter cannot take a tensor as a range bound (numpy 2).
    while k < n:
        k += 1
        sel = hit & (rank == k)
        t = tl.sum(tl.where(sel, tok, 0), axis=0)
        pt = tl.sum(tl.where(sel, p, 0), axis=0)
        req = tl.sum(tl.where(sel, reqs, 0), axis=0).to(tl.int64)
        # The window's 16 blocks: block-table columns (p - 127) // 8 + 0..15.
        bt_row = bt_ptr + req * bt_stride + (pt - 127) // 8
        out_row = out_ptr + t * _HEAD
        if path == 1:
            # The host streams only when block_stride % 4 == 0: written so, every row offset is
            # provably 16-byte aligned and the copies are 16-byte vectors.
            _pool_stream(state_ptr, bt_row, out_row, (block_stride // 4) * 4, chunk, BD_STREAM, STREAM_ROWS,
                         STREAM_STAGES)
        else:
            # Any block stride. (An aligned copy of this path measured 0.6 us slower in decode, not
            # faster: latency-bound, and a third copy of the pooling code.)
            _pool_tile(state_ptr, bt_row, out_row, block_stride, chunk, BD_TILE)


class C128CompressTriton(C128CompressBase, TritonJitKernel["C128CompressBase.CompileKey"]):
    """K7 on Triton (GPU, or the interpreter on CPU)."""

    kernel_fn = c128_compress_kernel
    params = {
        **STATE_POINTERS,
        "out_ptr": Ptr(torch.float32, aligned=False),
        **dict.fromkeys(("n_tok", "tpp", "block_stride", "bt_stride", "path"), Runtime()),
        "BD_TILE": Const(BD_TILE),
        "BD_STREAM": Const(BD_STREAM),
        "STREAM_ROWS": Const(STREAM_ROWS),
        "STREAM_STAGES": Const(STREAM_STAGES),
        "SCAN": Const(SCAN),
    }

    def launch_options(self, key: Any) -> dict[str, Any]:
        return {"num_warps": 1}  # 1-warp programs: many resident per SM, reductions within a warp

    def interpreter_constexprs(self, key: Any) -> dict[str, Any]:
        return {"BD_TILE": HEAD, "BD_STREAM": HEAD}

    def plan(self, t: int, block_stride: int) -> tuple[int, int]:
        """``(tpp, path)``: :func:`k7_plan` on the GPU; under the interpreter SCAN tokens per program
        (fewer interpreted programs) and the GPU's path."""
        tpp, path = k7_plan(t, block_stride)
        return (tpp if self.platform.is_cuda else SCAN), path

    def block_cols(self, path: int) -> int:
        """Columns per program of ``path`` (512 / this chunk programs per token block)."""
        if not self.platform.is_cuda:
            return HEAD
        return BD_STREAM if path else BD_TILE

    def grid(self, key: Any, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(args["n_tok"], args["tpp"]) * (HEAD // self.block_cols(args["path"])),)

    def launch_args(self, key: Any, ops: Any, run: LaunchOperands) -> tuple[Any, ...]:
        tpp, path = self.plan(run.t, run.block_stride)
        return (run.state, ops.token_to_req, ops.positions, ops.slot_mapping, ops.block_table, ops.out, run.t,
                tpp, run.block_stride, run.bt_stride, path)


# --------------------------------------------------------------------------- K8a / K8b


@triton.jit
def _store_block(
    ckv_ptr, pos_ptr, slot_ptr, kv_slot_ptr, nw_ptr, cs_ptr, cache_ptr, scale_ptr, n_tok, tpp, eps,
    kv_bs, page_stride, ENC: tl.constexpr, SCAN: tl.constexpr, HW: tl.constexpr,
):
    """Norm, rotate, encode and store every live boundary token of block b (program b)."""
    first = tl.program_id(0).to(tl.int64) * tpp
    i = tl.arange(0, SCAN)
    tok = first + i
    live = (i < tpp) & (tok < n_tok)
    p = tl.load(pos_ptr + tok, mask=live, other=0)
    slot = tl.load(slot_ptr + tok, mask=live, other=-1)
    kv_slots = tl.load(kv_slot_ptr + tok, mask=live, other=-1)
    hit = live & (slot >= 0) & (kv_slots >= 0) & ((p + 1) % 128 == 0)
    rank = tl.cumsum(hit.to(tl.int32), axis=0)  # the k-th boundary of the block has rank k + 1
    d = tl.arange(0, _HEAD)
    n = tl.sum(hit.to(tl.int32), axis=0)
    k = 0
    while k < n:  # as _pool_block
        k += 1
        sel = hit & (rank == k)
        t = tl.sum(tl.where(sel, tok, 0), axis=0)
        pt = tl.sum(tl.where(sel, p, 0), axis=0)
        kv_slot = tl.sum(tl.where(sel, kv_slots, 0), axis=0)
        c = tl.load(ckv_ptr + t * _HEAD + d)
        y = norm_rope(c, nw_ptr, cs_ptr, (pt // 128) * 128, eps, _HEAD)
        encode_store(y, cache_ptr, scale_ptr, kv_slot, kv_bs, page_stride, ENC, _HEAD // 64, HW)


_STORE_UNALIGNED = ["ckv_ptr", "pos_ptr", "slot_ptr", "kv_slot_ptr", "nw_ptr", "cs_ptr", "scale_ptr"]


@triton.jit(do_not_specialize=["n_tok", "tpp"], do_not_specialize_on_alignment=_STORE_UNALIGNED)
def c128_store_ds_kernel(
    ckv_ptr,  # fp32 [T, 512] compressed_kv, strides (512, 1); any alignment
    pos_ptr,  # int64 [T]
    slot_ptr,  # int64 [T] state slots (< 0: padding)
    kv_slot_ptr,  # int64 [T] compressed-cache slots (< 0: skip)
    nw_ptr,  # bf16 / fp32 [512] norm weight
    cs_ptr,  # fp32 [max_pos, 64] cos/sin
    cache_ptr,  # uint8: the fp8_ds_mla cache from its first page (StoreOperands.cache), 32-byte aligned
    scale_ptr,  # fp32 [1] stand-in, never read (E1)
    n_tok: tl.int32,
    tpp: tl.int32,
    eps: tl.float32,
    KV_BS: tl.constexpr,  # k_cache.shape[1] (key): slot // KV_BS is a constant division
    PAGE_STRIDE: tl.constexpr,  # k_cache.stride(0) in bytes (key, trap 4)
    ENC: tl.constexpr,
    SCAN: tl.constexpr,
    HW_CVT: tl.constexpr = True,  # bf16 / e4m3 rounding by the GPU's casts (False: the interpreter)
):
    _store_block(ckv_ptr, pos_ptr, slot_ptr, kv_slot_ptr, nw_ptr, cs_ptr, cache_ptr, scale_ptr, n_tok, tpp,
                 eps, KV_BS, PAGE_STRIDE, ENC, SCAN, HW_CVT)


@triton.jit(
    do_not_specialize=["n_tok", "tpp", "kv_bs", "page_stride"],
    do_not_specialize_on_alignment=_STORE_UNALIGNED,
)
def c128_store_plain_kernel(
    ckv_ptr,  # fp32 [T, 512] compressed_kv, strides (512, 1); any alignment
    pos_ptr,  # int64 [T]
    slot_ptr,  # int64 [T] state slots (< 0: padding)
    kv_slot_ptr,  # int64 [T] compressed-cache slots (< 0: skip)
    nw_ptr,  # bf16 / fp32 [512] norm weight
    cs_ptr,  # fp32 [max_pos, 64] cos/sin
    cache_ptr,  # uint8: the plain-row cache from its first page (StoreOperands.cache), 16-byte aligned
    scale_ptr,  # fp32 [1] fp8_scale (E3), otherwise never read
    n_tok: tl.int32,
    tpp: tl.int32,
    eps: tl.float32,
    kv_bs: tl.int32,
    page_stride: tl.int64,  # bytes, a multiple of 16 (host-checked)
    ENC: tl.constexpr,
    SCAN: tl.constexpr,
    HW_CVT: tl.constexpr = True,  # bf16 / e4m3 rounding by the GPU's casts (False: the interpreter)
):
    _store_block(ckv_ptr, pos_ptr, slot_ptr, kv_slot_ptr, nw_ptr, cs_ptr, cache_ptr, scale_ptr, n_tok, tpp,
                 eps, kv_bs, page_stride, ENC, SCAN, HW_CVT)


_STORE_PARAMS = {
    "ckv_ptr": Ptr(torch.float32, aligned=False),
    "pos_ptr": Ptr(torch.int64, aligned=False),
    "slot_ptr": Ptr(torch.int64, aligned=False),
    "kv_slot_ptr": Ptr(torch.int64, aligned=False),
    "nw_ptr": Ptr("norm_weight_dtype", aligned=False),
    "cs_ptr": Ptr(torch.float32, aligned=False),
    "cache_ptr": Ptr(torch.uint8),  # data_ptr % 32 (fp8_ds_mla) / % 16 (plain rows) == 0: checked
    "scale_ptr": Ptr(torch.float32, aligned=False),
    "n_tok": Runtime(),
    "tpp": Runtime(),
    "eps": Runtime(),
    "ENC": FromKey(key_encoder),
    "SCAN": Const(SCAN),
    "HW_CVT": Const(True),
}


class _C128StoreTriton:
    """The launch K8a and K8b share (a mixin): one program per token block, the key's encoder."""

    def launch_options(self, key: Any) -> dict[str, Any]:
        return {"num_warps": 4}

    def tokens_per_program(self, t: int) -> int:
        """``tpp`` for T tokens: the GPU's rule, or SCAN under the interpreter (fewer programs)."""
        return tokens_per_program(t) if self.platform.is_cuda else SCAN

    def grid(self, key: Any, args: Mapping[str, Any]) -> tuple[int, ...]:
        return (triton.cdiv(args["n_tok"], args["tpp"]),)

    def launch_args(self, key: Any, ops: Any, run: LaunchOperands) -> tuple[Any, ...]:
        st, t = run.store, run.t
        common = (ops.compressed_kv, ops.positions, ops.slot_mapping, ops.kv_slot_mapping,
                  ops.rms_norm_weight, ops.cos_sin_cache, st.cache, st.scale, t, self.tokens_per_program(t),
                  run.eps)
        return common if self.geometry_in_key else (*common, st.kv_bs, st.page_stride)


class C128StoreDsMlaTriton(
    _C128StoreTriton, C128StoreDsMlaBase, TritonJitKernel["C128StoreDsMlaBase.CompileKey"]
):
    """K8a on Triton: page geometry from the key (constexpr)."""

    kernel_fn = c128_store_ds_kernel
    params = {
        **_STORE_PARAMS,
        "KV_BS": FromKey("kv_cache_block_size"),
        "PAGE_STRIDE": FromKey("kv_block_stride"),
    }
    geometry_in_key = True


class C128StorePlainTriton(
    _C128StoreTriton, C128StorePlainBase, TritonJitKernel["C128StorePlainBase.CompileKey"]
):
    """K8b on Triton: page geometry runtime."""

    kernel_fn = c128_store_plain_kernel
    params = {**_STORE_PARAMS, "kv_bs": Runtime(), "page_stride": Runtime()}
    geometry_in_key = False

