"""K7, K8a, K8b, the C128 compressors: their contracts, the operands both backends launch with, and
one family spec per op (their place in a DSv4 layer: :mod:`dsv4kit.model.hooks.c128_compress`).

K7 pools; K8a / K8b normalize, rotate and store what K7 pooled (the same encoders as the store
hooks). Keys carry only what changes code (spec K7, K8): fixed fields (validated) everywhere;
the norm weight dtype (trap 9); ``store_full_fp8`` (K8b); and for K8a the page geometry,
``kv_cache_block_size = k_cache.shape[1]`` and ``kv_block_stride = k_cache.stride(0)``, read from
the real cache tensor on every call (trap 4: a packed pool is another key, a guard hit in
``error`` mode, never a silent mis-store). T, every other stride, K8b's page geometry and the
state pool are runtime values.

Registration gates (spec §2.11): K7 iff 128 in ratios; K8a iff 128 in ratios and cache dtype
fp8_ds_mla, with ``kv_bs = max(1, B // 128)`` and the allocator's ``round_up(kv_bs * 584, 576)``
-- or the geometry of the bound cache (:meth:`C128CompressConfig.with_cache`); K8b iff 128 in
ratios and a plain-row cache dtype (``store_full_fp8`` from the one dtype-string map, trap 3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import DEFAULT_VARIANT, FamilySpec, Variant
from dsv4kit.family.spec import KernelRef
from dsv4kit.formats.cache_dtypes import NORM_WEIGHT_DTYPES, normalize_cache_dtype
from dsv4kit.formats.ds_mla import (
    DS_ENTRY_BYTES,
    DS_HEAD_DIM,
    check_ds_cache,
    ds_min_page_stride,
)
from dsv4kit.jit import Immediate, JitKernel, Like, WarmupChoices, fixed, kernel_launcher
from dsv4kit.kernels.c128_compress.reference import (
    ARGS,
    RATIO,
    STATE_BLOCK_SIZE,
    c128_compress_reference,
    c128_norm_rope_store_ds_mla_reference,
    c128_norm_rope_store_plain_reference,
    check_c128_compress_inputs,
    check_c128_compress_values,
    check_c128_store_inputs,
    check_c128_store_values,
)
from dsv4kit.kernels.encoders.reference import check_aligned
from dsv4kit.kernels.encoders.spec import StoreOperands, cache_operands

__all__ = [
    "SPECS",
    "C128CompressBase",
    "C128CompressConfig",
    "C128StoreBase",
    "C128StoreDsMlaBase",
    "C128StorePlainBase",
    "NormStoreOperands",
    "StateOperands",
    "state_operands",
]

_I32 = 2**31


@dataclass(frozen=True)
class C128CompressConfig:
    """The warmup inputs the C128 compressors read (spec §2.11); defaults: DSv4-Flash.

    ``k_cache_geometry``: ``(kv_bs, page stride in bytes)`` of the bound fp8_ds_mla cache, when
    the runtime's cache exists (:meth:`with_cache`); None derives it from B and the allocator rule.
    ``state_block_size``: rows per block of the runtime's C128 state cache; K7 pools 16 whole
    blocks of 8, so any other value is refused here, when the model is configured (trap 5), not
    at the first C128 boundary of a serving step.
    """

    cache_block_size: int = 256
    compress_ratios: tuple[int, ...] = (4, 128)
    cache_dtype: str = "fp8_ds_mla"
    norm_weight_dtype: str = "bfloat16"
    k_cache_geometry: tuple[int, int] | None = None
    state_block_size: int = STATE_BLOCK_SIZE

    def __post_init__(self) -> None:
        where = "C128CompressConfig"
        if self.state_block_size != STATE_BLOCK_SIZE or isinstance(self.state_block_size, bool):
            why = f"{STATE_BLOCK_SIZE} (K7 pools 16 whole blocks of 8 state rows; spec §2.11 trap 5)"
            raise input_error(where, "state_block_size", why, repr(self.state_block_size))
        b = self.cache_block_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise input_error(where, "cache_block_size", "an int >= 0", repr(b))
        if not isinstance(self.compress_ratios, Iterable) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in self.compress_ratios
        ):
            raise input_error(where, "compress_ratios", "ints >= 0", repr(self.compress_ratios))
        normalize_cache_dtype(self.cache_dtype, where)  # trap 3: e5m2 and friends raise here
        if self.norm_weight_dtype not in NORM_WEIGHT_DTYPES:
            raise input_error(
                where,
                "norm_weight_dtype",
                f"one of {', '.join(NORM_WEIGHT_DTYPES)}",
                repr(self.norm_weight_dtype),
            )
        g = self.k_cache_geometry
        if g is not None:
            ok = isinstance(g, tuple) and len(g) == 2 and all(isinstance(v, int) and v > 0 for v in g)
            if not ok or g[1] % 576 or g[1] < g[0] * DS_ENTRY_BYTES:
                raise input_error(
                    where,
                    "k_cache_geometry",
                    "(kv_bs, page stride): stride % 576 == 0, >= 584 kv_bs",
                    repr(g),
                )

    def with_cache(self, k_cache: torch.Tensor) -> C128CompressConfig:
        """This config with the page geometry of the runtime's bound fp8_ds_mla cache (trap 4)."""
        check_ds_cache("C128CompressConfig", "k_cache", k_cache)
        return replace(self, k_cache_geometry=(k_cache.shape[1], k_cache.stride(0)))

    @property
    def has_c128(self) -> bool:
        return RATIO in self.compress_ratios

    @property
    def kv_kind(self) -> str:
        """``"fp8_ds_mla"``, ``"fp8"`` or ``"bfloat16"`` (the one map of trap 3)."""
        return normalize_cache_dtype(self.cache_dtype, "C128CompressConfig")

    @property
    def page_geometry(self) -> tuple[int, int]:
        """K8a's ``(kv_bs, stride)``: the bound cache's, else ``max(1, B // 128)`` and the allocator's."""
        if self.k_cache_geometry is not None:
            return self.k_cache_geometry
        kv_bs = max(1, self.cache_block_size // RATIO)
        return kv_bs, ds_min_page_stride(kv_bs)


# --------------------------------------------------------------------------- operands


@dataclass(frozen=True)
class StateOperands:
    """K7's state pool as both backends address it: ``state`` a 1-D fp32 view from the first block
    (16-byte aligned, §2.8), ``block_stride`` elements between blocks, ``bt_stride`` elements
    between block-table rows."""

    state: torch.Tensor
    block_stride: int
    bt_stride: int


def state_operands(
    kernel: str, state_cache: torch.Tensor, block_table: torch.Tensor, t: int
) -> StateOperands:
    """The :class:`StateOperands` of a checked K7 call of ``t`` tokens."""
    if t >= _I32:
        raise input_error(kernel, "positions", f"fewer than {_I32} tokens", t)
    nsb, sbs, row = state_cache.shape
    span = (nsb - 1) * state_cache.stride(0) + sbs * row if nsb else 1
    state = state_cache.as_strided((max(span, 1),), (1,))
    return StateOperands(state, state_cache.stride(0), block_table.stride(0) if block_table.dim() else 0)


@dataclass(frozen=True)
class NormStoreOperands:
    """K8's operands besides the caller's arrays: ``eps`` (fp32-rounded by the kernels) and where the
    rows go (:class:`~dsv4kit.kernels.encoders.spec.StoreOperands`)."""

    eps: float
    store: StoreOperands


# --------------------------------------------------------------------------- K7


class C128CompressBase(JitKernel[Any]):
    """K7: at boundary tokens pool 128 state rows (16 blocks of 8) per column into fp32 ``[T, 512]``.

    A backend class adds :meth:`launch_args` and the kernel."""

    op_name: ClassVar[str] = "c128_compress"

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(512)
        state_width: int = fixed(512)
        #: Trap 5: the window is 16 whole blocks of 8 rows; other block sizes raise before dispatch.
        state_block_size: int = fixed(STATE_BLOCK_SIZE)

    def dispatch(self, state_cache):
        return self.CompileKey(
            head_size=state_cache.shape[2] // 2,
            state_width=state_cache.shape[2] // 2,
            state_block_size=state_cache.shape[1],
        )

    @staticmethod
    def applies(config: C128CompressConfig) -> bool:
        """Whether a runtime of ``config`` calls K7 (its warmup and registration gate)."""
        return config.has_c128

    def get_warmup_keys(self, config: C128CompressConfig | None = None) -> list[CompileKey]:
        cfg = config or C128CompressConfig()
        if not self.applies(cfg):
            return []
        return self.trace(state_cache=Like(shape=(1, STATE_BLOCK_SIZE, 2 * DS_HEAD_DIM)))

    def launch_args(
        self,
        key: Any,
        token_to_req: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_table: torch.Tensor,
        out: torch.Tensor,
        ops: StateOperands,
        t: int,
    ) -> tuple[Any, ...]:
        """The executor's arguments (per backend); ``out`` is ``[>= T, 512]`` with strides (512, 1)."""
        raise NotImplementedError

    @kernel_launcher
    def __call__(
        self,
        state_cache: torch.Tensor,
        token_to_req: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_table: torch.Tensor,
        out: torch.Tensor | None = None,
        *,
        debug_checks: bool | None = None,
    ) -> Any:
        """K7 (spec): ``compressed_kv [T, 512]``, a view of ``out`` (allocated uninitialized if None);
        rows of non-boundary and padding tokens are not written.

        ``debug_checks`` (default: on under the CPU interpreter, off on a GPU) also reads the index
        arrays back: live positions >= 0, request rows, the window's block-table columns and entries.
        """
        debug = (not self.platform.is_cuda) if debug_checks is None else debug_checks
        t = check_c128_compress_inputs(
            self.name, state_cache, token_to_req, positions, slot_mapping, block_table, out
        )
        self.check_device("state_cache", state_cache)
        if debug:
            check_c128_compress_values(
                self.name, state_cache, token_to_req, positions, slot_mapping, block_table
            )
        if out is None:
            out = torch.empty((t, DS_HEAD_DIM), dtype=torch.float32, device=state_cache.device)
        compressed_kv = out[:t]
        if t == 0:
            return Immediate(compressed_kv)
        key = self.dispatch(state_cache=state_cache)
        ops = state_operands(self.name, state_cache, block_table, t)
        args = self.launch_args(key, token_to_req, positions, slot_mapping, block_table, out, ops, t)
        return key, args, compressed_kv, _same


def _same(x: Any) -> Any:
    return x


# --------------------------------------------------------------------------- K8a / K8b


class C128StoreBase(JitKernel[Any]):
    """What K8a and K8b share: the call (checks, T == 0, dispatch, operands). Each op class adds its
    CompileKey, dispatch and warmup keys; a backend class :meth:`launch_args` and the kernel."""

    #: The op name (its argument table in :data:`~dsv4kit.kernels.c128_compress.reference.ARGS`).
    op_name: ClassVar[str]

    def launch_args(
        self,
        key: Any,
        compressed_kv: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_slot_mapping: torch.Tensor,
        rms_norm_weight: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        ops: NormStoreOperands,
        t: int,
    ) -> tuple[Any, ...]:
        """The executor's arguments (per backend)."""
        raise NotImplementedError

    @staticmethod
    def applies(config: C128CompressConfig) -> bool:
        """Whether a runtime of ``config`` calls this op (its warmup and registration gate)."""
        raise NotImplementedError

    def _store(
        self,
        key_args: dict[str, Any],
        compressed_kv: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_slot_mapping: torch.Tensor,
        rms_norm_weight: torch.Tensor,
        rms_norm_eps: float,
        cos_sin_cache: torch.Tensor,
        cache: torch.Tensor,
        fp8_scale: torch.Tensor | None,
        debug_checks: bool | None,
    ) -> Any:
        debug = (not self.platform.is_cuda) if debug_checks is None else debug_checks
        t, eps = check_c128_store_inputs(
            self.name,
            self.op_name,
            compressed_kv,
            positions,
            slot_mapping,
            kv_slot_mapping,
            rms_norm_weight,
            rms_norm_eps,
            cos_sin_cache,
            cache,
            fp8_scale,
        )
        self.check_device("compressed_kv", compressed_kv)
        if self.op_name == "c128_norm_rope_store_plain":
            check_aligned(self.name, "kv_cache", cache, 16)  # the kernels store 16-byte vectors
        if debug:
            check_c128_store_values(
                self.name, positions, slot_mapping, kv_slot_mapping, cos_sin_cache, cache, fp8_scale
            )
        if t == 0:
            return Immediate(None)
        if t >= _I32:
            raise input_error(self.name, "positions", f"fewer than {_I32} tokens", t)
        key = self.dispatch(**key_args)
        ops = NormStoreOperands(eps, cache_operands(cache, fp8_scale, compressed_kv))
        args = self.launch_args(
            key,
            compressed_kv,
            positions,
            slot_mapping,
            kv_slot_mapping,
            rms_norm_weight,
            cos_sin_cache,
            ops,
            t,
        )
        return key, args, None, _none

    def _norm_weight_keys(self, config: C128CompressConfig, **cache: Any) -> list[Any]:
        """Keys traced from ``dispatch`` for the config's norm weight dtype (and ``cache`` inputs)."""
        return self.trace(
            rms_norm_weight=Like(
                shape=(DS_HEAD_DIM,), dtype=WarmupChoices(NORM_WEIGHT_DTYPES[config.norm_weight_dtype])
            ),
            cos_sin_cache=Like(shape=(1, 64)),
            **cache,
        )


def _none(_: Any) -> None:
    return None


class C128StoreDsMlaBase(C128StoreBase):
    """K8a: RMSNorm -> RoPE -> E1 -> fp8_ds_mla, page geometry in the key (trap 4)."""

    op_name = "c128_norm_rope_store_ds_mla"

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(512)
        rope_head_dim: int = fixed(64)
        fp8_max: float = fixed(448.0)
        quant_block: int = fixed(64)
        token_stride: int = fixed(576)
        scale_dim: int = fixed(8)
        compress_ratio: int = fixed(128)
        #: ``"bfloat16"`` or ``"float32"`` (trap 9).
        norm_weight_dtype: str
        #: ``k_cache.shape[1]``: entries per page (compile-time addresses).
        kv_cache_block_size: int
        #: ``k_cache.stride(0)``: bytes between pages, the real stride (trap 4).
        kv_block_stride: int

    def dispatch(self, rms_norm_weight, cos_sin_cache, k_cache):
        return self.CompileKey(
            head_size=rms_norm_weight.shape[0],
            rope_head_dim=cos_sin_cache.shape[1],
            norm_weight_dtype=str(rms_norm_weight.dtype).removeprefix("torch."),
            kv_cache_block_size=k_cache.shape[1],
            kv_block_stride=k_cache.stride(0),
        )

    @staticmethod
    def applies(config: C128CompressConfig) -> bool:
        return config.has_c128 and config.kv_kind == "fp8_ds_mla"

    def get_warmup_keys(self, config: C128CompressConfig | None = None) -> list[CompileKey]:
        cfg = config or C128CompressConfig()
        if not self.applies(cfg):
            return []
        kv_bs, stride = cfg.page_geometry
        cache = Like(shape=(1, kv_bs, DS_ENTRY_BYTES), stride=(stride, DS_ENTRY_BYTES, 1), dtype=torch.uint8)
        return self._norm_weight_keys(cfg, k_cache=cache)

    @kernel_launcher
    def __call__(
        self,
        compressed_kv: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_slot_mapping: torch.Tensor,
        rms_norm_weight: torch.Tensor,
        rms_norm_eps: float,
        cos_sin_cache: torch.Tensor,
        k_cache: torch.Tensor,
        *,
        debug_checks: bool | None = None,
    ) -> Any:
        """K8a (spec): write E1 of each boundary token's normalized, rotated row; returns None.

        ``debug_checks`` (default: on under the CPU interpreter, off on a GPU) also reads the index
        arrays back: kv slots unique and in range, rope rows.
        """
        return self._store(
            dict(rms_norm_weight=rms_norm_weight, cos_sin_cache=cos_sin_cache, k_cache=k_cache),
            compressed_kv,
            positions,
            slot_mapping,
            kv_slot_mapping,
            rms_norm_weight,
            rms_norm_eps,
            cos_sin_cache,
            k_cache,
            None,
            debug_checks,
        )


class C128StorePlainBase(C128StoreBase):
    """K8b: RMSNorm -> RoPE -> E2 (bf16 cache) or E3 (e4m3 cache, ``fp8_scale``); geometry runtime."""

    op_name = "c128_norm_rope_store_plain"

    @dataclass(frozen=True, kw_only=True)
    class CompileKey:
        head_size: int = fixed(512)
        rope_head_dim: int = fixed(64)
        fp8_max: float = fixed(448.0)
        quant_block: int = fixed(64)
        compress_ratio: int = fixed(128)
        #: ``kv_cache`` is float8_e4m3fn (E3); else bf16 (E2).
        store_full_fp8: bool
        norm_weight_dtype: str

    def dispatch(self, rms_norm_weight, cos_sin_cache, kv_cache):
        return self.CompileKey(
            head_size=rms_norm_weight.shape[0],
            rope_head_dim=cos_sin_cache.shape[1],
            store_full_fp8=kv_cache.dtype == torch.float8_e4m3fn,
            norm_weight_dtype=str(rms_norm_weight.dtype).removeprefix("torch."),
        )

    @staticmethod
    def applies(config: C128CompressConfig) -> bool:
        return config.has_c128 and config.kv_kind != "fp8_ds_mla"

    def get_warmup_keys(self, config: C128CompressConfig | None = None) -> list[CompileKey]:
        cfg = config or C128CompressConfig()
        if not self.applies(cfg):
            return []
        dtype = torch.float8_e4m3fn if cfg.kv_kind == "fp8" else torch.bfloat16
        return self._norm_weight_keys(cfg, kv_cache=Like(shape=(1, 1, DS_HEAD_DIM), dtype=dtype))

    @kernel_launcher
    def __call__(
        self,
        compressed_kv: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_slot_mapping: torch.Tensor,
        rms_norm_weight: torch.Tensor,
        rms_norm_eps: float,
        cos_sin_cache: torch.Tensor,
        kv_cache: torch.Tensor,
        fp8_scale: torch.Tensor | None = None,
        *,
        debug_checks: bool | None = None,
    ) -> Any:
        """K8b (spec): write E2 / E3 of each boundary token's normalized, rotated row; returns None.

        ``debug_checks`` as K8a's, plus ``fp8_scale`` finite and > 0.
        """
        return self._store(
            dict(rms_norm_weight=rms_norm_weight, cos_sin_cache=cos_sin_cache, kv_cache=kv_cache),
            compressed_kv,
            positions,
            slot_mapping,
            kv_slot_mapping,
            rms_norm_weight,
            rms_norm_eps,
            cos_sin_cache,
            kv_cache,
            fp8_scale,
            debug_checks,
        )


def _triton():  # the module (inferred, so tools follow `_triton().Class`); it imports this one
    from dsv4kit.kernels.c128_compress import triton

    return triton


def _cutedsl():  # imported on first use: CUTLASS costs 0.5 s at import
    from dsv4kit.kernels.c128_compress import cutedsl

    return cutedsl


def _spec(
    contract: Any,
    spec_id: str,
    summary: str,
    reference: Any,
    backends: tuple[KernelRef, KernelRef],
    returns: str,
    device_arg: str,
) -> FamilySpec:
    return FamilySpec(
        name=contract.op_name,
        spec_id=spec_id,
        summary=summary,
        op_name=contract.op_name,
        args=ARGS[contract.op_name],
        contract=contract,
        variants={DEFAULT_VARIANT: Variant(reference, *backends)},
        returns=returns,
        device_arg=device_arg,
        config_type=C128CompressConfig,
        folder="c128_compress",
        # K7 writes out (allocated [T, 512] when None) and returns its first T rows; K8 the cache.
        mutates=tuple(a.name for a in ARGS[contract.op_name] if a.name in ("out", "k_cache", "kv_cache")),
        result=(lambda a: a["out"][: a["positions"].shape[0]]) if contract is C128CompressBase else None,
        allocates={"out": lambda a: torch.empty((a["positions"].shape[0], DS_HEAD_DIM), dtype=torch.float32,
                                                device=a["state_cache"].device)}
        if contract is C128CompressBase else {},
    )


_STORED = "None (the entries of boundary tokens with slots >= 0 are written in place; no other byte changes)"

SPECS: dict[str, FamilySpec] = {
    s.name: s
    for s in (
        _spec(
            C128CompressBase,
            "K7",
            "C128 compress: pool the 128-row window (16 state blocks of 8) at each boundary token into an "
            "fp32 row; C128 layers, every step",
            c128_compress_reference,
            (lambda: _triton().C128CompressTriton, lambda: _cutedsl().C128CompressCuTeDSL),
            "compressed_kv [T, 512] fp32, a view of out (rows of boundary tokens with slots >= 0 written; "
            "the others untouched)",
            "state_cache",
        ),
        _spec(
            C128StoreDsMlaBase,
            "K8a",
            "C128 RMSNorm -> RoPE -> E1 into the fp8_ds_mla cache (page geometry in the key, trap 4); "
            "C128 layers with an fp8_ds_mla cache, every step",
            c128_norm_rope_store_ds_mla_reference,
            (lambda: _triton().C128StoreDsMlaTriton, lambda: _cutedsl().C128StoreDsMlaCuTeDSL),
            _STORED,
            "compressed_kv",
        ),
        _spec(
            C128StorePlainBase,
            "K8b",
            "C128 RMSNorm -> RoPE -> E2 bf16 / E3 e4m3 into a plain-row cache; C128 layers with a bf16 / "
            "fp8 cache, every step",
            c128_norm_rope_store_plain_reference,
            (lambda: _triton().C128StorePlainTriton, lambda: _cutedsl().C128StorePlainCuTeDSL),
            _STORED,
            "compressed_kv",
        ),
    )
}
