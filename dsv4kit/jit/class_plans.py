"""Class plans: one launch recipe per signature class, its sizes as symbols (issue 36).

A launch plan (:mod:`dsv4kit.jit.launch_plans`) serves one exact signature: a call of sizes never
seen runs the kernel's full path (its checks, ``dispatch``, the launch arguments) in Python. A
*class plan* serves every call of a signature class, whatever its sizes: the class fixes what
changes the compiled code and the launch's structure (each tensor's type, dtype, device, number of
dimensions and which tensors share a storage; each scalar's type and value), and the sizes,
strides, storage offsets and addresses are symbols.

It is made by running the kernel's own launch description once (``launch_operands``: what its
``__call__`` returns, checks included) on fake tensors whose sizes are symbols (torch's
``FakeTensorMode`` over a ``ShapeEnv``; an address is a symbol too, ``data_ptr`` answering for the
fakes during the trace). Every decision it takes on a size, a stride, an offset or
an address (a shape relation of spec §2.10, an alignment rule, ``dispatch``'s buckets, the
CompileKey's fields) is recorded as a guard over those symbols; what it computes from them (the
grid's and the kernel's integer arguments, the outputs' shapes, the views it launches with)
comes out as expressions. From these, one Python function per class region is generated:

* read each tensor's sizes, strides, storage offset and address once;
* check the class (``TensorGuards`` in C++, the scalars by value), the storage sharing, that each
  stride and offset is the expression the trace assumed, and every recorded guard: any failure
  returns :data:`MISS` and the call takes the full path, which raises the right
  ``KernelInputError`` (a plan never raises one, and never skips a check: the guards *are* the
  checks, in the form the trace found them);
* allocate the outputs, build the launch arguments from the sizes, run the key's executor.

The op keeps the class plans of each of its call plans (:func:`~dsv4kit.family.plans.first_sight`:
the path of sizes the op never saw). One is made on a class's second full-path call there (the first
may be a one-off), outside CUDA
graph capture, only while no :class:`~dsv4kit.jit.monitor.JitMonitor` is armed (generating code is
host code generation: after warmup the monitor would report it, so under a monitor a new class keeps
the full path), and never where a launch plan could not be made either (value checks on, a launch
not plan-safe). A trace costs 30-600 ms on the CPU machine, once per class region. Whatever the
trace cannot follow (a read of a fresh output's address, a data-dependent branch, an argument a
plan cannot rebuild) leaves the class unplanned: the full path serves it, as before.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dsv4kit.jit import coverage
from dsv4kit.jit.launch_plans import (
    Address,
    _is_tensor_entry,
    _rebind,
    _scalar_sig,
    class_check,
    launch_signature,
)
from dsv4kit.jit.monitor import active_monitor

__all__ = ["HOT", "MAX_CLASSES", "MISS", "ClassPlan", "ClassTable", "class_key", "learn", "serve",
           "set_enabled", "trace_class"]

#: What a class plan returns for a call it does not serve.
MISS = object()

#: Classes kept per table (a class may hold up to ``HOT`` plans: one per region of its guards, e.g.
#: each ``rows_per_program`` bucket); the table is cleared when full.
MAX_CLASSES = 64

#: Class plans tried per call before the full path, most recent first.
HOT = 4

_ON = {"on": True}


def set_enabled(on: bool) -> bool:
    """Turn class plans on or off for the process; returns the previous setting."""
    before, _ON["on"] = _ON["on"], bool(on)
    return before


class _Unplannable(Exception):
    """The trace cannot describe this class; its calls keep the full path."""


def class_key(signature: tuple[Any, ...]) -> tuple[Any, ...]:
    """The signature class of a :func:`~dsv4kit.jit.launch_plans.launch_signature`: the signature
    with each tensor's sizes, strides, storage offset and address replaced by its number of
    dimensions (type, dtype, device and which tensors share a storage stay), scalars as they are."""
    return (signature[0], *((e[0], e[1], e[2], e[3], len(e[4]), e[8]) if _is_tensor_entry(e) else e
                            for e in signature[1:]))


class ClassTable(dict):  # type: ignore[type-arg]
    """Class plans by :func:`class_key`: ``[ClassPlan, ...]`` (empty: the class was seen once), and
    ``hot``: the plans tried first, most recent first; ``failed``: the classes a trace could not
    follow (their plans made before stay, no trace is tried again). An op keeps one per call plan
    (:func:`~dsv4kit.family.plans.first_sight`)."""

    __slots__ = ("failed", "hot")

    def __init__(self) -> None:
        super().__init__()
        self.hot: tuple[ClassPlan, ...] = ()
        self.failed: set[tuple[Any, ...]] = set()

    def clear(self) -> None:
        self.hot = ()
        self.failed.clear()
        super().clear()


def serve(table: ClassTable, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The call served by one of ``table``'s hot class plans, or :data:`MISS`."""
    if not _ON["on"]:
        return MISS
    for plan in table.hot:
        r = plan.fn(args, kwargs)
        if r is not MISS:
            if table.hot[0] is not plan:
                table.hot = (plan, *(p for p in table.hot if p is not plan))
            return r
    return MISS


