"""WarmupRegistry: collect what a model registers, then compile the union once.

Model code calls ``kernel.register_warmup(config)`` while it builds itself.  With
no registry active that does nothing, so a model built outside warmup pays no
cost.  Inside ``with registry.activate():`` (or a constructor wrapped by
``registry.capture``) each registration adds the kernel's warmup keys to the
registry; a 43-layer model that registers one kernel 43 times adds its keys once.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from dsv4kit.errors import WarmupError
from dsv4kit.jit.report import KernelReport, WarmupReport

if TYPE_CHECKING:
    from dsv4kit.jit.kernel import JitKernel

__all__ = ["Registration", "WarmupRegistry", "active_registry", "register"]

_ACTIVE: list[WarmupRegistry] = []


def active_registry() -> WarmupRegistry | None:
    """The innermost active registry, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def register(kernel: JitKernel, keys: Iterable[Any]) -> None:
    """Add ``keys`` of ``kernel`` to the active registry; a no-op when none is active."""
    registry = active_registry()
    if registry is not None:
        registry.register(kernel, keys)


@dataclass
class Registration:
    """One kernel (by class) in a registry: a representative instance and the key union."""

    kernel: JitKernel
    keys: dict[Any, None] = field(default_factory=dict)
    count: int = 0


class WarmupRegistry:
    """Collects warmup registrations and compiles their union."""

    def __init__(self) -> None:
        self._regs: dict[tuple[type, str], Registration] = {}

    # ------------------------------------------------------------------ collecting
    @contextlib.contextmanager
    def activate(self) -> Iterator[WarmupRegistry]:
        """Make this the registry that ``register_warmup`` calls reach, for the ``with`` body."""
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)

    def capture(self, ctor: Callable[..., Any]) -> Any:
        """Decorate a constructor (function or class) so that building under it registers here."""
        if isinstance(ctor, type):
            init = ctor.__init__

            @functools.wraps(init)
            def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
                with self.activate():
                    init(obj, *args, **kwargs)

            ctor.__init__ = __init__  # type: ignore[misc]
            return ctor

        @functools.wraps(ctor)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.activate():
                return ctor(*args, **kwargs)

        return wrapper

    def register(self, kernel: JitKernel, keys: Iterable[Any]) -> None:
        """Record that ``kernel`` needs ``keys``; kernels of one class and target share one entry."""
        reg = self._regs.setdefault((type(kernel), kernel.target), Registration(kernel))
        reg.count += 1
        for k in keys:
            reg.keys.setdefault(k, None)

    def _label(self, reg: Registration) -> str:
        # The kernel's name; with the target appended when one class is registered for several.
        same = sum(1 for cls, _ in self._regs if cls is type(reg.kernel))
        return reg.kernel.name if same == 1 else f"{reg.kernel.name}@{reg.kernel.target}"

    @property
    def registrations(self) -> dict[str, Registration]:
        """Kernel name (``name@target`` if a class has several targets) → its registration."""
        return {self._label(r): r for r in self._regs.values()}

    def keys(self) -> dict[str, list[Any]]:
        """Kernel name → the union of its registered keys, in first-registered order."""
        return {self._label(r): list(r.keys) for r in self._regs.values()}

    def __len__(self) -> int:
        return sum(len(r.keys) for r in self._regs.values())

    # ------------------------------------------------------------------ compiling
    def warmup(self, *, progress: bool = True, raise_on_failure: bool = True) -> WarmupReport:
        """Compile every registered key, kernel by kernel, with a progress bar.

        Every key is attempted; when some fail and ``raise_on_failure`` is set, a
        :class:`WarmupError` naming each failure is raised after all were tried
        (the report is on the exception as ``.report``).
        """
        report = WarmupReport()
        total = len(self)
        with tqdm(total=total, disable=not progress, desc="warmup", unit="key") as bar:
            for reg in self._regs.values():
                kernel = reg.kernel
                bar.set_postfix_str(kernel.name)
                keys = kernel.compile_many(list(reg.keys), on_done=lambda _r: bar.update(1))
                report.kernels.append(KernelReport(kernel.name, kernel.backend, reg.count, keys))
        if raise_on_failure and report.failures:
            err = WarmupError([(f.kernel, f.key, f.error or "") for f in report.failures])
            err.report = report  # type: ignore[attr-defined]
            raise err
        return report
