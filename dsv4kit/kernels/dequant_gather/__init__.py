"""K3: dequantize_and_gather_k_cache (fp8_ds_mla -> bf16 workspace).

``dequantize_and_gather_k_cache`` is the op (backend chosen by :mod:`dsv4kit.platform`);
``DequantGatherTriton`` / ``DequantGatherCuTeDSL`` (in ``.triton`` / ``.cutedsl``) are the
kernels, ``register_dequant_gather`` / ``get_warmup_keys`` the warmup side.
"""

from dsv4kit.kernels.dequant_gather.common import DequantGatherConfig
from dsv4kit.kernels.dequant_gather.op import dequantize_and_gather_k_cache
from dsv4kit.kernels.dequant_gather.reference import dequantize_and_gather_k_cache_reference
from dsv4kit.kernels.dequant_gather.registration import get_warmup_keys, kernel_for, register_dequant_gather

__all__ = [
    "DequantGatherConfig",
    "dequantize_and_gather_k_cache",
    "dequantize_and_gather_k_cache_reference",
    "get_warmup_keys",
    "kernel_for",
    "register_dequant_gather",
]
