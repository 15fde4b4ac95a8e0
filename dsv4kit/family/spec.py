"""FamilySpec: the one object per kernel family that the rest of the kit reads.

A family is one folder, ``dsv4kit/kernels/<name>/``, with the same files as every other:

==================  =========================================================================
``reference.py``    the PyTorch oracle, the op's argument table (:class:`~.schema.Arg` rows)
                    and the input checks the reference and every backend share
``spec.py``         the contract class (CompileKey, ``dispatch``, warmup keys, ``__call__``)
                    and ``SPEC``, the family's :class:`FamilySpec`
``triton.py``       the Triton kernel class(es)
``cutedsl.py``      the CuTeDSL kernel class(es)
``cases.py``        seeded test cases (tests, notebooks and GPU scripts use the same ones)
``bench.py``        ``PLANS``, the folder's sweeps of ``dsv4kit bench`` (:class:`dsv4kit.bench.SweepPlan`:
                    sizes, bytes model, arguments from ``cases``), and its ``*_bytes`` models
``__init__.py``     the public names: the op, the reference, the spec
==================  =========================================================================

From ``SPEC`` come, with no per-family code anywhere else: the public op (:meth:`FamilySpec.op`,
its signature from the argument table, validated before any backend is chosen), the kernel
object for a device and backend (one selection predicate, one cache), registration for warmup,
and the compile key of a call (:meth:`FamilySpec.dispatch`, op arguments bound to ``dispatch`` by
name). The family knows nothing of a model: where it runs in a DSv4 layer is the model's
business (:mod:`dsv4kit.model.hooks`, keyed by family name).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from dsv4kit.errors import ContractError, KernelInputError, input_error
from dsv4kit.family.plans import MAX_PLANS, CallPlans, OpLaunch, call_signature, op_launch_for, plan_for
from dsv4kit.family.schema import Arg, arg_table_markdown, check_args
from dsv4kit.jit import JitKernel, registry
from dsv4kit.jit.launch_plans import (
    _STATE,
    FIRST,
    PLAN,
    PlanTable,
    by_identity,
    launch_signature,
    size_sight,
)
from dsv4kit.jit.monitor import runtime_entry
from dsv4kit.platform import BACKENDS, Platform, current_platform

__all__ = ["DEFAULT_VARIANT", "FamilySpec", "KernelRef", "Variant", "backend_modules"]

# An op call's launch signature holds the platform it names by identity (the model passes its
# own): such a call is planned too, and the op launch keeps the platform alive.
by_identity(Platform)

#: The variant name of a family with one kernel per backend.
DEFAULT_VARIANT = "default"
#: Keyword-only arguments every op takes besides its table.
OP_OPTIONS = ("backend", "debug_checks", "platform")


#: A kernel class, or a function returning it: a family's spec refers to its CuTeDSL classes
#: through one (``lambda: _cutedsl().RowQuantCuTeDSL``) so that ``import dsv4kit.ops`` does not
#: import CUTLASS (0.5 s) before a kernel is asked for.
KernelRef = type[JitKernel] | Callable[[], type[JitKernel]]


def backend_modules(package: str) -> tuple[Callable[[], ModuleType], Callable[[], ModuleType]]:
    """The Triton and CuTeDSL modules of the family folder ``package``, each imported on its first
    call. A family's ``spec.py`` reaches its classes through them
    (``_triton, _cutedsl = backend_modules(__package__)``, then ``lambda: _cutedsl().RowQuantCuTeDSL``
    in its :class:`Variant`): the backend modules import ``spec.py``, and CUTLASS costs 0.5 s at
    import, so neither is imported before a kernel is asked for."""
    return (functools.partial(importlib.import_module, f"{package}.triton"),
            functools.partial(importlib.import_module, f"{package}.cutedsl"))


@dataclass(frozen=True)
class Variant:
    """One kernel of a family: its reference and its class per backend (:data:`KernelRef`)."""

    reference: Callable[..., Any]
    triton: KernelRef
    cutedsl: KernelRef

    def kernel_class(self, backend: str) -> type[JitKernel]:
        """The class on ``backend`` (its module imported on first use)."""
        ref = getattr(self, backend)
        return ref if isinstance(ref, type) else ref()

    def class_name(self, backend: str) -> str:
        return self.kernel_class(backend).__name__


@dataclass(frozen=True)
class FamilySpec:
    """Everything the kit knows of one kernel family (see the module docstring).

    ``name``: the folder (``dsv4kit.kernels.<name>``). ``spec_id``: its name in the numeric spec
    ("K4"). ``op_name``: the public op (default: ``name``). ``args``: the op's argument table.
    ``contract``: the backend-neutral kernel class (CompileKey, dispatch, warmup keys).
    ``variants``: variant name -> :class:`Variant`; ``variant_arg`` names the op argument that
    chooses one (None: a single variant, ``DEFAULT_VARIANT``, which ``variants`` may also give as
    the :class:`Variant` alone). ``device_arg``: the tensor whose device picks the backend
    (default: the first tensor argument). ``returns``: what the op returns, for its docs.
    ``folder``: the family's folder under ``dsv4kit/kernels`` when it is not ``name`` (a folder
    whose ops share one kernel core holds several specs, e.g. the three C4 compressors).
    """

    name: str
    spec_id: str
    summary: str
    args: tuple[Arg, ...]
    contract: type[JitKernel]
    variants: Mapping[str, Variant] | Variant
    returns: str
    op_name: str = ""
    variant_arg: str | None = None
    device_arg: str | None = None
    config_type: type | None = None
    folder: str | None = None
    _kernels: dict[tuple[type, Platform], JitKernel] = field(default_factory=dict, compare=False, repr=False)
    _keys: dict[tuple[type, Any], list[Any]] = field(default_factory=dict, compare=False, repr=False)
    _plans: CallPlans = field(default_factory=CallPlans, compare=False, repr=False)
    _launches: PlanTable = field(default_factory=PlanTable, compare=False, repr=False)  # OpLaunch | False
    #: The torch op's effects (:mod:`dsv4kit.family.torch_op`). ``mutates``: the arguments the op
    #: writes in place (caches, ``out``). ``outputs(args)``: an op that writes nothing: its new
    #: results (a tensor or a tuple) as empty tensors from the bound arguments (the fake kernel).
    #: ``result(args)``: an op that writes arguments: what it returns (``out`` or a view of it) from
    #: the bound arguments; torch ops cannot return an alias, so its torch op returns nothing.
    #: ``allocates``: written arguments the op allocates when passed None -> that allocation.
    mutates: tuple[str, ...] = ()
    outputs: Callable[[Mapping[str, Any]], Any] | None = field(default=None, compare=False, repr=False)
    result: Callable[[Mapping[str, Any]], Any] | None = field(default=None, compare=False, repr=False)
    allocates: Mapping[str, Callable[[Mapping[str, Any]], torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        where = f"FamilySpec({self.name})"
        if not self.op_name:
            object.__setattr__(self, "op_name", self.name)
        if isinstance(self.variants, Variant):
            object.__setattr__(self, "variants", {DEFAULT_VARIANT: self.variants})
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ContractError(f"{where}: args: duplicate names in {names}")
        clash = sorted(set(names) & set(OP_OPTIONS))
        if clash:
            raise ContractError(f"{where}: args {clash} are options every op has; rename them")
        if self.variant_arg is None:
            if set(self.variants) != {DEFAULT_VARIANT}:
                raise ContractError(f"{where}: several variants need variant_arg (the op argument "
                                    "choosing one)")
        elif self.variant_arg not in names:
            raise ContractError(f"{where}: variant_arg {self.variant_arg!r} is not an argument {names}")
        if self.device_arg is None:
            first = next((a.name for a in self.args if a.kind == "tensor" and not a.optional), None)
            if first is None:
                raise ContractError(f"{where}: no tensor argument to take the device from")
            object.__setattr__(self, "device_arg", first)
        prog = getattr(self.contract, "_dispatch_program", None)
        if prog is None:
            raise ContractError(f"{where}: contract {self.contract.__name__} has no CompileKey/dispatch")

    # ------------------------------------------------------------------ identity
    @property
    def package(self) -> str:
        return f"dsv4kit.kernels.{self.folder or self.name}"

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FamilySpec) and other.name == self.name

    # ------------------------------------------------------------------ kernels
    def kernel_class(self, variant: str = DEFAULT_VARIANT, backend: str = "triton") -> type[JitKernel]:
        """The kernel class of ``variant`` on ``backend`` (imported on first use)."""
        if variant not in self.variants:
            raise input_error(self.op_name, self.variant_arg or "variant",
                              f"one of {', '.join(map(repr, self.variants))}", repr(variant))
        if backend not in BACKENDS:
            raise input_error(self.op_name, "backend", f"one of {', '.join(BACKENDS)}", repr(backend))
        return self.variants[variant].kernel_class(backend)

    def kernel(self, variant: str = DEFAULT_VARIANT, device: torch.device | str | None = None,
               backend: str | None = None, platform: Platform | None = None) -> JitKernel:
        """The kernel object that runs ``variant`` for tensors on ``device`` (default: the
        platform's), chosen by the platform's one backend predicate; one object per class and
        platform, shared by the op, registration and every layer."""
        p = platform or current_platform()
        if not isinstance(p, Platform):
            raise input_error(self.op_name, "platform", "a dsv4kit Platform or None", type(p).__name__)
        which = p.select_backend(device if device is not None else p.device, backend, what=self.op_name)
        cls = self.kernel_class(variant, which)
        k = self._kernels.get((cls, p))
        if k is None:
            k = self._kernels[(cls, p)] = cls(p)  # type: ignore[call-arg]
        return k

    def variant_of(self, kernel: JitKernel) -> str | None:
        """The variant a kernel object implements (None: not this family's)."""
        # Its own backend only: asking a Triton kernel's family must not import CuTeDSL.
        backends = (kernel.backend,) if kernel.backend in BACKENDS else BACKENDS
        return next((v for v, var in self.variants.items()
                     if any(type(kernel) is var.kernel_class(b) for b in backends)), None)

    def owns(self, kernel: JitKernel) -> bool:
        """Whether ``kernel`` (any variant, any backend) belongs to this family."""
        return isinstance(kernel, self.contract)

    # ------------------------------------------------------------------ the op
    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The op's signature: the argument table, then ``*, backend, debug_checks, platform``."""
        params = []
        for a in self.args:
            kind = (inspect.Parameter.KEYWORD_ONLY if a.keyword_only
                    else inspect.Parameter.POSITIONAL_OR_KEYWORD)
            params.append(inspect.Parameter(a.name, kind, default=a.default))
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in OP_OPTIONS]
        return inspect.Signature(params)

    def bind(self, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(op arguments, options)`` of a call, defaults applied and the table's checks run."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise KernelInputError(f"{self.op_name}: arguments: expected {self.signature}, "
                                   f"got {exc}") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        options = {n: values.pop(n) for n in OP_OPTIONS}
        if not isinstance(options["debug_checks"], bool | None):
            raise input_error(self.op_name, "debug_checks", "True, False or None",
                              repr(options["debug_checks"]))
        return check_args(self.op_name, self.args, values), options

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the op: check the table and the devices, pick the variant and backend, call the kernel.

        The op layer's outcome is kept per argument signature (:mod:`dsv4kit.family.plans`): a call
        of a signature already checked goes straight to the kernel, which runs its own checks; a
        call whose launch signature has an :class:`~dsv4kit.family.plans.OpLaunch` runs the
        kernel's launch plan at once (False marks a launch signature the kernel does not plan);
        the op launches used last are tried first by their guard, without computing the signature.
        """
        return self._call(args, kwargs)

    @runtime_entry
    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`call` of packed arguments (the public op calls it: no second packing)."""
        launches = self._launches
        if launches.hot and not launches.missed and _STATE["enabled"]:
            platform = current_platform()
            for hot, guard in launches.hot:  # the guard first: a miss never hashes the key
                if hot.platform is platform:
                    tensors = guard(args, kwargs)
                    if tensors is not None and hot.valid():
                        return hot.plan(tensors)
            launches.missed = True  # the next call asks its size sight first (PlanTable.missed)
        try:
            return self._lookup_call(args, kwargs)
        except KernelInputError as exc:  # raised below the op: it names the op, as the op's own checks do
            raise self._op_error(exc) from None

    def _op_error(self, exc: KernelInputError) -> KernelInputError:
        """``exc`` naming this op where it names a kernel class (``StoreRowsDsTriton: arg: ...``);
        the kernel's name stays on the error as ``kernel``."""
        who, sep, rest = str(exc).partition(": ")
        if not sep or who == self.op_name:
            return exc
        named = KernelInputError(f"{self.op_name}: {rest}")
        named.kernel = who  # type: ignore[attr-defined]
        return named

    def _lookup_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """:meth:`_call` past the hot entries: by launch signature, by call signature, or checked."""
        launches = self._launches
        first, described, sizes = False, None, None
        if _STATE["enabled"]:
            sizes = size_sight(args, kwargs)
            entries = launches.sighted(sizes)
            # sizes never counted: a launch signature never seen (not computed; the kernel is told FIRST)
            first = entries is None
            if entries:
                platform = current_platform()
                for entry in entries:  # op launches made for these sizes, by their guards
                    hot = entry[0]
                    if hot.platform is platform:
                        tensors = entry[1](args, kwargs)
                        if tensors is not None and hot.valid():
                            launches.lift(entry)
                            return hot.plan(tensors)
            if not first:
                described = launch_signature(args, kwargs)
        fast: OpLaunch | bool | None = None
        if described is not None:
            key = (described[0], id(current_platform()))
            fast = launches.get(key)
            if fast and fast.valid():
                launches.promote(fast, described[1])
                launches.file(sizes, fast)
                return fast(described[1])
        plan = self._plans.match(args, kwargs)  # the hot signature classes first: no signature computed
        if plan is None:
            sig = call_signature(self.args, OP_OPTIONS, args, kwargs, self._rows)
            plan = self._plans.get(sig) if sig is not None else None
            if plan is None:
                return self.call_checked(*args, _signature=sig, **kwargs)
            self._plans.promote(plan)
        # an op launch is made on the signature's second call, when the kernel has planned it too
        make = described is not None and fast is not False and (fast is not None or launches.seen_before(key))
        if first or (described is not None and not fast):
            if not make and plan.first is not None:  # nothing to look up or to plan: the full path at once
                return plan.first(args, kwargs)
            # what the kernel cannot know cheaply: a first sight (nothing to look up) or a second (plan it)
            _STATE["sight"] = PLAN if make else FIRST
        try:
            result = plan(args, kwargs)  # the kernel's keywords in the plan's order, the order OpLaunch finds
        finally:
            _STATE["sight"] = None
        if make:
            if len(launches) >= MAX_PLANS:
                launches.clear()
            made = op_launch_for(plan, args, kwargs, described[1], described[0])
            launches[key] = made or False
            if made:
                launches.promote(made, described[1])
                launches.file(sizes, made)
        return result

    def call_checked(self, *args: Any, _signature: tuple[Any, ...] | None = None, **kwargs: Any) -> Any:
        """The full path of :meth:`call`, whatever plans exist; with ``_signature`` (the call's), the
        outcome of the op layer's checks is kept as that signature's plan."""
        try:
            return self._checked(args, kwargs, _signature)
        except KernelInputError as exc:  # raised below the op: it names the op, as the op's own checks do
            raise self._op_error(exc) from None

    def _checked(self, args: tuple[Any, ...], kwargs: dict[str, Any], sig: tuple[Any, ...] | None) -> Any:
        """:meth:`call_checked`'s body (its errors still name the kernel that raised them)."""
        values, opts = self.bind(*args, **kwargs)
        device = self._check_devices(values, opts["backend"])
        checked = dict(values)
        variant = values.pop(self.variant_arg) if self.variant_arg else DEFAULT_VARIANT
        kernel = self.kernel(variant, device, opts["backend"], opts["platform"])
        if sig is not None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[sig] = plan_for(kernel, opts["platform"] or current_platform(), self.args,
                                        OP_OPTIONS, args, kwargs, checked, self.variant_arg,
                                        opts["debug_checks"], sig)
        return kernel(**values, debug_checks=opts["debug_checks"])

    @functools.cached_property
    def _rows(self) -> dict[str, Arg]:
        return {a.name: a for a in self.args}

    def _check_devices(self, values: Mapping[str, Any], backend: str | None) -> torch.device:
        """Every tensor on the device of ``device_arg`` (spec §2.10), one a backend can run on; the
        error names the tensor that is off, not a generic ``device``."""
        where = self.device_arg
        device = values[where].device
        if device.type not in ("cpu", "cuda"):
            raise input_error(self.op_name, where, "a cpu or cuda tensor", f"device {device}")
        if backend == "cutedsl" and device.type != "cuda":
            raise input_error(self.op_name, "backend", "'triton' (or None) for tensors on the CPU: CuTeDSL "
                              "kernels run only on a GPU (to compile them without one: `dsv4kit warmup "
                              "--device cuda --arch sm_90a`, or kernel.compile_for(key, 'sm_90a'))",
                              f"'cutedsl' with {where} on {device}")
        for a in self.args:
            t = values.get(a.name)
            if a.kind == "tensor" and t is not None and t.device != device:
                raise input_error(self.op_name, a.name, f"device {device} (the device of {where})",
                                  f"device {t.device}")
        return device

    @functools.cached_property
    def op(self) -> Callable[..., Any]:
        """The public op: a function with the table's signature and docs. Under ``torch.compile`` it
        calls its torch op (``torch.ops.dsv4kit.<op_name>``); eager calls skip the dispatcher."""
        from dsv4kit.family.torch_op import compiled_call

        spec = self

        call = spec._call
        traced = compiled_call(spec)
        is_compiling = torch.compiler.is_compiling

        def op(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                return traced(args, kwargs)
            return call(args, kwargs)

        op.__name__ = op.__qualname__ = self.op_name
        op.__module__ = self.package
        op.__signature__ = self.signature  # type: ignore[attr-defined]
        op.__doc__ = self.doc()
        return op

    def doc(self) -> str:
        """The op's docstring: summary, returns, the argument table, the common options."""
        return (f"{self.spec_id}: {self.summary}.\n\nReturns {self.returns}.\n\n"
                f"{arg_table_markdown(self.args)}\n\n"
                "``backend``: 'triton' or 'cutedsl' (default: the platform's choice for the device). "
                "``debug_checks``: also run the value checks that read device memory (default: on under "
                "the CPU interpreter, off on a GPU). ``platform``: a dsv4kit Platform (default: this "
                "process's). Bad inputs raise KernelInputError before any launch.")

    # ------------------------------------------------------------------ warmup
    def register(self, config: Any = None, *, variant: str = DEFAULT_VARIANT, backend: str | None = None,
                 platform: Platform | None = None) -> JitKernel:
        """Register the warmup keys of ``config`` on the kernel the runtime selects; returns it.

        A no-op without an active :class:`~dsv4kit.jit.WarmupRegistry`.
        """
        kernel = self.kernel(variant, None, backend, platform)
        registry.register(kernel, self._warmup_keys(kernel, config))
        return kernel

    def _warmup_keys(self, kernel: JitKernel, config: Any) -> list[Any]:
        # Keys depend on the kernel class and the (frozen) config only; a 43-layer model asks
        # for the same ones per layer, and tracing dispatch over 8192 batch sizes is not free.
        try:
            memo = (type(kernel), config)
            hash(memo)
        except TypeError:
            return kernel.get_warmup_keys(config)
        keys = self._keys.get(memo)
        if keys is None:
            keys = self._keys[memo] = list(kernel.get_warmup_keys(config))
        return list(keys)

    # ------------------------------------------------------------------ keys of calls
    def dispatch(self, kernel: JitKernel, args: Mapping[str, Any]) -> Any:
        """The key ``kernel`` dispatches for op arguments ``args``, bound to ``dispatch`` by name."""
        prog = type(kernel)._dispatch_program
        return kernel.dispatch(**{p: args[p] for p in prog.params if p in args})  # type: ignore[union-attr]

    # ------------------------------------------------------------------ the sweep
    def bench_plans(self) -> tuple[Any, ...]:
        """The ``PLANS`` of the folder's ``bench.py``: its :class:`dsv4kit.bench.SweepPlan` s, this
        family's among them (imported on first use: the op path never imports a sweep)."""
        return tuple(importlib.import_module(f"{self.package}.bench").PLANS)

    # ------------------------------------------------------------------ completeness
    def missing(self) -> list[str]:
        """What a complete family lacks (empty when complete): used by the test of every spec."""
        out = []
        for v, var in self.variants.items():
            if not callable(var.reference):
                out.append(f"variant {v}: reference")
            for b in BACKENDS:
                try:
                    cls = self.kernel_class(v, b)
                except ImportError as exc:
                    if b == "cutedsl" and "cutlass" in str(exc):
                        continue  # CuTeDSL not installed here: nothing to check
                    out.append(f"variant {v}: {b} kernel ({exc})")
                    continue
                except AttributeError as exc:
                    out.append(f"variant {v}: {b} kernel ({exc})")
                    continue
                if not issubclass(cls, self.contract):
                    out.append(f"variant {v}: {b} kernel {cls.__name__} is not a {self.contract.__name__}")
        try:
            importlib.import_module(f"{self.package}.cases")
        except ImportError:
            out.append("cases module")
        try:
            if not any(self.name in p.families for p in self.bench_plans()):
                out.append("bench.py: no plan in PLANS times this family")
        except (ImportError, AttributeError) as exc:
            out.append(f"bench.py: PLANS ({exc})")
        for a in self.args:
            if a.kind == "tensor" and not (a.shape and a.dtypes):
                out.append(f"arg {a.name}: shape and dtypes")
        return out

