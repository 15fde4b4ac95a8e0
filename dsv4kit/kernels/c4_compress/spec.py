"""K5, K6, K9, the C4 compressors: their contracts, the operands both backends launch with, and
one family spec per op (their place in a DSv4 layer: :mod:`dsv4kit.model.hooks.c4_compress`).

The three share one pooling core per backend (window of 8, softmax, RMSNorm, RoPE) and differ
in the head (512 or 128) and the encoder, both read from the CompileKey. Keys carry only what
changes code (spec K5, K6, K9): fixed fields (validated) and the norm weight dtype (trap 9),
plus ``store_full_fp8`` (K6) or ``use_fp4_cache`` (K9; trap 8: nothing else, not the state or
cache block sizes). T, the state block size, kv_bs, every stride and the page stride are
runtime values.

Registration gates (spec §2.11): K5 iff B > 0, 4 in ratios and cache dtype fp8_ds_mla; K6 iff 4
in ratios and a plain-row cache dtype (``store_full_fp8`` from the one dtype-string map, trap
3); K9 iff 4 in ratios (FP8 or MXFP4 from the indexer cache dtype).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import DEFAULT_VARIANT, FamilySpec, Variant
from dsv4kit.family.spec import KernelRef
from dsv4kit.formats.cache_dtypes import INDEXER_CACHE_DTYPES, NORM_WEIGHT_DTYPES, normalize_cache_dtype
from dsv4kit.formats.ds_mla import DS_HEAD_DIM
from dsv4kit.formats.indexer_cache import IDX_HEAD_DIM
from dsv4kit.jit import Like, WarmupChoices, fixed
from dsv4kit.kernels.c4_compress.reference import (
    ARGS,
    OPERANDS,
    RATIO,
    c4_compress_ds_mla_reference,
    c4_compress_plain_reference,
    check_c4,
    indexer_compress_reference,
)
from dsv4kit.kernels.compressor.contract import CompressorBase

__all__ = [
    "SPECS",
    "C4CompressBase",
    "C4CompressConfig",
    "C4CompressDsMlaBase",
    "C4CompressPlainBase",
    "IndexerCompressBase",
]


@dataclass(frozen=True)
class C4CompressConfig:
    """The warmup inputs the C4 compressors read (spec §2.11); defaults: DSv4-Flash."""

    cache_block_size: int = 256
    compress_ratios: tuple[int, ...] = (4, 128)
    cache_dtype: str = "fp8_ds_mla"
    indexer_cache_dtype: str = "fp8"
    norm_weight_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        where = "C4CompressConfig"
        b = self.cache_block_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise input_error(where, "cache_block_size", "an int >= 0", repr(b))
        if not isinstance(self.compress_ratios, Iterable) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in self.compress_ratios
        ):
            raise input_error(where, "compress_ratios", "ints >= 0", repr(self.compress_ratios))
        normalize_cache_dtype(self.cache_dtype, where)
        if self.indexer_cache_dtype not in INDEXER_CACHE_DTYPES:
            raise input_error(
                where, "indexer_cache_dtype", "'fp8' or 'mxfp4'", repr(self.indexer_cache_dtype)
            )
        if self.norm_weight_dtype not in NORM_WEIGHT_DTYPES:
            raise input_error(
                where,
                "norm_weight_dtype",
                f"one of {', '.join(NORM_WEIGHT_DTYPES)}",
                repr(self.norm_weight_dtype),
            )

    @property
    def has_c4(self) -> bool:
        return RATIO in self.compress_ratios

    @property
    def kv_kind(self) -> str:
        """``"fp8_ds_mla"``, ``"fp8"`` or ``"bfloat16"`` (the one map of trap 3)."""
        return normalize_cache_dtype(self.cache_dtype, "C4CompressConfig")


class C4CompressBase(CompressorBase):
    """What K5, K6 and K9 share: the call (:class:`~dsv4kit.kernels.compressor.contract.CompressorBase`)
    with the C4 checks. Each op class adds its record, CompileKey, dispatch and warmup keys; a
    backend class :meth:`launch_args` and the kernel."""

    ratio = RATIO
    overlap = True
    check_inputs = staticmethod(check_c4)

    @staticmethod
    def applies(config: C4CompressConfig) -> bool:
        """Whether a runtime of ``config`` calls this op (its warmup and registration gate)."""
        raise NotImplementedError

    def _norm_weight_keys(self, config: C4CompressConfig, **cache: Any) -> list[Any]:
        """Keys traced from ``dispatch`` for the config's norm weight dtype (and ``cache`` inputs)."""
        sw = 2 * self.head
        return self.trace(
            rms_norm_weight=Like(
                shape=(self.head,), dtype=WarmupChoices(NORM_WEIGHT_DTYPES[config.norm_weight_dtype])
            ),
            state_cache=Like(shape=(1, 4, 2 * sw)),
            cos_sin_cache=Like(shape=(1, 64)),
            **cache,
        )


