"""Public ops: validate, pick the backend through :mod:`dsv4kit.platform`, launch the warmed kernel."""

from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache
from dsv4kit.kernels.indexer_q.op import indexer_q_rope_quant

__all__ = ["dequantize_and_gather_k_cache", "indexer_q_rope_quant"]
