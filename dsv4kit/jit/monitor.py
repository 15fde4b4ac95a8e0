"""The JIT monitor: after warmup, any compile is a bug in the warmup, so say so loudly.

Modes: ``off`` (record nothing), ``warn`` (log once per (kernel, key)), ``error``
(raise :class:`~dsv4kit.errors.UnwarmedKeyError` naming the nearest warmed key and
the exact fields that differ).  Compiles reach the monitor from two places:
``JitKernel._get_or_compile`` misses (every backend), and the backend hooks that
arm with the monitor (Triton's compile hook, the ``cute.compile`` wrapper).

Host code counts too: while a monitor is armed, Python code generated (``compile`` / ``exec`` of
a string) inside an op or kernel call, in the kit or below it (Triton's argument binder, say), is
reported as a compile of kernel ``host`` (source ``host``): the launch path must not generate
code after warmup any more than the kernels may compile.

Monitors nest as a stack: a compile is reported to every armed monitor, and it raises when
any of them is in ``error`` mode, so an inner ``off`` or ``warn`` monitor can never weaken an
outer ``error`` one. Re-entering an armed monitor (``with m: with m:``) keeps it armed until
the outermost exit. The backend hooks are installed when the first monitor arms and removed
when the last one disarms, in whatever order they disarm.
"""

from __future__ import annotations

import ast
import builtins
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any, Literal

from dsv4kit.errors import UnwarmedKeyError

__all__ = [
    "CompileEvent",
    "HostCodegenError",
    "JitMonitor",
    "active_monitor",
    "key_diff",
    "forget_runtime_compiles",
    "nearest_key",
    "nearest_keys",
    "unwarmed_key_error",
    "register_monitor_hook",
    "runtime_entry",
]

log = logging.getLogger("dsv4kit.jit")

Mode = Literal["off", "warn", "error"]
_MODES = ("off", "warn", "error")

# Installers called when the first monitor arms; each returns the function that uninstalls it.
_HOOK_INSTALLERS: list[Callable[[JitMonitor], Callable[[], None]]] = []
_ACTIVE: list[JitMonitor] = []
_UNINSTALLERS: list[Callable[[], None]] = []
# (kernel, key) pairs compiled while a monitor was armed: never offered as "nearest warmed".
_RUNTIME_COMPILED: set[tuple[str, Any]] = set()


def forget_runtime_compiles(kernel: str) -> None:
    """Forget which keys of ``kernel`` were compiled at runtime (its executors were cleared: a
    later warmup of those keys makes them warmed keys again)."""
    for entry in [e for e in _RUNTIME_COMPILED if e[0] == kernel]:
        _RUNTIME_COMPILED.discard(entry)


def register_monitor_hook(install: Callable[[JitMonitor], Callable[[], None]]) -> None:
    """Register a backend hook: ``install(monitor)`` runs at arm time and returns its uninstaller."""
    if install not in _HOOK_INSTALLERS:
        _HOOK_INSTALLERS.append(install)


# Code objects of the functions every op or kernel call runs through (the op's entry, the kernel
# launcher's wrapper): host code generated under one of them is generated at runtime.
_RUNTIME_CODES: set[Any] = set()


