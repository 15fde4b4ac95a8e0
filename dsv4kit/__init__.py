"""dsv4kit: DeepSeek-V4 attention-side kernels under a zero-runtime-JIT contract."""

import os as _os
import sys as _sys

from dsv4kit.errors import (
    ContractError,
    KernelInputError,
    MissingExecutorError,
    UnwarmedKeyError,
    WarmupError,
)

# TRITON_INTERPRET=1 (Triton's CPU convention) is accepted and not needed: the kit runs Triton
# kernels under the interpreter on CPU itself, and needs @triton.jit to build functions it can
# compile ahead of time for a named arch. Triton reads the variable when it decorates, including
# its own library at import, so it is switched off here, before triton is imported.
TRITON_INTERPRET_SET = _os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
if TRITON_INTERPRET_SET:
    if "triton" in _sys.modules:
        raise ImportError("dsv4kit: TRITON_INTERPRET=1 was set when triton was imported; dsv4kit runs the "
                          "Triton interpreter itself on CPU: unset it, or import dsv4kit before triton")
    _os.environ["TRITON_INTERPRET"] = "0"

__version__ = "0.1.0"

__all__ = [
    "ContractError",
    "KernelInputError",
    "MissingExecutorError",
    "TRITON_INTERPRET_SET",
    "UnwarmedKeyError",
    "WarmupError",
    "__version__",
]
