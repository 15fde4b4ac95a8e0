"""The launch vocabulary of Triton kernels and Triton's specialization of a call.

The parameter kinds a :class:`~dsv4kit.backends.triton.TritonJitKernel` declares (``Ptr``,
``Runtime``, ``IntClass``, ``FromKey``, ``Const``), the specialization classes of ints, fake
pointers for warmup, and the binder that specializes a call as ``JITFunction.run`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from dsv4kit.errors import input_error

# --------------------------------------------------------------------------- parameter kinds


@dataclass(frozen=True)
class Ptr:
    """A tensor argument of dtype ``dtype`` (a torch dtype, or a key field holding one or its name)."""

    dtype: torch.dtype | str
    aligned: bool = True


@dataclass(frozen=True)
class Runtime:
    """A per-call scalar Triton does not specialize on (int: ``do_not_specialize`` + annotation)."""


@dataclass(frozen=True)
class IntClass:
    """A runtime int whose Triton specialization class is key field ``field``."""

    field: str


@dataclass(frozen=True)
class FromKey:
    """A value derived from the key: field name, or a function of the key."""

    field: str | Callable[[Any], Any]


#: The constexpr naming how a kernel rounds fp32 -> bf16 / e4m3: the GPU's casts (True, what every
#: compile gets) or integer recipes giving the same bits (False: what every interpreted run gets).
HW_CVT = "HW_CVT"


@dataclass(frozen=True)
class Const:
    """A fixed value."""

    value: Any


Param = Ptr | Runtime | IntClass | FromKey | Const

#: A representative value of each specialization class (what warmup passes).
INT_CLASS_VALUES: dict[str, int] = {
    "one": 1,
    "div16": 16,
    "other": 17,
    "i64_div16": 2**32,
    "i64_other": 2**32 + 1,
}


def int_class(value: int) -> str:
    """Triton's specialization class of an int argument (triton 3.6).

    ``== 1`` becomes a constexpr, ``% 16 == 0`` gets the divisibility attribute, and values
    outside int32 are passed as i64. Values at or above 2**63 (u64) are not supported.
    """
    if not -(2**63) <= value < 2**63:
        raise input_error("int_class", "value", "a value in [-2**63, 2**63)", value)
    wide = not -(2**31) <= value < 2**31
    if value == 1:
        return "one"
    cls = "div16" if value % 16 == 0 else "other"
    return f"i64_{cls}" if wide else cls


class FakePointer:
    """A pointer argument without storage: Triton reads only ``dtype`` and ``data_ptr()``.

    Address 0 is 16-byte aligned, which is the class a validated (aligned) tensor falls in.
    """

    def __init__(self, dtype: torch.dtype, aligned: bool = True) -> None:
        self.dtype = dtype
        self._addr = 0 if aligned else 8

    def data_ptr(self) -> int:
        return self._addr

    def __repr__(self) -> str:
        return f"FakePointer({self.dtype}, aligned={self._addr == 0})"


@dataclass(frozen=True)
class TritonVariant:
    """What Triton compiles for one call: the dsv4kit key and Triton's specialization of it.

    The monitor reports a specialization that differs from the warmed one with this type, so
    its diagnosis shows the exact argument whose class changed.
    """

    key: Any
    specialization: str


# --------------------------------------------------------------------------- specialization


@functools.cache
def _backend(capability: int) -> Any:
    return make_backend(GPUTarget("cuda", capability, 32))


@functools.cache
def _binder(fn: JITFunction, capability: int) -> Callable[..., Any]:
    # Triton's own argument binder: it computes the specialization exactly as JITFunction.run.
    return create_function_from_signature(fn.signature, fn.params, _backend(capability))


def _run_kwargs(fn: JITFunction, options: Mapping[str, Any]) -> dict[str, Any]:
    # JITFunction.run adds these two before binding; they are part of Triton's cache key.
    kwargs = dict(options)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    return kwargs


def _describe(fn: JITFunction, specialization: list[tuple[str, Any]], options: Mapping[str, Any]) -> str:
    """Compact text of a specialization: ``x_ptr:*bf16:D n:i32 BLOCK=128 | num_warps=4 ...``."""
    parts = []
    for p, (ty, attr) in zip(fn.params, specialization, strict=True):
        if ty == "constexpr":
            parts.append(f"{p.name}={attr}")
        else:
            parts.append(f"{p.name}:{ty}" + (f":{attr}" if attr else ""))
    opts = " ".join(f"{k}={v}" for k, v in options.items() if k not in ("debug", "instrumentation_mode"))
    return " ".join(parts) + (f" | {opts}" if opts else "")


def _describe_hook(fn: JITFunction, compile_info: Mapping[str, Any]) -> str:
    """The same text, rebuilt from what Triton hands its compile hooks."""
    signature = compile_info["signature"]
    constants = {k[0] if isinstance(k, tuple) else k: v for k, v in compile_info["constants"].items()}
    attrs = compile_info["configs"][0] if compile_info.get("configs") else {}
    spec = []
    for i, p in enumerate(fn.params):
        ty = signature[p.name]
        if ty == "constexpr":
            v = constants.get(i, constants.get(p.name))
            spec.append(("constexpr", getattr(v, "value", v)))
        else:
            a = attrs.get((i,), [])
            spec.append((ty, "D" if any(x[0] == "tt.divisibility" for x in a) else ""))
    opts = {"num_warps": compile_info["num_warps"], "enable_fp_fusion": compile_info["enable_fp_fusion"]}
    return _describe(fn, spec, opts)
