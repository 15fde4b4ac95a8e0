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

from dataclasses import dataclass, replace
from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.ds_mla import (
    DS_ENTRY_BYTES,
    DS_HEAD_DIM,
    check_ds_cache,
    ds_min_page_stride,
)
from dsv4kit.jit import Like, fixed
from dsv4kit.kernels.c128_compress.reference import (
    OPERANDS,
    RATIO,
    STATE_BLOCK_SIZE,
    c128_compress_reference,
    c128_norm_rope_store_ds_mla_reference,
    c128_norm_rope_store_plain_reference,
    check_k7,
    check_k8,
)
from dsv4kit.kernels.compressor.contract import (
    CompressorBase,
    CompressorConfig,
    LaunchOperands,
    PlainRowStore,
    compressor_spec,
    fixed_fields,
    launch_operands,
    specs,
)
from dsv4kit.kernels.encoders.spec import StoreOperands

__all__ = ["SPECS", "C128CompressBase", "C128CompressConfig", "C128StoreBase", "C128StoreDsMlaBase",
           "C128StorePlainBase", "NormStoreOperands", "state_operands"]


@dataclass(frozen=True)
class C128CompressConfig(CompressorConfig):
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
        self.check_common()
        g = self.k_cache_geometry
        if g is not None:
            ok = isinstance(g, tuple) and len(g) == 2 and all(isinstance(v, int) and v > 0 for v in g)
            if not ok or g[1] % 576 or g[1] < g[0] * DS_ENTRY_BYTES:
                why = "(kv_bs, page stride): stride % 576 == 0, >= 584 kv_bs"
                raise input_error(where, "k_cache_geometry", why, repr(g))

    def with_cache(self, k_cache: torch.Tensor) -> C128CompressConfig:
        """This config with the page geometry of the runtime's bound fp8_ds_mla cache (trap 4)."""
        check_ds_cache("C128CompressConfig", "k_cache", k_cache)
        return replace(self, k_cache_geometry=(k_cache.shape[1], k_cache.stride(0)))

    @property
    def has_c128(self) -> bool:
        return RATIO in self.compress_ratios

    @property
    def page_geometry(self) -> tuple[int, int]:
        """K8a's ``(kv_bs, stride)``: the bound cache's, else ``max(1, B // 128)`` and the allocator's."""
        if self.k_cache_geometry is not None:
            return self.k_cache_geometry
        kv_bs = max(1, self.cache_block_size // RATIO)
        return kv_bs, ds_min_page_stride(kv_bs)


# --------------------------------------------------------------------------- the call


class C128Base(CompressorBase):
    """What the three C128 ops share: ratio 128, no overlap, head 512; a backend's
    :meth:`launch_args` takes the record and :class:`LaunchOperands`, or (legacy) the arguments
    one by one (as the removed ``benchmarks/c128_compress_gpu_check.py`` passed them)."""

    ratio = RATIO
    overlap = False
    head = DS_HEAD_DIM
    config_type = C128CompressConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found = cls.launch_args
        if found is not CompressorBase.launch_args and not hasattr(found, "record_form"):
            cls.launch_args = _either_form(found)  # type: ignore[method-assign]


def _either_form(launch_args: Any) -> Any:
    """``launch_args(key, ops, run)``, also callable as ``(key, *the op's tensors, operands, t)``: the
    GPU check script's form (K7: ``token_to_req, positions, slot_mapping, block_table, out``; K8:
    ``compressed_kv, positions, slot_mapping, kv_slot_mapping, rms_norm_weight, cos_sin_cache``),
    with the operands of :func:`state_operands` / :func:`NormStoreOperands`."""

    def either(self: Any, key: Any, *args: Any) -> tuple[Any, ...]:
        if len(args) == 2:
            return launch_args(self, key, *args)
        *tensors, run, t = args
        if self.op_name == "c128_compress":
            ops = self.Operands(None, *tensors)
        else:
            ops = self.Operands(*tensors[:5], None, tensors[5], None)
        return launch_args(self, key, ops, run._replace(t=t))

    either.__doc__ = launch_args.__doc__
    either.record_form = launch_args  # type: ignore[attr-defined]
    return either


def state_operands(kernel: str, state_cache: torch.Tensor, block_table: torch.Tensor,
                   t: int) -> LaunchOperands:
    """K7's :class:`LaunchOperands` of a checked call of ``t`` tokens (the GPU check script's form)."""
    return launch_operands(kernel, OPERANDS["c128_compress"](state_cache, None, None, None, block_table), t)


def NormStoreOperands(eps: float, store: StoreOperands) -> LaunchOperands:  # noqa: N802 (the script's name)
    """K8's :class:`LaunchOperands` (the GPU check script's form; ``t`` comes with the call)."""
    return LaunchOperands(0, eps, store=store)


# --------------------------------------------------------------------------- K7


class C128CompressBase(C128Base):
    """K7: C128 compress: pool the 128-row window (16 state blocks of 8) at each boundary token into an
    fp32 row; C128 layers, every step.

    At boundary tokens pool 128 state rows (16 blocks of 8) per column into fp32 ``[T, 512]``, a view
    of ``out`` (allocated uninitialized if None); rows of non-boundary and padding tokens are not
    written. A backend class adds :meth:`launch_args` and the kernel.
    """

    Operands = OPERANDS["c128_compress"]

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
        return config.has_c128

    def key_inputs(self, config: C128CompressConfig) -> dict[str, Any]:
        return {"state_cache": Like(shape=(1, STATE_BLOCK_SIZE, 2 * DS_HEAD_DIM))}

    check_inputs = staticmethod(check_k7)
    returns_output = True

    def bind_output(self, ops: Any, t: int) -> tuple[Any, Any]:
        out = ops.out
        if out is None:
            out = torch.empty((t, DS_HEAD_DIM), dtype=torch.float32, device=ops.state_cache.device)
            ops = ops._replace(out=out)
        return ops, out[:t]


# --------------------------------------------------------------------------- K8a / K8b


class C128StoreBase(C128Base):
    """What K8a and K8b share: the call with the K8 checks. Each op class adds its record,
    CompileKey, dispatch and warmup keys; a backend class :meth:`launch_args` and the kernel."""

    check_inputs = staticmethod(check_k8)


#: The fields the K8a and K8b keys begin with.
_StoreKey = fixed_fields("_StoreKey", head_size=512, rope_head_dim=64, fp8_max=448.0, quant_block=64)


class C128StoreDsMlaBase(C128StoreBase):
    """K8a: C128 RMSNorm -> RoPE -> E1 into the fp8_ds_mla cache (page geometry in the key, trap 4); C128
    layers with an fp8_ds_mla cache, every step."""

    Operands = OPERANDS["c128_norm_rope_store_ds_mla"]

    @dataclass(frozen=True, kw_only=True)
    class CompileKey(_StoreKey):
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
        return config.stores(RATIO, "fp8_ds_mla")

    def key_inputs(self, config: C128CompressConfig) -> dict[str, Any]:
        kv_bs, stride = config.page_geometry
        cache = Like(shape=(1, kv_bs, DS_ENTRY_BYTES), stride=(stride, DS_ENTRY_BYTES, 1), dtype=torch.uint8)
        return {**super().key_inputs(config), "k_cache": cache}



class C128StorePlainBase(PlainRowStore, C128StoreBase):
    """K8b: C128 RMSNorm -> RoPE -> E2 bf16 / E3 e4m3 into a plain-row cache; C128 layers with a bf16 /
    fp8 cache, every step.

    E2 for a bf16 cache, E3 (``fp8_scale``) for an e4m3 one; the page geometry is a runtime value.
    """

    Operands = OPERANDS["c128_norm_rope_store_plain"]

    @dataclass(frozen=True, kw_only=True)
    class CompileKey(_StoreKey):
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




def _triton():  # the module (inferred, so tools follow `_triton().Class`); it imports this one
    from dsv4kit.kernels.c128_compress import triton

    return triton


def _cutedsl():  # imported on first use: CUTLASS costs 0.5 s at import
    from dsv4kit.kernels.c128_compress import cutedsl

    return cutedsl


SPECS = specs(
    compressor_spec(
        C128CompressBase, c128_compress_reference,
        lambda: _triton().C128CompressTriton, lambda: _cutedsl().C128CompressCuTeDSL,
        "compressed_kv [T, 512] fp32, a view of out (rows of boundary tokens with slots >= 0 written; the "
        "others untouched)",
        # K7 writes out (allocated [T, 512] when None) and returns its first T rows.
        result=lambda a: a["out"][: a["positions"].shape[0]],
        allocates={"out": lambda a: torch.empty((a["positions"].shape[0], DS_HEAD_DIM), dtype=torch.float32,
                                                device=a["state_cache"].device)},
    ),
    compressor_spec(C128StoreDsMlaBase, c128_norm_rope_store_ds_mla_reference,
                    lambda: _triton().C128StoreDsMlaTriton, lambda: _cutedsl().C128StoreDsMlaCuTeDSL),
    compressor_spec(C128StorePlainBase, c128_norm_rope_store_plain_reference,
                    lambda: _triton().C128StorePlainTriton, lambda: _cutedsl().C128StorePlainCuTeDSL),
)
