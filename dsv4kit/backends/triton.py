"""TritonJitKernel: Triton kernels under the warmup contract.

A subclass names its ``@triton.jit`` function (``kernel_fn``) and declares, for every
parameter of it, where the value comes from (``params``):

==================  =====================================================================
``Ptr(dtype)``      a tensor argument; ``dtype`` a torch dtype or the name of a key field.
                    Triton specializes on 16-byte alignment of the address, so the kernel
                    either requires aligned tensors (``aligned=True``, checked at call) or
                    lists the parameter in ``do_not_specialize_on_alignment``.
``Runtime()``       a scalar that varies per call and is *not* specialized: an int must be
                    in ``do_not_specialize`` and annotated (``n: tl.int32``), because Triton
                    otherwise picks i32/i64 from the value.
``IntClass(f)``     a runtime int Triton specializes on; key field ``f`` holds its class
                    (:func:`int_class`: ``"one"``, ``"div16"``, ``"other"``, ``"i64_div16"``,
                    ``"i64_other"``) and warmup uses a representative value of that class.
``FromKey(f)``      a constexpr, or a specialized int, whose value is key field ``f`` (or
                    ``f(key)`` when ``f`` is callable).
``Const(v)``        a constexpr (or int) with a fixed value.
==================  =====================================================================

The declaration is checked when the class is created: an argument Triton specializes on
that the CompileKey does not determine is a :class:`~dsv4kit.errors.ContractError`.
``__call__`` returns ``(key, args)`` with ``args`` the ``Ptr``/``Runtime``/``IntClass``
values in the function's parameter order; the backend adds the key-derived ones.

Where it runs (from :mod:`dsv4kit.platform`):

* **GPU**: ``compile(key)`` calls ``kernel_fn.warmup`` with fake pointers and representative
  scalars, which fills the very cache ``kernel_fn[grid](...)`` reads, so the first real call
  of a warmed key compiles nothing (``count_triton_compiles`` proves it on a GPU). A launch
  skips ``JITFunction.run`` (binding, specialization, cache key: most of a first-sight call's
  host time): it checks what Triton specializes on (:meth:`~TritonJitKernel.specialization_check`:
  pointer dtypes and 16-byte alignment, int classes), computes the grid and calls the warmed
  binary's C launcher; any other call goes through ``kernel_fn[grid](...)``, which compiles and
  is seen by the monitor. The check is held against Triton's binder on every interpreted launch.
* **CPU**: ``compile(key)`` compiles ahead of time for the platform's target through
  ``triton.compile(..., target=GPUTarget("cuda", 90 | 100, 32))`` (PTX, cubin, registers),
  and launches run the same Python function under the Triton interpreter. Each launch also
  computes the specialization Triton *would* compile for the real arguments and reports a
  mismatch to the monitor, so a specialization miss is caught on CPU as it would be on GPU.

Every launch and compile uses ``enable_fp_fusion=False`` (spec §2.1 rule 1).

**Artifact store** (:mod:`dsv4kit.jit.store`): an entry keeps the files of Triton's own cache
group (metadata json, cubin, PTX, IRs). It is keyed by the compile's :class:`TritonCompileId`:
Triton's own cache key without ``triton_key()`` (which hashes Triton's compiled extension, different
for one Triton release built for Python 3.11 and for 3.12). On a hit the files are put back into
Triton's cache under the hash the *running* Triton computes for this compile, and the normal
compile path finds them (Triton's ``knobs.compilation.listener`` sees ``cache_hit=True``; a load
that Triton compiles instead is an error, and the entry is rebuilt).
This is preferred to building a ``CompiledKernel`` from the files:
on the GPU, ``kernel_fn[grid](...)`` looks kernels up through ``JITFunction.run`` and its
per-device cache, which only Triton's own compile path fills; a ``CompiledKernel`` made aside
would never be found by a launch. The GPU half of this (restore, then ``kernel_fn.warmup`` hits)
is written against triton 3.6's ``JITFunction.run`` but was not run on a GPU in this change.

The parts live beside this module: the launch vocabulary in :mod:`~dsv4kit.backends.triton_params`,
the interpreter in :mod:`~dsv4kit.backends.triton_interpreter`, the compile hooks in
:mod:`~dsv4kit.backends.triton_hooks`, the store payloads in :mod:`~dsv4kit.backends.triton_store`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
import triton
from triton import knobs
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import cache as triton_cache
from triton.runtime.cache import get_cache_manager
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from dsv4kit.backends._common import compiling, cubin_resources
from dsv4kit.backends.triton_hooks import _LAUNCH, TritonCompileCounter, _report, count_triton_compiles
from dsv4kit.backends.triton_interpreter import _INTERP_LOCK, _interpreted, _interpreting, _rewrite_ahead
from dsv4kit.backends.triton_params import (
    HW_CVT,
    INT_CLASS_VALUES,
    Const,
    FakePointer,
    FromKey,
    IntClass,
    Param,
    Ptr,
    Runtime,
    TritonVariant,
    _backend,
    _binder,
    _describe,
    _run_kwargs,
    int_class,
)
from dsv4kit.backends.triton_store import (
    _COMPILE_IDS,
    _RESOURCE_FIELDS,
    TritonCompileId,
    _cache_hits,
    _served_from_cache,
    restore_triton_group,
    settle_cache_key,
    triton_compile_id,
)
from dsv4kit.errors import ContractError, input_error
from dsv4kit.jit import CompileArtifact, JitKernel
from dsv4kit.jit.launch_plans import Address
from dsv4kit.jit.store import Entry, toolchain
from dsv4kit.platform import Platform, arch_capability, current_platform

__all__ = [
    "Const",
    "FakePointer",
    "FromKey",
    "INT_CLASS_VALUES",
    "IntClass",
    "Ptr",
    "Runtime",
    "TritonCompileCounter",
    "TritonCompileId",
    "TritonJitKernel",
    "TritonVariant",
    "count_triton_compiles",
    "int_class",
    "restore_triton_group",
    "settle_cache_key",
    "triton_compile_id",
]

K = TypeVar("K")

# Launch options every Triton launch of dsv4kit passes (spec §2.1 rule 1: no FMA contraction).
FP_FUSION = False


# --------------------------------------------------------------------------- the kernel base


@dataclass
class TritonCompiled:
    """What one compiled key keeps: the artifact, and the warmed specialization."""

    variant: TritonVariant
    kernel: Any = None  # triton CompiledKernel (None for a pure AOT compile's runtime path)


def _c_launch(run: Any) -> tuple[Callable[..., Any], bool, bool] | None:
    """The C ``launch`` under a ``CudaLauncher`` and its cooperative-grid and PDL flags, where
    calling it directly does what ``CudaLauncher.__call__`` would: no scratch buffer to allocate
    per launch. None otherwise (another launcher class, or scratch needed). Its arguments (triton
    3.6): ``grid x, y, z, stream, function, cooperative, pdl, global scratch, profile scratch,
    packed metadata, launch metadata, enter hook, exit hook, *kernel args``."""
    names = ("launch", "global_scratch_size", "profile_scratch_size", "launch_cooperative_grid", "launch_pdl")
    if not all(hasattr(run, n) for n in names) or run.global_scratch_size or run.profile_scratch_size:
        return None
    return run.launch, bool(run.launch_cooperative_grid), bool(run.launch_pdl)


@dataclass(frozen=True)
class _WarmLaunch:
    """What a direct launch of one warmed key reads, set up once per launcher: the
    ``CompiledKernel``, its C launch (None: go through ``CompiledKernel.run``) with the
    cooperative-grid and PDL flags, each call argument's slot among the kernel's parameters, and the
    device it was warmed on with the driver's current-device and current-stream getters."""

    ck: Any
    c_launch: Callable[..., Any] | None
    coop: bool
    pdl: bool
    slots: tuple[int, ...]
    device: int
    get_device: Callable[[], int]
    get_stream: Callable[[int], int]


