"""An op's argument table, declared once: it checks calls and documents the op.

A family lists its public op's arguments as :class:`Arg` rows (name, kind, dtypes, shape,
constraints: the spec's argument table). :func:`check_args` applies the per-argument part of
spec §2.10 (a tensor where a tensor is expected, its dtype, a number where a number is
expected, a string among its choices) and raises :class:`~dsv4kit.errors.KernelInputError`
naming the argument; the reference and every backend run it through the family's input checks,
and the op runs it before choosing a backend, so no bad type reaches ``float()`` or a launch.
Relations between arguments (shapes, strides, lengths) stay in the family's own checks.
"""

from __future__ import annotations

import inspect
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.checks import check_dtype

__all__ = ["REQUIRED", "Arg", "arg_table_markdown", "as_int", "check_args", "normalize_scalar"]

REQUIRED = inspect.Parameter.empty

Kind = Literal["tensor", "int", "float", "bool", "str"]


@dataclass(frozen=True)
class Arg:
    """One argument of an op, as the spec's argument table gives it.

    ``dtypes``: the allowed dtypes of a tensor. ``shape`` and ``rule``: the table's shape and
    constraint columns (documentation; the family's checks enforce them). ``optional``: None
    is accepted. ``choices``: the allowed values of a str/int argument. ``default``: REQUIRED,
    or the op's default. ``keyword_only``: after ``*`` in the op's signature.
    """

    name: str
    kind: Kind
    dtypes: tuple[torch.dtype, ...] = ()
    shape: str = ""
    rule: str = ""
    optional: bool = False
    choices: tuple[Any, ...] = ()
    default: Any = REQUIRED
    keyword_only: bool = False

    def expected(self) -> str:
        """What the argument must be, in words (the ``expected`` part of an error)."""
        if self.kind == "tensor":
            what = "a torch.Tensor"
            if self.dtypes:
                what += " of dtype " + " or ".join(str(d).removeprefix("torch.") for d in self.dtypes)
        elif self.choices:
            what = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            what = {"int": "an int", "float": "a real number", "bool": "a bool", "str": "a str"}[self.kind]
        return what + (" or None" if self.optional else "")

    def check(self, op: str, value: Any) -> Any:
        """``value`` if it fits this row (ints normalized through ``__index__``), else raise."""
        if value is None and self.optional:
            return None
        if self.kind == "tensor":
            # the common case first, two reads and no call (every op call runs this per argument)
            if isinstance(value, torch.Tensor) and (not self.dtypes or value.dtype in self.dtypes):
                return value
            if not isinstance(value, torch.Tensor):
                raise input_error(op, self.name, self.expected(), _got(value))
            if self.dtypes:
                check_dtype(op, self.name, value, *self.dtypes)  # the message every dtype check gives
            return value
        scalar = normalize_scalar(self.kind, value)
        if scalar is None or (self.choices and scalar not in self.choices):
            raise input_error(op, self.name, self.expected(), _got(value))
        return scalar


def _got(value: Any) -> str:
    """What came, for an error message: a scalar's repr (strings quoted), else its type."""
    if value is None or isinstance(value, str | bool | int | float):
        return repr(value)
    return type(value).__name__


#: The kind each plain Python scalar type is as itself: :func:`normalize_scalar` returns such a value
#: unchanged (what its checks below would return), before any of them.
_OWN_KIND = {int: "int", float: "float", str: "str", bool: "bool"}


def normalize_scalar(kind: str, value: Any) -> Any:
    """The Python scalar ``value`` stands for, or None when it is not one of ``kind``."""
    if _OWN_KIND.get(type(value)) == kind:
        return value
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        return None  # a bool is not a number here; a tensor would need a device read
    if kind == "int":
        try:
            return operator.index(value)  # int, numpy integers
        except TypeError:
            return None
    if kind == "float":
        return float(value) if isinstance(value, numbers.Real) else None
    return value if isinstance(value, str) else None


def as_int(value: Any) -> Any:
    """``value`` as a Python int when it is an integer of another type (numpy's, a 0-d index
    array); anything else unchanged, for the check that follows to name it. Bools stay bools."""
    n = normalize_scalar("int", value)
    return value if n is None else n


def check_args(op: str, table: Sequence[Arg], values: Mapping[str, Any]) -> dict[str, Any]:
    """Check each of ``values`` present in ``table``; returns them normalized (same names)."""
    rows = {a.name: a for a in table}
    out = dict(values)
    for name, value in values.items():
        row = rows.get(name)
        if row is not None:
            out[name] = row.check(op, value)
    return out


def arg_table_markdown(table: Sequence[Arg]) -> str:
    """The argument table as markdown (the op's docs and the notebooks show this)."""
    lines = ["| arg | kind | dtype | shape | constraints |", "|---|---|---|---|---|"]
    for a in table:
        dt = " or ".join(str(d).removeprefix("torch.") for d in a.dtypes) or "-"
        kind = a.kind + (" or None" if a.optional else "")
        rule = a.rule or (", ".join(repr(c) for c in a.choices) if a.choices else "")
        if a.default is not REQUIRED:
            rule = (rule + "; " if rule else "") + f"default {a.default!r}"
        lines.append(f"| `{a.name}` | {kind} | {dt} | {a.shape or '-'} | {rule or '-'} |")
    return "\n".join(lines)
