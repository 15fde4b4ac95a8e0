"""K5, K6, K9: the C4 compressors (main KV into fp8_ds_mla or plain rows; indexer K).

``SPECS`` holds one family spec per op; the ops are ``dsv4kit.ops.c4_compress_ds_mla``,
``c4_compress_plain`` and ``indexer_compress``. One pooling core per backend serves all three.
"""

from dsv4kit.family import DEFAULT_VARIANT
from dsv4kit.kernels.c4_compress.spec import SPECS, C4CompressConfig

c4_compress_ds_mla, c4_compress_plain, indexer_compress = (spec.op for spec in SPECS.values())
c4_compress_ds_mla_reference, c4_compress_plain_reference, indexer_compress_reference = (
    spec.variants[DEFAULT_VARIANT].reference for spec in SPECS.values()
)

__all__ = ["SPECS", "C4CompressConfig", "c4_compress_ds_mla", "c4_compress_ds_mla_reference",
           "c4_compress_plain", "c4_compress_plain_reference", "indexer_compress",
           "indexer_compress_reference"]
