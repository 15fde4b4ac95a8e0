"""An op's operands, bound once per call into one record.

An op's argument table (:class:`~dsv4kit.family.schema.Arg` rows) is declared once, in its
family's ``reference.py``. :func:`operands` makes from it, once at import, the op's *record type*:
a named tuple with one field per row, in the table's order, the table's defaults trailing. A call
binds its arguments into one record (the record type called like the op: by position or by
keyword), and everything below takes that record instead of 11-15 positional values: the input
checks, the reference, the kernel's ``dispatch`` (:func:`dispatch_key`) and ``launch_args``, the
case makers. Adding an operand then touches the table and the code that reads it, nothing else.

Three helpers put a record behind a function of the op's signature:

* :func:`kernel_call`: a kernel's ``__call__`` (the table, then ``*, debug_checks``), decorated with
  :func:`~dsv4kit.jit.kernel_launcher`; it binds the record and returns
  ``self.launch_operands(record, debug_checks)``. Launch plans never reach it (they skip
  ``__call__``), and a full-path call pays one tuple construction where it built a dict before.
* :func:`with_operands`: a public function (a reference) whose body takes the record; its
  signature, name and docs are the table's and the caller's, so ``help()`` and ``inspect`` show the
  op's arguments.
* :func:`dispatch_key`: ``kernel.dispatch`` of a record, its parameters read by name (the
  contract's rule: ``dispatch`` reads op arguments by name only).

A record is a tuple: fields read as attributes (``ops.state_cache``) at the cost of a tuple index;
``ops._replace(out=...)`` gives a record with other values; ``ops._asdict()`` the op's keywords.
A family adds properties or methods common to its ops through ``bases`` (mixins with
``__slots__ = ()``), and names a field by another name through ``aliases`` (K6's ``kv_cache`` is
the compressors' ``cache``): an alias is the field's own accessor, no call in between.
"""

from __future__ import annotations

import collections
import inspect
import operator
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any, ClassVar, TypeVar

import torch

from dsv4kit.errors import ContractError
from dsv4kit.family.schema import REQUIRED, Arg
from dsv4kit.jit import kernel_launcher
from dsv4kit.jit.launcher import Immediate, as_launch_spec, launch_spec

__all__ = ["OperandRecord", "dispatch_key", "kernel_call", "launch_record", "operands", "with_operands"]

R = TypeVar("R")


class OperandRecord:
    """What every record type has besides its fields (a mixin of the named tuple :func:`operands`
    makes; the fields come first in its MRO, so a mixin's class attribute never hides one)."""

    __slots__ = ()

    #: The op the record binds the arguments of.
    op: ClassVar[str]
    #: The op's argument table, in field order.
    table: ClassVar[tuple[Arg, ...]]
    #: The op's signature (the table's), for functions that take the op's arguments.
    signature: ClassVar[inspect.Signature]
    #: The subclass :func:`~dsv4kit.family.plans.first_sight` builds: values a call plan proved.
    _proved: ClassVar[type]
    #: The tensor fields' names, and their values of a record, in table order.
    _tensor_names: ClassVar[tuple[str, ...]]
    _tensor_values: ClassVar[Callable[[Any], tuple[Any, ...]]]

    def checked(self, kernel: str) -> Any:
        """This record after the table's per-argument checks (spec §2.10), values normalized
        (ints through ``__index__``, floats to float); raises KernelInputError naming the first
        bad argument, in table order, and ``kernel``."""
        return tuple.__new__(type(self), map(Arg.check, self.table, repeat(kernel), self))

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """The tensor arguments by name (an optional one may be None)."""
        return dict(zip(self._tensor_names, self._tensor_values(self), strict=True))


#: An argument's annotation in a signature made from its row (strings, as under postponed evaluation).
_ANNOTATION = {"tensor": "torch.Tensor", "int": "int", "float": "float", "bool": "bool", "str": "str"}


