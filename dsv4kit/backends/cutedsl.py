"""CuTeDSLJitKernel: CuTeDSL kernels under the warmup contract.

A subclass names its ``@cute.jit`` host function (``jit_fn``) and builds, per key, the fake
arguments ``cute.compile`` traces with (:meth:`warmup_inputs`): fake tensors without storage
(:func:`fake_tensor`, symbolic sizes from :func:`sym` with stated divisibility) and a fake
stream (:func:`fake_stream`). ``compile(key)`` compiles for the platform's arch, always naming
it (``--gpu-arch``: with no GPU, CuTeDSL would otherwise silently target sm_100a), with
``--enable-tvm-ffi`` when apache-tvm-ffi is importable, and keeps PTX, cubin and the
register/spill report in the key's :class:`~dsv4kit.jit.CompileArtifact`.

``__call__`` returns ``(key, args)``, ``(key, args, output)`` or ``(key, args, output,
finalizer)``; ``args`` are the runtime arguments matching the fake ones minus the stream
(with TVM-FFI the stream is the caller's current torch stream). The runtime calls the
executor compiled during warmup: nothing is traced or compiled per call.

The monitor hook wraps ``cutlass.cute.compile`` while armed and reports *before* compiling,
so ``error`` mode stops a stray runtime compile before it starts.

**Artifact store** (:mod:`dsv4kit.jit.store`): an entry keeps PTX, cubin, the register report
and, with TVM-FFI, the compiled function exported by CuTeDSL's ahead-of-time path
(``JitCompiledFunction.export_to_c(path.o, function_name=...)``, its "TVM FFI module export").
A hit loads it with ``cutlass.cute.runtime.load_module(path, enable_tvm_ffi=True)``, which
links the object in-process and returns a ``tvm_ffi.Function``; no ``cute.compile`` runs. On
the CPU machine the load succeeds without a GPU; the function is then only launchable on one
(``launch`` still requires CUDA). Launching a loaded function was not run on a GPU in this change.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from dsv4kit.backends._common import (
    CompileCounter,
    artifact_files,
    compiling,
    cubin_resources,
    in_warmup_compile,
    stored_artifact,
)
from dsv4kit.errors import ContractError, input_error
from dsv4kit.jit import CompileArtifact, JitKernel, active_monitor, register_monitor_hook
from dsv4kit.jit.launch_plans import plan_safe
from dsv4kit.jit.store import Entry, key_text
from dsv4kit.platform import Platform, check_arch, current_platform

__all__ = [
    "CuTeDSLJitKernel",
    "CuteCompileCounter",
    "compile_options",
    "count_cute_compiles",
    "fake_stream",
    "fake_tensor",
    "import_cute",
    "sym",
]

K = TypeVar("K")


def import_cute(what: str = "dsv4kit.backends.cutedsl") -> Any:
    """``cutlass.cute``, or a clear error naming the package to install."""
    try:
        import cutlass.cute as cute
    except ImportError as exc:
        raise input_error(what, "backend", "nvidia-cutlass-dsl importable (pip install nvidia-cutlass-dsl"
                          "==4.8.1)", f"ImportError: {exc}") from None
    return cute


def sym(divisibility: int = 1, symbol: str | None = None, width: int = 32) -> Any:
    """A symbolic size/stride: a runtime value the compiled code may assume divisible as stated."""
    return import_cute().sym_int(width, divisibility=divisibility, symbol=symbol)


def fake_tensor(dtype: Any, shape: tuple[Any, ...], stride: tuple[Any, ...] | None = None,
                align: int = 16) -> Any:
    """A tensor without storage for ``cute.compile``: ``dtype`` a cutlass type, sizes ints or :func:`sym`.

    ``stride=None`` means row-major compact. ``align``: the byte alignment the code may assume
    of the base address (the kernel must check it at call time).
    """
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

    if stride is None:
        order = tuple(reversed(range(len(shape))))
        return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)
    return make_fake_tensor(dtype, shape, stride, assumed_align=align)


def fake_stream(tvm_ffi: bool = True) -> Any:
    """A stream placeholder; with TVM-FFI the compiled function takes torch's current stream itself."""
    from cutlass.runtime import make_fake_stream

    return make_fake_stream(use_tvm_ffi_env_stream=tvm_ffi)


