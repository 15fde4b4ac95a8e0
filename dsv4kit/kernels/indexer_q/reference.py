"""PyTorch references of K1 (indexer-Q RoPE + FP8 quant + weight fold) and K2 (… + MXFP4 quant).

Normative: Triton and CuTeDSL must match these bit for bit (D2).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.operands import operands, with_operands
from dsv4kit.family.schema import Arg
from dsv4kit.formats.bits import bf16_round, pow2
from dsv4kit.formats.checks import (
    check_contiguous,
    check_dtype,
    check_ndim,
    check_per_token,
    check_same_device,
    check_shape,
    check_values_in_range,
)
from dsv4kit.formats.fp8 import q8_quantize
from dsv4kit.formats.mxfp4 import MXFP4_BLOCK, pack_nibbles, q4_quantize, scale_bytes_to_int32
from dsv4kit.formats.rope import ROPE_DIM, rope_rotate

__all__ = [
    "ARGS",
    "INDEXER_HEAD_DIM",
    "INDEXER_NUM_HEADS",
    "DEFAULT_SOFTMAX_SCALE",
    "DEFAULT_HEAD_SCALE",
    "IndexerQOperands",
    "check_indexer_q_inputs",
    "indexer_q_rope_bf16",
    "indexer_q_fp8_reference",
    "indexer_q_mxfp4_reference",
    "indexer_q_outputs",
]

INDEXER_HEAD_DIM = 128
INDEXER_NUM_HEADS = 64
DEFAULT_SOFTMAX_SCALE = 128**-0.5
DEFAULT_HEAD_SCALE = 64**-0.5

#: The op's argument table (spec K1/K2).
ARGS = (
    Arg("positions", "tensor", (torch.int64,), "[T]", "contiguous; debug: 0 <= p < max_pos"),
    Arg("index_q", "tensor", (torch.bfloat16,), "[T, 64, 128]", "contiguous, data_ptr % 16 == 0"),
    Arg("cos_sin_cache", "tensor", (torch.float32, torch.bfloat16), "[max_pos, 64]",
        "contiguous; [cos (32) | sin (32)] per row; fp32 as built, bf16 after a model-dtype cast (trap 1)"),
    Arg("index_weights", "tensor", (torch.bfloat16,), "[T, 64]", "contiguous"),
    Arg("cache_format", "str", choices=("fp8", "mxfp4"), default="fp8", keyword_only=True,
        rule="the indexer cache format: K1 (fp8) or K2 (mxfp4)"),
    Arg("softmax_scale", "float", default=DEFAULT_SOFTMAX_SCALE, keyword_only=True, rule="fl(value) is used"),
    Arg("head_scale", "float", default=DEFAULT_HEAD_SCALE, keyword_only=True, rule="fl(value) is used"),
)


#: The operand record of each variant's kernel and reference (:mod:`dsv4kit.family.operands`): the
#: op's table less ``cache_format`` (the op picks the variant by it), the scales also by position.
IndexerQOperands = operands("indexer_q", tuple(replace(a, keyword_only=False) for a in ARGS
                                                if a.name != "cache_format"))


def check_indexer_q_inputs(kernel: str, ops: Any, *, debug_checks: bool = True) -> int:
    """K1/K2 "Edge cases & bad inputs" checks of a call's record ``ops``; returns T.
    Debug: ``0 <= positions < max_pos``."""
    positions, index_q, cos_sin_cache, index_weights, _, _ = ops.checked(kernel)
    check_dtype(kernel, "index_q", index_q, torch.bfloat16)
    check_ndim(kernel, "index_q", index_q, 3)
    t = index_q.shape[0]
    if index_q.shape[1] != INDEXER_NUM_HEADS or index_q.shape[2] != INDEXER_HEAD_DIM:
        raise input_error(
            kernel,
            "index_q",
            f"shape [T, {INDEXER_NUM_HEADS}, {INDEXER_HEAD_DIM}] (v1)",
            f"shape {tuple(index_q.shape)}",
        )
    check_contiguous(kernel, "index_q", index_q)
    if index_q.data_ptr() % 16 != 0:
        raise input_error(
            kernel, "index_q", "data_ptr % 16 == 0", f"data_ptr % 16 == {index_q.data_ptr() % 16}"
        )
    check_dtype(kernel, "cos_sin_cache", cos_sin_cache, torch.float32, torch.bfloat16)
    check_ndim(kernel, "cos_sin_cache", cos_sin_cache, 2)
    if cos_sin_cache.shape[1] != ROPE_DIM:
        raise input_error(
            kernel, "cos_sin_cache", f"shape[1] == {ROPE_DIM}", f"shape {tuple(cos_sin_cache.shape)}"
        )
    check_contiguous(kernel, "cos_sin_cache", cos_sin_cache)
    check_dtype(kernel, "index_weights", index_weights, torch.bfloat16)
    check_shape(kernel, "index_weights", index_weights, (t, INDEXER_NUM_HEADS))
    check_contiguous(kernel, "index_weights", index_weights)
    check_per_token(kernel, "positions", positions, torch.int64, t)
    check_same_device(
        kernel,
        {
            "positions": positions,
            "index_q": index_q,
            "cos_sin_cache": cos_sin_cache,
            "index_weights": index_weights,
        },
    )
    if debug_checks:
        check_values_in_range(kernel, "positions", positions, 0, cos_sin_cache.shape[0])
    return t


def indexer_q_rope_bf16(
    positions: torch.Tensor, index_q: torch.Tensor, cos_sin_cache: torch.Tensor
) -> torch.Tensor:
    """``y`` of K1: fp32 ``[T, H, 128]``, nope dims as given, rope dims rotated (no FMA) then bf16-rounded."""
    cs = cos_sin_cache[positions].to(torch.float32)[:, None, :]  # [T, 1, 64], broadcast over heads
    y = rope_rotate(index_q.to(torch.float32), cs)
    return torch.cat((y[..., :-ROPE_DIM], bf16_round(y[..., -ROPE_DIM:].contiguous())), dim=-1)


def indexer_q_outputs(cache_format: str, t: int, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """Uninitialized outputs of K1 (``"fp8"``: q_fp8, weights_out) or K2 (``"mxfp4"``: q_packed,
    q_scale, weights_out) for ``t`` tokens: the shapes and dtypes every implementation returns."""
    weights = torch.empty((t, INDEXER_NUM_HEADS), dtype=torch.float32, device=device)
    if cache_format == "fp8":
        return (torch.empty((t, INDEXER_NUM_HEADS, INDEXER_HEAD_DIM), dtype=torch.float8_e4m3fn,
                            device=device), weights)
    return (torch.empty((t, INDEXER_NUM_HEADS, INDEXER_HEAD_DIM // 2), dtype=torch.uint8, device=device),
            torch.empty((t, INDEXER_NUM_HEADS), dtype=torch.int32, device=device), weights)


def _fp32_scalar(v: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(v), dtype=torch.float32, device=like.device)  # fl(v)


def _fp8_reference(ops: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """K1 on a bound call (see :func:`indexer_q_fp8_reference`)."""
    t = check_indexer_q_inputs("indexer_q_fp8", ops)
    positions, index_q, cos_sin_cache, index_weights, softmax_scale, head_scale = ops
    if t == 0:
        return indexer_q_outputs("fp8", 0, index_q.device)
    y = indexer_q_rope_bf16(positions, index_q, cos_sin_cache)
    codes, e = q8_quantize(y, INDEXER_HEAD_DIM)
    w = index_weights.to(torch.float32)
    folded = w * pow2(e[..., 0])
    folded = folded * _fp32_scalar(softmax_scale, w)
    folded = folded * _fp32_scalar(head_scale, w)
    return codes.view(torch.float8_e4m3fn), folded


def _mxfp4_reference(ops: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K2 on a bound call (see :func:`indexer_q_mxfp4_reference`)."""
    kernel = "indexer_q_mxfp4"
    t = check_indexer_q_inputs(kernel, ops)
    positions, index_q, cos_sin_cache, index_weights, softmax_scale, head_scale = ops
    if INDEXER_HEAD_DIM % MXFP4_BLOCK != 0:  # pragma: no cover - v1 fixes head_dim = 128
        raise input_error(kernel, "index_q", "head_dim % 32 == 0", INDEXER_HEAD_DIM)
    if t == 0:
        return indexer_q_outputs("mxfp4", 0, index_q.device)
    y = indexer_q_rope_bf16(positions, index_q, cos_sin_cache)
    codes, scale_bytes = q4_quantize(y)
    w = index_weights.to(torch.float32)
    folded = (w * _fp32_scalar(softmax_scale, w)) * _fp32_scalar(head_scale, w)
    return pack_nibbles(codes), scale_bytes_to_int32(scale_bytes), folded


