"""K3: dequantize_and_gather_k_cache (fp8_ds_mla -> bf16 workspace)."""

from dsv4kit.kernels.dequant_gather.reference import dequantize_and_gather_k_cache_reference

__all__ = ["dequantize_and_gather_k_cache_reference"]
