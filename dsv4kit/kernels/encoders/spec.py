"""The encoder store hooks E1..E5 (spec §2.9): their contracts, the operands both backends launch
with, and one family spec per hook.

Each hook's CompileKey holds only what changes the generated code: the format (E2 bf16 or E3
e4m3 for plain rows, E4 FP8 or E5 MXFP4 for the indexer); the row width is a fixed field. T,
kv_bs and the page stride are runtime values, so packed page pools hit the same compile. The
hooks are test hooks, not warmed in production: their default config warms every format (what
a test session or a notebook calls), and they have no model hooks.

Every backend has one encode routine per encoder, chosen by the encoder id :data:`E1` ..
:data:`E5` (a compile-time constant); the store kernels here and the compressors of
:mod:`dsv4kit.kernels.c4_compress` call the same routine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.family import FamilySpec, Variant, backend_modules
from dsv4kit.family.operands import dispatch_key, kernel_call
from dsv4kit.family.spec import KernelRef
from dsv4kit.formats.ds_mla import DS_HEAD_DIM
from dsv4kit.formats.indexer_cache import IDX_HEAD_DIM
from dsv4kit.jit import Immediate, JitKernel, fixed
from dsv4kit.kernels.encoders.reference import (
    ARGS,
    OPERANDS,
    check_store_inputs,
    check_store_values,
    store_rows_ds_reference,
    store_rows_indexer_reference,
    store_rows_plain_reference,
)

__all__ = [
    "E1",
    "E2",
    "E3",
    "E4",
    "E5",
    "ENCODER_NAMES",
    "SPECS",
    "StoreOperands",
    "StoreRowsBase",
    "StoreRowsConfig",
    "StoreRowsDsBase",
    "StoreRowsIndexerBase",
    "StoreRowsPlainBase",
    "cache_operands",
    "key_encoder",
]

#: Encoder ids (spec §2.9): the compile-time constant that picks the encode routine.
E1, E2, E3, E4, E5 = 1, 2, 3, 4, 5
ENCODER_NAMES = {E1: "enc_ds", E2: "enc_row_bf16", E3: "enc_row_fp8", E4: "enc_idx_fp8", E5: "enc_idx_mxfp4"}


def key_encoder(key: Any) -> int:
    """The encoder a CompileKey selects (a hook's, or a compressor's): ``store_full_fp8`` ->
    E3 / E2 (plain rows), ``use_fp4_cache`` -> E5 / E4 (indexer), neither -> E1 (fp8_ds_mla)."""
    full_fp8 = getattr(key, "store_full_fp8", None)
    if full_fp8 is not None:
        return E3 if full_fp8 else E2
    fp4 = getattr(key, "use_fp4_cache", None)
    if fp4 is not None:
        return E5 if fp4 else E4
    return E1


@dataclass(frozen=True)
class StoreOperands:
    """Where encoded rows go, as both backends address it (bytes).

    ``cache``: a 1-D uint8 view of the cache's span (first page to the last entry byte).
    ``kv_bs``: entries per page. ``page_stride``: bytes between pages (``stride(0)`` x element
    size). ``scale``: ``fp8_scale`` for E3, else ``stand_in`` (an fp32 tensor never read).
    """

    cache: torch.Tensor
    kv_bs: int
    page_stride: int
    scale: torch.Tensor


def cache_operands(cache: torch.Tensor, fp8_scale: torch.Tensor | None,
                   stand_in: torch.Tensor) -> StoreOperands:
    """The :class:`StoreOperands` of a (checked) fp8_ds_mla, plain-row or indexer cache."""
    raw = cache.view(torch.uint8)            # same strides in bytes (stride(2) == 1)
    num_pages, kv_bs, width = raw.shape
    span = (num_pages - 1) * raw.stride(0) + kv_bs * width
    flat = raw.as_strided((span,), (1,))
    return StoreOperands(flat, kv_bs, raw.stride(0), stand_in if fp8_scale is None else fp8_scale)


@dataclass(frozen=True)
class StoreRowsConfig:
    """Formats to warm: the hooks are test hooks, so by default every one (True, False)."""

    store_full_fp8: tuple[bool, ...] = (False, True)
    use_fp4_cache: tuple[bool, ...] = (False, True)


class StoreRowsBase(JitKernel[Any]):
    """What the three hooks share: the call on a hook's record (checks, T == 0, dispatch, operands);
    each hook class adds its CompileKey, ``dispatch`` and ``__call__`` (:func:`kernel_call` of its
    record), and a backend class :meth:`launch_args` and the kernel."""

    def launch_args(self, key: Any, rows: torch.Tensor, kv_slot_mapping: torch.Tensor, ops: StoreOperands,
                    t: int) -> tuple[Any, ...]:
        """The executor's arguments (per backend)."""
        raise NotImplementedError

    def launch_operands(self, ops: Any, debug_checks: bool | None) -> Any:
        """The launch spec of one bound call (``ops``, the hook's record in :data:`OPERANDS`)."""
        debug = (not self.platform.is_cuda) if debug_checks is None else debug_checks
        t = check_store_inputs(self.name, ops)
        rows = ops.rows
        self.check_device("rows", rows)
        if debug:
            check_store_values(self.name, ops)
        if t == 0:
            return Immediate(None)
        key = dispatch_key(self, ops)
        store = cache_operands(ops.cache, ops.fp8_scale, rows)
        return key, self.launch_args(key, rows, ops.kv_slot_mapping, store, t), None, _none