def learn(table: ClassTable, kernel: Any, describe: Callable[..., Any], args: tuple[Any, ...],
          kwargs: Mapping[str, Any]) -> None:
    """After a full-path call of a plannable call (``describe(args, kwargs)``: its launch spec):
    count its class in ``table``; on its second full-path call, trace it and keep the plan (and
    make it hot). Never while a monitor is armed."""
    if not _ON["on"] or active_monitor() is not None or _capturing():
        return
    described = launch_signature(args, kwargs)
    if described is None:
        return
    key = class_key(described[0])
    if key in table.failed:
        return
    kept = table.get(key)
    if kept is None:  # first sight of the class
        if len(table) >= MAX_CLASSES:
            table.clear()
        table[key] = []
        return
    kept[:] = [p for p in kept if p.valid()]  # a plan whose executor was cleared serves nothing
    if len(kept) >= HOT:
        return  # a class of many regions: the full path keeps the rest
    try:
        plan = trace_class(kernel, describe, args, kwargs, described[1])
    except _Unplannable:
        table.failed.add(key)
        return
    kept.append(plan)
    table.hot = (plan, *(p for p in table.hot if p.valid()))[:HOT]


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (no trace then: it allocates)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@dataclasses.dataclass(frozen=True)
class ClassPlan:
    """One region of a signature class: ``fn(args, kwargs)`` serves a call of it or returns
    :data:`MISS`; ``source`` is the generated function (for a reader), ``key`` its CompileKey."""

    kernel_name: str
    key: Any
    source: str
    fn: Callable[[tuple[Any, ...], Mapping[str, Any]], Any]
    guards: tuple[str, ...]
    executors: dict[Any, Any]              # its kernel class's executor caches, by target
    target: Any
    cache: dict[Any, Any]                  # the target's cache it was made with
    executor: Callable[..., Any]           # the executor it launches

    def valid(self) -> bool:
        """Whether its executor is still the one cached for its key (``clear_cache``: not)."""
        return self.executors.get(self.target) is self.cache and self.cache.get(self.key) is self.executor


# --------------------------------------------------------------------------- the trace


def _sym_expr(v: Any) -> Any:
    """The sympy expression of a symbolic scalar, or None for a plain one."""
    node = getattr(v, "node", None)
    return None if node is None else node.expr


