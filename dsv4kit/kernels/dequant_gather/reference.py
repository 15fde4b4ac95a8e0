"""PyTorch reference of K3: dequantize_and_gather_k_cache (fp8_ds_mla -> bf16 workspace)."""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.operands import operands, with_operands
from dsv4kit.family.schema import Arg
from dsv4kit.formats.bits import bf16_round, bytes_to_bf16, e4m3_decode, ue8m0_decode
from dsv4kit.formats.checks import (
    check_contiguous,
    check_dtype,
    check_ndim,
    check_per_token,
    check_same_device,
    check_values_in_range,
)
from dsv4kit.formats.ds_mla import (
    DS_HEAD_DIM,
    DS_NOPE_DIM,
    DS_QUANT_BLOCK,
    check_ds_cache,
    ds_page_regions,
)

__all__ = [
    "ARGS",
    "DequantGatherOperands",
    "check_dequant_gather_inputs",
    "dequantize_and_gather_k_cache_reference",
]

KERNEL = "dequantize_and_gather_k_cache"

#: The op's argument table (spec K3).
ARGS = (
    Arg("out", "tensor", (torch.bfloat16,), "[B_req, M, 512]",
        "contiguous, data_ptr % 16 == 0; written in place"),
    Arg("k_cache", "tensor", (torch.uint8,), "[num_pages, bs, 584]",
        "fp8_ds_mla pages (§2.5, §2.10 strides)"),
    Arg("seq_lens", "tensor", (torch.int32,), "[B_req]", "L per request: entries in its pages"),
    Arg("gather_lens", "tensor", (torch.int32,), "[B_req]", "G <= L: gather the last G entries (None: all L)",
        optional=True),
    Arg("block_table", "tensor", (torch.int32,), "[B_req, max_blocks]", "stride(1) == 1; page ids"),
    Arg("block_size", "int", rule="== k_cache.shape[1]"),
    Arg("offset", "int", rule="first row written; offset + G <= M", default=0),
)


#: The op's operand record (:mod:`dsv4kit.family.operands`): the checks, the reference and the
#: kernel's call take one, bound once per call.
DequantGatherOperands = operands(KERNEL, ARGS)


def check_dequant_gather_inputs(ops: Any, *, kernel: str = KERNEL, debug_checks: bool = True) -> int:
    """K3 "Edge cases & bad inputs" checks of a call's record ``ops`` (plus the debug checks);
    returns ``nreq``."""
    out, k_cache, seq_lens, gather_lens, block_table, block_size, offset = ops.checked(kernel)
    check_dtype(kernel, "out", out, torch.bfloat16)
    check_ndim(kernel, "out", out, 3)
    if out.shape[2] != DS_HEAD_DIM:
        raise input_error(kernel, "out", f"shape[2] == {DS_HEAD_DIM}", f"shape {tuple(out.shape)}")
    check_contiguous(kernel, "out", out)
    if out.data_ptr() % 16 != 0:
        raise input_error(kernel, "out", "data_ptr % 16 == 0", f"data_ptr % 16 == {out.data_ptr() % 16}")
    check_ds_cache(kernel, "k_cache", k_cache)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size != k_cache.shape[1]:
        raise input_error(kernel, "block_size", f"k_cache.shape[1] == {k_cache.shape[1]}", block_size)
    check_per_token(kernel, "seq_lens", seq_lens, torch.int32, None)
    nreq = seq_lens.shape[0]
    if gather_lens is not None:
        check_per_token(kernel, "gather_lens", gather_lens, torch.int32, nreq)
    check_dtype(kernel, "block_table", block_table, torch.int32)
    check_ndim(kernel, "block_table", block_table, 2)
    if block_table.shape[0] != nreq:
        raise input_error(
            kernel, "block_table", f"shape[0] == nreq ({nreq})", f"shape {tuple(block_table.shape)}"
        )
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise input_error(kernel, "block_table", "stride(1) == 1", f"strides {tuple(block_table.stride())}")
    if out.shape[0] < nreq:
        raise input_error(kernel, "out", f"shape[0] >= nreq ({nreq})", f"shape {tuple(out.shape)}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise input_error(kernel, "offset", "an int >= 0", offset)
    check_same_device(
        kernel,
        {
            "out": out,
            "k_cache": k_cache,
            "seq_lens": seq_lens,
            "gather_lens": gather_lens,
            "block_table": block_table,
        },
    )
    if debug_checks and nreq:
        check_values_in_range(kernel, "seq_lens", seq_lens, 0, 2**31)
        g = seq_lens if gather_lens is None else gather_lens
        if bool((g < 0).any()) or bool((g > seq_lens).any()):
            raise input_error(kernel, "gather_lens", "0 <= G <= L per request", g.tolist())
        if bool((offset + g > out.shape[1]).any()):
            raise input_error(
                kernel, "out", f"offset + G <= M ({out.shape[1]})", f"max offset + G {offset + int(g.max())}"
            )
        bs = k_cache.shape[1]
        need = (seq_lens.to(torch.int64) + bs - 1) // bs
        if int(need.max()) > block_table.shape[1]:
            raise input_error(
                kernel, "block_table", f"ceil(L / bs) <= max_blocks ({block_table.shape[1]})", int(need.max())
            )
    return nreq


def _reference(ops: Any) -> torch.Tensor:
    """The reference on a bound call (see :func:`dequantize_and_gather_k_cache_reference`)."""
    nreq = check_dequant_gather_inputs(ops)
    out, k_cache, seq_lens, gather_lens, block_table, _, offset = ops
    if nreq == 0:
        return out
    data, scales = ds_page_regions(k_cache)
    bs = k_cache.shape[1]
    for b in range(nreq):
        length = int(seq_lens[b])
        g = length if gather_lens is None else int(gather_lens[b])
        if g == 0:
            continue
        tok = torch.arange(length - g, length, device=k_cache.device)
        pages = block_table[b, tok // bs].to(torch.int64)  # only the pages that hold the last G entries
        check_values_in_range(KERNEL, "block_table", pages, 0, k_cache.shape[0])
        d = data[pages, tok % bs]  # [G, 576]
        sb = scales[pages, tok % bs, : DS_NOPE_DIM // DS_QUANT_BLOCK]  # [G, 7]; pad byte ignored
        nope = (
            e4m3_decode(d[:, :DS_NOPE_DIM]).unflatten(1, (-1, DS_QUANT_BLOCK)) * ue8m0_decode(sb)[..., None]
        )
        out[b, offset : offset + g, :DS_NOPE_DIM] = bf16_round(nope.flatten(1)).to(torch.bfloat16)
        out[b, offset : offset + g, DS_NOPE_DIM:] = bytes_to_bf16(d[:, DS_NOPE_DIM:])
    return out


_DOC = """K3: write ``out[b, offset + i]`` = decoded entry ``L - G + i`` of request b, for i < G.

    Nope: ``bf16(e4m3_val(byte) * 2**(sb - 127))`` (exact); rope: bit copy of the stored bf16
    bytes. Rows outside ``[offset, offset + G)`` and rows of requests >= nreq are untouched.
    Block-table entries past ``ceil(L / bs)`` are never read. Returns ``out``.
    """
dequantize_and_gather_k_cache_reference = with_operands(DequantGatherOperands, _reference, _DOC,
                                                        returns="torch.Tensor")
