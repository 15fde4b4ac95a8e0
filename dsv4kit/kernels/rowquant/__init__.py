"""rowquant: per-row UE8M0 FP8 quantization of a bf16 matrix (the backends example kernel).

``rowquant(x)`` quantizes each 128-wide block of each row of ``x`` to float8_e4m3fn with a
power-of-two fp32 scale (see :mod:`.reference`). ``SPEC`` gives the op, the kernel object per
backend (``SPEC.kernel(device=..., backend=...)``: CuTeDSL on a GPU when installed, Triton
otherwise, the Triton interpreter on CPU) and registration (``SPEC.register(config)``), all
through the platform's one selection predicate, so warmup registers exactly the kernel the
runtime will call.
"""

from dsv4kit.kernels.rowquant.reference import BLOCK, rowquant_reference
from dsv4kit.kernels.rowquant.spec import COARSEN_AT, SPEC, RowQuantConfig

rowquant = SPEC.op

__all__ = ["BLOCK", "COARSEN_AT", "SPEC", "RowQuantConfig", "rowquant", "rowquant_reference"]