_FP8_DOC = """K1: returns ``(q_fp8 float8_e4m3fn [T, 64, 128], weights_out fp32 [T, 64])``.

    ``weights_out = fl(fl(fl(w * pow2(e)) * ss) * hs)`` with ``ss = fl(softmax_scale)``,
    ``hs = fl(head_scale)`` (the fold order is fixed by the spec).

    Signed zeros follow the IEEE formulas exactly: for an all-zero ``index_q`` the rope dims are
    ``fl(0*c) - fl(0*s)`` / ``fl(0*c) + fl(0*s)``, which is -0 (byte 0x80) where the cos/sin signs
    make it so. The spec's "zero regime -> all bytes 0" is read as "nope bytes 0, rope bytes
    +-0"; the formulas are what D2 bit-exactness is checked against.
    """
_MXFP4_DOC = """K2: returns ``(q_packed uint8 [T, 64, 64], q_scale int32 [T, 64], weights_out fp32 [T, 64])``.

    Weights are not multiplied by the q scales: ``weights_out = fl(fl(w * ss) * hs)``.
    """
indexer_q_fp8_reference = with_operands(IndexerQOperands, _fp8_reference, _FP8_DOC,
                                        returns="tuple[torch.Tensor, torch.Tensor]",
                                        name="indexer_q_fp8_reference")
indexer_q_mxfp4_reference = with_operands(IndexerQOperands, _mxfp4_reference, _MXFP4_DOC,
                                          returns="tuple[torch.Tensor, torch.Tensor, torch.Tensor]",
                                          name="indexer_q_mxfp4_reference")