class _Trace:
    """One trace's fakes, symbols and the names the generated code gives them."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        from torch._dynamo.source import LocalSource
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

        self.env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
        self.mode = FakeTensorMode(shape_env=self.env)
        self.names: dict[Any, str] = {}      # symbol -> the generated code's expression for it
        self.reads: list[str] = []           # lines reading the call's metadata
        self.fakes: list[Any] = []
        self.bases: list[Any] = []           # per input: its storage base symbol (a SymInt)
        first: dict[int, int] = {}
        for i, t in enumerate(tensors):
            # an alias with no ``_base``: the fake's symbols come from this tensor, not its base
            alias = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
            ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim())
            fake = self.mode.from_tensor(alias, source=LocalSource(f"t{i}"), symbolic_context=ctx)
            self.fakes.append(fake)
            self.reads.append(f"z{i} = t{i}.shape; d{i} = t{i}.stride(); o{i} = t{i}.storage_offset()")
            base = t.data_ptr() - t.storage_offset() * t.itemsize
            j = first.setdefault(base, i)
            if j == i:
                self.reads.append(f"b{i} = t{i}.data_ptr() - o{i} * {t.itemsize}")
                sym = self.env.create_symbol(base, LocalSource(f"b{i}"), dynamic_dim=DimDynamic.DYNAMIC)
                self.names[sym] = f"b{i}"
                self.bases.append(self.env.create_symintnode(sym, hint=base))
            else:
                self.reads.append(f"if t{i}.data_ptr() - o{i} * {t.itemsize} != b{j}: return MISS")
                self.bases.append(self.bases[j])
        if len(first) > 1:  # storages apart in the trace are apart in the call (an alias is another class)
            bases = ", ".join(f"b{i}" for i in first.values())
            self.reads.append(f"if len({{{bases}}}) != {len(first)}: return MISS")
        self.storage_of = {_storage_id(f): i for i, f in reversed(list(enumerate(self.fakes)))}
        self.checks: list[str] = []          # strides / offsets as the trace assumed them
        for i, fake in enumerate(self.fakes):
            for k, s in enumerate(fake.shape):
                self._bind(s, f"z{i}[{k}]")
            for k, s in enumerate(fake.stride()):
                self._bind(s, f"d{i}[{k}]")
            self._bind(fake.storage_offset(), f"o{i}")

    def _bind(self, v: Any, read: str) -> None:
        """``read`` is the call's value of ``v``: a fresh symbol takes it as its name; anything else
        (a constant, an expression of other symbols) becomes a check."""
        import sympy

        e = _sym_expr(v)
        if e is not None and isinstance(e, sympy.Symbol) and e not in self.names:
            self.names[e] = read
            return
        self.checks.append(f"{read} == {self.code(v)}")

    def code(self, v: Any) -> str:
        """Python for a symbolic or plain scalar, over the generated code's names (symbols replaced
        as the trace's guards allow: ``s3 -> 256`` once ``Eq(s3, 256)`` is a guard)."""
        e = _sym_expr(v)
        return repr(v) if e is None else self.render(self.env.replace(e))

    def render(self, e: Any) -> str:
        """Python for the sympy expression ``e`` over the generated code's names."""
        from torch.utils._sympy.printers import PythonPrinter

        names = {str(s): self.names.get(s) for s in e.free_symbols}
        missing = [s for s, n in names.items() if n is None]
        if missing:
            raise _Unplannable(f"symbols {missing} have no source")
        text = PythonPrinter().doprint(e)
        return re.sub(r"\b[a-z]\d+\b", lambda m: names.get(m.group(0)) or m.group(0), text)

    def data_ptr(self, t: Any) -> Any:
        """A fake's address during the trace: its storage base symbol plus its offset."""
        i = self.storage_of.get(_storage_id(t))
        if i is None:
            raise _Unplannable("the address of a tensor made inside the call")
        return self.bases[i] + t.storage_offset() * t.itemsize


def _storage_id(t: Any) -> int:
    return t.untyped_storage()._cdata


def trace_class(kernel: Any, describe: Callable[..., Any], args: tuple[Any, ...],
                kwargs: Mapping[str, Any], tensors: list[torch.Tensor]) -> ClassPlan:
    """The class plan of the region of ``(args, kwargs)``'s class this call falls in:
    ``describe(args, kwargs)`` (the call's launch spec, as ``kernel``'s ``__call__`` returns it)
    traced on fakes of the call's tensors (``tensors``: in
    :func:`~dsv4kit.jit.launch_plans.launch_signature` order; module docstring).
    Raises :class:`_Unplannable` where the trace cannot follow the call."""
    from dsv4kit.jit.launcher import Immediate, as_launch_spec

    try:
        tr = _Trace(tensors)
        fake_of = {id(t): f for t, f in zip(tensors, tr.fakes, strict=True)}
        fargs = tuple(fake_of.get(id(v), v) for v in args)
        fkwargs = {k: fake_of.get(id(v), v) for k, v in kwargs.items()}
        real_ptr = torch.Tensor.data_ptr

        def data_ptr(t: Any) -> Any:
            return tr.data_ptr(t) if _is_fake(t) else real_ptr(t)

        torch.Tensor.data_ptr = data_ptr  # type: ignore[method-assign]
        try:
            with tr.mode:
                spec = as_launch_spec(describe(fargs, fkwargs), type(kernel).__name__)
            if isinstance(spec, Immediate):
                raise _Unplannable("nothing to launch")
            key = _concrete_key(spec.key)
            kernel.check_key(key)
        finally:
            torch.Tensor.data_ptr = real_ptr  # type: ignore[method-assign]
        body, consts = _recipe(tr, kernel, key, spec)
        cache = kernel._executor_cache()
        if cache.get(key) is None:
            raise _Unplannable("the key's executor is not cached")
    except _Unplannable:
        raise
    except Exception as exc:  # anything the fake run or the symbols cannot take
        raise _Unplannable(f"{type(exc).__name__}: {exc}") from None
    guards = tuple(g for g in dict.fromkeys([*tr.checks, *(_guard_code(tr, g.expr) for g in tr.env.guards)])
                   if g != "True")
    check = class_check(tensors)
    consts.update(executors=type(kernel)._executors, target=kernel.target, cache=cache, key=key,
                  launch=cache[key], kernel_name=kernel.name, coverage=coverage)
    source, fn = _generate(tr, args, kwargs, tensors, guards, body, consts, check)
    return ClassPlan(kernel.name, key, source, fn, guards, type(kernel)._executors, kernel.target, cache,
                     cache[key])


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _guard_code(tr: _Trace, expr: Any) -> str:
    import sympy

    # as recorded: a replacement (``s3 -> 256``) would turn its own guard into True
    return "True" if expr == sympy.true else f"({tr.render(expr)})"


