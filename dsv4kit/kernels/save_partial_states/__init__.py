"""K4: save_partial_states (compressor state cache writes)."""

from dsv4kit.kernels.save_partial_states.reference import save_partial_states_reference

__all__ = ["save_partial_states_reference"]
