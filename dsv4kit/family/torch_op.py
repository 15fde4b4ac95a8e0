"""Every public op as a torch op, ``torch.ops.dsv4kit.<op_name>``, built from its family spec.

Serving engines put kernels inside ``torch.compile`` graphs and CUDA graphs as torch ops: a plain
Python op is traced into (its dispatch, the Triton interpreter) and breaks the graph. One function
here, :func:`register`, builds the torch op of any family from its :class:`~.spec.FamilySpec`:

- the schema from the argument table (``Tensor``, ``SymInt``, ``float``, ``bool``, ``str``; ``?`` for
  optional rows; defaults; ``*`` before keyword-only rows), then the options ``str? backend`` and
  ``bool? debug_checks``. ``platform`` is a Python object, not a schema type: a torch op runs on
  the process's current platform (:func:`~dsv4kit.platform.use_platform` sets it), and under
  ``torch.compile`` the public op takes no ``platform`` (None only);
- ``mutates_args`` from ``spec.mutates`` (each written argument is ``Tensor(x!)``);
- the fake kernel from ``spec.outputs``, so FakeTensor / meta tracing runs no kernel;
- the real kernel: the eager op, :meth:`FamilySpec.call`.

Returns. A torch op may not return an alias of an input. An op that writes nothing returns its new
tensors as ``Tensor[]`` (the public op gives back one tensor for a list of one, else a tuple). An op
that writes arguments returns nothing from its torch op; its public op returns ``spec.result``
of the arguments (``out``, or a view of it), and first allocates, through ``spec.allocates``, the
written arguments passed as None that the op would allocate itself (``c128_compress``'s ``out``).

The public op uses its torch op only while ``torch.compiler.is_compiling()``
(:meth:`FamilySpec.op`): an eager call skips the dispatcher (several microseconds a call).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.errors import ContractError, KernelInputError, input_error
from dsv4kit.family.schema import REQUIRED, Arg

if TYPE_CHECKING:
    from dsv4kit.family.spec import FamilySpec

__all__ = ["NAMESPACE", "OPTIONS", "compiled_call", "declares_effects", "register", "schema", "torch_op"]

#: The torch op namespace: ``torch.ops.dsv4kit``.
NAMESPACE = "dsv4kit"
#: The op options a schema carries (``platform`` cannot: it is the process's current platform).
OPTIONS = ("backend", "debug_checks")

_TYPES = {"tensor": "Tensor", "int": "SymInt", "float": "float", "bool": "bool", "str": "str"}
# The library must outlive every op defined in it: dropping it deregisters them.
_LIB: torch.library.Library | None = None
_REGISTERED: dict[str, FamilySpec] = {}


# --------------------------------------------------------------------------- the schema


def _default(a: Arg) -> str:
    """A row's default in schema syntax ('' when required)."""
    if a.default is REQUIRED:
        return ""
    if a.default is None:
        return "=None"
    if isinstance(a.default, str):
        return "=" + json.dumps(a.default)
    return f"={a.default!r}"


def _arg(a: Arg, alias: str | None) -> str:
    kind = _TYPES[a.kind] + (f"({alias}!)" if alias else "") + ("?" if a.optional else "")
    return f"{kind} {a.name}{_default(a)}"


def schema(spec: FamilySpec) -> str:
    """The torch op's schema (without its name): ``(args, *, options) -> returns``."""
    parts: list[str] = []
    aliases = iter("abcdefghijklmnopqrstuvwxyz")
    star = False
    for a in spec.args:
        if a.keyword_only and not star:
            parts.append("*")
            star = True
        parts.append(_arg(a, next(aliases) if a.name in spec.mutates else None))
    if not star:
        parts.append("*")
    parts += ["str? backend=None", "bool? debug_checks=None"]
    returns = "Tensor[]" if spec.outputs is not None else "()"
    return f"({', '.join(parts)}) -> {returns}"


def _check_effects(spec: FamilySpec) -> None:
    """The spec's torch effects describe an op a torch op can be (raises ContractError)."""
    where = f"FamilySpec({spec.name})"
    rows = {a.name: a for a in spec.args}
    bad = [m for m in spec.mutates if m not in rows or rows[m].kind != "tensor"]
    if bad:
        raise ContractError(f"{where}: mutates {bad} are not tensor arguments")
    if (spec.outputs is None) == (not spec.mutates):
        raise ContractError(f"{where}: a torch op needs outputs (new tensors) or mutates (written "
                            "arguments), not both or neither")
    if spec.result is not None and not spec.mutates:
        raise ContractError(f"{where}: result is for ops that write arguments (mutates)")
    bad = [m for m in spec.allocates if m not in spec.mutates or not rows[m].optional]
    if bad:
        raise ContractError(f"{where}: allocates {bad} are not optional arguments in mutates")


