"""Source code shown in a notebook: whole functions, or the few lines of a kernel that matter.

A tutorial shows the kit's own code rather than a copy of it, so what it shows cannot drift from
what runs. :func:`excerpt` cuts a function's source between two marker lines and raises when a
marker is gone (a kernel rewrite then fails the notebook instead of showing stale lines);
:func:`source_markdown` renders functions or excerpts as one fenced block, each headed by where
it lives.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Excerpt", "excerpt", "source_markdown", "whole"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Excerpt:
    """Lines ``first``..``first + len(lines) - 1`` (1-based) of ``path``."""

    path: str
    first: int
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def header(self) -> str:
        return f"# {self.path}, lines {self.first}-{self.first + len(self.lines) - 1}"


def _python_function(obj: Any) -> Any:
    # A @triton.jit function keeps the Python function it wraps as .fn.
    return getattr(obj, "fn", obj)


def _where(fn: Any) -> tuple[str, list[str], int]:
    path = Path(inspect.getsourcefile(fn) or "?").resolve()
    lines, first = inspect.getsourcelines(fn)
    try:
        shown = str(path.relative_to(_PACKAGE_ROOT))
    except ValueError:
        shown = path.name
    return shown, [line.rstrip("\n") for line in lines], first


def whole(obj: Any) -> Excerpt:
    """The whole source of a function or class (a Triton kernel's Python function)."""
    path, lines, first = _where(_python_function(obj))
    return Excerpt(path, first, tuple(lines))


def excerpt(obj: Any, start: str, stop: str | None = None) -> Excerpt:
    """The lines of ``obj``'s source from the first containing ``start`` through the first after it
    containing ``stop`` (default: only the start line). ValueError when a marker is not found."""
    path, lines, first = _where(_python_function(obj))
    i = next((n for n, line in enumerate(lines) if start in line), None)
    if i is None:
        raise ValueError(f"{path}: no line of {getattr(obj, '__name__', obj)!r} contains {start!r}")
    j = i if stop is None else next((n for n in range(i, len(lines)) if stop in lines[n]), None)
    if j is None:
        raise ValueError(f"{path}: no line after {start!r} contains {stop!r}")
    return Excerpt(path, first + i, tuple(lines[i:j + 1]))


def source_markdown(*parts: Excerpt) -> str:
    """One fenced Python block of ``parts``, each headed by its file and lines."""
    body = "\n\n".join(f"{p.header}\n{textwrap.dedent(p.text)}" for p in parts)
    return f"```python\n{body}\n```"
