"""FamilySpec: the one object per kernel family that the rest of the kit reads.

A family is one folder, ``dsv4kit/kernels/<name>/``, with the same files as every other:

==================  =========================================================================
``reference.py``    the PyTorch oracle, the op's argument table (:class:`~.schema.Arg` rows)
                    and the input checks the reference and every backend share
``spec.py``         the contract class (CompileKey, ``dispatch``, warmup keys, ``__call__``)
                    and ``SPEC``, the family's :class:`FamilySpec` (with its model hooks)
``triton.py``       the Triton kernel class(es)
``cutedsl.py``      the CuTeDSL kernel class(es)
``cases.py``        seeded test cases (tests, notebooks and GPU scripts use the same ones)
``__init__.py``     the public names: the op, the reference, the spec
==================  =========================================================================

From ``SPEC`` come, with no per-family code anywhere else: the public op (:meth:`FamilySpec.op`,
its signature from the argument table, validated before any backend is chosen), the kernel
object for a device and backend (one selection predicate, one cache), registration for warmup,
and, through :class:`ModelHooks`, the family's place in a DSv4 layer (the registration gate,
the call sites of a serving step, the reasons a warmed key is dead). Call arguments reach
``dispatch`` by name: every parameter of a model family's ``dispatch`` is an op argument.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.errors import ContractError, KernelInputError, input_error
from dsv4kit.family.plans import MAX_PLANS, CallPlan, OpLaunch, call_signature, op_launch_for, plan_for
from dsv4kit.family.schema import Arg, arg_table_markdown, check_args
from dsv4kit.jit import JitKernel, registry
from dsv4kit.jit.launch_plans import _STATE, PlanTable, launch_signature
from dsv4kit.jit.monitor import runtime_entry
from dsv4kit.platform import BACKENDS, Platform, current_platform

if TYPE_CHECKING:
    from dsv4kit.family.calls import Call
    from dsv4kit.model.stack import AttentionLayer, DSv4AttentionStack
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = ["DEFAULT_VARIANT", "FamilySpec", "ModelHooks", "Site", "Variant"]

#: The variant name of a family with one kernel per backend.
DEFAULT_VARIANT = "default"
#: Keyword-only arguments every op takes besides its table.
OP_OPTIONS = ("backend", "debug_checks", "platform")


@dataclass(frozen=True)
class Variant:
    """One kernel of a family: its reference and its class per backend, named by its class name in
    the family's ``triton.py`` / ``cutedsl.py`` (imported on first use) or given as a class."""

    reference: Callable[..., Any]
    triton: str | type[JitKernel]
    cutedsl: str | type[JitKernel]

    def class_name(self, backend: str) -> str:
        cls = getattr(self, backend)
        return cls if isinstance(cls, str) else cls.__name__


@dataclass(frozen=True)
class Site:
    """One op call a layer makes in a serving step: a call-site name and the op's arguments by
    name (:class:`~dsv4kit.family.calls.TensorSpec` stand-ins, or plain values)."""

    name: str
    args: Mapping[str, Any]


def _no_reason(*_: Any) -> str | None:
    return None


def _default_variant(_: Any) -> str:
    return DEFAULT_VARIANT


@dataclass(frozen=True)
class ModelHooks:
    """A family's place in a DSv4 attention layer (what :mod:`dsv4kit.model` reads).

    ``config(stack, layer)``: the warmup config of the calls the layer makes, or None where the
    runtime never calls the family on that layer (the registration gate). ``call_sites(stack,
    layer, step)``: the op calls of a serving step, as :class:`Site` rows. ``variant(stack)``:
    which variant this runtime calls; ``variant_reason(stack)`` completes "<variant> variant not
    selected: ..." for the others. ``unused(stack)``: why the runtime never calls the family at
    all (None when it does). ``explain_dead(stack, key, stats)``: why a warmed key was never
    requested by a trace, or None for no family-specific reason.
    """

    config: Callable[[DSv4AttentionStack, AttentionLayer], Any]
    call_sites: Callable[[DSv4AttentionStack, AttentionLayer, Step], list[Site]]
    variant: Callable[[DSv4AttentionStack], str] = _default_variant
    variant_reason: Callable[[DSv4AttentionStack], str] = _no_reason  # type: ignore[assignment]
    unused: Callable[[DSv4AttentionStack], str | None] = _no_reason
    explain_dead: Callable[[DSv4AttentionStack, Any, ReplayStats], str | None] = _no_reason


