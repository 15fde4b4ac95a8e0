"""K1/K2: indexer-Q RoPE + FP8 (weight fold) or MXFP4 quantization.

``SPEC`` is the family (op, kernels per backend and format, warmup); the op is
``dsv4kit.ops.indexer_q_rope_quant``. Backend modules are imported on first use, so the
reference needs neither Triton's compiler nor CuTeDSL.
"""

from dsv4kit.kernels.indexer_q.reference import indexer_q_fp8_reference, indexer_q_mxfp4_reference
from dsv4kit.kernels.indexer_q.spec import COARSEN_AT, SPEC, IndexerQConfig

indexer_q_rope_quant = SPEC.op

__all__ = [
    "COARSEN_AT",
    "SPEC",
    "IndexerQConfig",
    "indexer_q_fp8_reference",
    "indexer_q_mxfp4_reference",
    "indexer_q_rope_quant",
]
