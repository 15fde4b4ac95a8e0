"""A toy kernel with a pure-PyTorch "backend", for learning the contract without a compiler.

``ToyRowScale`` scales each row of ``x`` so that its largest magnitude becomes 1.
Its CompileKey carries the three things a real kernel specializes on: an input dtype
(a tensor property), a row width (a shape), and a launch shape that switches with the
token count (``coarsen``, like the indexer-Q kernels). "Compiling" a key builds a
closure specialized to it, so warmup, monitor and coverage behave as for real kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dsv4kit.errors import input_error
from dsv4kit.jit import (
    CompileArtifact,
    Immediate,
    JitKernel,
    Like,
    WarmupChoices,
    WarmupIntRange,
    kernel_launcher,
)

__all__ = ["ToyConfig", "ToyModel", "ToyRowScale", "toy_reference"]


def toy_reference(x: torch.Tensor) -> torch.Tensor:
    """Each row divided by its largest magnitude (rows of zeros stay zero), in fp32."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, x / amax.clamp_min(torch.finfo(torch.float32).tiny), x)


@dataclass(frozen=True)
class ToyConfig:
    """What a model tells the kernel at registration: row width and batch limit."""

    width: int = 128
    max_tokens: int = 8192
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)


class ToyRowScale(JitKernel["ToyRowScale.CompileKey"]):
    """Row scaling, keyed on (dtype, width, coarsen)."""

    backend = "python"

    @dataclass(frozen=True)
    class CompileKey:
        dtype: str
        width: int
        coarsen: int

    def dispatch(self, x, num_tokens):
        return self.CompileKey(
            dtype=str(x.dtype).removeprefix("torch."),
            width=x.shape[-1],
            coarsen=1 if num_tokens < 512 else 4,
        )

    def get_warmup_keys(self, config: ToyConfig | None = None) -> list[CompileKey]:
        cfg = config or ToyConfig()
        return self.trace(
            x=Like(dtype=WarmupChoices(*cfg.dtypes), shape=(1, cfg.width)),
            num_tokens=WarmupIntRange(1, cfg.max_tokens + 1),
        )

    def warmup_inputs(self, key: CompileKey) -> Like:
        return Like(dtype=getattr(torch, key.dtype), shape=(key.coarsen, key.width))

    def compile(self, key: CompileKey) -> None:
        t0 = time.perf_counter()
        rows_per_step = key.coarsen

        def run(x: torch.Tensor) -> torch.Tensor:
            # The "launch shape": coarsen rows per step, as a real kernel's program would.
            out = torch.empty(x.shape, dtype=torch.float32)
            for i in range(0, x.shape[0], rows_per_step):
                out[i : i + rows_per_step] = toy_reference(x[i : i + rows_per_step])
            return out

        art = CompileArtifact("python", self.target, time.perf_counter() - t0,
                              info={"rows_per_step": rows_per_step})
        self._cache_executor(key, run, art)

    @kernel_launcher
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise input_error(self.name, "x", "a 2-D tensor [T, width]", f"shape {tuple(x.shape)}")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise input_error(self.name, "x", "float32, bfloat16 or float16", x.dtype)
        if x.shape[0] == 0:
            return Immediate(torch.empty(x.shape, dtype=torch.float32))
        return self.dispatch(x, x.shape[0]), (x,)


class ToyModel:
    """A stack of layers that each own a ToyRowScale and register it, as a real model would."""

    def __init__(self, num_layers: int = 43, config: ToyConfig | None = None) -> None:
        self.config = config or ToyConfig()
        self.layers = [ToyRowScale() for _ in range(num_layers)]
        for kernel in self.layers:
            kernel.register_warmup(self.config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for kernel in self.layers:
            x = kernel(x)
        return x
