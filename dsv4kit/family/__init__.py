"""Kernel families: the one spec per family that the op, warmup, the model and the docs read.

See :mod:`dsv4kit.family.spec` for the layout of a family folder and what a spec holds, and
``docs/adding_a_family.md`` for the steps to add one.
"""

from dsv4kit.family.calls import Call, TensorSpec
from dsv4kit.family.schema import REQUIRED, Arg, arg_table_markdown, check_args
from dsv4kit.family.spec import DEFAULT_VARIANT, FamilySpec, Variant, backend_modules

__all__ = [
    "DEFAULT_VARIANT",
    "REQUIRED",
    "Arg",
    "Call",
    "FamilySpec",
    "TensorSpec",
    "Variant",
    "arg_table_markdown",
    "backend_modules",
    "check_args",
]
