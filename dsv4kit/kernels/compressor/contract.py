"""The call every compressor op makes (K5, K6, K9 in :mod:`dsv4kit.kernels.c4_compress`; K7, K8a,
K8b in :mod:`dsv4kit.kernels.c128_compress`), on the op's operand record.

An op's contract class (:class:`CompressorBase`) names its record type (``Operands``, made from the
op's argument table by :func:`dsv4kit.family.operands.operands` with :class:`CompressorOperands`
as a base) and gets ``__call__`` from it: the op's signature, one record bound per call. The
call (:meth:`CompressorBase.launch_operands`) is the same for all six ops:

1. the family's metadata checks (``check_inputs(kernel, ops) -> (T, eps)``), the backend's device
   rule on the first argument, 16-byte stores into a plain-row cache;
2. with ``debug_checks``, the value checks (:func:`~dsv4kit.kernels.compressor.reference.check_values`);
3. the output (:meth:`CompressorBase.bind_output`: K7 allocates ``out``; the stores write a cache);
4. T == 0: nothing to launch; else the key (``dispatch`` of the record, by name), the
   :class:`LaunchOperands` (the flat state and cache views, strides, eps) and the backend's
   ``launch_args(key, ops, run)``.

Launch plans skip all of it: a planned call never reaches ``__call__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.operands import dispatch_key, kernel_call
from dsv4kit.jit import Immediate, JitKernel
from dsv4kit.kernels.compressor.reference import check_values
from dsv4kit.kernels.encoders.reference import check_aligned
from dsv4kit.kernels.encoders.spec import StoreOperands, cache_operands

__all__ = ["CompressorBase", "CompressorOperands", "LaunchOperands", "flat", "launch_operands", "unit"]

_I32 = 2**31


class CompressorOperands:
    """The compressors' record mixin: an argument an op does not take reads as None (the record's
    fields come first in its MRO), and ``cache`` is the compressed cache (an alias of ``k_cache``
    or ``kv_cache``; None for K7)."""

    __slots__ = ()

    state_cache: torch.Tensor | None = None
    token_to_req: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    out: torch.Tensor | None = None
    kv_slot_mapping: torch.Tensor | None = None
    cos_sin_cache: torch.Tensor | None = None
    k_cache: torch.Tensor | None = None
    kv_cache: torch.Tensor | None = None
    cache: torch.Tensor | None = None
    fp8_scale: torch.Tensor | None = None
    use_fp4_cache: bool | None = None


@dataclass(frozen=True)
class LaunchOperands:
    """What both backends launch with besides the record's own tensors (after the checks).

    ``t``: tokens. ``eps``: the norm's (K5..K9; fp32-rounded by the kernels). ``state``: a 1-D fp32
    view of the state cache from its first block (16-byte aligned, §2.8), ``block_stride``
    elements between state blocks, ``sbs`` rows per block, ``bt_stride`` elements between
    block-table rows (K5, K6, K7, K9). ``store``: where the encoded rows go (K5, K6, K8, K9;
    :class:`~dsv4kit.kernels.encoders.spec.StoreOperands`).
    """

    t: int
    eps: float = 0.0
    state: torch.Tensor | None = None
    block_stride: int = 0
    sbs: int = 0
    bt_stride: int = 0
    store: StoreOperands | None = None


def launch_operands(kernel: str, ops: Any, t: int, eps: float = 0.0) -> LaunchOperands:
    """The :class:`LaunchOperands` of a checked call of ``t`` tokens (``ops``: its record)."""
    if t >= _I32:
        raise input_error(kernel, "positions", f"fewer than {_I32} tokens", t)
    sc = ops.state_cache
    if sc is None:
        return LaunchOperands(t, eps, store=cache_operands(ops.cache, ops.fp8_scale, ops[0]))
    nsb, sbs, row = sc.shape
    span = (nsb - 1) * sc.stride(0) + sbs * row if nsb else 1
    state = sc.as_strided((max(span, 1),), (1,))
    bt = ops.block_table
    store = None if ops.cache is None else cache_operands(ops.cache, ops.fp8_scale, state)
    return LaunchOperands(t, eps, state, sc.stride(0), sbs, bt.stride(0) if bt.dim() else 0, store)


class CompressorBase(JitKernel[Any]):
    """A compressor op's contract: ``Operands`` (its record type) gives ``__call__``; the family
    base gives the checks; each op class its CompileKey, ``dispatch`` and warmup keys; a backend
    class :meth:`launch_args` and the kernel."""

    #: The op's record type (its argument table): set by each op's class.
    Operands: ClassVar[type]
    #: The op name (set from ``Operands``).
    op_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Operands" in vars(cls):
            cls.op_name = cls.Operands.op
            cls.__call__ = kernel_call(cls.Operands)  # type: ignore[method-assign]

    #: The compress ratio, whether windows overlap (C4), the head the op pools or stores.
    ratio: ClassVar[int]
    overlap: ClassVar[bool]
    head: ClassVar[int]

    # ------------------------------------------------------------------ the family's
    @staticmethod
    def check_inputs(kernel: str, ops: Any) -> tuple[int, float]:
        """The metadata checks (host only: every call, before any launch); returns (T, eps)."""
        raise NotImplementedError

    def bind_output(self, ops: Any, t: int) -> tuple[Any, Any]:
        """``(ops, what the call returns)``: the stores write a cache in place and return None."""
        return ops, None

    # ------------------------------------------------------------------ the backend's
    def launch_args(self, key: Any, ops: Any, run: LaunchOperands) -> tuple[Any, ...]:
        """The executor's arguments (per backend)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the call
    def prepare(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, LaunchOperands]:
        """``(key, record, LaunchOperands)`` of a call of the op's arguments after its metadata checks
        (not the device rule: CuTeDSL kernels are examined on the CPU too); nothing is launched.
        ``launch_args(*kernel.prepare(...))`` are the executor's arguments the call would get."""
        ops = self.Operands(*args, **kwargs)
        t, eps = self.check_inputs(self.name, ops)
        ops, _ = self.bind_output(ops, t)
        return dispatch_key(self, ops), ops, launch_operands(self.name, ops, t, eps)

    def launch_operands(self, ops: Any, debug_checks: bool | None) -> Any:
        """The launch spec of one bound call (see the module docstring)."""
        debug = (not self.platform.is_cuda) if debug_checks is None else debug_checks
        t, eps = self.check_inputs(self.name, ops)
        self.check_device(ops.table[0].name, ops[0])
        if ops.kv_cache is not None:
            check_aligned(self.name, "kv_cache", ops.kv_cache, 16)  # the kernels store 16-byte vectors
        if debug:
            check_values(self.name, ops, self.ratio, self.overlap, self.head)
        ops, output = self.bind_output(ops, t)
        if t == 0:
            return Immediate(output)
        key = dispatch_key(self, ops)
        run = launch_operands(self.name, ops, t, eps)
        return key, self.launch_args(key, ops, run), output, _none if output is None else _same


def _none(_: Any) -> None:
    return None


def _same(x: Any) -> Any:
    return x


def unit(x: torch.Tensor, n: int) -> torch.Tensor:
    """A 1-D unit-stride view of the first ``n`` elements (a size-1 tensor may carry any stride)."""
    return x if x.stride(0) == 1 else x.as_strided((n,), (1,))


def flat(x: torch.Tensor, row_stride: int | None = None) -> torch.Tensor:
    """A 1-D unit-stride view of a contiguous tensor, or (``row_stride``) of a 2-D one whose rows
    are ``row_stride`` elements apart (a block table): from its first element to its last."""
    if row_stride is None:
        return x.as_strided((x.numel(),), (1,))
    rows, width = x.shape
    return x.as_strided(((rows - 1) * row_stride + width if rows and width else 0,), (1,))