def operands(op: str, table: Sequence[Arg], *bases: type, aliases: Mapping[str, str] | None = None,
             module: str | None = None) -> type:
    """The record type of ``op``: one field per row of ``table`` (see the module docstring).

    ``bases``: mixins (``__slots__ = ()``) giving the family's properties; ``aliases``: another
    name -> field. The type is named after the op (``c4_compress_ds_mla`` ->
    ``C4CompressDsMlaOperands``) and lives in ``module`` (default: the caller's).
    """
    names = [a.name for a in table]
    defaults = [a.default for a in table if a.default is not REQUIRED]
    if any(a.default is REQUIRED for a in table[len(table) - len(defaults):]):
        raise ContractError(f"operands({op}): the rows with a default must come last, as in the op's "
                            f"signature: {names}")
    title = "".join(part.title() for part in op.split("_")) + "Operands"
    fields = collections.namedtuple(f"_{title}Fields", names, defaults=defaults or None)  # type: ignore[misc]
    ns: dict[str, Any] = {
        "__slots__": (),
        "__doc__": f"The bound arguments of ``{op}`` (:mod:`dsv4kit.family.operands`).",
        "__module__": module or inspect.currentframe().f_back.f_globals["__name__"],  # type: ignore[union-attr]
        "op": op,
        "table": tuple(table),
        "signature": inspect.Signature([
            inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY if a.keyword_only
                              else inspect.Parameter.POSITIONAL_OR_KEYWORD, default=a.default,
                              annotation=_ANNOTATION[a.kind] + (" | None" if a.optional else ""))
            for a in table]),
    }
    tensor_at = [i for i, a in enumerate(table) if a.kind == "tensor"]
    ns["_tensor_names"] = tuple(names[i] for i in tensor_at)
    ns["_tensor_values"] = staticmethod(lambda r: tuple(r[i] for i in tensor_at))  # noqa: E731
    if len(tensor_at) > 1:
        ns["_tensor_values"] = staticmethod(operator.itemgetter(*tensor_at))
    for alias, name in (aliases or {}).items():
        if name not in names or alias in names:
            raise ContractError(f"operands({op}): alias {alias!r} -> {name!r}: not a field, or a field")
        ns[alias] = fields.__dict__[name]
    record = type(title, (fields, *bases, OperandRecord), ns)
    record._proved = type(f"{title}Proved", (record,), {  # type: ignore[attr-defined]
        "__slots__": (), "__module__": record.__module__, "checked": _proved_checked,
        "_make": classmethod(lambda cls, values: tuple.__new__(record, values)),
        "__doc__": f"A :class:`{title}` whose values the op's class guard proved (see ``checked``)."})
    return record


def _proved_checked(self: Any, kernel: str) -> Any:
    """The record itself: its values were normalized when it was built, and the table's checks
    (a tensor of an allowed dtype, a scalar of the row's kind, a choice) are proved for them by the
    guard or signature of the call plan that built it (exact tensor types and dtypes, exact scalar
    types, choice values, all equal to those of a call that passed them). A record made from it
    (``_replace``, ``_make``) is a plain one, checked again."""
    return self


def with_operands(record: type, body: Callable[[Any], R], doc: str, returns: str = "None", name: str = "",
                  module: str | None = None) -> Callable[..., R]:
    """A function of the op's signature (returning ``returns``, an annotation) that binds ``record``
    and returns ``body(record)``: the op's reference (``name`` by default ``<op>_reference``)."""

    def bound(*args: Any, **kwargs: Any) -> R:
        return body(record(*args, **kwargs))

    bound.__name__ = bound.__qualname__ = name or f"{record.op}_reference"
    bound.__doc__ = doc
    bound.__module__ = module or inspect.currentframe().f_back.f_globals["__name__"]  # type: ignore[union-attr]
    bound.__signature__ = record.signature.replace(return_annotation=returns)  # type: ignore[attr-defined]
    bound.__wrapped__ = body  # type: ignore[attr-defined]  # its source: what the function computes
    return bound


def kernel_call(record: type, doc: str = "") -> Callable[..., Any]:
    """A kernel's ``__call__`` for the op ``record`` binds (its table, then ``*, debug_checks``),
    launched by :func:`~dsv4kit.jit.kernel_launcher`: it returns
    ``self.launch_operands(record(*args, **kwargs), debug_checks)``, the launch spec."""
    def __call__(self: Any, *args: Any, debug_checks: bool | None = None, **kwargs: Any) -> Any:
        return self.launch_operands(record(*args, **kwargs), debug_checks)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              *record.signature.parameters.values(),
              inspect.Parameter("debug_checks", inspect.Parameter.KEYWORD_ONLY, default=None)]
    __call__.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    __call__.__doc__ = doc or (f"Launch ``{record.op}`` on the arguments of its table (returns what the op "
                               "returns); ``debug_checks`` (default: on under the CPU interpreter, off on a "
                               "GPU) also runs the value checks that read device memory.")
    launcher = kernel_launcher(__call__)
    launcher.record = record  # type: ignore[attr-defined]
    launcher.launch_record = launch_record  # type: ignore[attr-defined]
    return launcher


def launch_record(kernel: Any, ops: Any, debug_checks: bool | None) -> Any:
    """A :func:`kernel_call` kernel's full path for a call bound into ``ops``: its ``__call__``'s,
    without binding the arguments or looking up a plan (the op layer calls it for sizes it never
    saw, where no plan can exist), nor making one."""
    spec = as_launch_spec(kernel.launch_operands(ops, debug_checks), type(kernel).__name__)
    if isinstance(spec, Immediate):
        return spec.value
    return launch_spec(kernel, spec)


_DISPATCH_READS: dict[type, tuple[Callable[[Any], Any], bool]] = {}


def dispatch_key(kernel: Any, record: Any) -> Any:
    """``kernel.dispatch`` of the op arguments in ``record``, its parameters read by name."""
    found = _DISPATCH_READS.get(type(kernel))
    if found is None:
        params = type(kernel)._dispatch_program.params
        found = _DISPATCH_READS[type(kernel)] = (operator.attrgetter(*params), len(params) > 1)
    read, several = found
    return kernel.dispatch(*read(record)) if several else kernel.dispatch(read(record))
