"""Indexer-Q (K1, K2) on the CuTeDSL backend: compiles anywhere, runs on CUDA."""

from __future__ import annotations

from typing import Any

import torch
from cutlass import BFloat16, Float32, Int16, Int32, Int64

from dsv4kit.backends.cutedsl import CuTeDSLJitKernel, fake_stream, fake_tensor, sym
from dsv4kit.errors import input_error
from dsv4kit.kernels.indexer_q.common import IndexerQBase
from dsv4kit.kernels.indexer_q.cutedsl_kernels import launch_fp8, launch_mxfp4

__all__ = ["IndexerQFp8CuTeDSL", "IndexerQMxfp4CuTeDSL"]

_CS_DTYPES = {"float32": Float32, "bfloat16": BFloat16}


class _CuteLaunch:
    """Fake inputs and the device rule shared by the two CuTeDSL variants (a mixin)."""

    name: str
    tvm_ffi: bool

    def _shared_fakes(self, key: IndexerQBase.CompileKey) -> tuple[tuple[Any, ...], Any]:
        t, r, p = sym(symbol="T"), sym(symbol="R"), sym(symbol="max_pos")
        if key.cos_sin_dtype not in _CS_DTYPES:
            raise input_error(self.name, "cos_sin_dtype", f"one of {list(_CS_DTYPES)}", key.cos_sin_dtype)
        return (
            fake_tensor(Int64, (t,), align=8),                              # positions
            fake_tensor(Int64, (r, key.head_dim // 4)),                     # index_q as [R, 32] words
            fake_tensor(_CS_DTYPES[key.cos_sin_dtype], (p, key.rope_dim), align=4),
            fake_tensor(BFloat16, (r,), align=2),                           # index_weights [R]
        ), r

    def check_device(self, index_q: torch.Tensor) -> None:
        if index_q.device.type != "cuda":
            raise input_error(self.name, "index_q", "a cuda tensor (CuTeDSL kernels run only on a GPU)",
                              index_q.device)


class IndexerQFp8CuTeDSL(_CuteLaunch, IndexerQBase, CuTeDSLJitKernel["IndexerQBase.CompileKey"]):
    """K1 on CuTeDSL: ``q_out`` written as int32 words of 4 e4m3 bytes."""

    cache_format = "fp8"
    jit_fn = launch_fp8

    def warmup_inputs(self, key: IndexerQBase.CompileKey) -> tuple[Any, ...]:
        shared, r = self._shared_fakes(key)
        q_out = fake_tensor(Int32, (r, key.head_dim // 4))
        w_out = fake_tensor(Float32, (r,), align=4)
        return (*shared, q_out, w_out, Int32(0), Float32(0.0), Float32(0.0), fake_stream(self.tvm_ffi),
                key.coarsen)

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_fp8, w_out = outs
        rows = q_fp8.shape[0] * q_fp8.shape[1]
        return (positions, index_q.view(torch.int64).view(rows, -1), cos_sin_cache, index_weights.view(rows),
                q_fp8.view(torch.int32).view(rows, -1), w_out.view(rows), rows, ss, hs)


class IndexerQMxfp4CuTeDSL(_CuteLaunch, IndexerQBase, CuTeDSLJitKernel["IndexerQBase.CompileKey"]):
    """K2 on CuTeDSL: packed codes as int16 words (2 bytes per lane), int32 scale words."""

    cache_format = "mxfp4"
    jit_fn = launch_mxfp4

    def warmup_inputs(self, key: IndexerQBase.CompileKey) -> tuple[Any, ...]:
        shared, r = self._shared_fakes(key)
        q_out = fake_tensor(Int16, (r, key.head_dim // 4))
        scale = fake_tensor(Int32, (r,), align=4)
        w_out = fake_tensor(Float32, (r,), align=4)
        return (*shared, q_out, scale, w_out, Int32(0), Float32(0.0), Float32(0.0),
                fake_stream(self.tvm_ffi), key.coarsen)

    def launch_args(self, positions, index_q, cos_sin_cache, index_weights, outs, ss, hs):
        q_packed, q_scale, w_out = outs
        rows = q_packed.shape[0] * q_packed.shape[1]
        return (positions, index_q.view(torch.int64).view(rows, -1), cos_sin_cache, index_weights.view(rows),
                q_packed.view(torch.int16).view(rows, -1), q_scale.view(rows), w_out.view(rows), rows, ss,
                hs)


