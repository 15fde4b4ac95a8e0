"""The KV-cache dtype strings a runtime is configured with (spec §2.11, trap 3): the one list.

``"fp8_ds_mla"`` selects the paged fp8_ds_mla layout (K5, K8a, and K3 for sparse prefill);
``"fp8"``/``"fp8_e4m3"`` a per-tensor e4m3 plain-row cache and ``"bfloat16"``/``"bf16"``/
``"auto"`` a bf16 plain-row cache (K6, K8b). Anything else (``"fp8_e5m2"``, say) is rejected at
configuration time, so warmup and runtime can never read a dtype string differently.
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error

__all__ = ["CACHE_DTYPES", "INDEXER_CACHE_DTYPES", "NORM_WEIGHT_DTYPES", "ROPE_CACHE_DTYPES",
           "normalize_cache_dtype"]

#: KV cache dtype string -> canonical kind.
CACHE_DTYPES: dict[str, str] = {
    "fp8_ds_mla": "fp8_ds_mla",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "auto": "bfloat16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
}
#: Indexer K cache formats: FP8 (K1, K9 FP8) or MXFP4 (K2, K9 MXFP4).
INDEXER_CACHE_DTYPES = ("fp8", "mxfp4")
#: dtype of the RoPE cos/sin caches at runtime: fp32 as built, bf16 after a module-wide cast (trap 1).
ROPE_CACHE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: dtype of the compressors' RMSNorm weights: the model dtype, or fp32 when kept in fp32 (trap 9).
NORM_WEIGHT_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def normalize_cache_dtype(value: object, where: str = "cache_dtype") -> str:
    """``"fp8_ds_mla"``, ``"fp8"`` or ``"bfloat16"`` for an accepted string; else KernelInputError."""
    if not isinstance(value, str) or value not in CACHE_DTYPES:
        raise input_error(where, "cache_dtype", f"one of {', '.join(CACHE_DTYPES)}", repr(value))
    return CACHE_DTYPES[value]
