"""Per-row UE8M0 FP8 quantization of a bf16 matrix: the PyTorch reference (normative).

Each row of ``x [M, N]`` (N a multiple of 128) is cut into blocks of 128; each block is
quantized to float8_e4m3fn with one power-of-two scale (spec §2.3, decision D1):

    a = max(amax(|block|), fl(1e-4));  e = clog2(fl(a / 448));  q = e4m3(block * 2**-e)

The scale is stored as the fp32 value ``2**e``. Every step is exact or a single RNE rounding
done with integer bit recipes (:mod:`dsv4kit.formats`), so the kernels can match it bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.operands import operands, with_operands
from dsv4kit.family.schema import Arg
from dsv4kit.formats.bits import pow2
from dsv4kit.formats.checks import check_ndim
from dsv4kit.formats.fp8 import q8_quantize

__all__ = ["ARGS", "BLOCK", "RowQuantOperands", "check_rowquant_inputs", "rowquant_reference"]

BLOCK = 128


#: The op's argument table.
ARGS = (Arg("x", "tensor", (torch.bfloat16,), "[M, N]", "N a positive multiple of 128; rows may be strided"),)


#: The op's operand record (:mod:`dsv4kit.family.operands`): the checks, the reference and the
#: kernel's call take one, bound once per call.
RowQuantOperands = operands("rowquant", ARGS)


def check_rowquant_inputs(kernel: str, ops: Any) -> torch.Tensor:
    """The checks the reference and every backend share, of a call's record ``ops``; returns ``x``."""
    (x,) = ops.checked(kernel)
    check_ndim(kernel, "x", x, 2)
    if x.shape[1] == 0 or x.shape[1] % BLOCK:
        raise input_error(kernel, "x", f"last dim a positive multiple of {BLOCK}", f"shape {tuple(x.shape)}")
    return x


def _reference(ops: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference on a bound call (see :func:`rowquant_reference`)."""
    x = check_rowquant_inputs("rowquant_reference", ops)
    codes, e = q8_quantize(x, BLOCK)
    return codes.view(torch.float8_e4m3fn), pow2(e)


rowquant_reference = with_operands(
    RowQuantOperands, _reference,
    """``x`` bf16 ``[M, N]`` -> ``(q float8_e4m3fn [M, N], scale float32 [M, N // 128])``.""",
    returns="tuple[torch.Tensor, torch.Tensor]")
