"""What a tutorial notebook needs before its first section: one call, one line.

Every notebook of ``notebooks/`` opens with :func:`start`: the platform this process runs on, the
CPU platform its sections compile for (Triton under the interpreter, ahead-of-time compiles for
sm_90a), a seeded torch generator and a clock for the notebook's time budget (two minutes on two
CPU cores, checked by its last cell).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

from dsv4kit.platform import Platform, cpu_platform, current_platform

__all__ = ["BUDGET_SECONDS", "Session", "start"]

#: What one notebook may take under nbmake on a 2-core CI machine.
BUDGET_SECONDS = 120.0


@dataclass(frozen=True)
class Session:
    """A notebook's setting: ``platform`` (this process's), ``cpu`` (the CPU path, compiling for
    ``cpu.arch``) and ``t0`` (when the notebook started, for :meth:`elapsed`)."""

    platform: Platform
    cpu: Platform
    t0: float = field(default_factory=time.perf_counter)

    @property
    def on_gpu(self) -> bool:
        """Whether a live GPU runs the kernels (else recorded GPU results are shown)."""
        return self.platform.is_cuda

    def elapsed(self) -> float:
        """Seconds since :func:`start`."""
        return time.perf_counter() - self.t0


def start(arch: str = "sm_90a", *, seed: int = 0, quiet: bool = True) -> Session:
    """Seed torch, print the platform and return the notebook's :class:`Session`.

    ``quiet``: silence numpy's "overflow encountered" warnings, which the saturating regimes of the
    numerics sections provoke on purpose (their results are asserted, not the warnings).
    """
    if quiet:
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    torch.manual_seed(seed)
    session = Session(current_platform(), cpu_platform(arch))
    print(session.platform)
    return session
