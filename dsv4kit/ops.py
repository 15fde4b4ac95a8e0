"""Public ops: validate, pick the backend through :mod:`dsv4kit.platform`, launch the warmed kernel."""

from dsv4kit.kernels.indexer_q.op import indexer_q_rope_quant

__all__ = ["indexer_q_rope_quant"]
