"""dsv4kit: DeepSeek-V4 attention-side kernels under a zero-runtime-JIT contract."""

from dsv4kit.errors import (
    ContractError,
    KernelInputError,
    MissingExecutorError,
    UnwarmedKeyError,
    WarmupError,
)

__version__ = "0.1.0"

__all__ = [
    "ContractError",
    "KernelInputError",
    "MissingExecutorError",
    "UnwarmedKeyError",
    "WarmupError",
    "__version__",
]
