"""K5-K9: the C4 / C128 / indexer compressors."""

from dsv4kit.kernels.compressor.reference import (
    c4_compress_ds_mla_reference,
    c4_compress_plain_reference,
    c128_compress_reference,
    c128_norm_rope_store_ds_mla_reference,
    c128_norm_rope_store_plain_reference,
    indexer_compress_reference,
)

__all__ = [
    "c4_compress_ds_mla_reference",
    "c4_compress_plain_reference",
    "c128_compress_reference",
    "c128_norm_rope_store_ds_mla_reference",
    "c128_norm_rope_store_plain_reference",
    "indexer_compress_reference",
]
