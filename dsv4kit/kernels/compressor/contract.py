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

import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import DEFAULT_VARIANT, FamilySpec, Variant
from dsv4kit.family.operands import dispatch_key, kernel_call
from dsv4kit.formats.cache_dtypes import NORM_WEIGHT_DTYPES, normalize_cache_dtype
from dsv4kit.formats.ds_mla import DS_HEAD_DIM
from dsv4kit.jit import Immediate, JitKernel, Like, WarmupChoices, fixed
from dsv4kit.kernels.compressor.reference import check_values
from dsv4kit.kernels.encoders.reference import check_aligned
from dsv4kit.kernels.encoders.spec import StoreOperands, cache_operands

__all__ = ["CompressorBase", "CompressorConfig", "CompressorOperands", "LaunchOperands", "PlainRowStore",
           "compressor_spec", "fixed_fields", "flat", "launch_operands", "specs", "unit"]

_I32 = 2**31


class CompressorConfig:
    """What the C4 and C128 warmup configs share (a mixin of their frozen dataclasses, which
    declare the fields): ``cache_block_size``, ``compress_ratios``, ``cache_dtype`` and
    ``norm_weight_dtype``, their checks, the cache kind and the ops' gates."""

    __slots__ = ()

    cache_block_size: int
    compress_ratios: tuple[int, ...]
    cache_dtype: str
    norm_weight_dtype: str

    def check_common(self) -> None:
        """Refuse a bad common field, naming it and the config class."""
        where = type(self).__name__
        b = self.cache_block_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise input_error(where, "cache_block_size", "an int >= 0", repr(b))
        if not isinstance(self.compress_ratios, Iterable) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in self.compress_ratios
        ):
            raise input_error(where, "compress_ratios", "ints >= 0", repr(self.compress_ratios))
        normalize_cache_dtype(self.cache_dtype, where)  # trap 3: e5m2 and friends raise here
        if self.norm_weight_dtype not in NORM_WEIGHT_DTYPES:
            raise input_error(where, "norm_weight_dtype", f"one of {', '.join(NORM_WEIGHT_DTYPES)}",
                              repr(self.norm_weight_dtype))

    @property
    def kv_kind(self) -> str:
        """``"fp8_ds_mla"``, ``"fp8"`` or ``"bfloat16"`` (the one map of trap 3)."""
        return normalize_cache_dtype(self.cache_dtype, type(self).__name__)

    def stores(self, ratio: int, kind: str) -> bool:
        """Whether a layer of ``ratio`` stores into the main cache of ``kind`` (``"fp8_ds_mla"``, or
        ``"plain"``: bf16 / fp8 rows) under this config."""
        return ratio in self.compress_ratios and (self.kv_kind == "fp8_ds_mla") == (kind == "fp8_ds_mla")

    def plain_cache(self) -> Like:
        """The plain-row cache a K6 / K8b key is traced from: e4m3 for ``fp8``, else bf16."""
        dtype = torch.float8_e4m3fn if self.kv_kind == "fp8" else torch.bfloat16
        return Like(shape=(1, 1, DS_HEAD_DIM), dtype=dtype)


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


