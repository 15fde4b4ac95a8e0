"""A kernel object with an empty in-memory compile cache, for fixtures that compile or load keys."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4kit.jit import JitKernel
from dsv4kit.platform import cpu_platform


def fresh_kernel(cls: type[JitKernel]) -> Iterator[JitKernel]:
    """A fixture body (``yield from fresh_kernel(RowQuantTriton)``): ``cls`` on a CPU sm_90a
    platform, its class's compile cache cleared before the test and after it."""
    k = cls(cpu_platform("sm_90a"))  # type: ignore[call-arg]
    k.clear_cache()
    yield k
    k.clear_cache()
