"""JitKernel: the warmup contract every dsv4kit kernel signs.

A kernel class declares

* ``CompileKey``: a frozen dataclass of ints, bools, strs, floats, torch dtypes and
  tuples of those. Everything that makes the compiled code differ is a field.
* ``dispatch(...)``: plain Python mapping runtime metadata to a key (parsed and
  checked when the class is defined; see :mod:`dsv4kit.jit.space`).
* ``get_warmup_keys(config)``: the keys a model configuration needs, usually
  ``self.trace(...)`` over declared inputs.
* ``warmup_inputs(key)`` and ``compile(key)``: the backend's half; ``compile`` must
  store an executor with :meth:`_cache_executor`.
* ``__call__`` decorated with :func:`~dsv4kit.jit.launcher.kernel_launcher`.

A backend that can keep artifacts on disk (``stores_artifacts``) also provides
``compile_for(key, arch)``, ``entry_payload`` and ``load_entry``: warmup with an
:class:`~dsv4kit.jit.store.ArtifactStore` then loads stored keys and compiles the rest.

Executors are cached per kernel *class* and compile target, so every instance (one per
layer, say) shares what warmup compiled for its target, and a process that compiles for two
targets (sm_90a and sm_100a on a CPU) never hands one target's executor to the other.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import torch

from dsv4kit.errors import ContractError, MissingExecutorError, WarmupError, input_error
from dsv4kit.jit import coverage, monitor, registry
from dsv4kit.jit.launch_plans import plan_safe
from dsv4kit.jit.launcher import LaunchSpec
from dsv4kit.jit.report import CompileArtifact, KeyReport, format_key
from dsv4kit.jit.space import DispatchProgram, ZippedInputs, parse_dispatch, trace_dispatch
from dsv4kit.jit.store import ArtifactStore, Entry, StoreWarning

__all__ = ["JitKernel", "fixed", "validate_compile_key"]

K = TypeVar("K")

_SCALAR_TYPES = (int, bool, str, float, torch.dtype)
ALLOWED_FIELD_TYPES = "int, bool, str, float, torch.dtype, or tuple of those"


def fixed(value: Any) -> Any:
    """A CompileKey field whose value is fixed: a call that implies another value is rejected.

    ``head_size: int = fixed(512)``
    """
    return dataclasses.field(default=value, metadata={"fixed": True})


def _allowed(tp: Any) -> bool:
    if tp in _SCALAR_TYPES:
        return True
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return _allowed(args[0])
        return bool(args) and all(_allowed(a) for a in args)
    return False


def validate_compile_key(key_cls: Any, where: str) -> None:
    """Reject a CompileKey class that is not a frozen dataclass of supported field types."""
    if not isinstance(key_cls, type) or not dataclasses.is_dataclass(key_cls):
        raise ContractError(f"{where}.CompileKey: expected a @dataclass(frozen=True) class, got {key_cls!r}")
    if not key_cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise ContractError(f"{where}.CompileKey: expected a frozen dataclass (frozen=True), got mutable")
    try:
        hints = typing.get_type_hints(key_cls)
    except Exception as exc:  # a NameError in a string annotation, typically
        raise ContractError(f"{where}.CompileKey: cannot resolve field annotations ({exc})") from exc
    for f in dataclasses.fields(key_cls):
        tp = hints.get(f.name)
        if not _allowed(tp):
            raise ContractError(
                f"{where}.CompileKey: field {f.name!r}: expected type {ALLOWED_FIELD_TYPES}, got {tp!r}"
            )


class JitKernel(Generic[K]):
    """Base class of every kernel; see the module docstring for what a subclass provides."""

    CompileKey: ClassVar[type]
    #: Backend name shown in reports ("python", "triton", "cutedsl", ...).
    backend: ClassVar[str] = "python"
    #: Compile target shown in artifacts ("cpu", "sm_90a", ...); backends set it per instance.
    target: str = "cpu"

    _dispatch_program: ClassVar[DispatchProgram | None] = None
    _executors: ClassVar[dict[str, dict[Any, Callable[..., Any]]]]   # target -> key -> executor
    _artifacts: ClassVar[dict[str, dict[Any, CompileArtifact]]]       # target -> key -> artifact
    _checked_keys: ClassVar[set[Any]]                                   # keys check_key passed

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._executors = {}
        cls._artifacts = {}
        cls._checked_keys = set()
        key_cls = getattr(cls, "CompileKey", None)
        if key_cls is None:
            return  # an abstract (backend) base
        validate_compile_key(key_cls, cls.__name__)
        if cls.dispatch is JitKernel.dispatch:
            raise ContractError(f"{cls.__name__}: a kernel with a CompileKey must define dispatch(...)")
        names = [f.name for f in dataclasses.fields(key_cls)]
        cls._dispatch_program = parse_dispatch(cls.dispatch, names, f"{cls.__name__}.dispatch")
        cls._validate_backend()

    @classmethod
    def _validate_backend(cls) -> None:
        """Backend-specific checks at class creation (e.g. Triton specialization coverage)."""

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        """The kernel's name in reports, ledgers and errors."""
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{self.name} backend={self.backend} target={self.target}>"

    # ------------------------------------------------------------------ the contract
    def dispatch(self, *args: Any, **kwargs: Any) -> K:
        """Map runtime metadata to a CompileKey. Pure, host-only, traced by AST."""
        raise NotImplementedError

    def get_warmup_keys(self, config: Any = None) -> list[K]:
        """The keys a configuration needs. Default: none."""
        return []

    def trace(self, *zips: ZippedInputs, when: Callable[..., bool] | None = None, **inputs: Any) -> list[K]:
        """Keys of ``dispatch`` over the product of declared inputs (see :mod:`dsv4kit.jit.space`)."""
        prog = type(self)._dispatch_program
        if prog is None:
            raise ContractError(f"{self.name}: trace() needs a CompileKey and a dispatch")
        return trace_dispatch(prog, self.CompileKey, *zips, self_obj=self, when=when,
                              where=f"{self.name}.trace", **inputs).keys

    def warmup_inputs(self, key: K) -> Any:
        """Fake inputs (no storage) that make ``compile(key)`` produce exactly the runtime code."""
        raise NotImplementedError(f"{self.name}: warmup_inputs is the backend's to define")

    def compile(self, key: K) -> None:
        """Compile ``key`` and store the executor with :meth:`_cache_executor`."""
        raise NotImplementedError(f"{self.name}: compile is the backend's to define")

    def check_key(self, key: K) -> None:
        """Reject a key that is not this kernel's, or whose fixed fields differ from their values.

        Runs on every launch; a key that passed is remembered per class (the outcome depends on the
        key alone), so a launch of a known key pays one set lookup.
        """
        if type(key) is not self.CompileKey:
            raise TypeError(f"{self.name}: dispatch must return {self.CompileKey.__qualname__}, got {key!r}")
        checked = type(self)._checked_keys
        if key in checked:
            return
        for f in dataclasses.fields(key):  # type: ignore[arg-type]
            if f.metadata.get("fixed") and getattr(key, f.name) != f.default:
                raise input_error(self.name, f.name, f"{f.default!r} (fixed)", repr(getattr(key, f.name)))
        checked.add(key)

    # ------------------------------------------------------------------ executors
    def _executor_cache(self) -> dict[Any, Callable[..., Any]]:
        """Key -> executor for this kernel class and this instance's target."""
        return type(self)._executors.setdefault(self.target, {})

    def _cache_executor(
        self, key: K, executor: Callable[..., Any], artifact: CompileArtifact | None = None
    ) -> None:
        """Store what ``compile(key)`` built; the runtime will find it here."""
        self._executor_cache()[key] = executor
        if artifact is not None:
            type(self)._artifacts.setdefault(self.target, {})[key] = artifact

    def compiled_keys(self) -> list[K]:
        """Keys with a cached executor for this target, in compile order."""
        return list(self._executor_cache())

    def artifact(self, key: K) -> CompileArtifact | None:
        """The compile artifact of ``key`` (PTX, registers, ...), if the backend kept one."""
        return type(self)._artifacts.get(self.target, {}).get(key)

    @classmethod
    def clear_cache(cls) -> None:
        """Forget every compiled executor and artifact of this kernel class (all targets), and that
        some of them were compiled at runtime (a later warmup of those keys warms them)."""
        cls._executors.clear()
        cls._artifacts.clear()
        monitor.forget_runtime_compiles(cls.__name__)

    def _get_or_compile(self, key: K) -> Callable[..., Any]:
        """The executor for ``key``; a miss is reported to the monitor, then compiled."""
        coverage.record_request(self.name, key)
        exe = self._executor_cache().get(key)
        if exe is not None:
            return exe
        mon = monitor.active_monitor()
        if mon is not None:
            mon.report_compile(self.name, key, self.compiled_keys(), source="jit")
        self.compile(key)
        exe = self._executor_cache().get(key)
        if exe is None:
            raise MissingExecutorError(
                f"{self.name}: compile({key}) returned without caching an executor; "
                "compile must call self._cache_executor(key, executor)"
            )
        return exe

    @plan_safe
    def launch(self, spec: LaunchSpec, inputs: dict[str, Any] | None) -> Any:
        """Run ``spec`` with the executor warmed for its key. Backends may override (an override
        that does more than run the executor leaves its kernel without launch plans unless marked
        :func:`~dsv4kit.jit.launch_plans.plan_safe`)."""
        result = self._get_or_compile(spec.key)(*spec.args)
        if spec.output is not None:
            result = spec.output
        if spec.finalizer is not None:
            result = spec.finalizer(result)
        return result

    def plan_launcher(self, key: K, executor: Callable[..., Any], args: tuple[Any, ...]
                      ) -> tuple[Callable[[list[Any]], Any], frozenset[int]]:
        """How a launch plan of ``key`` runs (:mod:`dsv4kit.jit.launch_plans`): a function of the
        executor's arguments, and the positions where it takes a bare address (an int) instead of
        a tensor. Default: call the executor; a backend may launch the compiled code directly."""
        return (lambda call_args: executor(*call_args)), frozenset()

    # ------------------------------------------------------------------ warmup
    def _compile_one(self, key: K, store: ArtifactStore | None = None,
                     built: Mapping[Any, float] | None = None) -> KeyReport:
        t0 = time.perf_counter()
        try:
            self.check_key(key)  # a key of another kernel, or a wrong fixed field: this key's failure
            origin = self._warm_key(key, store)
            if key not in self._executor_cache():
                raise MissingExecutorError(f"compile({key}) did not cache an executor")
        except Exception as exc:  # reported, not hidden: warmup raises after all keys ran
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return KeyReport(self.name, key, time.perf_counter() - t0, error=last)
        seconds = time.perf_counter() - t0
        art = self.artifact(key)
        if origin == "hit" and built is not None and key in built:
            origin, seconds = "compiled", seconds + built[key]  # a worker compiled it in this warmup
        elif art is not None and origin != "hit":
            art.seconds = seconds
        info = dict(art.info) if art else {}
        if origin is not None:
            info["origin"] = origin
        return KeyReport(self.name, key, seconds, info)

    # ------------------------------------------------------------------ the artifact store
    #: Whether this backend can save its artifacts in an :class:`ArtifactStore` and load them.
    stores_artifacts: ClassVar[bool] = False

    def entry_payload(self, key: K, art: CompileArtifact) -> tuple[dict[str, bytes], dict[str, Any]]:
        """Files and metadata a store entry keeps for ``art`` (backends that store artifacts)."""
        raise NotImplementedError(f"{self.name}: the {self.backend} backend does not store artifacts")

    def load_entry(self, key: K, entry: Entry) -> None:
        """Cache the executor and artifact of ``key`` from a store entry, compiling nothing."""
        raise NotImplementedError(f"{self.name}: the {self.backend} backend does not store artifacts")

    def compile_for(self, key: K, arch: str) -> CompileArtifact:
        """Compile ``key`` ahead of time for ``arch``, leaving the executor cache alone (backends)."""
        raise NotImplementedError(f"{self.name}: compile_for is the backend's to define")

    def _warm_key(self, key: K, store: ArtifactStore | None) -> str | None:
        """Load ``key`` from ``store`` or compile it (and store it); ``hit``, ``compiled`` or None
        (no store in use for this kernel)."""
        if store is None or not self.stores_artifacts:
            self.compile(key)
            return None
        entry = store.get(self, key)
        if entry is not None:
            try:
                self.load_entry(key, entry)
                return "hit"
            except Exception as exc:  # an entry this process cannot load: rebuilt, not fatal
                warnings.warn(f"dsv4kit artifact store: entry of {self.name} {key} at {entry.path} could "
                              f"not be loaded ({type(exc).__name__}: {exc}); it is rebuilt", StoreWarning,
                              stacklevel=2)
                store.remove(entry.path)
        self.compile(key)
        art = self.artifact(key)
        if art is not None:
            self.save_entry(key, art, store)
        return "compiled"

    def _put_entry(self, key: K, art: CompileArtifact, store: ArtifactStore) -> None:
        files, meta = self.entry_payload(key, art)
        store.put(self, key, files, {"info": art.info, "seconds": art.seconds, **meta},
                  display=format_key(key))

    def save_entry(self, key: K, art: CompileArtifact, store: ArtifactStore) -> None:
        """Write ``art`` into ``store``; a store that cannot be written only warns."""
        try:
            self._put_entry(key, art, store)
        except Exception as exc:  # the compile succeeded; only the cache is lost
            warnings.warn(f"dsv4kit artifact store: could not store {self.name} {key} in {store.root} "
                          f"({type(exc).__name__}: {exc})", StoreWarning, stacklevel=2)

    def build_entry(self, key: K, store: ArtifactStore) -> float:
        """Compile ``key`` for this kernel's target and store it, without caching an executor (a
        worker process of a parallel warmup runs this); returns the compile seconds."""
        self.check_key(key)
        t0 = time.perf_counter()
        art = self.compile_for(key, self.target)
        art.seconds = time.perf_counter() - t0
        self._put_entry(key, art, store)
        return art.seconds

    def compile_many(
        self, keys: Iterable[K], on_done: Callable[[KeyReport], None] | None = None, *,
        store: ArtifactStore | None = None, built: Mapping[Any, float] | None = None,
    ) -> list[KeyReport]:
        """Warm each key, in order, and report each: with a ``store``, a key stored there is
        loaded (``info["origin"] == "hit"``), any other is compiled and stored (``"compiled"``).
        ``built``: keys a worker process compiled into ``store`` during this warmup (seconds)."""
        out = []
        for key in keys:
            r = self._compile_one(key, store, built)
            if r.ok:
                coverage.record_warmed(self.name, [key])
            out.append(r)
            if on_done is not None:
                on_done(r)
        return out

    def warmup(self, config: Any = None, *, keys: Iterable[K] | None = None,
               store: ArtifactStore | None = None) -> list[KeyReport]:
        """Compile the keys of ``config`` (or the given ``keys``) now; raise if any failed."""
        reports = self.compile_many(self.get_warmup_keys(config) if keys is None else keys, store=store)
        failures = [(r.kernel, r.key, r.error or "") for r in reports if not r.ok]
        if failures:
            raise WarmupError(failures)
        return reports

    def register_warmup(self, config: Any = None) -> None:
        """Register this kernel's warmup keys with the active registry (no-op if none)."""
        if registry.active_registry() is not None:
            registry.register(self, self.get_warmup_keys(config))
