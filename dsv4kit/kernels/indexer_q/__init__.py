"""K1/K2: indexer-Q RoPE + FP8 (weight fold) or MXFP4 quantization.

``reference`` (the oracle), ``triton`` / ``cutedsl`` (the kernels), ``op`` (the public op and
its registration). Backend modules are imported lazily so that the reference needs neither.
"""

from dsv4kit.kernels.indexer_q.common import COARSEN_AT, IndexerQConfig
from dsv4kit.kernels.indexer_q.op import indexer_q_kernel, indexer_q_rope_quant, register_indexer_q
from dsv4kit.kernels.indexer_q.reference import indexer_q_fp8_reference, indexer_q_mxfp4_reference

__all__ = [
    "COARSEN_AT",
    "IndexerQConfig",
    "indexer_q_fp8_reference",
    "indexer_q_kernel",
    "indexer_q_mxfp4_reference",
    "indexer_q_rope_quant",
    "register_indexer_q",
]
