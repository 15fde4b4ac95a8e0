"""Warmup key spaces: declared inputs, and the tracer that turns ``dispatch`` into keys.

``dispatch`` is written as plain Python: a few assignments and one
``return self.CompileKey(...)``.  The tracer parses that source once (when the
kernel class is defined), finds which parameters each key field reads, and
evaluates the fields over the product of the declared inputs.  Fields that read
disjoint inputs are evaluated independently and their values combined, so a
field that reads ``num_tokens`` over 65 536 values costs 65 536 evaluations of
that field, not of the product with every other axis.

Because the tracer re-uses ``dispatch``'s own expressions (compiled from its
own source, with its own globals), the traced key for given inputs is the key
``dispatch`` returns for them.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from dsv4kit.errors import ContractError

__all__ = [
    "DispatchProgram",
    "Like",
    "Strides",
    "TraceResult",
    "WarmupChoices",
    "WarmupIntRange",
    "ZippedInputs",
    "parse_dispatch",
    "trace_dispatch",
    "zip_inputs",
]

SUPPORTED_SYNTAX = (
    "dispatch may contain: plain assignments `name = expr`, one final `return CompileKey(...)` "
    "(or self.CompileKey / cls.CompileKey), and expressions built from names, constants, "
    "attributes, subscripts, calls with positional/keyword arguments, arithmetic, comparisons, "
    "`and`/`or`/`not`, conditional expressions `a if c else b`, tuples and lists"
)

_ALLOWED_EXPR_NODES = (
    ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.Call, ast.keyword,
    ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List,
    ast.Load, ast.Store, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)


# --------------------------------------------------------------------------- declared inputs


@dataclass(frozen=True)
class WarmupIntRange:
    """Integers from ``start`` (inclusive) to ``stop`` (exclusive), like ``range``.

    Either a constant ``step`` or an ``advance`` function (``advance=lambda v: 2 * v``
    gives powers of two) moves from one value to the next.
    """

    start: int
    stop: int
    step: int | None = None
    advance: Callable[[int], int] | None = None

    def __post_init__(self) -> None:
        if self.step is not None and self.advance is not None:
            raise ValueError("WarmupIntRange: give step or advance, not both")
        if self.step is not None and self.step <= 0:
            raise ValueError(f"WarmupIntRange: step: expected a positive int, got {self.step!r}")

    def __iter__(self) -> Iterator[int]:
        if self.advance is None:
            yield from range(self.start, self.stop, self.step or 1)
            return
        v = self.start
        while v < self.stop:
            yield v
            nxt = self.advance(v)
            if nxt <= v:
                raise ValueError(f"WarmupIntRange: advance({v}) = {nxt} does not increase")
            v = nxt


class WarmupChoices(tuple):
    """An explicit set of values for one input: ``WarmupChoices(torch.float32, torch.bfloat16)``."""

    def __new__(cls, *values: Any) -> WarmupChoices:
        if not values:
            raise ValueError("WarmupChoices: expected at least one value, got none")
        return super().__new__(cls, values)

    def __repr__(self) -> str:
        return f"WarmupChoices{tuple.__repr__(self)}"


@dataclass(frozen=True)
class ZippedInputs:
    """Inputs that move in lockstep: each row gives one value to every name."""

    names: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def zip_inputs(*rows: Mapping[str, Any]) -> ZippedInputs:
    """Declare lockstep inputs: ``zip_inputs(dict(bs=256, g=True), dict(bs=64, g=False))``."""
    if not rows:
        raise ValueError("zip_inputs: expected at least one row, got none")
    names = tuple(rows[0])
    for i, row in enumerate(rows):
        if tuple(row) != names:
            raise ValueError(f"zip_inputs: row {i}: expected the names {list(names)}, got {list(row)}")
    return ZippedInputs(names, tuple(tuple(row[n] for n in names) for row in rows))


class Strides(tuple):
    """A tuple of strides that is also callable like ``Tensor.stride``: ``s()`` or ``s(dim)``."""

    def __call__(self, dim: int | None = None) -> Any:
        return tuple(self) if dim is None else self[dim]


class Like(SimpleNamespace):
    """A stand-in for a tensor (or any object) whose attributes dispatch reads.

    Attributes may themselves be axes: ``Like(shape=(WarmupIntRange(1, 8193), 64, 128),
    dtype=torch.bfloat16)`` expands to 8192 objects with concrete shapes. A ``stride`` tuple
    is callable as on a tensor (``x.stride(0)``), and may hold axes too.
    """

    def __init__(self, **attrs: Any) -> None:
        stride = attrs.get("stride")
        if isinstance(stride, tuple) and not _has_axis(stride):
            attrs["stride"] = Strides(stride)
        super().__init__(**attrs)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, _hashable(v)) for k, v in vars(self).items())))

    def __eq__(self, other: object) -> bool:
        return type(other) is Like and vars(self) == vars(other)

    # Tensor-style accessors, so dispatch code may call x.dim() / x.size(i) on a stand-in.
    def dim(self) -> int:
        return len(self.shape)

    def size(self, i: int | None = None) -> Any:
        return tuple(self.shape) if i is None else self.shape[i]


def _has_axis(values: tuple) -> bool:
    return any(isinstance(v, WarmupIntRange | WarmupChoices | list) for v in values)


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _expand(value: Any) -> list[Any]:
    """All concrete values one declared input stands for (axes inside ``Like`` included)."""
    if isinstance(value, Like):
        names = list(vars(value))
        per_attr = [_expand_attr(getattr(value, n)) for n in names]
        return [Like(**dict(zip(names, combo, strict=True))) for combo in itertools.product(*per_attr)]
    if isinstance(value, WarmupIntRange | WarmupChoices | list):
        return list(value)
    if isinstance(value, tuple):
        return list(value)
    return [value]


def _expand_attr(value: Any) -> list[Any]:
    # Inside a Like, a plain tuple is a shape, not a set of choices: expand its elements.
    if isinstance(value, tuple) and not isinstance(value, WarmupChoices):
        return [tuple(c) for c in itertools.product(*(_expand_attr(v) for v in value))]
    if isinstance(value, WarmupIntRange | WarmupChoices | list):
        return list(value)
    return [value]


# --------------------------------------------------------------------------- parsing dispatch


@dataclass(frozen=True)
class DispatchProgram:
    """The parsed form of one ``dispatch`` method."""

    func: Callable[..., Any]
    params: tuple[str, ...]            # without self
    defaults: Mapping[str, Any]
    self_name: str | None
    assigns: tuple[tuple[str, ast.expr], ...]
    fields: tuple[tuple[str, ast.expr], ...]   # key field -> expression
    field_reads: Mapping[str, frozenset[str]]  # key field -> parameters it reads
    filename: str
    first_line: int

    @property
    def reads(self) -> frozenset[str]:
        """Parameters that at least one key field reads."""
        return frozenset().union(*self.field_reads.values()) if self.field_reads else frozenset()


def _reject(node: ast.AST, source_lines: list[str], where: str, what: str) -> ContractError:
    line = source_lines[node.lineno - 1].strip() if hasattr(node, "lineno") else "?"
    return ContractError(f"{where}: unsupported syntax in dispatch ({what}): `{line}`. {SUPPORTED_SYNTAX}")


def _check_expr(expr: ast.expr, lines: list[str], where: str) -> None:
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg is None:
                    raise _reject(node, lines, where, "a **kwargs call")
            if any(isinstance(a, ast.Starred) for a in node.args):
                raise _reject(node, lines, where, "a *args call")
        if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            raise _reject(node, lines, where, "a comprehension")
        if isinstance(node, ast.Set | ast.Dict):
            raise _reject(node, lines, where, "a set or dict literal")
        if isinstance(node, ast.Lambda | ast.NamedExpr | ast.Await | ast.Yield | ast.YieldFrom):
            raise _reject(node, lines, where, type(node).__name__)
        if not isinstance(node, _ALLOWED_EXPR_NODES):
            raise _reject(node, lines, where, type(node).__name__)


def _names(expr: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


def _is_key_ctor(call: ast.expr) -> bool:
    if not isinstance(call, ast.Call):
        return False
    f = call.func
    return (isinstance(f, ast.Name) and f.id == "CompileKey") or (
        isinstance(f, ast.Attribute) and f.attr == "CompileKey"
    )


def parse_dispatch(func: Callable[..., Any], key_fields: Sequence[str], where: str) -> DispatchProgram:
    """Parse ``func`` (a ``dispatch`` function) into a :class:`DispatchProgram`.

    Raises :class:`ContractError` quoting the offending line when the body uses syntax
    outside the supported subset, or when the return is not one ``CompileKey(...)`` call.
    """
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise ContractError(f"{where}: cannot read the source of dispatch ({exc})") from exc
    lines = source.splitlines()
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise ContractError(f"{where}: dispatch must be a plain `def`, got {type(fdef).__name__}")
    args = fdef.args
    if args.vararg or args.kwarg or args.posonlyargs:
        raise ContractError(
            f"{where}: dispatch must take named parameters only (no *args, **kwargs, or `/`): "
            f"`{lines[0].strip()}`"
        )
    names = [a.arg for a in args.args] + [a.arg for a in args.kwonlyargs]
    sig = inspect.signature(func)
    self_name = names[0] if names and names[0] in ("self", "cls") else None
    params = tuple(n for n in names if n != self_name)
    defaults = {
        n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty
    }

    body = list(fdef.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstring
    returns = [n for n in ast.walk(fdef) if isinstance(n, ast.Return)]
    if len(returns) != 1:
        raise ContractError(
            f"{where}: dispatch must have exactly one return, found {len(returns)}. {SUPPORTED_SYNTAX}"
        )
    assigns: list[tuple[str, ast.expr]] = []
    for stmt in body[:-1]:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            _check_expr(stmt.value, lines, where)
            assigns.append((stmt.targets[0].id, stmt.value))
            continue
        kind = {
            ast.If: "a statement `if` (use `a if cond else b`)",
            ast.For: "a loop", ast.While: "a loop", ast.Return: "several returns",
        }.get(type(stmt), f"a {type(stmt).__name__} statement")
        raise _reject(stmt, lines, where, kind)
    last = body[-1] if body else None
    if not isinstance(last, ast.Return) or last.value is None or not _is_key_ctor(last.value):
        node = last or fdef
        raise _reject(node, lines, where, "the last statement must be `return self.CompileKey(...)`")
    call = last.value
    assert isinstance(call, ast.Call)
    _check_expr(call, lines, where)

    fields: dict[str, ast.expr] = {}
    if len(call.args) > len(key_fields):
        raise _reject(call, lines, where, f"CompileKey takes {len(key_fields)} fields")
    for name, arg in zip(key_fields, call.args, strict=False):
        fields[name] = arg
    for kw in call.keywords:
        assert kw.arg is not None
        if kw.arg not in key_fields:
            raise _reject(call, lines, where, f"CompileKey has no field {kw.arg!r}")
        if kw.arg in fields:
            raise _reject(call, lines, where, f"field {kw.arg!r} given twice")
        fields[kw.arg] = kw.value

    # Resolve which parameters each field reads, through the assignments.
    reads_of_local: dict[str, set[str]] = {}
    for name, expr in assigns:
        r: set[str] = set()
        for n in _names(expr):
            r |= reads_of_local.get(n, {n} if n in params else set())
        reads_of_local[name] = r
    field_reads = {}
    for fname, expr in fields.items():
        r = set()
        for n in _names(expr):
            r |= reads_of_local.get(n, {n} if n in params else set())
        field_reads[fname] = frozenset(r)

    return DispatchProgram(
        func=func, params=params, defaults=defaults, self_name=self_name, assigns=tuple(assigns),
        fields=tuple(fields.items()), field_reads=field_reads,
        filename=inspect.getsourcefile(func) or "<dispatch>", first_line=fdef.lineno,
    )


def _field_evaluator(prog: DispatchProgram, fnames: Sequence[str], inputs: Sequence[str]) -> Callable:
    """Compile ``lambda self, *inputs: (field values...)`` from dispatch's own expressions."""
    body: list[ast.stmt] = []
    # Keep the assignments in source order; unused ones are cheap, but skip them so that a
    # field group never evaluates an expression that reads another group's inputs.
    wanted = set().union(*(_names(dict(prog.fields)[f]) for f in fnames)) if fnames else set()
    for name, expr in reversed(prog.assigns):
        if name in wanted:
            wanted |= _names(expr)
    for name, expr in prog.assigns:
        if name in wanted:
            body.append(ast.Assign(targets=[ast.Name(name, ast.Store())], value=expr))
    ret = ast.Tuple([dict(prog.fields)[f] for f in fnames], ast.Load())
    body.append(ast.Return(ret))
    arg_names = [prog.self_name or "_self"] + list(inputs)
    extra = {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}
    fn = ast.FunctionDef(
        name="_traced_fields",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in arg_names], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=body, decorator_list=[], returns=None, **extra,
    )
    module = ast.Module([fn], type_ignores=[])
    ast.fix_missing_locations(module)
    namespace: dict[str, Any] = {}
    code = compile(module, prog.filename, "exec")
    globs = dict(getattr(prog.func, "__globals__", {}))
    exec(code, globs, namespace)  # noqa: S102 - dispatch's own, already-vetted source
    return namespace["_traced_fields"]