class C4CompressDsMlaBase(C4CompressBase):
    """K5: C4 pool (D 512) -> RMSNorm -> RoPE -> E1 -> fp8_ds_mla."""

    Operands = OPERANDS["c4_compress_ds_mla"]
    head = DS_HEAD_DIM

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(512)
        state_width: int = fixed(1024)
        rope_head_dim: int = fixed(64)
        fp8_max: float = fixed(448.0)
        quant_block: int = fixed(64)
        token_stride: int = fixed(576)
        scale_dim: int = fixed(8)
        compress_ratio: int = fixed(4)
        overlap: bool = fixed(True)
        #: ``"bfloat16"`` or ``"float32"`` (trap 9: fp32-kept weights are another key).
        norm_weight_dtype: str

    def dispatch(self, rms_norm_weight, state_cache, cos_sin_cache):
        return self.CompileKey(
            head_size=rms_norm_weight.shape[0],
            state_width=state_cache.shape[2] // 2,
            rope_head_dim=cos_sin_cache.shape[1],
            norm_weight_dtype=str(rms_norm_weight.dtype).removeprefix("torch."),
        )

    @staticmethod
    def applies(config: C4CompressConfig) -> bool:
        return config.cache_block_size > 0 and config.has_c4 and config.kv_kind == "fp8_ds_mla"

    def get_warmup_keys(self, config: C4CompressConfig | None = None) -> list[CompileKey]:
        cfg = config or C4CompressConfig()
        return self._norm_weight_keys(cfg) if self.applies(cfg) else []



class C4CompressPlainBase(C4CompressBase):
    """K6: as K5 up to the row, then E2 (bf16 cache) or E3 (e4m3 cache, ``fp8_scale``)."""

    Operands = OPERANDS["c4_compress_plain"]
    head = DS_HEAD_DIM

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(512)
        state_width: int = fixed(1024)
        rope_head_dim: int = fixed(64)
        fp8_max: float = fixed(448.0)
        quant_block: int = fixed(64)
        compress_ratio: int = fixed(4)
        overlap: bool = fixed(True)
        #: ``kv_cache`` is float8_e4m3fn (E3); else bf16 (E2).
        store_full_fp8: bool
        norm_weight_dtype: str

    def dispatch(self, rms_norm_weight, state_cache, cos_sin_cache, kv_cache):
        return self.CompileKey(
            head_size=rms_norm_weight.shape[0],
            state_width=state_cache.shape[2] // 2,
            rope_head_dim=cos_sin_cache.shape[1],
            store_full_fp8=kv_cache.dtype == torch.float8_e4m3fn,
            norm_weight_dtype=str(rms_norm_weight.dtype).removeprefix("torch."),
        )

    @staticmethod
    def applies(config: C4CompressConfig) -> bool:
        return config.has_c4 and config.kv_kind != "fp8_ds_mla"

    def get_warmup_keys(self, config: C4CompressConfig | None = None) -> list[CompileKey]:
        cfg = config or C4CompressConfig()
        if not self.applies(cfg):
            return []
        cache_dtype = torch.float8_e4m3fn if cfg.kv_kind == "fp8" else torch.bfloat16
        return self._norm_weight_keys(cfg, kv_cache=Like(shape=(1, 1, DS_HEAD_DIM), dtype=cache_dtype))



