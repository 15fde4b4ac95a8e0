"""rowquant (the backends example): the contract every backend shares and the family spec.

rowquant is not part of a DSv4 layer, so the model has no hooks for it; everything else (the op,
the kernel per backend, warmup registration) comes from the spec like every family's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.backends.triton import int_class
from dsv4kit.errors import input_error
from dsv4kit.family import FamilySpec, Variant, backend_modules
from dsv4kit.family.operands import kernel_call
from dsv4kit.jit import Immediate, JitKernel, WarmupIntRange, zip_inputs
from dsv4kit.kernels.rowquant.reference import (
    ARGS,
    BLOCK,
    RowQuantOperands,
    check_rowquant_inputs,
    rowquant_reference,
)

__all__ = ["COARSEN_AT", "MAX_BLOCKS_PER_PROGRAM", "SPEC", "RowQuantBase", "RowQuantConfig",
           "blocks_per_program"]

#: From this many rows on, a program handles 4 rows instead of 1 (a launch-shape switch in the key).
COARSEN_AT = 512

#: Most 128-wide column blocks one program of the coarse key covers (:func:`blocks_per_program`).
MAX_BLOCKS_PER_PROGRAM = 8


def blocks_per_program(n_cols: int, rows_per_program: int) -> int:
    """Column blocks a program covers: 1 at one row per program (a decode launch: one block, the
    shortest path), else the largest power of two <= 8 dividing ``n_cols / 128``. A program of the
    coarse key then reads 4 rows x up to 1024 columns (8 KB): with one block (1 KB) both backends
    launched 512 Ki CTAs at T = 65536 x 4096, the SMs' CTA launch rate held achieved occupancy
    at 36-39 % (Nsight Compute) and both stopped at 60 % of the copy on the H200."""
    if rows_per_program == 1:
        return 1
    nblk, k = n_cols // BLOCK, MAX_BLOCKS_PER_PROGRAM
    while nblk % k:
        k //= 2
    return k


@dataclass(frozen=True)
class RowQuantConfig:
    """What a model tells rowquant at registration: row widths and the largest batch."""

    widths: tuple[int, ...] = (512, 4096)
    max_tokens: int = 8192


class RowQuantBase(JitKernel["RowQuantBase.CompileKey"]):
    """Contract half of rowquant; a backend class adds the kernel, compile and launch args."""

    @dataclass(frozen=True)
    class CompileKey:
        #: Row width (a multiple of 128): a static shape for CuTeDSL, a specialized int for Triton.
        n_cols: int
        #: Triton's specialization class of x's row stride (``int_class``): "div16" for contiguous
        #: rows of a multiple-of-128 width, "other" for e.g. a view with stride 136.
        x_stride_class: str
        #: Rows per program: 1 below COARSEN_AT rows, 4 from there on.
        rows_per_program: int

    def dispatch(self, n_cols, x_row_stride, num_rows):
        return self.CompileKey(
            n_cols=n_cols,
            x_stride_class=int_class(x_row_stride),
            rows_per_program=1 if num_rows < COARSEN_AT else 4,
        )

    def get_warmup_keys(self, config: RowQuantConfig | None = None) -> list[CompileKey]:
        cfg = config or RowQuantConfig()
        # Contiguous inputs: the row stride is the width.
        return self.trace(zip_inputs(*(dict(n_cols=w, x_row_stride=w) for w in cfg.widths)),
                          num_rows=WarmupIntRange(1, cfg.max_tokens + 1))

    # ------------------------------------------------------------------ per backend
    def launch_args(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> tuple[Any, ...]:
        """The executor's arguments for one call (``q`` as uint8 bytes)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the call
    __call__ = kernel_call(
        RowQuantOperands,
        """``x`` bf16 ``[M, N]`` (rows may be strided) -> ``(q e4m3fn [M, N], scale fp32 [M, N/128])``.

        ``debug_checks`` is accepted like every op's; rowquant reads no indices, so it has none.
        """)

    def launch_operands(self, ops: Any, debug_checks: bool | None) -> Any:
        """The launch spec of one bound call (``ops``, a :data:`RowQuantOperands`)."""
        name = self.name
        x = check_rowquant_inputs(name, ops)
        m, n = x.shape
        self.check_device("x", x)
        q = torch.empty((m, n), dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.empty((m, n // BLOCK), dtype=torch.float32, device=x.device)
        if m == 0:
            return Immediate((q, scale))
        if m == 1 and x.stride(0) != n:
            # A size-1 dim may carry any stride in torch (a row sliced out of a wider buffer),
            # and Triton would specialize on it: canonicalize so one row never misses the key.
            x = x.as_strided((1, n), (n, x.stride(1)))
        if x.stride(1) != 1 or (m > 1 and x.stride(0) < n):
            raise input_error(name, "x", "rows with unit stride, non-overlapping", f"strides {x.stride()}")
        if x.data_ptr() % 16:
            raise input_error(name, "x", "a 16-byte aligned data pointer",
                              f"address % 16 = {x.data_ptr() % 16}")
        if m * max(x.stride(0), n) >= 2**31:
            raise input_error(name, "x", "fewer than 2**31 elements spanned", f"shape {tuple(x.shape)}")
        key = self.dispatch(n, x.stride(0), m)
        return key, self.launch_args(x, q.view(torch.uint8), scale), (q, scale)


_triton, _cutedsl = backend_modules(__package__)  # each imported on first use


SPEC = FamilySpec(
    name="rowquant", spec_id="example",
    summary="per-row UE8M0 FP8 quantization of a bf16 matrix (the backends example kernel)",
    args=ARGS,
    contract=RowQuantBase,
    variants=Variant(rowquant_reference, lambda: _triton().RowQuantTriton,
                     lambda: _cutedsl().RowQuantCuTeDSL),
    returns="(q float8_e4m3fn [M, N], scale float32 [M, N // 128])",
    config_type=RowQuantConfig,
    outputs=lambda a: (torch.empty(a["x"].shape, dtype=torch.float8_e4m3fn, device=a["x"].device),
                       torch.empty((a["x"].shape[0], a["x"].shape[1] // BLOCK), dtype=torch.float32,
                                   device=a["x"].device)),
)