@dataclass(frozen=True)
class FamilySpec:
    """Everything the kit knows of one kernel family (see the module docstring).

    ``name``: the folder (``dsv4kit.kernels.<name>``). ``spec_id``: its name in the numeric spec
    ("K4"). ``op_name``: the public op. ``args``: the op's argument table. ``contract``: the
    backend-neutral kernel class (CompileKey, dispatch, warmup keys). ``variants``: variant name ->
    :class:`Variant`; ``variant_arg`` names the op argument that chooses one (None: a single
    variant, ``DEFAULT_VARIANT``). ``device_arg``: the tensor whose device picks the backend
    (default: the first tensor argument). ``returns``: what the op returns, for its docs.
    ``model``: the model hooks, or None for a kernel that is not part of a DSv4 layer.
    ``folder``: the family's folder under ``dsv4kit/kernels`` when it is not ``name`` (a folder
    whose ops share one kernel core holds several specs, e.g. the three C4 compressors).
    """

    name: str
    spec_id: str
    summary: str
    op_name: str
    args: tuple[Arg, ...]
    contract: type[JitKernel]
    variants: Mapping[str, Variant]
    returns: str
    variant_arg: str | None = None
    device_arg: str | None = None
    config_type: type | None = None
    model: ModelHooks | None = None
    folder: str | None = None
    _kernels: dict[tuple[type, Platform], JitKernel] = field(default_factory=dict, compare=False, repr=False)
    _keys: dict[tuple[type, Any], list[Any]] = field(default_factory=dict, compare=False, repr=False)
    _plans: dict[tuple[Any, ...], CallPlan] = field(default_factory=dict, compare=False, repr=False)
    _launches: PlanTable = field(default_factory=PlanTable, compare=False, repr=False)  # OpLaunch | False

    def __post_init__(self) -> None:
        where = f"FamilySpec({self.name})"
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
        if self.model is not None:
            # The model replays calls by binding op arguments to dispatch by name: no adapters.
            missing = [p for p in prog.params if p not in names]
            if missing:
                raise ContractError(f"{where}: dispatch parameters {missing} of {self.contract.__name__} "
                                    f"are not op arguments {names}; dispatch must read the op's arguments "
                                    "by name")

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
        cls = getattr(self.variants[variant], backend)
        if not isinstance(cls, str):
            return cls
        return getattr(importlib.import_module(f"{self.package}.{backend}"), cls)

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
        name = type(kernel).__name__
        return next((v for v, var in self.variants.items()
                     if name in (var.class_name("triton"), var.class_name("cutedsl"))), None)

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
        if launches.hot and _STATE["enabled"]:
            platform = current_platform()
            for hot, guard in launches.hot:
                if hot.platform is platform and hot.valid():
                    tensors = guard(args, kwargs)
                    if tensors is not None:
                        return hot.plan(tensors)
        described = launch_signature(args, kwargs) if _STATE["enabled"] else None
        fast: OpLaunch | bool | None = None
        if described is not None:
            key = (described[0], id(current_platform()))
            fast = launches.get(key)
            if fast and fast.valid():
                launches.promote(fast, described[1])
                return fast(described[1])
        sig = call_signature(self.args, OP_OPTIONS, args, kwargs, self._rows)
        plan = self._plans.get(sig) if sig is not None else None
        if plan is None:
            return self.call_checked(*args, _signature=sig, **kwargs)
        result = plan(args, kwargs)  # the kernel's keywords in the plan's order, the order OpLaunch finds
        if described is not None and fast is not False:
            if len(launches) >= MAX_PLANS:
                launches.clear()
            made = op_launch_for(plan, args, kwargs, described[1], described[0])
            launches[key] = made or False
            if made:
                launches.promote(made, described[1])
        return result

    def call_checked(self, *args: Any, _signature: tuple[Any, ...] | None = None, **kwargs: Any) -> Any:
        """The full path of :meth:`call`, whatever plans exist; with ``_signature`` (the call's), the
        outcome of the op layer's checks is kept as that signature's plan."""
        sig = _signature
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
                                        opts["debug_checks"])
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
            raise input_error(self.op_name, where, "a cuda tensor (CuTeDSL kernels run only on a GPU)",
                              f"device {device}")
        for a in self.args:
            t = values.get(a.name)
            if a.kind == "tensor" and t is not None and t.device != device:
                raise input_error(self.op_name, a.name, f"device {device} (the device of {where})",
                                  f"device {t.device}")
        return device

    @functools.cached_property
    def op(self) -> Callable[..., Any]:
        """The public op: a function with the table's signature and docs."""
        spec = self

        call = spec._call

        def op(*args: Any, **kwargs: Any) -> Any:
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

    # ------------------------------------------------------------------ model
    def dispatch(self, kernel: JitKernel, args: Mapping[str, Any]) -> Any:
        """The key ``kernel`` dispatches for op arguments ``args``, bound to ``dispatch`` by name."""
        prog = type(kernel)._dispatch_program
        return kernel.dispatch(**{p: args[p] for p in prog.params if p in args})  # type: ignore[union-attr]

    def calls(self, stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Call]:
        """The op calls ``layer`` makes in ``step`` (none where the family is not registered)."""
        from dsv4kit.family.calls import Call

        kernel = layer.kernels.get(self.name)
        if kernel is None or self.model is None:
            return []
        return [Call(self, kernel, s.name, s.args) for s in self.model.call_sites(stack, layer, step)]

    def launch(self, stack: DSv4AttentionStack, kernel: JitKernel, args: Mapping[str, Any]) -> Any:
        """Run the public op with real arguments, as the runtime would (no device-read checks)."""
        return self.op(**args, backend=kernel.backend, platform=stack.platform, debug_checks=False)

    def not_selected(self, stack: DSv4AttentionStack, kernel: JitKernel) -> str | None:
        """Why the runtime never calls ``kernel`` (family unused, or another variant), or None."""
        if self.model is None:
            return "not part of the DSv4 attention stack"
        why = self.model.unused(stack)
        if why is not None:
            return why
        v = self.variant_of(kernel)
        if v is not None and v != self.model.variant(stack):
            return f"{v.upper()} variant not selected: {self.model.variant_reason(stack)}"
        return None

    def explain_dead(self, stack: DSv4AttentionStack, kernel: JitKernel, key: Any,
                     stats: ReplayStats) -> str | None:
        return None if self.model is None else self.model.explain_dead(stack, key, stats)

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
        for a in self.args:
            if a.kind == "tensor" and not (a.shape and a.dtypes):
                out.append(f"arg {a.name}: shape and dtypes")
        return out

