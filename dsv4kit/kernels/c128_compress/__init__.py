"""K7, K8a, K8b: the C128 compressor (pool 128 rows; then norm, RoPE and store).

``SPECS`` holds one family spec per op; the ops are ``dsv4kit.ops.c128_compress``,
``c128_norm_rope_store_ds_mla`` and ``c128_norm_rope_store_plain``. K8a and K8b share one
norm-RoPE core per backend and the store hooks' encoders.
"""

from dsv4kit.family import DEFAULT_VARIANT
from dsv4kit.kernels.c128_compress.spec import SPECS, C128CompressConfig

c128_compress, c128_norm_rope_store_ds_mla, c128_norm_rope_store_plain = (spec.op for spec in SPECS.values())
c128_compress_reference, c128_norm_rope_store_ds_mla_reference, c128_norm_rope_store_plain_reference = (
    spec.variants[DEFAULT_VARIANT].reference for spec in SPECS.values()
)

__all__ = ["SPECS", "C128CompressConfig", "c128_compress", "c128_compress_reference",
           "c128_norm_rope_store_ds_mla", "c128_norm_rope_store_ds_mla_reference",
           "c128_norm_rope_store_plain", "c128_norm_rope_store_plain_reference"]
