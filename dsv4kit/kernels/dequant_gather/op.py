"""The public K3 op: validate, pick the backend through :mod:`dsv4kit.platform`, launch."""

from __future__ import annotations

import torch

from dsv4kit.formats.checks import check_tensor
from dsv4kit.kernels.dequant_gather.reference import KERNEL
from dsv4kit.kernels.dequant_gather.registration import _kernel
from dsv4kit.platform import Platform, current_platform

__all__ = ["dequantize_and_gather_k_cache"]


def dequantize_and_gather_k_cache(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int = 0,
    *,
    backend: str | None = None,
    debug_checks: bool | None = None,
    platform: Platform | None = None,
) -> torch.Tensor:
    """K3 (spec §3): dequantize the fp8_ds_mla entries of each request into a bf16 workspace.

    For request ``b`` with ``L = seq_lens[b]`` and ``G = gather_lens[b]`` (``L`` if None), row
    ``out[b, offset + i]`` (``i < G``) becomes entry ``L - G + i`` of the request's pages
    (``block_table[b]``): nope ``bf16(e4m3_val * 2**(sb - 127))`` (exact), rope a bit copy.
    No other byte of ``out`` changes. Returns ``out``.

    ``backend``: ``"triton"`` or ``"cutedsl"`` (default: the platform's choice for the
    tensors' device). ``debug_checks``: run the value checks (device reads): ``0 <= G <= L``,
    ``offset + G <= M``, ``ceil(L / bs) <= max_blocks``, used page ids in range; default on
    under the Triton interpreter, off on the GPU.
    """
    plat = platform or current_platform()
    device = check_tensor(KERNEL, "k_cache", k_cache).device
    which = plat.select_backend(device, backend, what=KERNEL)
    return _kernel(which, plat)(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset,
                                debug_checks=debug_checks)