def _none(_: Any) -> None:
    return None


class StoreRowsDsBase(StoreRowsBase):
    """E1 hook: fp32 rows [T, 512] -> fp8_ds_mla entries."""

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(DS_HEAD_DIM)

    def dispatch(self, rows):
        return self.CompileKey(head_size=rows.shape[1])

    def get_warmup_keys(self, config: StoreRowsConfig | None = None) -> list[CompileKey]:
        return [self.CompileKey()]

    __call__ = kernel_call(
        OPERANDS["store_rows_ds"],
        """Write ``enc_ds(rows[t])`` at slot ``kv_slot_mapping[t]`` (>= 0); returns None.""")


class StoreRowsPlainBase(StoreRowsBase):
    """E2 / E3 hook: fp32 rows [T, 512] -> bf16 or per-tensor-scaled e4m3 plain rows."""

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(DS_HEAD_DIM)
        #: The cache is float8_e4m3fn (E3, with ``fp8_scale``); else bf16 (E2).
        store_full_fp8: bool

    def dispatch(self, rows, cache):
        return self.CompileKey(head_size=rows.shape[1], store_full_fp8=cache.dtype == torch.float8_e4m3fn)

    def get_warmup_keys(self, config: StoreRowsConfig | None = None) -> list[CompileKey]:
        cfg = config or StoreRowsConfig()
        return [self.CompileKey(store_full_fp8=f) for f in dict.fromkeys(cfg.store_full_fp8)]

    __call__ = kernel_call(
        OPERANDS["store_rows_plain"],
        """Write E2 (bf16 cache) or E3 (e4m3 cache, ``fp8_scale``) of each row; returns None.""")


class StoreRowsIndexerBase(StoreRowsBase):
    """E4 / E5 hook: fp32 rows [T, 128] -> indexer K cache entries (FP8 or MXFP4)."""

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(IDX_HEAD_DIM)
        #: MXFP4 (E5) pages; else FP8 (E4).
        use_fp4_cache: bool

    def dispatch(self, rows, use_fp4):
        return self.CompileKey(head_size=rows.shape[1], use_fp4_cache=use_fp4)

    def get_warmup_keys(self, config: StoreRowsConfig | None = None) -> list[CompileKey]:
        cfg = config or StoreRowsConfig()
        return [self.CompileKey(use_fp4_cache=f) for f in dict.fromkeys(cfg.use_fp4_cache)]

    __call__ = kernel_call(
        OPERANDS["store_rows_indexer"],
        """Write E4 (``use_fp4=False``) or E5 of each row; returns None.""")


_triton, _cutedsl = backend_modules(__package__)  # each imported on first use


def _spec(hook: str, spec_id: str, summary: str, contract: type[JitKernel], reference: Any,
          triton_cls: KernelRef, cutedsl_cls: KernelRef) -> FamilySpec:
    return FamilySpec(
        name=hook, spec_id=spec_id, summary=summary, args=ARGS[hook], contract=contract,
        variants=Variant(reference, triton_cls, cutedsl_cls),
        returns="None (the entries of slots >= 0 are written in place; no other byte changes)",
        config_type=StoreRowsConfig, folder="encoders",
        mutates=(ARGS[hook][1].name,))  # the cache (k_cache or cache), second in every table


SPECS: dict[str, FamilySpec] = {s.name: s for s in (
    _spec("store_rows_ds", "E1", "store hook of encoder E1: fp32 rows [T, 512] into an fp8_ds_mla cache "
          "(7 ue8m0-scaled e4m3 blocks of 64, bf16 rope dims)", StoreRowsDsBase, store_rows_ds_reference,
          lambda: _triton().StoreRowsDsTriton, lambda: _cutedsl().StoreRowsDsCuTeDSL),
    _spec("store_rows_plain", "E2/E3", "store hook of encoders E2 (bf16) and E3 (e4m3 / fp8_scale): fp32 "
          "rows [T, 512] into a plain-row cache", StoreRowsPlainBase, store_rows_plain_reference,
          lambda: _triton().StoreRowsPlainTriton, lambda: _cutedsl().StoreRowsPlainCuTeDSL),
    _spec("store_rows_indexer", "E4/E5", "store hook of encoders E4 (FP8) and E5 (MXFP4): fp32 rows [T, 128] "
          "into an indexer K cache", StoreRowsIndexerBase, store_rows_indexer_reference,
          lambda: _triton().StoreRowsIndexerTriton, lambda: _cutedsl().StoreRowsIndexerCuTeDSL),
)}
