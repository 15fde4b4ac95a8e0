"""K1/K2: indexer-Q RoPE + FP8 (weight fold) or MXFP4 quantization."""

from dsv4kit.kernels.indexer_q.reference import indexer_q_fp8_reference, indexer_q_mxfp4_reference

__all__ = ["indexer_q_fp8_reference", "indexer_q_mxfp4_reference"]
