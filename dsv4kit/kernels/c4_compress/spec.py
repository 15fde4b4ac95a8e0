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

from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.cache_dtypes import INDEXER_CACHE_DTYPES
from dsv4kit.formats.ds_mla import DS_HEAD_DIM
from dsv4kit.formats.indexer_cache import IDX_HEAD_DIM
from dsv4kit.jit import Like, WarmupChoices, fixed
from dsv4kit.kernels.c4_compress.reference import (
    OPERANDS,
    RATIO,
    c4_compress_ds_mla_reference,
    c4_compress_plain_reference,
    check_c4,
    indexer_compress_reference,
)
from dsv4kit.kernels.compressor.contract import (
    CompressorBase,
    CompressorConfig,
    PlainRowStore,
    compressor_spec,
    fixed_fields,
    specs,
)

__all__ = [
    "SPECS",
    "C4CompressBase",
    "C4CompressConfig",
    "C4CompressDsMlaBase",
    "C4CompressPlainBase",
    "IndexerCompressBase",
]


@dataclass(frozen=True)
class C4CompressConfig(CompressorConfig):
    """The warmup inputs the C4 compressors read (spec §2.11); defaults: DSv4-Flash."""

    cache_block_size: int = 256
    compress_ratios: tuple[int, ...] = (4, 128)
    cache_dtype: str = "fp8_ds_mla"
    indexer_cache_dtype: str = "fp8"
    norm_weight_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        self.check_common()
        if self.indexer_cache_dtype not in INDEXER_CACHE_DTYPES:
            raise input_error("C4CompressConfig", "indexer_cache_dtype", "'fp8' or 'mxfp4'",
                              repr(self.indexer_cache_dtype))

    @property
    def has_c4(self) -> bool:
        return RATIO in self.compress_ratios


class C4CompressBase(CompressorBase):
    """What K5, K6 and K9 share: the call (:class:`~dsv4kit.kernels.compressor.contract.CompressorBase`)
    with the C4 checks. Each op class adds its record, CompileKey, dispatch and warmup keys; a
    backend class :meth:`launch_args` and the kernel."""

    ratio = RATIO
    overlap = True
    check_inputs = staticmethod(check_c4)

    config_type = C4CompressConfig

    def key_inputs(self, config: C4CompressConfig) -> dict[str, Any]:
        return {**super().key_inputs(config), "state_cache": Like(shape=(1, 4, 4 * self.head))}


#: The fields the K5 and K6 keys begin with.
_MainKey = fixed_fields("_MainKey", head_size=512, state_width=1024, rope_head_dim=64, fp8_max=448.0,
                        quant_block=64)


class C4CompressDsMlaBase(C4CompressBase):
    """K5: C4 main compressor: pool the 8-row window at each boundary token, RMSNorm, RoPE, E1 into the
    fp8_ds_mla cache; C4 layers with an fp8_ds_mla cache, every step.

    C4 pool (D 512) -> RMSNorm -> RoPE -> E1 -> fp8_ds_mla. (The first paragraph is the op's summary.)
    """

    Operands = OPERANDS["c4_compress_ds_mla"]
    head = DS_HEAD_DIM

    @dataclass(frozen=True, kw_only=True)
    class CompileKey(_MainKey):
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
        return config.cache_block_size > 0 and config.stores(RATIO, "fp8_ds_mla")


class C4CompressPlainBase(PlainRowStore, C4CompressBase):
    """K6: C4 main compressor into a plain-row cache (E2 bf16 or E3 e4m3); C4 layers with a bf16 / fp8
    cache, every step.

    As K5 up to the row, then E2 (bf16 cache) or E3 (e4m3 cache, ``fp8_scale``).
    """

    Operands = OPERANDS["c4_compress_plain"]
    head = DS_HEAD_DIM

    @dataclass(frozen=True, kw_only=True)
    class CompileKey(_MainKey):
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



class IndexerCompressBase(C4CompressBase):
    """K9: C4 indexer compressor (head 128): E4 FP8 or E5 MXFP4 into the indexer K cache; C4 layers, every
    step.

    C4 pool (D 128) -> RMSNorm -> RoPE -> E4 (FP8) or E5 (MXFP4) indexer K cache.
    """

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

    def key_inputs(self, config: C4CompressConfig) -> dict[str, Any]:
        fp4 = WarmupChoices(config.indexer_cache_dtype == "mxfp4")
        return {**super().key_inputs(config), "use_fp4_cache": fp4}


def _triton():  # the module (inferred, so tools follow `_triton().Class`); it imports this one
    from dsv4kit.kernels.c4_compress import triton

    return triton


def _cutedsl():  # imported on first use: CUTLASS costs 0.5 s at import
    from dsv4kit.kernels.c4_compress import cutedsl

    return cutedsl


SPECS = specs(
    compressor_spec(C4CompressDsMlaBase, c4_compress_ds_mla_reference,
                    lambda: _triton().C4CompressDsMlaTriton, lambda: _cutedsl().C4CompressDsMlaCuTeDSL),
    compressor_spec(C4CompressPlainBase, c4_compress_plain_reference,
                    lambda: _triton().C4CompressPlainTriton, lambda: _cutedsl().C4CompressPlainCuTeDSL),
    compressor_spec(IndexerCompressBase, indexer_compress_reference,
                    lambda: _triton().IndexerCompressTriton, lambda: _cutedsl().IndexerCompressCuTeDSL),
)