def _concrete_key(key: Any) -> Any:
    """``key`` with every symbolic field made a plain value (each such read becomes a guard)."""
    if not dataclasses.is_dataclass(key):
        return key
    changes = {}
    for f in dataclasses.fields(key):
        v = getattr(key, f.name)
        c = _concrete(v)
        if c is not v:
            changes[f.name] = c
    return dataclasses.replace(key, **changes) if changes else key


def _concrete(v: Any) -> Any:
    if isinstance(v, torch.SymBool):
        return bool(v)
    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, torch.SymFloat):
        return float(v)
    if type(v) is tuple:
        parts = tuple(_concrete(x) for x in v)
        return v if all(a is b for a, b in zip(parts, v, strict=True)) else parts
    return v


def _recipe(tr: _Trace, kernel: Any, key: Any, spec: Any) -> tuple[list[str], dict[str, Any]]:
    """The plan's body after its guards: fresh outputs, launch arguments, the launch, the result."""
    consts: dict[str, Any] = {}

    def const(v: Any) -> str:
        name = f"c{len(consts)}"
        consts[name] = v
        return name

    lines: list[str] = []
    sources: dict[int, str] = {_storage_id(f): f"t{i}" for i, f in reversed(list(enumerate(tr.fakes)))}
    whole: dict[int, Any] = {_storage_id(f): f for f in reversed(tr.fakes)}
    named: dict[int, str] = {id(f): f"t{i}" for i, f in enumerate(tr.fakes)}
    out = spec.output
    leaves = [] if out is None else list(out) if isinstance(out, tuple) else [out]
    for j, leaf in enumerate(leaves):  # fresh allocations: outputs sharing no input's storage
        if not isinstance(leaf, torch.Tensor) or _storage_id(leaf) in sources:
            continue
        if leaf._base is not None or _is_offset(leaf):
            raise _Unplannable("an output that is part of a larger fresh allocation")
        size = ", ".join(tr.code(s) for s in leaf.shape)
        stride = ", ".join(tr.code(s) for s in leaf.stride())
        lines.append(f"f{j} = empty_strided(({size},), ({stride},), dtype={const(leaf.dtype)}, "
                     f"device={const(leaf.device)})")
        sources[_storage_id(leaf)] = f"f{j}"
        whole[_storage_id(leaf)] = leaf
        named[id(leaf)] = f"f{j}"

    def tensor_expr(t: Any) -> str:
        if id(t) in named:
            return named[id(t)]
        src = sources.get(_storage_id(t))
        if src is None:
            raise _Unplannable("a launch tensor made inside the call")
        base = whole[_storage_id(t)]
        size = "(" + "".join(tr.code(s) + ", " for s in t.shape) + ")"
        stride = "(" + "".join(tr.code(s) + ", " for s in t.stride()) + ")"
        off = tr.code(t.storage_offset())
        if t.dtype == base.dtype:
            return f"{src}.as_strided({size}, {stride}, {off})"
        if t.itemsize == base.itemsize:
            return f"{src}.view({const(t.dtype)}).as_strided({size}, {stride}, {off})"
        return f"_rebind({src}, {const(t.dtype)}, {off}, {size}, {stride})"

    def arg_expr(a: Any) -> str:
        if isinstance(a, torch.Tensor):
            return tensor_expr(a)
        if isinstance(a, Address):
            return f"Address({tr.code(a.data_ptr())}, {const(a.dtype)})"
        if isinstance(a, torch.SymInt | torch.SymBool | torch.SymFloat):
            return tr.code(a)
        if _scalar_sig(a) is None:
            raise _Unplannable(f"a launch argument of type {type(a).__name__}")
        return const(a)

    launch_args = ", ".join(arg_expr(a) for a in spec.args)
    lines.append(f"r = launch({launch_args})")
    if spec.output is not None:
        outs = [arg_expr(x) if isinstance(x, torch.Tensor) else const(x) for x in leaves]
        lines.append(f"r = ({', '.join(outs)},)" if isinstance(spec.output, tuple) else f"r = {outs[0]}")
    if spec.finalizer is not None:
        if getattr(spec.finalizer, "__closure__", True) is not None:
            raise _Unplannable("a finalizer that may hold this call's values")
        lines.append(f"r = {const(spec.finalizer)}(r)")
    lines.append("return r")
    return lines, consts


