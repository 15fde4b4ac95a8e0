"""WarmupRegistry: collect what a model registers, then compile the union once.

Model code calls ``kernel.register_warmup(config)`` while it builds itself.  With
no registry active that does nothing, so a model built outside warmup pays no
cost.  Inside ``with registry.activate():`` (or a constructor wrapped by
``registry.capture``) each registration adds the kernel's warmup keys to the
registry; a 43-layer model that registers one kernel 43 times adds its keys once.

``warmup(store=..., jobs=N)`` loads what an :class:`~dsv4kit.jit.store.ArtifactStore` holds,
compiles the rest in N worker processes (spawned) that write the store, then loads every key
into this process.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from dsv4kit.errors import WarmupError
from dsv4kit.jit.report import KernelReport, WarmupReport
from dsv4kit.jit.store import ArtifactStore

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
    def warmup(self, *, progress: bool = True, raise_on_failure: bool = True,
               store: ArtifactStore | None = None, jobs: int = 1) -> WarmupReport:
        """Warm every registered key, kernel by kernel, with a progress bar counting keys.

        ``store``: load the keys stored there, compile and store the others (each key's report
        says ``info["origin"]``: ``hit`` or ``compiled``). ``jobs > 1``: the keys missing from
        the store are first compiled in up to ``jobs`` spawned worker processes, which write
        them into the store (a temporary one when ``store`` is None); this process then loads
        every key from it, so the in-process executors exist. Reports keep registration order;
        a key a worker failed is compiled again here, so its report carries this process' error.

        Every key is attempted; when some fail and ``raise_on_failure`` is set, a
        :class:`WarmupError` naming each failure is raised after all were tried
        (the report is on the exception as ``.report``).
        """
        with contextlib.ExitStack() as stack:
            if jobs > 1 and store is None:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="dsv4kit-warmup-"))
                store = ArtifactStore(Path(tmp))
            report = self._warm_all(store, jobs, progress)
        if raise_on_failure and report.failures:
            err = WarmupError([(f.kernel, f.key, f.error or "") for f in report.failures])
            err.report = report  # type: ignore[attr-defined]
            raise err
        return report

    def _warm_all(self, store: ArtifactStore | None, jobs: int, progress: bool) -> WarmupReport:
        report = WarmupReport()
        with tqdm(total=len(self), disable=not progress, desc="warmup", unit="key") as bar:
            built: dict[tuple[type, str], dict[Any, float]] = {}
            if jobs > 1 and store is not None:
                built = _compile_in_workers(self._pool_work(store), store, jobs, bar)
            for (cls, target), reg in self._regs.items():
                kernel = reg.kernel
                bar.set_postfix_str(kernel.name)
                done = built.get((cls, target), {})
                keys = kernel.compile_many(list(reg.keys), store=store, built=done,
                                           on_done=lambda r, done=done: bar.update(0 if r.key in done else 1))
                report.kernels.append(KernelReport(kernel.name, kernel.backend, reg.count, keys))
        report.pool_keys = sum(len(b) for b in built.values())  # type: ignore[attr-defined]
        return report

    def _pool_work(self, store: ArtifactStore) -> list[tuple[tuple[type, str], bytes, Any]]:
        """(registration, pickled kernel, key) for every key a worker can build into ``store``."""
        work = []
        for ident, reg in self._regs.items():
            kernel = reg.kernel
            if not kernel.stores_artifacts:
                continue
            try:
                blob = pickle.dumps(kernel)
            except Exception:  # e.g. a class defined in a notebook: compiled in this process instead
                continue
            work += [(ident, blob, k) for k in reg.keys if not store.has(kernel, k)]
        return work


def _build_in_worker(blob: bytes, key: Any, root: str) -> float:
    """Worker process: compile one key and write its store entry; returns the compile seconds."""
    kernel = pickle.loads(blob)
    return kernel.build_entry(key, ArtifactStore(Path(root)))


def _compile_in_workers(work: list[tuple[tuple[type, str], bytes, Any]], store: ArtifactStore,
                        jobs: int, bar: Any) -> dict[tuple[type, str], dict[Any, float]]:
    """Build ``work`` in ``jobs`` spawned processes; per registration, the keys built (seconds).

    A key that fails in a worker is left out: the in-process warmup compiles it and reports
    the error. Processes, not threads: the Triton compiler holds the GIL.
    """
    built: dict[tuple[type, str], dict[Any, float]] = {}
    if len(work) < 2:
        return built
    ctx = multiprocessing.get_context("spawn")
    bar.set_postfix_str(f"compiling {len(work)} key(s) in {min(jobs, len(work))} worker(s)")
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=ctx) as pool:
        futures = {pool.submit(_build_in_worker, blob, key, str(store.root)): (ident, key)
                   for ident, blob, key in work}
        for fut in as_completed(futures):
            ident, key = futures[fut]
            try:
                built.setdefault(ident, {})[key] = fut.result()
            except Exception:  # compiled again (and reported) in this process, counted then
                continue
            bar.update(1)
    return built