def _no_hook(hook: Any) -> bool:
    """Whether a launch hook of ``knobs.runtime`` would do nothing: None, or an empty ``HookChain``."""
    return hook is None or (type(hook) is knobs.HookChain and not hook.calls)


class TritonJitKernel(JitKernel[K]):
    """Base of Triton kernels; see the module docstring."""

    backend: ClassVar[str] = "triton"
    #: The ``@triton.jit`` function.
    kernel_fn: ClassVar[JITFunction]
    #: Where each parameter of ``kernel_fn`` comes from.
    params: ClassVar[Mapping[str, Param]]

    _variants: ClassVar[dict[str, dict[Any, TritonVariant]]]   # target -> key -> specialization

    def __init_subclass__(cls, **kwargs: Any) -> None:
        cls._variants = {}
        super().__init_subclass__(**kwargs)

    def __init__(self, platform: Platform | None = None) -> None:
        self.platform = platform or current_platform()
        self.target = self.platform.arch

    @classmethod
    def clear_cache(cls) -> None:
        """Forget compiled executors, artifacts and warmed specializations of this class."""
        super().clear_cache()
        cls._variants.clear()

    def check_device(self, arg: str, t: Any) -> None:
        """Spec §2.10 device rule: CUDA tensors on a GPU platform, CPU tensors for the interpreter."""
        want = "cuda" if self.platform.is_cuda else "cpu"
        if t.device.type != want:
            where = "Triton on the GPU" if want == "cuda" else "the Triton interpreter (no CUDA here)"
            raise input_error(self.name, arg, f"a {want} tensor ({where})", t.device)

    # ------------------------------------------------------------------ what a subclass gives
    def launch_options(self, key: K) -> dict[str, Any]:
        """Triton launch options of ``key`` (``num_warps``, ``num_stages``); fp fusion is always off."""
        return {"num_warps": 4}

    def grid(self, key: K, args: Mapping[str, Any]) -> tuple[int, ...]:
        """The launch grid of ``key`` for the call's arguments (by parameter name)."""
        raise NotImplementedError(f"{self.name}: grid(key, args) is the kernel's to define")

    def interpreter_constexprs(self, key: K) -> dict[str, Any]:
        """Constexpr overrides for runs under the CPU interpreter only (default: none).

        The interpreter spends ~10-20 ms of Python per program instance, so a kernel whose
        GPU launch uses tiny programs may let each interpreted program cover more rows, and a
        kernel may swap an instruction the interpreter cannot model (a rounding fp8 cast) for
        an integer recipe that gives the same bits. Results must stay bit-identical to the GPU
        compile's; ``grid`` must agree. Compiles and the specialization check still use the
        key's values.
        """
        return {}

    def interpreted_constexprs(self, key: K) -> dict[str, Any]:
        """What an interpreted run overrides: ``HW_CVT`` false where the kernel has it (the
        interpreter truncates fp32 -> bf16 and can drop an fp32 -> fp8 carry, so such a kernel
        rounds with the integer recipes of :mod:`dsv4kit.kernels.triton_numerics`, which give
        the GPU casts' bits), then :meth:`interpreter_constexprs`."""
        hw = {HW_CVT: False} if HW_CVT in self.params else {}
        return {**hw, **self.interpreter_constexprs(key)}

    # ------------------------------------------------------------------ the contract check
    @classmethod
    def _validate_backend(cls) -> None:
        fn = getattr(cls, "kernel_fn", None)
        where = cls.__name__
        if isinstance(fn, InterpretedFunction):
            raise ContractError(f"{where}: kernel_fn is an InterpretedFunction (decorated while Triton's "
                                "interpret knob was on); dsv4kit runs the interpreter itself on CPU and "
                                "needs a JITFunction to compile ahead of time: leave the knob off")
        if not isinstance(fn, JITFunction):
            raise ContractError(f"{where}: kernel_fn: expected a @triton.jit function, got {fn!r}")
        params = getattr(cls, "params", None)
        if not isinstance(params, Mapping):
            raise ContractError(f"{where}: params: expected a mapping name -> Ptr/Runtime/..., got {params}")
        fields = {f.name for f in dataclasses.fields(cls.CompileKey)}
        names = [p.name for p in fn.params]
        extra = sorted(set(params) - set(names))
        if extra:
            raise ContractError(f"{where}: params {extra} are not parameters of {fn.fn.__name__}{names}")
        for p in fn.params:
            decl = params.get(p.name)
            what = f"{where}: parameter {p.name!r} of {fn.fn.__name__}"
            if decl is None:
                raise ContractError(f"{what}: not declared in params (Triton may specialize on it)")
            if p.name == HW_CVT and decl != Const(True):
                raise ContractError(f"{what}: expected Const(True) (GPU compiles round with the hardware "
                                    f"casts; interpreted runs get False), got {decl}")
            if not isinstance(decl, Param):
                raise ContractError(f"{what}: expected Ptr, Runtime, IntClass, FromKey or Const; got {decl}")
            for f in (getattr(decl, "field", None), getattr(decl, "dtype", None)):
                if isinstance(f, str) and f not in fields:
                    raise ContractError(f"{what}: refers to {f!r}, which is not a field of "
                                        f"{cls.CompileKey.__qualname__} {sorted(fields)}")
            if p.is_constexpr and not isinstance(decl, FromKey | Const):
                raise ContractError(f"{what}: a constexpr must come from the key (FromKey) or be Const; "
                                    "a per-call constexpr compiles once per value")
            if isinstance(decl, Ptr) and not decl.aligned and not p.do_not_specialize_on_alignment:
                raise ContractError(f"{what}: Triton specializes on its 16-byte alignment; require aligned "
                                    "tensors (aligned=True) or add it to do_not_specialize_on_alignment")
            if isinstance(decl, Runtime):
                ann = p.annotation_type
                if ann.startswith("*"):
                    raise ContractError(f"{what}: a pointer is declared Ptr(dtype), not Runtime()")
                if ann in ("fp16", "bf16", "fp32", "fp64", "u1"):
                    continue  # Triton never specializes floats and bools
                if not p.do_not_specialize:
                    raise ContractError(f"{what}: Triton specializes on its value (an int on ==1, %16 and "
                                        "i32/i64; a pointer on 16-byte alignment) and the CompileKey does "
                                        "not cover it: add it to do_not_specialize, or declare it "
                                        "IntClass/FromKey (a pointer: Ptr)")
                if not ann:
                    raise ContractError(f"{what}: annotate it (e.g. `{p.name}: tl.int32`): without an "
                                        "annotation Triton picks i32 or i64 from the value")

    # ------------------------------------------------------------------ arguments
    def _value(self, decl: Param, key: K, call_value: Any = None) -> Any:
        if isinstance(decl, Const):
            return decl.value
        if isinstance(decl, FromKey):
            return decl.field(key) if callable(decl.field) else getattr(key, decl.field)
        return call_value

    def _call_params(self) -> list[str]:
        return [p.name for p in self.kernel_fn.params
                if isinstance(self.params[p.name], Ptr | Runtime | IntClass)]

    def _full_args(self, key: K, call_args: tuple[Any, ...]) -> list[Any]:
        names = self._call_params()
        if len(call_args) != len(names):
            raise TypeError(f"{self.name}: launch args: expected {len(names)} values ({', '.join(names)}), "
                            f"got {len(call_args)}")
        given = dict(zip(names, call_args, strict=True))
        return [self._value(self.params[p.name], key, given.get(p.name)) for p in self.kernel_fn.params]

    def _options(self, key: K) -> dict[str, Any]:
        opts = dict(self.launch_options(key))
        opts["enable_fp_fusion"] = FP_FUSION
        return opts

    def warmup_inputs(self, key: K) -> tuple[Any, ...]:
        """Fake pointers, representative ints and key-derived values for every parameter."""
        out = []
        for p in self.kernel_fn.params:
            decl = self.params[p.name]
            if isinstance(decl, Ptr):
                dt = getattr(key, decl.dtype) if isinstance(decl.dtype, str) else decl.dtype
                out.append(FakePointer(getattr(torch, dt) if isinstance(dt, str) else dt, decl.aligned))
            elif isinstance(decl, IntClass):
                cls_name = getattr(key, decl.field)
                if cls_name not in INT_CLASS_VALUES:
                    raise input_error(self.name, decl.field, f"one of {list(INT_CLASS_VALUES)}",
                                      repr(cls_name))
                out.append(INT_CLASS_VALUES[cls_name])
            elif isinstance(decl, Runtime):
                # Not specialized: any value of the annotated type compiles the same code.
                out.append(0.0 if p.annotation_type.startswith(("fp", "bf")) else 0)
            else:
                out.append(self._value(decl, key))
        return tuple(out)

    def variant(self, key: K, args: list[Any] | tuple[Any, ...],
                capability: int | None = None) -> TritonVariant:
        """The specialization Triton compiles for ``args`` (all parameters, in order)."""
        cap = capability or self.platform.capability
        _, spec, opts = _binder(self.kernel_fn, cap)(*args, **_run_kwargs(self.kernel_fn, self._options(key)))
        return TritonVariant(key, _describe(self.kernel_fn, spec, opts))

    def warmed_variants(self) -> list[TritonVariant]:
        """The specializations compiled so far for this target (one per warmed key)."""
        return list(type(self)._variants.get(self.target, {}).values())

    # ------------------------------------------------------------------ compiling
    def compile_for(self, key: K, arch: str) -> CompileArtifact:
        """Compile ``key`` ahead of time for ``arch`` (no GPU needed); the runtime cache is untouched.

        Holds the interpreter lock: the interpreter patches ``triton.language`` process-wide while
        a kernel runs, and a compile in another thread meanwhile would see the patched module.
        """
        with _INTERP_LOCK:
            return self._compile_for(key, arch)

    def _compile_for(self, key: K, arch: str, resources: Mapping[str, Any] | None = None) -> CompileArtifact:
        cap = arch_capability(arch)
        t0 = time.perf_counter()
        fn = self.kernel_fn
        settle_cache_key(fn)
        kwargs = _run_kwargs(fn, self._options(key))
        bound, spec, opts = _binder(fn, cap)(*self.warmup_inputs(key), **kwargs)
        # The same packing JITFunction.run does before it compiles (signature, constexprs, attrs).
        options, signature, constexprs, attrs = fn._pack_args(_backend(cap), kwargs, bound, spec, opts)
        ck = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", cap, 32),
                            options=options.__dict__)
        variant = TritonVariant(key, _describe(fn, spec, opts))
        return self._artifact(ck, arch, time.perf_counter() - t0, variant, resources)

    def _artifact(self, ck: Any, arch: str, seconds: float, variant: TritonVariant,
                  resources: Mapping[str, Any] | None = None) -> CompileArtifact:
        # ``resources``: the cuobjdump report of a stored entry (reading the cubin again costs a
        # subprocess per key).
        md = ck.metadata
        res = dict(resources) if resources is not None else cubin_resources(ck.asm["cubin"], md.name)
        info = {"shared": md.shared, "num_warps": md.num_warps, "enable_fp_fusion": md.enable_fp_fusion,
                **res, "specialization": variant.specialization}
        return CompileArtifact(self.backend, arch, seconds, info=info,
                               text={k: ck.asm[k] for k in ("ttgir", "llir", "ptx") if k in ck.asm},
                               binary={"cubin": ck.asm["cubin"]}, executable=ck)

    def compile(self, key: K) -> None:
        """Compile ``key`` for this platform and cache the executor the runtime will use."""
        self._compile(key)

    def _compile(self, key: K, resources: Mapping[str, Any] | None = None) -> None:
        t0 = time.perf_counter()
        with compiling(), _INTERP_LOCK:  # see compile_for: no compile while the interpreter runs
            if self.platform.is_cuda and torch.cuda.is_available():
                args = self.warmup_inputs(key)
                settle_cache_key(self.kernel_fn)
                ck = self.kernel_fn.warmup(*args, grid=(1,), **self._options(key))
                if ck is None:
                    raise RuntimeError(f"{self.name}: Triton skipped the compile of {key} (a jit_cache_hook "
                                       "returned True)")
                variant = self.variant(key, args)
                art = self._artifact(ck, self.target, time.perf_counter() - t0, variant, resources)
                executor = self._gpu_executor(key, variant)
            else:
                # On CPU, and for a compile-only GPU platform (no device): ahead of time.
                art = self._compile_for(key, self.target, resources)
                variant = TritonVariant(key, art.info["specialization"])
                executor = (self._interpreter_executor(key, variant) if not self.platform.is_cuda
                            else self._no_device_executor())
        type(self)._variants.setdefault(self.target, {})[key] = variant
        self._cache_executor(key, executor, art)

    def _no_device_executor(self) -> Callable[..., Any]:
        def run(*call_args: Any) -> None:
            self.platform.require_cuda(self.name)

        return run

    # ------------------------------------------------------------------ the artifact store
    stores_artifacts: ClassVar[bool] = True

    def compile_id(self, key: K) -> TritonCompileId:
        """The :class:`TritonCompileId` of ``key`` for this kernel's target (cached per process and
        environment: the store asks at every lookup, Triton's hashing is not free)."""
        env = get_cache_invalidating_env_vars()
        memo = (type(self), self.target, key, str(sorted(env.items())))
        got = _COMPILE_IDS.get(memo)
        if got is None:
            fn = self.kernel_fn
            with _INTERP_LOCK:  # see compile_for: the interpreter patches triton.language meanwhile
                got = triton_compile_id(fn, self.warmup_inputs(key), _run_kwargs(fn, self._options(key)),
                                        arch_capability(self.target), env)
            _COMPILE_IDS[memo] = got
        return got

    def prepare_store(self) -> None:
        """Once per process, before a warmup from a store: what Triton's first cache lookup would
        compute anyway (``triton_key()``, its hash of its own installation: about 0.4 s on the CPU
        machine) and the store's toolchain for this target, so that load times are loads."""
        triton_cache.triton_key()
        toolchain(self.backend, self.target)

    def store_compile_id(self, key: K) -> str:
        """What the artifact store keys this key's entry by, beside kernel, key, arch, source and
        toolchain: :attr:`TritonCompileId.portable`."""
        return self.compile_id(key).portable

    def entry_payload(self, key: K, art: CompileArtifact) -> tuple[dict[str, bytes], dict[str, Any]]:
        """The files of Triton's own cache group for ``art`` (metadata json, cubin, PTX, IRs) and
        its compile id: restored into Triton's cache, they make the compile a cache hit. Also marks
        ``art.info["triton_cache"]``: whether this compile was served by Triton's own cache."""
        ck, ident = art.executable, self.compile_id(key)
        if ck.hash != ident.running_hash():  # the store key would not describe this artifact
            raise RuntimeError(f"Triton compiled {key} under hash {ck.hash}, its compile id predicts "
                               f"{ident.running_hash()}: not stored")
        group = get_cache_manager(ck.hash).get_group(ident.group)
        if not group or ident.group not in group:
            raise RuntimeError(f"Triton's cache has no group {ident.group} for hash {ck.hash} "
                               "(is its cache off?)")
        art.info["triton_cache"] = _served_from_cache(group[ident.group], art.seconds)
        files = {f"triton/{child}": Path(path).read_bytes() for child, path in group.items()}
        return files, {"triton_hash": ck.hash, "group": ident.group, "compile_id": ident.portable}

    def load_entry(self, key: K, entry: Entry) -> None:
        """Put the entry's files into Triton's cache under the hash this process's Triton computes
        for the compile, then compile: Triton finds them there (a cache hit: nothing is compiled)
        and this process gets its normal executor. Raises when Triton compiled instead."""
        meta, ident = entry.meta, self.compile_id(key)
        if meta.get("group") != ident.group:
            raise RuntimeError(f"the entry holds group {meta.get('group')}, this compile is {ident.group}")
        running = ident.running_hash()
        restore_triton_group(entry, running, ident.group)
        info = meta.get("info", {})
        with _cache_hits() as hits:
            self._compile(key, {k: info[k] for k in _RESOURCE_FIELDS if k in info})
        art = self.artifact(key)
        if art is None or art.executable.hash != running or not all(hits):
            got = None if art is None else art.executable.hash
            raise RuntimeError(f"Triton computed hash {got} for the entry restored under {running}, "
                               f"cache hits {hits} (it compiled instead of loading)")
        art.seconds = float(meta.get("seconds", art.seconds))

    # ------------------------------------------------------------------ launching
    def _named(self, call_args: tuple[Any, ...]) -> dict[str, Any]:
        return dict(zip(self._call_params(), call_args, strict=True))

    def _gpu_executor(self, key: K, variant: TritonVariant) -> Callable[..., Any]:
        """``run(*call_args)``: the warmed binary launched directly (:meth:`_key_launch`) when the
        call's specialization is the warmed one, else ``kernel_fn[grid](...)`` (which compiles a
        new specialization, and the monitor sees it)."""
        fn, options = self.kernel_fn, self._options(key)

        def slow(*call_args: Any) -> None:
            args = self._full_args(key, call_args)
            grid = self.grid(key, self._named(call_args))
            token = _LAUNCH.set((self, key))
            try:
                fn[grid](*args, **options)
            finally:
                _LAUNCH.reset(token)

        direct: list[Callable[..., bool] | None] = []

        def run(*call_args: Any) -> None:
            if not direct:  # the first launch loads the binary (as JITFunction.run's first call does)
                direct.append(self._key_launch(key))
            launch = direct[0]
            if launch is None or not launch(call_args):
                slow(*call_args)

        run.direct = functools.partial(self._direct_launcher, key, slow)  # type: ignore[attr-defined]
        return run

    def specialization_check(self, key: K) -> Callable[[tuple[Any, ...]], bool]:
        """``ok(call_args)``: whether Triton would specialize a call of ``key`` as the warmed compile
        was (true implies ``variant(key, full_args) == warmed``; tested against Triton's binder on
        every interpreted launch). What Triton specializes on, per declared kind: a ``Ptr`` on its
        dtype and, where ``aligned``, its address's 16-byte alignment; an ``IntClass`` int on its
        class; nothing else varies per call (``Runtime`` is not specialized, the rest is the key's).
        """
        warm = self.warmup_inputs(key)
        names = self._call_params()
        params = list(self.kernel_fn.params)
        at = {p.name: i for i, p in enumerate(params)}
        ptrs = tuple((i, warm[at[n]].dtype, self.params[n].aligned) for i, n in enumerate(names)
                     if isinstance(self.params[n], Ptr))
        ints = tuple((i, getattr(key, self.params[n].field)) for i, n in enumerate(names)
                     if isinstance(self.params[n], IntClass))

        def ok(call_args: tuple[Any, ...]) -> bool:
            try:
                for i, dtype, aligned in ptrs:
                    a = call_args[i]
                    if a.dtype is not dtype or (aligned and a.data_ptr() & 15):
                        return False
                for i, cls in ints:
                    v = call_args[i]
                    if type(v) is not int or int_class(v) != cls:
                        return False
            except Exception:  # not a tensor, an address or an int: Triton's own path says what
                return False
            return True

        return ok

    def _warm_launch(self, key: K) -> _WarmLaunch | None:
        """The launch pieces of the warmed ``CompiledKernel`` of ``key`` (None: no binary kept)."""
        art = self.artifact(key)
        ck = None if art is None else art.executable
        if ck is None:
            return None
        ck._init_handles()
        c_launch, coop, pdl = _c_launch(ck.run) or (None, False, False)
        at = {p.name: i for i, p in enumerate(self.kernel_fn.params)}
        drv = triton.runtime.driver.active
        return _WarmLaunch(ck, c_launch, coop, pdl, tuple(at[n] for n in self._call_params()),
                           drv.get_current_device(), drv.get_current_device, drv.get_current_stream)

    def _key_launch(self, key: K) -> Callable[[tuple[Any, ...]], bool] | None:
        """``launch(call_args)`` of the warmed ``CompiledKernel`` of ``key``, returning False (having
        launched nothing) where the call needs ``JITFunction.run``: another specialization, another
        current device than the warmed one, launch hooks registered. None: no direct launch here
        (another launcher class, or per-launch scratch). The grid is computed per call; the rest of
        ``JITFunction.run`` (binding, specialization, cache key and lookup) is what it skips."""
        warm = self._warm_launch(key)
        if warm is None or warm.c_launch is None:
            return None
        spec_ok = self.specialization_check(key)
        names = self._call_params()
        template = self._full_args(key, tuple(None for _ in names))
        grid_of, runtime = self.grid, knobs.runtime
        c_launch, coop, pdl, slots = warm.c_launch, warm.coop, warm.pdl, warm.slots
        function, packed = warm.ck.function, warm.ck.packed_metadata
        get_device, get_stream, device = warm.get_device, warm.get_stream, warm.device

        def launch(call_args: tuple[Any, ...]) -> bool:
            if (not spec_ok(call_args) or get_device() != device or not _no_hook(runtime.launch_enter_hook)
                    or not _no_hook(runtime.launch_exit_hook)):
                return False
            values = template.copy()
            for slot, a in zip(slots, call_args, strict=True):
                values[slot] = a
            g0, g1, g2 = (*grid_of(key, dict(zip(names, call_args, strict=True))), 1, 1)[:3]
            stream = get_stream(device)
            c_launch(g0, g1, g2, stream, function, coop, pdl, None, None, packed, None, None, None, *values)
            return True

        return launch

    def plan_launcher(self, key: K, executor: Callable[..., Any], args: tuple[Any, ...]
                      ) -> tuple[Callable[[list[Any]], Any], frozenset[int]]:
        """On a GPU, a launch plan calls the compiled kernel's launcher itself (what
        ``JITFunction.run`` ends with, without its binding, specialization and cache lookup)."""
        direct = getattr(executor, "direct", None)
        if direct is None:
            return super().plan_launcher(key, executor, args)
        return direct(args)

    def _direct_launcher(self, key: K, executor: Callable[..., Any], call_args: tuple[Any, ...]
                         ) -> tuple[Callable[[list[Any]], Any], frozenset[int]]:
        """A launch of the warmed ``CompiledKernel`` of ``key`` with this call's grid and constants.

        Every argument but the addresses is a function of the plan's signature, so the grid, the
        constexprs and the specialization are this call's; the specialization is checked once
        here against the warmed one (a different one would have been a compile). Addresses come
        as ints (Triton's launcher takes an int or a ``data_ptr()``). Launched on the current
        device's current stream, as ``JITFunction.run`` does; on another current device than the
        plan's, the call goes through the executor (``JITFunction.run``) instead.
        """
        full = self._full_args(key, call_args)
        warmed = type(self)._variants.get(self.target, {}).get(key)
        warm = self._warm_launch(key) if warmed is not None and self.variant(key, full) == warmed else None
        if warm is None:
            return super().plan_launcher(key, executor, call_args)
        names = self._call_params()
        dtypes = {i: a.dtype for i, a in enumerate(call_args) if isinstance(self.params[names[i]], Ptr)}
        grid = tuple(self.grid(key, self._named(call_args)))
        g0, g1, g2 = (*grid, 1, 1)[:3]
        ck, c_launch, coop, pdl, slots = warm.ck, warm.c_launch, warm.coop, warm.pdl, warm.slots
        run, function, packed, runtime = ck.run, ck.function, ck.packed_metadata, knobs.runtime
        get_device, get_stream, device = warm.get_device, warm.get_stream, warm.device
        template = list(full)

        def launch(args: list[Any]) -> None:
            if get_device() != device:
                executor(*[Address(a, dtypes[i]) if i in dtypes else a for i, a in enumerate(args)])
                return
            values = template.copy()
            for slot, a in zip(slots, args, strict=True):
                values[slot] = a
            stream = get_stream(device)
            enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
            if c_launch is not None and _no_hook(enter) and _no_hook(leave):
                # What CudaLauncher.__call__ does with nothing to allocate and no hook registered,
                # without its frame, the launch-metadata dict and two empty hook-chain calls.
                c_launch(g0, g1, g2, stream, function, coop, pdl, None, None, packed, None, None, None,
                         *values)
                return
            meta = ck.launch_metadata(grid, stream, *values)
            run(g0, g1, g2, stream, function, packed, meta, enter, leave, *values)

        return launch, frozenset(dtypes)

    def _interpreter_executor(self, key: K, variant: TritonVariant) -> Callable[..., Any]:
        fn, options = self.kernel_fn, self._options(key)
        _rewrite_ahead(fn)  # during warmup: an interpreted run generates no code
        spec_ok = self.specialization_check(key)

        def run(*call_args: Any) -> None:
            args = self._full_args(key, call_args)
            # What a GPU would compile for these arguments; a different specialization than the
            # warmed one would be a compile after warmup there, so report it here too.
            seen = self.variant(key, args)
            if seen != variant:
                _report(self, fn.fn.__name__, seen, "triton")
            if spec_ok(call_args) and seen != variant:  # the GPU's direct launch would run a wrong binary
                raise ContractError(f"{self.name}: specialization_check passed a call Triton specializes "
                                    f"as {seen.specialization}, not the warmed {variant.specialization}")
            overrides = self.interpreted_constexprs(key)
            run_args = [overrides.get(p.name, a) for p, a in zip(fn.params, args, strict=True)]
            grid = self.grid(key, self._named(call_args))
            with _interpreting():
                _interpreted(fn)[grid](*run_args, **options)

        return run
