"""Op calls described by metadata: what a serving step asks of a family, before any tensor exists.

A family's model hooks describe each op call of a step as op arguments by name; tensor
arguments are :class:`TensorSpec` rows (shape, dtype, strides), so the key of a call can be
derived with the kernel's own ``dispatch`` on :class:`~dsv4kit.jit.Like` stand-ins (dispatch
mode), or real tensors built for a launch (launch mode).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.jit import JitKernel, Like

if TYPE_CHECKING:
    from dsv4kit.family.spec import FamilySpec

__all__ = ["LAUNCH_POOL_PAGES", "Call", "TensorSpec"]

#: Pages of each KV-cache pool in launch mode: block tables alias them (calls only read pages).
LAUNCH_POOL_PAGES = 16


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument of an op call, described by metadata only.

    ``like()`` gives the :class:`~dsv4kit.jit.Like` stand-in a ``dispatch`` reads (shape, dtype,
    stride, device); ``materialize`` builds the real tensor for ``launch`` mode: ``values`` (a
    function returning a CPU tensor: positions, lengths, block tables), or zeros. Tensors with a
    ``pool`` name share one allocation (the caches of all layers, workspaces grown on demand).
    ``make`` allocates specially (e.g. an fp8_ds_mla cache with its page stride).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None
    pool: str | None = None
    values: Callable[[], torch.Tensor] | None = field(default=None, compare=False)
    make: Callable[[torch.device], torch.Tensor] | None = field(default=None, compare=False)

    def strides(self) -> tuple[int, ...]:
        if self.stride is not None:
            return self.stride
        out, acc = [], 1
        for n in reversed(self.shape):
            out.append(acc)
            acc *= max(n, 1)
        return tuple(reversed(out))

    def like(self, device: str = "cpu") -> Like:
        return Like(shape=tuple(self.shape), dtype=self.dtype, stride=self.strides(),
                    device=torch.device(device), ndim=len(self.shape))

    def materialize(self, device: torch.device, pools: dict[Any, torch.Tensor]) -> torch.Tensor:
        if self.values is not None:
            t = self.values()
            if tuple(t.shape) != tuple(self.shape) or t.dtype != self.dtype:
                raise AssertionError(f"TensorSpec values: {tuple(t.shape)} {t.dtype}, "
                                     f"declared {self.shape} {self.dtype}")
            return t.to(device)
        if self.make is not None:
            key = (self.pool, self.shape, self.stride)
            if self.pool is None or key not in pools:
                t = self.make(device)
                if self.pool is None:
                    return t
                pools[key] = t
            return pools[key]
        numel = math.prod(self.shape)
        if self.pool is None:
            return torch.zeros(self.shape, dtype=self.dtype, device=device)
        key = (self.pool, self.dtype)
        buf = pools.get(key)
        if buf is None or buf.numel() < numel:
            buf = pools[key] = torch.zeros(max(numel, 1), dtype=self.dtype, device=device)
        return buf[:numel].view(self.shape)


@dataclass(frozen=True)
class Call:
    """One op call of a serving step on one layer: which family, kernel and call site, with what."""

    family: FamilySpec
    kernel: JitKernel
    site: str
    args: Mapping[str, Any]

    def like_args(self, device: str = "cpu") -> dict[str, Any]:
        return {k: v.like(device) if isinstance(v, TensorSpec) else v for k, v in self.args.items()}

    def real_args(self, device: torch.device, pools: dict[Any, torch.Tensor]) -> dict[str, Any]:
        return {k: v.materialize(device, pools) if isinstance(v, TensorSpec) else v
                for k, v in self.args.items()}

    def key(self, device: str = "cpu") -> Any:
        """The key the op would dispatch for this call (metadata only, nothing launched)."""
        return self.family.dispatch(self.kernel, self.like_args(device))
