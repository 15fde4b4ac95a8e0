"""rowquant: per-row UE8M0 FP8 quantization of a bf16 matrix (the backends example kernel).

``rowquant(x)`` quantizes each 128-wide block of each row of ``x`` to float8_e4m3fn with a
power-of-two fp32 scale (see :mod:`.reference`). The backend comes from the platform's one
selection predicate (CuTeDSL on a GPU when installed, Triton otherwise, the Triton
interpreter on CPU), the same predicate :func:`register_rowquant_warmup` uses, so warmup
registers exactly the kernel the runtime will call.
"""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.kernels.rowquant.common import COARSEN_AT, RowQuantBase, RowQuantConfig
from dsv4kit.kernels.rowquant.reference import BLOCK, rowquant_reference
from dsv4kit.platform import Platform, current_platform

__all__ = [
    "BLOCK",
    "COARSEN_AT",
    "RowQuantConfig",
    "register_rowquant_warmup",
    "rowquant",
    "rowquant_kernel",
    "rowquant_reference",
]

_KERNELS: dict[tuple[str, Platform], RowQuantBase] = {}


def rowquant_kernel(device: torch.device | str | None = None, backend: str | None = None,
                    platform: Platform | None = None) -> RowQuantBase:
    """The rowquant kernel object that runs for tensors on ``device`` (default: the platform's)."""
    p = platform or current_platform()
    name = p.select_backend(device or p.device, backend, what="rowquant")
    kernel = _KERNELS.get((name, p))
    if kernel is None:
        if name == "cutedsl":
            from dsv4kit.kernels.rowquant.cutedsl import RowQuantCuTeDSL as cls
        else:
            from dsv4kit.kernels.rowquant.triton import RowQuantTriton as cls
        kernel = _KERNELS[(name, p)] = cls(p)
    return kernel


def rowquant(x: torch.Tensor, *, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` bf16 ``[M, N]`` -> ``(q float8_e4m3fn [M, N], scale float32 [M, N // 128])``."""
    if not isinstance(x, torch.Tensor):
        from dsv4kit.errors import input_error

        raise input_error("rowquant", "x", "a torch.Tensor", type(x).__name__)
    return rowquant_kernel(x.device, backend)(x)


def register_rowquant_warmup(config: RowQuantConfig | None = None, device: Any = None,
                             backend: str | None = None) -> RowQuantBase:
    """Register the warmup keys of the kernel the runtime will select (no-op without a registry)."""
    kernel = rowquant_kernel(device, backend)
    kernel.register_warmup(config)
    return kernel
