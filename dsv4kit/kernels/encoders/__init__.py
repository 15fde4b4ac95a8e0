"""E1..E5: the row encoders as store hooks (spec §2.9).

``SPECS`` holds one family spec per hook; the ops are ``dsv4kit.ops.store_rows_ds``,
``store_rows_plain`` and ``store_rows_indexer``. The compressors call the same encode routine
of each backend (``triton.encode_store``, ``cutedsl.encode_store``).
"""

from dsv4kit.kernels.encoders.reference import (
    store_rows_ds_reference,
    store_rows_indexer_reference,
    store_rows_plain_reference,
)
from dsv4kit.kernels.encoders.spec import SPECS, StoreRowsConfig

store_rows_ds = SPECS["store_rows_ds"].op
store_rows_plain = SPECS["store_rows_plain"].op
store_rows_indexer = SPECS["store_rows_indexer"].op

__all__ = ["SPECS", "StoreRowsConfig", "store_rows_ds", "store_rows_ds_reference", "store_rows_indexer",
           "store_rows_indexer_reference", "store_rows_plain", "store_rows_plain_reference"]
