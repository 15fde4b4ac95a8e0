"""K3: dequantize_and_gather_k_cache (fp8_ds_mla -> bf16 workspace).

``SPEC`` is the family (op, kernels per backend, warmup); the op is
``dsv4kit.ops.dequantize_and_gather_k_cache``. Backend modules are imported on first use.
"""

from dsv4kit.kernels.dequant_gather.reference import dequantize_and_gather_k_cache_reference
from dsv4kit.kernels.dequant_gather.spec import SPEC, DequantGatherConfig, get_warmup_keys

dequantize_and_gather_k_cache = SPEC.op

__all__ = [
    "SPEC",
    "DequantGatherConfig",
    "dequantize_and_gather_k_cache",
    "dequantize_and_gather_k_cache_reference",
    "get_warmup_keys",
]