def runtime_entry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as an entry of op or kernel calls: code generated below it while a monitor is
    armed is reported as a host compile. Returns ``fn``."""
    _RUNTIME_CODES.add(fn.__code__)
    return fn


def _runtime_caller(asker: Any) -> str | None:
    """``file:function`` of frame ``asker`` (it asked for the code) when an op or kernel entry is on
    its stack, else None."""
    f = asker
    while f is not None:
        if f.f_code in _RUNTIME_CODES:
            return f"{asker.f_code.co_filename}:{asker.f_code.co_name}"
        f = f.f_back
    return None


def _install_host_hook(monitor: JitMonitor) -> Callable[[], None]:
    """Wrap ``compile`` and ``exec`` so that code generated under a runtime entry is reported."""
    real_compile, real_exec = builtins.compile, builtins.exec

    def report(what: str, asker: Any) -> None:
        where = _runtime_caller(asker)
        if where is not None:
            mon = active_monitor()
            if mon is not None:
                mon.report_host_codegen(f"{what} in {where}")

    def compile_(source: Any, filename: Any = "<unknown>", mode: str = "exec", flags: int = 0,
                 *args: Any, **kwargs: Any) -> Any:
        if not flags & ast.PyCF_ONLY_AST:  # ast.parse builds a tree, not code
            report("compile", sys._getframe(1))
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    def exec_(source: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(source, str | bytes):  # a code object was compiled (and reported) already
            report("exec", sys._getframe(1))
        return real_exec(source, *args, **kwargs)

    builtins.compile, builtins.exec = compile_, exec_

    def uninstall() -> None:
        builtins.compile, builtins.exec = real_compile, real_exec

    return uninstall


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


def nearest_keys(requested: Any, warmed: Iterable[Any]) -> list[Any]:
    """The warmed keys with the fewest differing fields, in warm order (empty: none of its class)."""
    best: list[Any] = []
    best_n = None
    for w in warmed:
        if type(w) is not type(requested):
            continue
        n = len(key_diff(w, requested))
        if best_n is None or n < best_n:
            best, best_n = [w], n
        elif n == best_n:
            best.append(w)
    return best


def nearest_key(requested: Any, warmed: Iterable[Any]) -> Any | None:
    """The warmed key with the fewest differing fields (the first warmed on ties), or None."""
    near = nearest_keys(requested, warmed)
    return near[0] if near else None


def unwarmed_key_error(kernel: str, key: Any, warmed: Iterable[Any]) -> UnwarmedKeyError:
    """The error for ``key`` of ``kernel``, naming the nearest warmed key and every equally near one."""
    near = nearest_keys(key, warmed)
    if not near:
        return UnwarmedKeyError(kernel, key, None, {})
    return UnwarmedKeyError(kernel, key, near[0], key_diff(near[0], key),
                            [(k, key_diff(k, key)) for k in near[1:]])


class HostCodegenError(UnwarmedKeyError):
    """Python code was generated inside an op or kernel call after warmup (``error`` mode)."""

    def __init__(self, where: str) -> None:
        RuntimeError.__init__(self, f"host: Python code generated after warmup ({where}); the launch "
                                    "path must generate nothing per call")
        self.kernel, self.key, self.nearest, self.diff, self.also_near = "host", where, None, {}, []


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
        self._depth = 0

    @property
    def armed(self) -> bool:
        return self._depth > 0

    def arm(self) -> JitMonitor:
        """Start watching (again: arming an armed monitor nests, one disarm per arm)."""
        self._depth += 1
        if self._depth == 1:
            if not _ACTIVE:
                _UNINSTALLERS[:] = [install(self) for install in list(_HOOK_INSTALLERS)]
            _ACTIVE.append(self)
        return self

    def disarm(self) -> None:
        """Stop watching; the last monitor to disarm restores the backend hooks."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth:
            return
        _ACTIVE.remove(self)
        if not _ACTIVE:
            for uninstall in reversed(_UNINSTALLERS):
                uninstall()
            _UNINSTALLERS.clear()

    def __enter__(self) -> JitMonitor:
        return self.arm()

    def __exit__(self, *exc: object) -> None:
        self.disarm()

    def report_compile(self, kernel: str, key: Any, warmed: Iterable[Any], source: str = "jit") -> None:
        """Called just before (or, for hooks that cannot run earlier, just after) a compile.

        Every armed monitor records it (this one too, if it is not armed); ``error`` in any of
        them raises :class:`UnwarmedKeyError`; ``warn`` logs once per (kernel, key). The nearest
        key is taken among keys that were warmed, not among keys compiled at runtime.
        """
        warmed = [w for w in warmed if (kernel, w) not in _RUNTIME_COMPILED]
        err = unwarmed_key_error(kernel, key, warmed)
        monitors = list(_ACTIVE) if self in _ACTIVE else [*_ACTIVE, self]
        for m in monitors:
            m._record(CompileEvent(kernel, key, source), err)
        if any(m.mode == "error" for m in monitors):
            raise err
        if any(m.mode == "warn" for m in monitors):
            _RUNTIME_COMPILED.add((kernel, key))  # it will compile now: not a warmed key

    def report_host_codegen(self, where: str) -> None:
        """Python code generated at runtime (see the module docstring): recorded as kernel ``host``,
        source ``host``; raises :class:`HostCodegenError` in ``error`` mode."""
        err = HostCodegenError(where)
        monitors = list(_ACTIVE) if self in _ACTIVE else [*_ACTIVE, self]
        for m in monitors:
            m._record(CompileEvent("host", where, "host"), err)
        if any(m.mode == "error" for m in monitors):
            raise err

    def _record(self, event: CompileEvent, err: UnwarmedKeyError) -> None:
        if self.mode == "off":
            return
        self.events.append(event)
        if self.mode == "warn" and (event.kernel, event.key) not in self._warned:
            self._warned.add((event.kernel, event.key))
            log.warning("%s", err)

    def compiles(self, kernel: str | None = None) -> list[CompileEvent]:
        """Compile events seen so far (of one kernel, if named)."""
        return [e for e in self.events if kernel is None or e.kernel == kernel]


register_monitor_hook(_install_host_hook)