# --------------------------------------------------------------------------- tracing


@dataclass
class TraceResult:
    """Keys traced from a dispatch, with what the tracer did to the inputs."""

    keys: list[Any]
    used_inputs: tuple[str, ...]
    dropped_inputs: tuple[str, ...]
    evaluations: int = 0
    groups: list[tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def trace_dispatch(
    prog: DispatchProgram,
    key_cls: type,
    *zips: ZippedInputs,
    self_obj: Any = None,
    when: Callable[..., bool] | None = None,
    where: str = "dispatch",
    **inputs: Any,
) -> TraceResult:
    """Evaluate ``prog``'s key over the product of declared ``inputs``.

    ``zips`` are lockstep axes from :func:`zip_inputs`; ``when`` is a predicate whose
    parameter names are inputs: combinations where it is false are skipped.
    """
    axes: dict[str, list[Any]] = {}
    zipped_of: dict[str, ZippedInputs] = {}
    for z in zips:
        if not isinstance(z, ZippedInputs):
            raise TypeError(f"{where}: positional warmup inputs must come from zip_inputs(), got {z!r}")
        for n in z.names:
            if n in zipped_of:
                raise ValueError(f"{where}: input {n!r} appears in two zip_inputs() groups")
            zipped_of[n] = z
    for n in inputs:
        if n in zipped_of:
            raise ValueError(f"{where}: input {n!r} is given both in zip_inputs() and as a keyword")
    all_names = set(inputs) | set(zipped_of)
    unknown = sorted(all_names - set(prog.params))
    if unknown:
        raise ValueError(
            f"{where}: warmup input(s) {unknown} are not parameters of dispatch; "
            f"dispatch takes {list(prog.params)}"
        )
    when_reads: frozenset[str] = frozenset()
    if when is not None:
        when_reads = frozenset(inspect.signature(when).parameters)
        bad = sorted(when_reads - all_names)
        if bad:
            raise ValueError(f"{where}: `when` reads {bad}, which are not declared warmup inputs")

    reads = prog.reads
    for fname, r in prog.field_reads.items():
        for n in r:
            if n not in all_names and n not in prog.defaults:
                raise ValueError(
                    f"{where}: key field {fname!r} reads {n!r}, which has no warmup input and no default"
                )

    # An "atom" is one independent axis: a keyword input, or a whole zip group.
    atoms: list[tuple[str, ...]] = []
    for n in inputs:
        axes[n] = _expand(inputs[n])
        atoms.append((n,))
    for z in dict.fromkeys(zipped_of.values()):
        atoms.append(z.names)

    def atom_of(name: str) -> tuple[str, ...] | None:
        for a in atoms:
            if name in a:
                return a
        return None

    # Group fields (and the `when` predicate) that share atoms: union-find over atoms.
    parent: dict[tuple[str, ...], tuple[str, ...]] = {a: a for a in atoms}

    def find(a: tuple[str, ...]) -> tuple[str, ...]:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def atoms_read(names: Iterable[str]) -> list[tuple[str, ...]]:
        return [a for a in dict.fromkeys(atom_of(n) for n in names) if a is not None]

    for r in [*prog.field_reads.values(), when_reads]:
        ats = atoms_read(r)
        for a in ats[1:]:
            parent[find(a)] = find(ats[0])

    used_atoms = {a for a in atoms if any(n in reads or n in when_reads for n in a)}
    groups: dict[tuple[str, ...], list[str]] = {}
    constant_fields: list[str] = []
    for fname, r in prog.field_reads.items():
        ats = atoms_read(r)
        if ats:
            groups.setdefault(find(ats[0]), []).append(fname)
        else:
            constant_fields.append(fname)
    if when is not None and when_reads:
        groups.setdefault(find(atoms_read(when_reads)[0]), [])

    evaluations = 0
    group_values: list[tuple[list[str], list[tuple]]] = []
    group_info: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for root, fnames in groups.items():
        members = [a for a in atoms if find(a) == root and a in used_atoms]
        names = [n for a in members for n in a]
        reads_here = set().union(*(prog.field_reads[f] for f in fnames)) if fnames else set()
        defaulted = sorted(n for n in reads_here if n not in all_names)
        evaluator = _field_evaluator(prog, fnames, names + defaulted)
        default_vals = [prog.defaults[n] for n in defaulted]
        per_atom = [
            [tuple(row) for row in zipped_of[a[0]].rows] if a[0] in zipped_of else [(v,) for v in axes[a[0]]]
            for a in members
        ]
        seen: dict[tuple, None] = {}
        for combo in itertools.product(*per_atom):
            values = [v for part in combo for v in part]
            if when is not None and when_reads & set(names):
                env = dict(zip(names, values, strict=True))
                if not when(**{n: env[n] for n in when_reads}):
                    continue
            evaluations += 1
            seen.setdefault(tuple(evaluator(self_obj, *values, *default_vals)), None)
        group_values.append((fnames, list(seen)))
        group_info.append((tuple(names), tuple(fnames)))

    if constant_fields:
        defaulted = sorted(set().union(*(prog.field_reads[f] for f in constant_fields)))
        evaluator = _field_evaluator(prog, constant_fields, defaulted)
        values = tuple(evaluator(self_obj, *(prog.defaults[n] for n in defaulted)))
        group_values.append((constant_fields, [values]))
        evaluations += 1

    keys: dict[Any, None] = {}
    for combo in itertools.product(*(vals for _, vals in group_values)):
        kwargs: dict[str, Any] = {}
        for (fnames, _), vals in zip(group_values, combo, strict=True):
            kwargs.update(zip(fnames, vals, strict=True))
        keys.setdefault(key_cls(**kwargs), None)

    used = tuple(n for a in atoms if a in used_atoms for n in a)
    dropped = tuple(n for a in atoms if a not in used_atoms for n in a)
    return TraceResult(list(keys), used, dropped, evaluations, group_info)