def _is_offset(t: Any) -> bool:
    e = _sym_expr(t.storage_offset())
    return e is not None or t.storage_offset() != 0


def _generate(tr: _Trace, args: tuple[Any, ...], kwargs: Mapping[str, Any], tensors: list[torch.Tensor],
              guards: tuple[str, ...], body: list[str], consts: dict[str, Any], check: Callable[..., bool]
              ) -> tuple[str, Callable[..., Any]]:
    """The class plan's function (module docstring) and its source."""
    nargs, keys = len(args), tuple(kwargs)
    vals = (*args, *kwargs.values())
    at = [j for j, v in enumerate(vals) if isinstance(v, torch.Tensor)]
    scalars = [(j, v) for j, v in enumerate(vals) if not isinstance(v, torch.Tensor)]
    ns: dict[str, Any] = {"MISS": MISS, "check": check, "empty_strided": torch.empty_strided,
                          "Address": Address, "_rebind": _rebind, "scalar_sig": _scalar_sig, "keys": keys,
                          **consts}
    lines = ["def class_plan(args, kwargs):",
             f"    if len(args) != {nargs} or {'tuple(kwargs) != keys' if keys else 'kwargs'}:",
             "        return MISS"]
    lines.append("    vals = args + tuple(kwargs.values())" if keys else "    vals = args")
    for i, j in enumerate(at):
        lines.append(f"    t{i} = vals[{j}]")
    lines.append(f"    if not check({', '.join(f't{i}' for i in range(len(at)))}):")
    lines.append("        return MISS")
    for n, (j, v) in enumerate(scalars):
        ns[f"v{n}"] = v
        test = _scalar_test(f"vals[{j}]", f"v{n}", v, ns)
        lines.append(f"    if not ({test}):")
        lines.append("        return MISS")
    lines += [f"    {ln}" for ln in tr.reads]
    if guards:
        lines.append("    if not (" + "\n            and ".join(guards) + "):")
        lines.append("        return MISS")
    lines.append("    if executors.get(target) is not cache or cache.get(key) is not launch:")
    lines.append("        return MISS")
    lines.append("    if coverage._ACTIVE:")
    lines.append("        coverage.record_request(kernel_name, key)")
    lines += [f"    {ln}" for ln in body]
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<class_plan>", "exec"), ns)  # noqa: S102 - generated from the trace above
    return source, ns["class_plan"]


def _scalar_test(expr: str, name: str, v: Any, ns: dict[str, Any]) -> str:
    """A test that the call's scalar ``expr`` is the traced ``v`` (``ns[name]``), as the launch
    signature tells them apart: singletons by identity; ints, strings and nonzero floats by exact
    type and value (a nan never passes: the full path decides); anything else (a zero float, whose
    sign ``==`` cannot see; a tuple) by its signature entry."""
    tp = type(v)
    if v is None or tp is bool or tp is torch.dtype:
        return f"{expr} is {name}"
    if tp is int or tp is str or (tp is float and v != 0.0):
        return f"type({expr}) is type({name}) and {expr} == {name}"
    ns[f"{name}_sig"] = _scalar_sig(v)
    return f"scalar_sig({expr}) == {name}_sig"


