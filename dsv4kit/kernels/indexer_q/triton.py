"""Indexer-Q (K1, K2) on the Triton backend: GPU, or the interpreter on CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton

from dsv4kit.backends.triton import FromKey, Ptr, Runtime, TritonJitKernel
from dsv4kit.errors import input_error
from dsv4kit.kernels.indexer_q.common import IndexerQBase
from dsv4kit.kernels.indexer_q.triton_kernels import indexer_q_fp8_kernel, indexer_q_mxfp4_kernel

__all__ = ["IndexerQFp8Triton", "IndexerQMxfp4Triton"]

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
    """Launch shape and device rule shared by the two Triton variants (a mixin)."""

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

    def check_device(self, index_q: torch.Tensor) -> None:
        want = "cuda" if self.platform.is_cuda else "cpu"
        if index_q.device.type != want:
            where = "Triton on the GPU" if want == "cuda" else "the Triton interpreter (no CUDA here)"
            raise input_error(self.name, "index_q", f"a {want} tensor ({where})", index_q.device)


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