class LaunchOperands(NamedTuple):
    """What both backends launch with besides the record's own tensors (after the checks).

    ``t``: tokens. ``eps``: the norm's (K5..K9; fp32-rounded by the kernels). ``state``: a 1-D fp32
    view of the state cache from its first block (16-byte aligned, §2.8), ``block_stride``
    elements between state blocks, ``sbs`` rows per block, ``bt_stride`` elements between
    block-table rows (K5, K6, K7, K9). ``store``: where the encoded rows go (K5, K6, K8, K9;
    :class:`~dsv4kit.kernels.encoders.spec.StoreOperands`). A named tuple: built on every
    full-path call, and a tuple is the cheapest record to build.
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
    #: The argument whose device the backend checks: the first (``state_cache`` or ``compressed_kv``).
    _device_arg: ClassVar[str]
    #: :meth:`launch_args` as the call makes it, ``(key, ops, run)`` (set per class).
    _record_launch_args: ClassVar[Callable[..., tuple[Any, ...]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Operands" in vars(cls):
            cls.op_name = cls.Operands.op
            cls._device_arg = cls.Operands.table[0].name
            cls.__call__ = kernel_call(cls.Operands)  # type: ignore[method-assign]
        found = cls.launch_args  # the call's own: a family may wrap launch_args for other callers
        cls._record_launch_args = getattr(found, "record_form", found)

    #: The compress ratio, whether windows overlap (C4), the head the op pools or stores.
    ratio: ClassVar[int]
    overlap: ClassVar[bool]
    head: ClassVar[int]

    # ------------------------------------------------------------------ the family's
    @staticmethod
    def check_inputs(kernel: str, ops: Any) -> tuple[int, float]:
        """The metadata checks (host only: every call, before any launch); returns (T, eps)."""
        raise NotImplementedError

    #: Whether the call returns a tensor (:meth:`bind_output`); the stores write a cache and return None.
    returns_output: ClassVar[bool] = False

    def bind_output(self, ops: Any, t: int) -> tuple[Any, Any]:
        """``(ops, what the call returns)`` of an op that returns a tensor (K7: ``out[:T]``, ``out``
        allocated when None)."""
        return ops, None

    # ------------------------------------------------------------------ warmup
    #: The family's warmup config class.
    config_type: ClassVar[type]

    @staticmethod
    def applies(config: Any) -> bool:
        """Whether a runtime of ``config`` calls this op (its warmup and registration gate)."""
        raise NotImplementedError

    def key_inputs(self, config: Any) -> dict[str, Any]:
        """The declared inputs ``dispatch`` is traced over (:meth:`get_warmup_keys`): by default the
        config's norm weight dtype and a cos/sin cache; an op adds what else its key reads."""
        weight = Like(shape=(self.head,), dtype=WarmupChoices(NORM_WEIGHT_DTYPES[config.norm_weight_dtype]))
        return dict(rms_norm_weight=weight, cos_sin_cache=Like(shape=(1, 64)))

    def get_warmup_keys(self, config: Any = None) -> list[Any]:
        cfg = config or self.config_type()
        return self.trace(**self.key_inputs(cfg)) if self.applies(cfg) else []

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
        if self.returns_output:
            ops, _ = self.bind_output(ops, t)
        return dispatch_key(self, ops), ops, launch_operands(self.name, ops, t, eps)

    def launch_operands(self, ops: Any, debug_checks: bool | None) -> Any:
        """The launch spec of one bound call (see the module docstring)."""
        name = self.name
        t, eps = self.check_inputs(name, ops)
        self.check_device(self._device_arg, ops[0])
        plain = ops.kv_cache
        if plain is not None:
            check_aligned(name, "kv_cache", plain, 16)  # the kernels store 16-byte vectors
        if (not self.platform.is_cuda) if debug_checks is None else debug_checks:
            check_values(name, ops, self.ratio, self.overlap, self.head)
        output = None
        if self.returns_output:
            ops, output = self.bind_output(ops, t)
        if t == 0:
            return Immediate(output)
        key = dispatch_key(self, ops)
        run = launch_operands(name, ops, t, eps)
        return key, self._record_launch_args(key, ops, run), output, _none if output is None else _same


def fixed_fields(name: str, **values: Any) -> type:
    """A CompileKey base of fixed fields, in order (``head_size=512``: ``head_size: int = fixed(512)``):
    the fields several ops' keys begin with; each key subclasses it and adds its own."""
    fields = [(n, type(v).__name__, fixed(v)) for n, v in values.items()]  # string annotations, as written
    base = dataclasses.make_dataclass(name, fields, frozen=True, kw_only=True)
    base.__module__ = sys._getframe(1).f_globals["__name__"]
    return base


class PlainRowStore:
    """The plain-row stores K6 and K8b (a mixin before their family's base): called where a layer of
    the family's ratio has a bf16 / fp8 main cache; keys traced with that cache (E2 / E3)."""

    __slots__ = ()

    ratio: ClassVar[int]

    @classmethod
    def applies(cls, config: Any) -> bool:
        return config.stores(cls.ratio, "plain")

    def key_inputs(self, config: Any) -> dict[str, Any]:
        return {**super().key_inputs(config), "kv_cache": config.plain_cache()}  # type: ignore[misc]


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


_STORED = "None (the entries of boundary tokens with slots >= 0 are written in place; no other byte changes)"


def compressor_spec(contract: type[CompressorBase], reference: Callable[..., Any], triton: Any, cutedsl: Any,
                    returns: str = _STORED, **extra: Any) -> FamilySpec:
    """The :class:`~dsv4kit.family.FamilySpec` of a compressor op. Its spec id and summary are the first
    paragraph of the contract's docstring (``"K5: <summary>."``); its table is the record's, its
    device the first argument's, ``mutates`` the written arguments (``out`` or the cache);
    ``triton`` / ``cutedsl``: the backend classes (:data:`~dsv4kit.family.spec.KernelRef`);
    ``extra``: the torch op's ``result`` / ``allocates`` (K7)."""
    head = inspect.cleandoc(contract.__doc__ or "").split("\n\n")[0]
    spec_id, _, summary = " ".join(head.split()).partition(": ")
    args = contract.Operands.table
    return FamilySpec(
        name=contract.op_name,
        spec_id=spec_id,
        summary=summary.removesuffix("."),
        op_name=contract.op_name,
        args=args,
        contract=contract,
        variants={DEFAULT_VARIANT: Variant(reference, triton, cutedsl)},
        returns=returns,
        device_arg=args[0].name,
        config_type=contract.config_type,
        folder=contract.__module__.split(".")[2],
        mutates=tuple(a.name for a in args if a.name in ("out", "k_cache", "kv_cache")),
        **extra,
    )


def specs(*each: FamilySpec) -> Mapping[str, FamilySpec]:
    """A family folder's ``SPECS``: op name -> spec."""
    return {s.name: s for s in each}
