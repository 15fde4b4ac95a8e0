"""Exceptions shared by the whole kit.

Every message follows one shape so that a user can grep for it:
``"<kernel>: <arg>: expected <...>, got <...>"`` for bad inputs (spec §2.10).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = [
    "ContractError",
    "KernelInputError",
    "MissingExecutorError",
    "UnwarmedKeyError",
    "WarmupError",
    "format_key",
    "input_error",
]


def _short(value: object) -> str:
    return str(value).removeprefix("torch.")


def format_key(key: object) -> str:
    """``Key(a=1, dtype=torch.float32)`` → ``(a=1, dtype=float32)``: short, one line."""
    if not dataclasses.is_dataclass(key):
        return repr(key)
    parts = (f"{f.name}={_short(getattr(key, f.name))}" for f in dataclasses.fields(key))
    return "(" + ", ".join(parts) + ")"


class ContractError(TypeError):
    """A kernel class breaks the warmup contract (raised when the class is defined)."""


class KernelInputError(ValueError):
    """A kernel was called with arguments it cannot take (dtype, shape, device, ...)."""


def input_error(kernel: str, arg: str, expected: str, got: object) -> KernelInputError:
    """Build a :class:`KernelInputError` with the project's message shape."""
    return KernelInputError(f"{kernel}: {arg}: expected {expected}, got {got}")


class MissingExecutorError(RuntimeError):
    """``compile(key)`` returned without caching an executor for ``key``."""


class UnwarmedKeyError(RuntimeError):
    """A compile was requested after warmup while the JIT monitor is in ``error`` mode."""

    def __init__(self, kernel: str, key: object, nearest: object | None, diff: dict[str, tuple],
                 also_near: Sequence[tuple[object, dict[str, tuple]]] = ()):
        self.kernel = kernel
        self.key = key
        self.nearest = nearest
        self.diff = diff
        #: Other warmed keys as near as ``nearest`` (as many differing fields), with their diffs:
        #: with two candidates one field away each, either field may be the misconfiguration.
        self.also_near = list(also_near)
        if nearest is None:
            hint = "no key of this kernel was warmed"
        else:
            hint = f"nearest warmed key {format_key(nearest)} differs in {_fields(diff)}"
            hint += "".join(f"; equally near, {format_key(k)} differs in {_fields(d)}" for k, d in also_near)
        super().__init__(f"{kernel}: compile after warmup for unwarmed key {format_key(key)}; {hint}")


def _fields(diff: dict[str, tuple]) -> str:
    return ", ".join(f"{name}: warmed {_short(w)}, requested {_short(r)}" for name, (w, r) in diff.items())


class WarmupError(RuntimeError):
    """One or more keys failed to compile during warmup; ``failures`` lists each."""

    def __init__(self, failures: list[tuple[str, object, str]]):
        self.failures = failures
        lines = "\n".join(f"  {kernel} {format_key(key)}: {err}" for kernel, key, err in failures)
        super().__init__(f"warmup failed for {len(failures)} key(s):\n{lines}")