def compile_options(arch: str, tvm_ffi: bool, dump_dir: str | None = None) -> str:
    """The ``cute.compile`` option string dsv4kit uses: explicit arch, TVM-FFI, kept PTX and cubin."""
    opts = [f"--gpu-arch {check_arch(arch, 'cute.compile')}"]
    if tvm_ffi:
        opts.append("--enable-tvm-ffi")
    if dump_dir is not None:
        # PTX/cubin are written there and read back into the compiled object's artifacts.
        opts += ["--keep-ptx", "--keep-cubin", f"--dump-dir {dump_dir}"]
    return " ".join(opts)


# --------------------------------------------------------------------------- cute.compile hooks


class _CompileProxy:
    """Stands in for ``cutlass.cute.compile``: calls ``before(func)`` then the real compile."""

    def __init__(self, inner: Any, before: Callable[[Any], None]) -> None:
        self._inner = inner
        self._before = before

    def __call__(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        self._before(func)
        return self._inner(func, *args, **kwargs)

    def __getitem__(self, options: Any) -> _CompileProxy:  # cute.compile[Option](...)
        return _CompileProxy(self._inner[options], self._before)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def _wrapped_compile(before: Callable[[Any], None]) -> Iterator[None]:
    mod = sys.modules.get("cutlass.cute")
    if mod is None:  # nobody can call cute.compile without importing it first
        yield
        return
    original = mod.compile
    mod.compile = _CompileProxy(original, before)
    try:
        yield
    finally:
        mod.compile = original


def _fn_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def _install_cute_hook(monitor: Any) -> Callable[[], None]:
    def before(func: Any) -> None:
        if in_warmup_compile():
            return  # a kernel's own compile(key): reported by _get_or_compile if after warmup
        mon = active_monitor()
        if mon is not None:
            mon.report_compile(_fn_name(func), f"cute.compile({_fn_name(func)})", [], source="cutedsl")

    stack = contextlib.ExitStack()
    stack.enter_context(_wrapped_compile(before))
    return stack.close


register_monitor_hook(_install_cute_hook)


#: Counts ``cute.compile`` calls.
CuteCompileCounter = CompileCounter


@contextlib.contextmanager
def count_cute_compiles() -> Iterator[CuteCompileCounter]:
    """Count every ``cute.compile`` in the block (imports CuTeDSL)."""
    import_cute()
    counter = CuteCompileCounter()
    def before(func: Any) -> None:
        counter.events.append({"fn": _fn_name(func), "warmup": in_warmup_compile()})

    with _wrapped_compile(before):
        yield counter


# --------------------------------------------------------------------------- the kernel base


class CuTeDSLJitKernel(JitKernel[K]):
    """Base of CuTeDSL kernels; see the module docstring."""

    backend: ClassVar[str] = "cutedsl"
    #: The ``@cute.jit`` host function (it launches the ``@cute.kernel``).
    jit_fn: ClassVar[Callable[..., Any]]

    @classmethod
    def _validate_backend(cls) -> None:
        if not callable(cls.__dict__.get("jit_fn", getattr(cls, "jit_fn", None))):
            raise ContractError(f"{cls.__name__}: jit_fn: expected a @cute.jit function")

    def __init__(self, platform: Platform | None = None) -> None:
        self.platform = platform or current_platform()
        self.platform.require_cutedsl(self.name)
        self.target = self.platform.arch
        self.tvm_ffi = self.platform.tvm_ffi

    def check_device(self, arg: str, t: Any) -> None:
        """Spec §2.10 device rule: CuTeDSL kernels take CUDA tensors only."""
        if t.device.type != "cuda":
            raise input_error(self.name, arg, "a cuda tensor (CuTeDSL kernels run only on a GPU)", t.device)

    def warmup_inputs(self, key: K) -> tuple[Any, ...]:
        """Fake tensors / scalars / a fake stream, in ``jit_fn``'s parameter order."""
        raise NotImplementedError(f"{self.name}: warmup_inputs is the kernel's to define")

    def compile_for(self, key: K, arch: str) -> CompileArtifact:
        """Compile ``key`` for ``arch`` (no GPU needed); the compiled function is ``.executable``."""
        cute = import_cute(self.name)
        arch = check_arch(arch, self.name)
        dump = tempfile.mkdtemp(prefix="dsv4kit_cute_")
        try:
            t0 = time.perf_counter()
            fn = type(self).jit_fn
            options = compile_options(arch, self.tvm_ffi, dump)
            compiled = cute.compile(fn, *self.warmup_inputs(key), options=options)
            seconds = time.perf_counter() - t0
            arts = compiled.artifacts
            ptx = arts.PTX if isinstance(arts.PTX, str) and not arts.PTX.endswith(".ptx") else None
            cubin = arts.CUBIN if isinstance(arts.CUBIN, bytes) else None
        finally:
            shutil.rmtree(dump, ignore_errors=True)
        kernels = list(getattr(compiled, "kernel_info", {}) or {})
        info: dict[str, Any] = {"tvm_ffi": self.tvm_ffi, "kernels": kernels}
        if cubin is not None:
            info.update(cubin_resources(cubin, kernels[0] if len(kernels) == 1 else None))
        return CompileArtifact(self.backend, arch, seconds, info=info, text={"ptx": ptx} if ptx else {},
                               binary={"cubin": cubin} if cubin else {}, executable=compiled)

    def compile(self, key: K) -> None:
        """Compile ``key`` for the platform's arch and cache the executor the runtime calls."""
        with compiling():
            art = self.compile_for(key, self.target)
        self._cache_executor(key, self._executor(art.executable), art)

    # ------------------------------------------------------------------ the artifact store
    stores_artifacts: ClassVar[bool] = True

    def entry_payload(self, key: K, art: CompileArtifact) -> tuple[dict[str, bytes], dict[str, Any]]:
        """PTX, cubin and (with TVM-FFI) the compiled function exported as an object file.

        ``export_to_c`` writes host code with the cubin embedded; ``cute.runtime.load_module``
        links it again (JITLink) without compiling anything. Without TVM-FFI nothing can launch
        anyway (see :meth:`_executor`), so only the inspection data is kept.
        """
        files = artifact_files(art.text, art.binary)
        meta: dict[str, Any] = {"tvm_ffi": self.tvm_ffi}
        if self.tvm_ffi:
            name = "dsv4kit_" + hashlib.sha256(key_text(key).encode()).hexdigest()[:16]
            with tempfile.TemporaryDirectory(prefix="dsv4kit_cute_export_") as tmp:
                obj = Path(tmp) / "module.o"
                art.executable.export_to_c(str(obj), function_name=name)
                files["cute/module.o"] = obj.read_bytes()
            meta["function"] = name
        return files, meta

    def load_entry(self, key: K, entry: Entry) -> None:
        """Load the exported object of ``key`` (no ``cute.compile``) and cache its function.

        Loading works without a GPU (measured on the CPU machine: ~10 ms a key, CuTeDSL 4.8.1);
        only a launch needs one. Untested here: launching a loaded function on a GPU.
        """
        meta = entry.meta
        function = None
        if meta.get("function") and self.tvm_ffi:
            from cutlass.cute.runtime import load_module

            import_cute(self.name)
            module = load_module(str(entry.file("cute/module.o")), enable_tvm_ffi=True)
            function = getattr(module, meta["function"])
        art = stored_artifact(entry, self.backend, self.target, function)
        self._cache_executor(key, self._executor(function), art)

    def _executor(self, compiled: Any) -> Callable[..., Any]:
        if not self.tvm_ffi:
            name = self.name

            def unavailable(*args: Any) -> Any:
                raise input_error(name, "backend", "apache-tvm-ffi importable to launch CuTeDSL kernels "
                                  "(compiling works without it)", "tvm_ffi is not importable")

            return unavailable
        return compiled

    @plan_safe
    def launch(self, spec: Any, inputs: dict[str, Any] | None) -> Any:
        """Run the executor warmed for ``spec.key`` (a CUDA device is required; a launch plan is
        made only after a launch passed, on the same platform)."""
        self.platform.require_cuda(self.name)
        return super().launch(spec, inputs)


def artifact_dir(art: CompileArtifact, path: str | Path) -> Path:
    """Write an artifact's PTX and cubin under ``path`` for inspection with CUDA tools."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    for k, v in art.text.items():
        (out / f"kernel.{k}").write_text(v)
    for k, b in art.binary.items():
        (out / f"kernel.{k}").write_bytes(b)
    return out
