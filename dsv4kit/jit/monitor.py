"""The JIT monitor: after warmup, any compile is a bug in the warmup, so say so loudly.

Modes: ``off`` (record nothing), ``warn`` (log once per (kernel, key)), ``error``
(raise :class:`~dsv4kit.errors.UnwarmedKeyError` naming the nearest warmed key and
the exact fields that differ).  Compiles reach the monitor from two places:
``JitKernel._get_or_compile`` misses (every backend), and the backend hooks that
arm with the monitor (Triton's compile hook, the ``cute.compile`` wrapper).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any, Literal

from dsv4kit.errors import UnwarmedKeyError

__all__ = [
    "CompileEvent",
    "JitMonitor",
    "active_monitor",
    "key_diff",
    "nearest_key",
    "register_monitor_hook",
]

log = logging.getLogger("dsv4kit.jit")

Mode = Literal["off", "warn", "error"]
_MODES = ("off", "warn", "error")

# Installers called when a monitor arms; each returns the function that uninstalls it.
_HOOK_INSTALLERS: list[Callable[[JitMonitor], Callable[[], None]]] = []
_ACTIVE: list[JitMonitor] = []


def register_monitor_hook(install: Callable[[JitMonitor], Callable[[], None]]) -> None:
    """Register a backend hook: ``install(monitor)`` runs at arm time and returns its uninstaller."""
    if install not in _HOOK_INSTALLERS:
        _HOOK_INSTALLERS.append(install)


def active_monitor() -> JitMonitor | None:
    """The innermost armed monitor, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def key_diff(warmed: Any, requested: Any) -> dict[str, tuple[Any, Any]]:
    """Fields where two keys of one CompileKey class differ: ``{name: (warmed, requested)}``."""
    return {
        f.name: (getattr(warmed, f.name), getattr(requested, f.name))
        for f in fields(requested)
        if getattr(warmed, f.name) != getattr(requested, f.name)
    }


def nearest_key(requested: Any, warmed: Iterable[Any]) -> Any | None:
    """The warmed key with the fewest differing fields (first one on ties), or None."""
    best, best_n = None, None
    for w in warmed:
        if type(w) is not type(requested):
            continue
        n = len(key_diff(w, requested))
        if best_n is None or n < best_n:
            best, best_n = w, n
    return best


@dataclass(frozen=True)
class CompileEvent:
    """One compile seen while a monitor was armed."""

    kernel: str
    key: Any
    source: str   # "jit" (a _get_or_compile miss), "triton", "cutedsl", ...


class JitMonitor:
    """Watches for compiles after warmup.

    Use as a context manager (``with JitMonitor("error"):``) or with :meth:`arm` /
    :meth:`disarm`. ``events`` lists every compile seen while armed, in every mode but ``off``.
    """

    def __init__(self, mode: Mode = "error") -> None:
        if mode not in _MODES:
            raise ValueError(f"JitMonitor: mode: expected one of {list(_MODES)}, got {mode!r}")
        self.mode: Mode = mode
        self.events: list[CompileEvent] = []
        self._warned: set[tuple[str, Any]] = set()
        self._uninstallers: list[Callable[[], None]] = []
        self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    def arm(self) -> JitMonitor:
        """Start watching; installs the registered backend hooks."""
        if self._armed:
            return self
        self._uninstallers = [install(self) for install in list(_HOOK_INSTALLERS)]
        _ACTIVE.append(self)
        self._armed = True
        return self

    def disarm(self) -> None:
        """Stop watching; backend hooks are restored to what they were."""
        if not self._armed:
            return
        for uninstall in reversed(self._uninstallers):
            uninstall()
        self._uninstallers = []
        _ACTIVE.remove(self)
        self._armed = False

    def __enter__(self) -> JitMonitor:
        return self.arm()

    def __exit__(self, *exc: object) -> None:
        self.disarm()

    def report_compile(self, kernel: str, key: Any, warmed: Iterable[Any], source: str = "jit") -> None:
        """Called just before (or, for hooks that cannot run earlier, just after) a compile.

        ``error`` raises :class:`UnwarmedKeyError`; ``warn`` logs once per (kernel, key).
        """
        if self.mode == "off":
            return
        self.events.append(CompileEvent(kernel, key, source))
        warmed = list(warmed)
        nearest = nearest_key(key, warmed)
        diff = key_diff(nearest, key) if nearest is not None else {}
        err = UnwarmedKeyError(kernel, key, nearest, diff)
        if self.mode == "error":
            raise err
        if (kernel, key) not in self._warned:
            self._warned.add((kernel, key))
            log.warning("%s", err)

    def compiles(self, kernel: str | None = None) -> list[CompileEvent]:
        """Compile events seen so far (of one kernel, if named)."""
        return [e for e in self.events if kernel is None or e.kernel == kernel]