# --------------------------------------------------------------------------- registration


def _bound(spec: FamilySpec, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A kernel's schema-ordered arguments (table rows, then options) by name; the dispatcher
    leaves out keyword arguments equal to their default, so defaults fill the rest."""
    values = {a.name: a.default for a in spec.args if a.default is not REQUIRED}
    values.update(dict.fromkeys(OPTIONS))
    values.update(zip([a.name for a in spec.args] + list(OPTIONS), args, strict=False))
    values.update(kwargs)
    return values


def _real(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        spec = _REGISTERED[name]
        values = _bound(spec, args, kwargs)
        out = spec.call(**values)  # the eager op, on the current platform
        if spec.outputs is None:
            return None
        return list(out) if isinstance(out, tuple) else [out]

    return kernel


def _fake(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        spec = _REGISTERED[name]
        if spec.outputs is None:
            return None
        values = _bound(spec, args, kwargs)
        out = spec.outputs({a.name: values[a.name] for a in spec.args})
        return list(out) if isinstance(out, tuple) else [out]

    return kernel


def declares_effects(spec: FamilySpec) -> bool:
    """Whether ``spec`` says what its op returns or writes (what a torch op needs)."""
    return spec.outputs is not None or bool(spec.mutates)


def register(spec: FamilySpec) -> torch._ops.OpOverload:
    """Define ``torch.ops.dsv4kit.<op_name>`` from ``spec``; returns it.

    Once per op name and process: torch cannot redefine a schema, so a later spec of the same name
    (a test building its spec again) must have the same schema and takes over the kernels.
    """
    global _LIB
    _check_effects(spec)
    text = schema(spec)
    old = _REGISTERED.get(spec.op_name)
    if old is not None:
        if schema(old) != text:
            raise ContractError(f"torch op {NAMESPACE}::{spec.op_name} is defined as {schema(old)}, "
                                f"not {text}")
        _REGISTERED[spec.op_name] = spec
        return torch_op(spec)
    if _LIB is None:
        _LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
    _LIB.define(spec.op_name + text)
    # One kernel for CPU and CUDA: the eager op picks the backend from the tensors' device.
    _LIB.impl(spec.op_name, _real(spec.op_name), "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{spec.op_name}", _fake(spec.op_name), lib=_LIB)
    _REGISTERED[spec.op_name] = spec
    return torch_op(spec)


def torch_op(spec: FamilySpec) -> torch._ops.OpOverload:
    """``torch.ops.dsv4kit.<op_name>.default`` (registered by :func:`register`)."""
    return getattr(getattr(torch.ops, NAMESPACE), spec.op_name).default


# --------------------------------------------------------------------------- the compiled path


def compiled_call(spec: FamilySpec) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """What the public op runs under ``torch.compile``: bind the call to the table (plain Python a
    tracer follows), allocate what the op would, call the torch op, rebuild the op's result."""
    op = register(spec) if declares_effects(spec) else None
    names = tuple(a.name for a in spec.args)
    positional = sum(not a.keyword_only for a in spec.args)
    defaults = tuple(a.default for a in spec.args)
    known = (*names, *OPTIONS, "platform")
    outputs, result, allocates = spec.outputs is not None, spec.result, dict(spec.allocates)
    where = spec.op_name

    def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if op is None:
            raise ContractError(f"{where}: no torch op: its FamilySpec declares neither outputs nor mutates")
        if len(args) > positional:
            raise KernelInputError(f"{where}: arguments: at most {positional} positional, got {len(args)}")
        for k in kwargs:
            if k not in known:
                raise KernelInputError(f"{where}: arguments: unexpected keyword {k!r}")
        values: dict[str, Any] = {}
        for i, name in enumerate(names):
            if i < len(args):
                values[name] = args[i]
            elif name in kwargs:
                values[name] = kwargs[name]
            elif defaults[i] is not REQUIRED:
                values[name] = defaults[i]
            else:
                raise KernelInputError(f"{where}: arguments: missing {name!r}")
        if kwargs.get("platform") is not None:
            # A tracer cannot tell one Platform object from another reliably (identity is not
            # guarded), and the torch op runs on whatever platform is current when it runs.
            raise input_error(where, "platform", "None under torch.compile (the torch op runs on the "
                              "current platform: run the compiled code inside use_platform)", "a Platform")
        for name, make in allocates.items():
            if values[name] is None:
                values[name] = make(values)
        out = op(**values, backend=kwargs.get("backend"), debug_checks=kwargs.get("debug_checks"))
        if outputs:
            return out[0] if len(out) == 1 else tuple(out)
        return None if result is None else result(values)

    return call
