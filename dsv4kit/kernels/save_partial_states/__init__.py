"""K4: save_partial_states (the compressor state cache writes of every token).

``SPEC`` is the family (op, kernels per backend, warmup); the op is
``dsv4kit.ops.save_partial_states``.
"""

from dsv4kit.kernels.save_partial_states.reference import save_partial_states_reference
from dsv4kit.kernels.save_partial_states.spec import FLASH_STATES, SPEC, SavePartialStatesConfig

save_partial_states = SPEC.op

__all__ = ["FLASH_STATES", "SPEC", "SavePartialStatesConfig", "save_partial_states",
           "save_partial_states_reference"]
