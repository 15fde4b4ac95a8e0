"""K7, K8a, K8b: the C128 compressors (and the reference pieces all compressors share)."""

from dsv4kit.kernels.compressor.reference import (
    c128_compress_reference,
    c128_norm_rope_store_ds_mla_reference,
    c128_norm_rope_store_plain_reference,
)

__all__ = [
    "c128_compress_reference",
    "c128_norm_rope_store_ds_mla_reference",
    "c128_norm_rope_store_plain_reference",
]
