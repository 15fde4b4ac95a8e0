"""Pieces both compiled backends share: compile scopes, cubin resource reports, and the
inspection files (PTX, cubin, ...) of an artifact in a store entry."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

__all__ = ["CompileCounter", "artifact_files", "compiling", "cubin_resources", "in_warmup_compile",
           "stored_artifact"]

# Set while a kernel's own compile(key) runs: the backend hooks then stay quiet, because a
# compile reached through JitKernel._get_or_compile was already reported (before it started).
_COMPILING: contextvars.ContextVar[bool] = contextvars.ContextVar("dsv4kit_compiling", default=False)


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Mark the block as a kernel's own ``compile(key)``."""
    token = _COMPILING.set(True)
    try:
        yield
    finally:
        _COMPILING.reset(token)


def in_warmup_compile() -> bool:
    """True inside :func:`compiling`."""
    return _COMPILING.get()


class CompileCounter:
    """Compiles a backend hook saw (warmup ones included), one dict per compile."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    @property
    def count(self) -> int:
        return len(self.events)

    @property
    def runtime_count(self) -> int:
        """Compiles that were not a kernel's own warmup compile."""
        return sum(1 for e in self.events if not e["warmup"])


@functools.cache
def _cuobjdump() -> str | None:
    # Triton ships cuobjdump (CUDA 12.8); it reads the cubins of both backends, sm_90a and sm_100a.
    try:
        from triton import knobs

        path = knobs.nvidia.cuobjdump.path
        if path and os.path.exists(path):
            return path
    except Exception:  # triton missing or without the tool: fall back to a system CUDA
        pass
    return shutil.which("cuobjdump")


_FUNC = re.compile(r"Function ([^:\s]+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def cubin_resources(cubin: bytes, kernel_name: str | None = None) -> dict[str, Any]:
    """Registers, local memory and static shared memory of the kernel in ``cubin`` (``kernel_name``);
    of a cubin of several kernels without a name: the largest of each, and ``per_kernel`` by name.

    Read from the cubin with ``cuobjdump --dump-resource-usage``, so it works without a GPU.
    ``spills`` follows Triton's definition (local bytes / 4, what ``CompiledKernel.n_spills``
    reports on a GPU). Returns ``{}`` when no cuobjdump is available.
    """
    tool = _cuobjdump()
    if tool is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=False).stdout
    funcs = [(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in _FUNC.finditer(out)]
    if not funcs:
        return {}
    chosen = [f for f in funcs if kernel_name and f[0] == kernel_name] or funcs
    per = {name: {"registers": regs, "spills": local // 4, "local_bytes": local, "stack_bytes": stack,
                  "static_shared": shared} for name, regs, stack, shared, local in chosen}
    if len(per) == 1:
        return next(iter(per.values()))
    # Several kernels (one compile may launch either): the worst of each, and each one's own.
    worst = {k: max(r[k] for r in per.values()) for k in next(iter(per.values()))}
    return {**worst, "per_kernel": per}


# --------------------------------------------------------------------------- store entries


def artifact_files(text: dict[str, str], binary: dict[str, bytes]) -> dict[str, bytes]:
    """An artifact's inspection text and binaries as store files (``text/ptx``, ``binary/cubin``)."""
    return {**{f"text/{k}": v.encode() for k, v in text.items()},
            **{f"binary/{k}": v for k, v in binary.items()}}


def stored_artifact(entry: Any, backend: str, target: str, executable: Any) -> Any:
    """The :class:`~dsv4kit.jit.CompileArtifact` a store entry holds (seconds: its compile time)."""
    from dsv4kit.jit.report import CompileArtifact

    text = {n.removeprefix("text/"): entry.read(n).decode() for n in entry.files if n.startswith("text/")}
    binary = {n.removeprefix("binary/"): entry.read(n) for n in entry.files if n.startswith("binary/")}
    meta = entry.meta
    return CompileArtifact(backend, target, float(meta.get("seconds", 0.0)), info=dict(meta.get("info", {})),
                           text=text, binary=binary, executable=executable)