class IndexerCompressBase(C4CompressBase):
    """K9: C4 pool (D 128) -> RMSNorm -> RoPE -> E4 (FP8) or E5 (MXFP4) indexer K cache."""

    Operands = OPERANDS["indexer_compress"]
    head = IDX_HEAD_DIM

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        #: MXFP4 pages (E5); else FP8 (E4).
        use_fp4_cache: bool
        norm_weight_dtype: str
        head_size: int = fixed(128)
        state_width: int = fixed(256)
        compress_ratio: int = fixed(4)
        overlap: bool = fixed(True)
        rope_head_dim: int = fixed(64)
        #: 32 (MXFP4) or 128 (FP8): follows ``use_fp4_cache``.
        quant_block: int
        #: Data bytes per token: 64 (MXFP4) or 128 (FP8); follows ``use_fp4_cache``.
        token_stride: int
        scale_dim: int = fixed(4)

    def dispatch(self, rms_norm_weight, state_cache, cos_sin_cache, use_fp4_cache):
        return self.CompileKey(
            use_fp4_cache=use_fp4_cache,
            norm_weight_dtype=str(rms_norm_weight.dtype).removeprefix("torch."),
            head_size=rms_norm_weight.shape[0],
            state_width=state_cache.shape[2] // 2,
            rope_head_dim=cos_sin_cache.shape[1],
            quant_block=32 if use_fp4_cache else 128,
            token_stride=64 if use_fp4_cache else 128,
        )

    @staticmethod
    def applies(config: C4CompressConfig) -> bool:
        return config.has_c4

    def get_warmup_keys(self, config: C4CompressConfig | None = None) -> list[CompileKey]:
        cfg = config or C4CompressConfig()
        if not self.applies(cfg):
            return []
        return self._norm_weight_keys(cfg, use_fp4_cache=WarmupChoices(cfg.indexer_cache_dtype == "mxfp4"))



def _triton():  # the module (inferred, so tools follow `_triton().Class`); it imports this one
    from dsv4kit.kernels.c4_compress import triton

    return triton


def _cutedsl():  # imported on first use: CUTLASS costs 0.5 s at import
    from dsv4kit.kernels.c4_compress import cutedsl

    return cutedsl


def _spec(
    contract: type[C4CompressBase],
    spec_id: str,
    summary: str,
    reference: Any,
    triton_cls: KernelRef,
    cutedsl_cls: KernelRef,
) -> FamilySpec:
    return FamilySpec(
        name=contract.op_name,
        spec_id=spec_id,
        summary=summary,
        op_name=contract.op_name,
        args=ARGS[contract.op_name],
        contract=contract,
        variants={DEFAULT_VARIANT: Variant(reference, triton_cls, cutedsl_cls)},
        returns="None (the entries of boundary tokens with slots >= 0 are written in place; no other byte "
        "changes)",
        device_arg="state_cache",
        config_type=C4CompressConfig,
        folder="c4_compress",
        # The compressed cache (k_cache or kv_cache) is the one argument written.
        mutates=tuple(a.name for a in ARGS[contract.op_name] if a.name in ("k_cache", "kv_cache")),
    )


SPECS: dict[str, FamilySpec] = {
    s.name: s
    for s in (
        _spec(
            C4CompressDsMlaBase,
            "K5",
            "C4 main compressor: pool the 8-row window at each boundary token, RMSNorm, "
            "RoPE, E1 into the fp8_ds_mla cache; C4 layers with an fp8_ds_mla cache, every step",
            c4_compress_ds_mla_reference,
            lambda: _triton().C4CompressDsMlaTriton,
            lambda: _cutedsl().C4CompressDsMlaCuTeDSL,
        ),
        _spec(
            C4CompressPlainBase,
            "K6",
            "C4 main compressor into a plain-row cache (E2 bf16 or E3 e4m3); C4 layers "
            "with a bf16 / fp8 cache, every step",
            c4_compress_plain_reference,
            lambda: _triton().C4CompressPlainTriton,
            lambda: _cutedsl().C4CompressPlainCuTeDSL,
        ),
        _spec(
            IndexerCompressBase,
            "K9",
            "C4 indexer compressor (head 128): E4 FP8 or E5 MXFP4 into the indexer K "
            "cache; C4 layers, every step",
            indexer_compress_reference,
            lambda: _triton().IndexerCompressTriton,
            lambda: _cutedsl().IndexerCompressCuTeDSL,
        ),
    )
}
