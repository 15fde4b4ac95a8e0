"""DSv4AttentionStack: the attention side of a DeepSeek-V4 model, as its kernels see it.

The stack is built from a :class:`~dsv4kit.model.presets.ModelPreset` plus the runtime settings
a serving engine is started with (platform/arch, KV cache dtype, indexer cache format, cache
block size B, batch limits, max model length). Building it walks the layers and, for every
kernel family in :data:`FAMILIES`, calls the family's registration function wherever the runtime
would call the family's op. Under an active :class:`~dsv4kit.jit.WarmupRegistry` that collects
the warmup keys; 43 layers registering one kernel collapse into one registry entry.

Runtime gating mirrored here (spec §1 data flow, §2.11, K1-K3):

* **Compress ratio per layer** from the preset: 0 (sliding-window only, treated as ratio 1),
  4 (C4: has the indexer) or 128 (C128).
* **K1/K2 indexer-Q** runs on every C4 layer, on all ``T`` tokens of every step (padded ``T``
  under a CUDA graph). K1 when the indexer cache is ``fp8``, K2 when it is ``mxfp4``: exactly
  one of the two is registered.
* **K3 dequant-gather** is the sparse-MLA prefill path: it exists only with the ``fp8_ds_mla``
  KV cache and a paged cache (B > 0), and runs only in steps that prefill. Per layer it gathers
  the sliding window (page size B, explicit ``gather_lens``) and, on a compressed layer of ratio
  R, the compressed entries (page size ``max(1, B // R)``, no ``gather_lens``). Warmup keys:
  ``[(B, True)] + [(max(1, B // r), False) for r in sorted ratios > 1]``, none if B == 0.
  Plain-row caches (``bfloat16``/``auto``, ``fp8``/``fp8_e4m3``) take the dense path: no K3.
* **Platform gate**: every family picks its backend with
  :meth:`~dsv4kit.platform.Platform.select_backend`, the predicate its op uses at runtime, so
  registration can never warm CuTeDSL where Triton runs, or the reverse (trap 6).

A family (one row of :data:`FAMILIES`) is a registration function plus a runtime call site:
``call_sites(stack, layer, step)`` describes each op call of a serving step as op arguments
(:class:`TensorSpec` stand-ins or scalars), ``dispatch(kernel, args)`` derives the key exactly
as the op's ``__call__`` does (same kernel object, same ``dispatch``), and ``launch`` calls the
public op with real tensors. Families added later (K4-K9) plug in by appending a row.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.jit import JitKernel, Like, WarmupRegistry, WarmupReport
from dsv4kit.jit import registry as jit_registry
from dsv4kit.model.presets import DSV4_FLASH, DSV4_PRO, ModelPreset
from dsv4kit.platform import BACKENDS, Platform, check_arch, cpu_platform, current_platform

if TYPE_CHECKING:
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = [
    "CACHE_DTYPES",
    "FAMILIES",
    "INDEXER_CACHE_DTYPES",
    "PRESET_NAMES",
    "ROPE_CACHE_DTYPES",
    "AttentionLayer",
    "Call",
    "DSv4AttentionStack",
    "KernelFamily",
    "TensorSpec",
    "check_block_size",
    "gpu_platform",
    "normalize_cache_dtype",
    "prefetch_triton",
    "registrations_table",
    "resolve_preset",
    "union_keys",
    "warmup",
]

STACK = "DSv4AttentionStack"

#: KV cache dtype strings (spec §2.11, trap 3) -> canonical kind. Anything else is rejected.
CACHE_DTYPES: dict[str, str] = {
    "fp8_ds_mla": "fp8_ds_mla",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "auto": "bfloat16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
}
INDEXER_CACHE_DTYPES = ("fp8", "mxfp4")
#: dtype of the RoPE cos/sin caches at runtime (fp32 as built; bf16 after a module-wide cast).
ROPE_CACHE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Short preset names of the CLI.
PRESET_NAMES: dict[str, ModelPreset] = {"flash": DSV4_FLASH, "pro": DSV4_PRO}

#: Pages of each KV-cache pool in ``launch`` mode: block tables alias them (K3 only reads pages).
LAUNCH_POOL_PAGES = 16


# --------------------------------------------------------------------------- settings checks


def normalize_cache_dtype(value: object) -> str:
    """``"fp8_ds_mla"``, ``"fp8"`` (also ``"fp8_e4m3"``) or ``"bfloat16"`` (also ``"bf16"``, ``"auto"``).

    Anything else (``"fp8_e5m2"``, say) is rejected here, at configuration time (trap 3).
    """
    if not isinstance(value, str) or value not in CACHE_DTYPES:
        raise input_error(STACK, "cache_dtype", f"one of {', '.join(CACHE_DTYPES)}", repr(value))
    return CACHE_DTYPES[value]


def check_block_size(value: object) -> int:
    """The cache block size B: a power of two, or 0 (no paged KV cache)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value & (value - 1)):
        raise input_error(STACK, "block_size", "a power of two or 0", repr(value))
    return value


def resolve_preset(preset: ModelPreset | str) -> ModelPreset:
    """A preset, or its name (``"flash"``, ``"pro"``, or ``"DSv4-Flash"`` ... case-insensitive)."""
    if isinstance(preset, ModelPreset):
        return preset
    if isinstance(preset, str):
        names = {**PRESET_NAMES, **{p.name: p for p in PRESET_NAMES.values()}}
        for name, p in names.items():
            if name.lower() == preset.lower():
                return p
    raise input_error(STACK, "preset", f"one of {', '.join(PRESET_NAMES)} (or a ModelPreset)", repr(preset))


def gpu_platform(arch: str) -> Platform:
    """The platform a GPU process of ``arch`` has, for compile-only use on a machine without one.

    Registration then selects what a real H100/H200 (sm_90a) or B200 (sm_100a) would (CuTeDSL
    where it is importable); keys compile ahead of time for ``arch``; nothing can launch.
    """
    cpu = cpu_platform(check_arch(arch, "gpu_platform"))
    return Platform("cuda", arch, "no device, compile only", cpu.cutedsl, cpu.tvm_ffi)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise input_error(STACK, name, "an int >= 1", repr(value))
    return value


# --------------------------------------------------------------------------- call descriptions


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument of an op call, described by metadata only.

    ``like()`` gives the :class:`~dsv4kit.jit.Like` stand-in a ``dispatch`` reads (shape, dtype,
    stride, device); ``materialize`` builds the real tensor for ``launch`` mode: ``values`` (a
    function returning a CPU tensor: positions, lengths, block tables), or zeros. Tensors with a
    ``pool`` name share one allocation (the caches of all layers, workspaces grown on demand).
    ``make`` allocates specially (e.g. an fp8_ds_mla cache with its page stride).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None
    pool: str | None = None
    values: Callable[[], torch.Tensor] | None = field(default=None, compare=False)
    make: Callable[[torch.device], torch.Tensor] | None = field(default=None, compare=False)

    def strides(self) -> tuple[int, ...]:
        if self.stride is not None:
            return self.stride
        out, acc = [], 1
        for n in reversed(self.shape):
            out.append(acc)
            acc *= max(n, 1)
        return tuple(reversed(out))

    def like(self, device: str = "cpu") -> Like:
        return Like(shape=tuple(self.shape), dtype=self.dtype, stride=self.strides(),
                    device=torch.device(device), ndim=len(self.shape))

    def materialize(self, device: torch.device, pools: dict[Any, torch.Tensor]) -> torch.Tensor:
        if self.values is not None:
            t = self.values()
            if tuple(t.shape) != tuple(self.shape) or t.dtype != self.dtype:
                raise AssertionError(f"TensorSpec values: {tuple(t.shape)} {t.dtype}, "
                                     f"declared {self.shape} {self.dtype}")
            return t.to(device)
        if self.make is not None:
            key = (self.pool, self.shape, self.stride)
            if self.pool is None or key not in pools:
                t = self.make(device)
                if self.pool is None:
                    return t
                pools[key] = t
            return pools[key]
        numel = math.prod(self.shape)
        if self.pool is None:
            return torch.zeros(self.shape, dtype=self.dtype, device=device)
        key = (self.pool, self.dtype)
        buf = pools.get(key)
        if buf is None or buf.numel() < numel:
            buf = pools[key] = torch.zeros(max(numel, 1), dtype=self.dtype, device=device)
        return buf[:numel].view(self.shape)


@dataclass(frozen=True)
class Call:
    """One op call of a serving step on one layer: which family, kernel and call site, with what."""

    family: KernelFamily
    kernel: JitKernel
    site: str
    args: Mapping[str, Any]

    def like_args(self, device: str = "cpu") -> dict[str, Any]:
        return {k: v.like(device) if isinstance(v, TensorSpec) else v for k, v in self.args.items()}

    def real_args(self, device: torch.device, pools: dict[Any, torch.Tensor]) -> dict[str, Any]:
        return {k: v.materialize(device, pools) if isinstance(v, TensorSpec) else v
                for k, v in self.args.items()}

    def key(self, device: str = "cpu") -> Any:
        """The key the op would dispatch for this call (metadata only, nothing launched)."""
        return self.family.dispatch(self.kernel, self.like_args(device))


@dataclass(frozen=True)
class KernelFamily:
    """A kernel family as the model uses it: registration, runtime call sites, diagnosis.

    ``register(stack, layer)`` registers the family's kernel for one layer (a no-op where the
    runtime would not call it) and returns the kernel or None. ``call_sites(stack, layer, step)``
    lists the op calls the layer makes in a serving step. ``dispatch(kernel, args)`` maps op
    arguments to the key exactly as the op's ``__call__`` does. ``launch(stack, kernel, args)``
    runs the public op. ``explain_dead(stack, kernel, key, stats)`` says why a warmed key was
    never requested, or returns None when the family has no specific reason. ``owns(kernel)``:
    whether a kernel object (any variant, any backend) belongs to the family.
    ``not_selected(stack, kernel)``: why the runtime never calls that kernel object (the other
    variant; the family unused by the configuration), or None.
    """

    name: str
    spec: str
    summary: str
    owns: Callable[[JitKernel], bool]
    register: Callable[[DSv4AttentionStack, AttentionLayer], JitKernel | None]
    call_sites: Callable[[DSv4AttentionStack, AttentionLayer, Step], list[Call]]
    dispatch: Callable[[JitKernel, Mapping[str, Any]], Any]
    launch: Callable[[DSv4AttentionStack, JitKernel, Mapping[str, Any]], Any]
    explain_dead: Callable[[DSv4AttentionStack, JitKernel, Any, ReplayStats], str | None]
    not_selected: Callable[[DSv4AttentionStack, JitKernel], str | None] = lambda stack, kernel: None


# --------------------------------------------------------------------------- K1/K2 indexer-Q


def _iq_config(stack: DSv4AttentionStack) -> Any:
    from dsv4kit.kernels.indexer_q import IndexerQConfig

    return IndexerQConfig(
        max_num_batched_tokens=stack.max_num_batched_tokens,
        cos_sin_dtypes=tuple(ROPE_CACHE_DTYPES[d] for d in stack.warmup_cos_sin_dtypes),
        indexer_cache_dtype=stack.indexer_cache_dtype,  # type: ignore[arg-type]
    )


def _iq_register(stack: DSv4AttentionStack, layer: AttentionLayer) -> JitKernel | None:
    if layer.compress_ratio != 4:
        return None  # only C4 layers have an indexer
    from dsv4kit.kernels.indexer_q import register_indexer_q

    return register_indexer_q(_iq_config(stack), backend=stack.backend, platform=stack.platform)


def _iq_call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Call]:
    kernel = layer.kernels.get("indexer_q")
    if kernel is None:
        return []
    t = step.padded_tokens
    p = stack.preset
    args = {
        "positions": TensorSpec((t,), torch.int64, values=step.positions),
        "index_q": TensorSpec((t, p.index_n_heads, p.index_head_dim), torch.bfloat16, pool="index_q"),
        "cos_sin_cache": TensorSpec((p.compress_rope.max_pos, p.compress_rope.rope_dim), stack.rope_dtype,
                                    pool=f"cos_sin:{stack.rope_cache_dtype}"),
        "index_weights": TensorSpec((t, p.index_n_heads), torch.bfloat16, pool="index_weights"),
    }
    return [Call(INDEXER_Q, kernel, "indexer_q", args)]


def _iq_dispatch(kernel: Any, args: Mapping[str, Any]) -> Any:
    # IndexerQBase.__call__: t = index_q.shape[0] (validated == len(positions)); T == 0 never
    # reaches dispatch (the trace has no empty steps).
    return kernel.dispatch(args["index_q"], args["cos_sin_cache"], args["index_q"].shape[0])


def _iq_launch(stack: DSv4AttentionStack, kernel: Any, args: Mapping[str, Any]) -> Any:
    from dsv4kit.kernels.indexer_q import indexer_q_rope_quant

    p = stack.preset
    return indexer_q_rope_quant(args["positions"], args["index_q"], args["cos_sin_cache"],
                                args["index_weights"], cache_format=kernel.cache_format,
                                softmax_scale=p.indexer_softmax_scale, head_scale=p.indexer_head_scale,
                                backend=stack.backend)


def _iq_not_selected(stack: DSv4AttentionStack, kernel: Any) -> str | None:
    fmt = getattr(kernel, "cache_format", None)
    if fmt is not None and fmt != stack.indexer_cache_dtype:
        return (f"{fmt.upper()} variant not selected: this runtime's indexer cache is "
                f"{stack.indexer_cache_dtype}")
    return None


def _iq_explain(stack: DSv4AttentionStack, kernel: Any, key: Any, stats: ReplayStats) -> str | None:
    from dsv4kit.kernels.indexer_q import COARSEN_AT

    if key.cos_sin_dtype != stack.rope_cache_dtype:
        return (f"cos_sin {key.cos_sin_dtype} never requested: this runtime's RoPE cache is "
                f"{stack.rope_cache_dtype} (the other dtype is warmed for a model-dtype cast, trap 1)")
    if not stats.tokens:
        return "no step in this trace"
    if key.coarsen > 1 and max(stats.tokens) < COARSEN_AT:
        return (f"coarsen-{key.coarsen} never requested by this trace (largest batch "
                f"{max(stats.tokens)} tokens < {COARSEN_AT})")
    if key.coarsen == 1 and min(stats.tokens) >= COARSEN_AT:
        return (f"coarsen-1 never requested by this trace (smallest batch {min(stats.tokens)} tokens "
                f">= {COARSEN_AT})")
    return None


def _iq_owns(kernel: JitKernel) -> bool:
    from dsv4kit.kernels.indexer_q.common import IndexerQBase

    return isinstance(kernel, IndexerQBase)


INDEXER_Q = KernelFamily(
    name="indexer_q", spec="K1/K2",
    summary="indexer-Q RoPE + FP8 (K1) or MXFP4 (K2) quant; C4 layers, every step, all T tokens",
    owns=_iq_owns,
    register=_iq_register, call_sites=_iq_call_sites, dispatch=_iq_dispatch, launch=_iq_launch,
    explain_dead=_iq_explain, not_selected=_iq_not_selected,
)


# --------------------------------------------------------------------------- K3 dequant-gather


def _k3_config(stack: DSv4AttentionStack) -> Any:
    from dsv4kit.kernels.dequant_gather import DequantGatherConfig

    return DequantGatherConfig(cache_block_size=stack.block_size,
                               compress_ratios=stack.preset.compress_ratios, cache_dtype=stack.kv_cache_dtype)


def _k3_used(stack: DSv4AttentionStack) -> bool:
    return stack.kv_cache_dtype == "fp8_ds_mla" and stack.block_size > 0


def _k3_register(stack: DSv4AttentionStack, layer: AttentionLayer) -> JitKernel | None:
    if not _k3_used(stack):
        return None  # dense (plain-row) path, or no paged cache
    from dsv4kit.kernels.dequant_gather import register_dequant_gather

    return register_dequant_gather(_k3_config(stack), ratio=layer.compress_ratio, platform=stack.platform,
                                   backend=stack.backend)


def _ds_cache_spec(bs: int) -> TensorSpec:
    from dsv4kit.formats.ds_mla import DS_ENTRY_BYTES, allocate_ds_cache, ds_min_page_stride

    stride = ds_min_page_stride(bs)
    return TensorSpec((LAUNCH_POOL_PAGES, bs, DS_ENTRY_BYTES), torch.uint8, (stride, DS_ENTRY_BYTES, 1),
                      pool=f"ds_cache:{bs}",
                      make=lambda device: allocate_ds_cache(LAUNCH_POOL_PAGES, bs, device=device))


def _int32(values: Sequence[int]) -> Callable[[], torch.Tensor]:
    data = list(values)
    return lambda: torch.tensor(data, dtype=torch.int32)


def _block_table(nreq: int, blocks: int) -> Callable[[], torch.Tensor]:
    # Page ids alias a small pool: K3 only reads pages, so real layouts are not needed.
    return lambda: (torch.arange(nreq * blocks, dtype=torch.int32) % LAUNCH_POOL_PAGES).view(nreq, blocks)


def _k3_call_sites(stack: DSv4AttentionStack, layer: AttentionLayer, step: Step) -> list[Call]:
    kernel = layer.kernels.get("dequant_gather")
    prefill = step.prefill_chunks
    if kernel is None or not prefill:
        return []  # K3 is the prefill path
    b, r, window = stack.block_size, layer.compress_ratio, stack.preset.sliding_window
    nreq = len(prefill)
    seq_lens = [c.context_len + c.num_tokens for c in prefill]   # entries in the cache after the store
    gather = [min(n, c.num_tokens + window - 1) for n, c in zip(seq_lens, prefill, strict=True)]
    comp_lens = [n // r for n in seq_lens] if r > 1 else []
    width = max(comp_lens, default=0)                           # N: the compressed region of a row
    rows = width + max(gather)                                  # M = N + G_max > offset: always dispatched
    out = TensorSpec((nreq, rows, stack.preset.head_dim), torch.bfloat16, pool="k3_workspace")
    calls = []
    if r > 1:
        bs = max(1, b // r)
        blocks = max(1, -(-width // bs))
        calls.append(Call(DEQUANT_GATHER, kernel, f"gather_compressed_c{r}", {
            "out": out, "k_cache": _ds_cache_spec(bs), "seq_lens": TensorSpec((nreq,), torch.int32,
                                                                             values=_int32(comp_lens)),
            "gather_lens": None, "block_table": TensorSpec((nreq, blocks), torch.int32,
                                                           values=_block_table(nreq, blocks)),
            "block_size": bs, "offset": 0}))
    blocks = -(-max(seq_lens) // b)
    calls.append(Call(DEQUANT_GATHER, kernel, "gather_window", {
        "out": out, "k_cache": _ds_cache_spec(b),
        "seq_lens": TensorSpec((nreq,), torch.int32, values=_int32(seq_lens)),
        "gather_lens": TensorSpec((nreq,), torch.int32, values=_int32(gather)),
        "block_table": TensorSpec((nreq, blocks), torch.int32, values=_block_table(nreq, blocks)),
        "block_size": b, "offset": width}))
    return calls


def _k3_dispatch(kernel: Any, args: Mapping[str, Any]) -> Any:
    # DequantGatherBase.__call__: key = self.dispatch(k_cache, gather_lens), reached only when
    # nreq > 0 and offset < out.shape[1] (the call sites guarantee both).
    return kernel.dispatch(args["k_cache"], args["gather_lens"])


def _k3_launch(stack: DSv4AttentionStack, kernel: Any, args: Mapping[str, Any]) -> Any:
    from dsv4kit.kernels.dequant_gather import dequantize_and_gather_k_cache

    return dequantize_and_gather_k_cache(args["out"], args["k_cache"], args["seq_lens"], args["gather_lens"],
                                         args["block_table"], args["block_size"], args["offset"],
                                         backend=stack.backend, platform=stack.platform, debug_checks=False)


def _k3_not_selected(stack: DSv4AttentionStack, kernel: Any) -> str | None:
    if not _k3_used(stack):
        why = "B = 0 (no paged cache)" if stack.block_size == 0 else f"the KV cache is {stack.cache_dtype}"
        return f"K3 not used by this runtime: {why}; K3 is the fp8_ds_mla sparse-MLA prefill path"
    return None


def _k3_explain(stack: DSv4AttentionStack, kernel: Any, key: Any, stats: ReplayStats) -> str | None:
    if stats.prefill_steps == 0:
        return "no prefill in this trace: K3 gathers only on the sparse-MLA prefill path"
    return None


def _k3_owns(kernel: JitKernel) -> bool:
    from dsv4kit.kernels.dequant_gather.common import DequantGatherBase

    return isinstance(kernel, DequantGatherBase)


DEQUANT_GATHER = KernelFamily(
    name="dequant_gather", spec="K3",
    summary="fp8_ds_mla -> bf16 gather for sparse-MLA prefill: window (B) and compressed (B // R) pages",
    owns=_k3_owns,
    register=_k3_register, call_sites=_k3_call_sites, dispatch=_k3_dispatch, launch=_k3_launch,
    explain_dead=_k3_explain, not_selected=_k3_not_selected,
)

#: Every kernel family of the kit the model uses, in call order within a layer. Add a row to
#: plug in a new family (K4-K9): registration, call sites, dispatch, launch, dead-key reasons.
FAMILIES: tuple[KernelFamily, ...] = (INDEXER_Q, DEQUANT_GATHER)


# --------------------------------------------------------------------------- the stack


@dataclass
class AttentionLayer:
    """One attention layer: its compress ratio and the kernel each family registered for it."""

    index: int
    compress_ratio: int  # 0: sliding-window only (treated as ratio 1)
    kernels: dict[str, JitKernel] = field(default_factory=dict)
    #: family name -> the keys this layer registered
    keys: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return {0: "SWA", 1: "SWA"}.get(self.compress_ratio, f"C{self.compress_ratio}")


class DSv4AttentionStack:
    """The attention side of a DSv4 model with runtime settings; registers its kernels when built.

    ``platform``: a :class:`~dsv4kit.platform.Platform`, an arch (a CPU platform compiling for
    it), or None (the current platform). ``cache_dtype``: ``fp8_ds_mla``, ``bf16``/``bfloat16``/
    ``auto``, ``fp8``/``fp8_e4m3``. ``indexer_cache_dtype``: ``fp8`` or ``mxfp4``. ``block_size``:
    B, a power of two or 0 (default: the preset's). ``rope_cache_dtype``: the dtype the runtime's
    cos/sin caches have (``float32`` as built, ``bfloat16`` after a module-wide cast);
    ``warmup_cos_sin_dtypes``: the dtypes warmup covers (both, trap 1). ``cuda_graphs``: decode
    batches are padded to captured sizes up to ``max_cuda_graph_size``. ``backend`` forces one
    backend for every family (checked by ``select_backend``).

    Inside an active registry the registrations reach it; ``self.registry`` always holds this
    stack's own (so ``stack.registry.warmup()`` warms exactly what this runtime needs).
    """

    def __init__(
        self,
        preset: ModelPreset | str = DSV4_FLASH,
        platform: Platform | str | None = None,
        *,
        cache_dtype: str = "fp8_ds_mla",
        indexer_cache_dtype: str = "fp8",
        block_size: int | None = None,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        rope_cache_dtype: str = "float32",
        warmup_cos_sin_dtypes: Sequence[str] = ("float32", "bfloat16"),
        cuda_graphs: bool = True,
        max_cuda_graph_size: int = 512,
        backend: str | None = None,
        families: Sequence[KernelFamily] = FAMILIES,
    ) -> None:
        self.preset = resolve_preset(preset)
        if isinstance(platform, str):
            platform = cpu_platform(platform)
        self.platform: Platform = platform or current_platform()
        self.cache_dtype = cache_dtype
        self.kv_cache_dtype = normalize_cache_dtype(cache_dtype)
        if indexer_cache_dtype not in INDEXER_CACHE_DTYPES:
            raise input_error(STACK, "indexer_cache_dtype", "'fp8' or 'mxfp4'", repr(indexer_cache_dtype))
        self.indexer_cache_dtype = indexer_cache_dtype
        self.block_size = check_block_size(self.preset.cache_block_size if block_size is None else block_size)
        self.max_num_batched_tokens = _positive("max_num_batched_tokens", max_num_batched_tokens)
        self.max_num_seqs = _positive("max_num_seqs", max_num_seqs)
        if self.max_num_seqs > self.max_num_batched_tokens:
            raise input_error(STACK, "max_num_seqs", f"<= max_num_batched_tokens ({max_num_batched_tokens}): "
                              "every sequence of a decode step is one token", max_num_seqs)
        max_pos = self.preset.compress_rope.max_pos
        self.max_model_len = _positive("max_model_len", max_pos if max_model_len is None else max_model_len)
        if self.max_model_len > max_pos:
            raise input_error(STACK, "max_model_len", f"<= {max_pos} (rows of the RoPE cache)", max_model_len)
        if rope_cache_dtype not in ROPE_CACHE_DTYPES:
            raise input_error(STACK, "rope_cache_dtype", f"one of {', '.join(ROPE_CACHE_DTYPES)}",
                              repr(rope_cache_dtype))
        self.rope_cache_dtype = rope_cache_dtype
        bad = [d for d in warmup_cos_sin_dtypes if d not in ROPE_CACHE_DTYPES]
        if bad or not warmup_cos_sin_dtypes:
            raise input_error(STACK, "warmup_cos_sin_dtypes",
                              f"a non-empty subset of {list(ROPE_CACHE_DTYPES)}", list(warmup_cos_sin_dtypes))
        self.warmup_cos_sin_dtypes = tuple(warmup_cos_sin_dtypes)
        self.cuda_graphs = bool(cuda_graphs)
        self.max_cuda_graph_size = _positive("max_cuda_graph_size", max_cuda_graph_size)
        if backend is not None and backend not in BACKENDS:
            raise input_error(STACK, "backend", f"one of {', '.join(BACKENDS)} or None", repr(backend))
        self.backend = backend
        self.families = tuple(families)

        self.registry = WarmupRegistry()
        self.layers: list[AttentionLayer] = []
        for index in range(self.preset.num_layers):
            layer = AttentionLayer(index, self.preset.ratio_of_layer(index))
            for fam in self.families:
                kernel = self._register(fam, layer)
                if kernel is not None:
                    layer.kernels[fam.name] = kernel
            self.layers.append(layer)

    def _register(self, fam: KernelFamily, layer: AttentionLayer) -> JitKernel | None:
        # Catch what the family registers, keep it (self.registry) and forward it to whatever
        # registry is active, registration by registration (so counts stay per layer).
        probe = WarmupRegistry()
        with probe.activate():
            kernel = fam.register(self, layer)
        for reg in probe.registrations.values():
            keys = list(reg.keys)
            mine = layer.keys.setdefault(fam.name, [])
            mine += [k for k in keys if k not in mine]
            for _ in range(reg.count):
                self.registry.register(reg.kernel, keys)
                jit_registry.register(reg.kernel, keys)
        return kernel

    # ------------------------------------------------------------------ derived settings
    @property
    def rope_dtype(self) -> torch.dtype:
        return ROPE_CACHE_DTYPES[self.rope_cache_dtype]

    @property
    def device(self) -> str:
        return self.platform.device

    def cuda_graph_sizes(self) -> tuple[int, ...]:
        """Batch sizes captured as CUDA graphs (decode-only steps are padded up to one of them)."""
        if not self.cuda_graphs:
            return ()
        cap = min(self.max_num_seqs, self.max_num_batched_tokens, self.max_cuda_graph_size)
        sizes = {s for s in (1, 2, 4) if s <= cap} | set(range(8, cap + 1, 8)) | {cap}
        return tuple(sorted(sizes))

    def kernels(self) -> dict[str, JitKernel]:
        """Kernel name -> kernel object, for every kernel some layer registered."""
        return {r.kernel.name: r.kernel for r in self.registry.registrations.values()}

    def family_of(self, kernel_name: str) -> KernelFamily | None:
        for layer in self.layers:
            for fam_name, k in layer.kernels.items():
                if k.name == kernel_name:
                    return next(f for f in self.families if f.name == fam_name)
        return None

    def warmup_keys(self) -> dict[str, list[Any]]:
        """Kernel name -> the union of keys this stack registered."""
        return self.registry.keys()

    def calls(self, layer: AttentionLayer, step: Step) -> list[Call]:
        """The op calls ``layer`` makes in ``step``, in family order."""
        return [c for fam in self.families for c in fam.call_sites(self, layer, step)]

    def describe(self) -> str:
        """One paragraph: preset, platform, settings, layer kinds, and what each family registered."""
        kinds: dict[str, int] = {}
        for layer in self.layers:
            kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
        plat = self.platform
        where = (f"cuda {plat.arch}: {plat.device_name}" if plat.is_cuda
                 else f"cpu: compiles AOT for {plat.arch}, Triton runs under the interpreter")
        lines = [
            f"{self.preset.name}: {len(self.layers)} layers ("
            + ", ".join(f"{n} {k}" for k, n in kinds.items()) + f"); platform {where}",
            f"  KV cache {self.cache_dtype} ({self.kv_cache_dtype}), indexer cache "
            f"{self.indexer_cache_dtype}, B = {self.block_size}; max_num_batched_tokens "
            f"{self.max_num_batched_tokens}, max_num_seqs {self.max_num_seqs}, "
            f"max_model_len {self.max_model_len}",
            f"  RoPE cache at runtime {self.rope_cache_dtype}, warmed for "
            f"{', '.join(self.warmup_cos_sin_dtypes)}; CUDA graphs "
            f"{'up to ' + str(self.cuda_graph_sizes()[-1]) if self.cuda_graphs else 'off'}",
        ]
        for fam in self.families:
            regs = [r for r in self.registry.registrations.values()
                    if any(layer.kernels.get(fam.name) is r.kernel for layer in self.layers)]
            if regs:
                what = "; ".join(f"{r.kernel.name} ({r.kernel.backend}) x{r.count} layers, {len(r.keys)} keys"
                                 for r in regs)
            else:
                what = "not used by this configuration"
            lines.append(f"  {fam.spec} {fam.name}: {what}")
        return "\n".join(lines)

    def clear_compiled(self) -> None:
        """Forget every executor the stack's kernels compiled (cached per class and target)."""
        for kernel in self.kernels().values():
            type(kernel).clear_cache()


# --------------------------------------------------------------------------- warmup


def _aot_worker(cls: type, platform: Platform, keys: list[Any]) -> list[str | None]:
    """Compile ``keys`` ahead of time in a worker process (fills Triton's on-disk cache)."""
    kernel = cls(platform)
    errors: list[str | None] = []
    for key in keys:
        try:
            kernel.compile_for(key, platform.arch)
            errors.append(None)
        except Exception as exc:  # reported by the in-process compile that follows
            errors.append(f"{type(exc).__name__}: {exc}")
    return errors


def prefetch_triton(registry: WarmupRegistry, jobs: int) -> int:
    """Compile every Triton key of ``registry`` in ``jobs`` worker processes; returns keys sent.

    Only the on-disk Triton cache is filled: the in-process ``compile`` that follows loads from
    it in milliseconds. Threads would not help: the Triton compiler holds the GIL (measured:
    12 cold keys took 3.4 s on one thread, 4.7 s on two). CuTeDSL keys are left to the
    sequential warmup.
    """
    work = [(type(r.kernel), r.kernel.platform, k) for r in registry.registrations.values()
            if r.kernel.backend == "triton" for k in r.keys]
    if jobs <= 1 or len(work) < 2:
        return 0
    chunks: list[list[tuple[type, Platform, Any]]] = [work[i::jobs] for i in range(jobs)]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=ctx) as pool:
        futures = []
        for chunk in chunks:
            by_cls: dict[tuple[type, Platform], list[Any]] = {}
            for cls, plat, key in chunk:
                by_cls.setdefault((cls, plat), []).append(key)
            futures += [pool.submit(_aot_worker, cls, plat, keys) for (cls, plat), keys in by_cls.items()]
        for f in futures:
            f.result()
    return len(work)


def warmup(registry: WarmupRegistry, *, jobs: int = 1, progress: bool = True,
           raise_on_failure: bool = False) -> WarmupReport:
    """Compile every key of ``registry``; with ``jobs > 1`` Triton keys are first compiled in
    ``jobs`` worker processes (see :func:`prefetch_triton`). Returns the report (every key is
    attempted; failures are in it, and raised only with ``raise_on_failure``)."""
    t0 = time.perf_counter()
    if jobs > 1:
        prefetch_triton(registry, jobs)
    report = registry.warmup(progress=progress, raise_on_failure=raise_on_failure)
    report.wall_seconds = time.perf_counter() - t0  # type: ignore[attr-defined]
    return report


def registrations_table(stack: DSv4AttentionStack) -> list[dict[str, Any]]:
    """One row per layer: index, kind, and the kernel each family registered (or '-')."""
    return [{"layer": layer.index, "kind": layer.kind,
             **{fam.name: (layer.kernels[fam.name].name if fam.name in layer.kernels else "-")
                for fam in stack.families}}
            for layer in stack.layers]


def union_keys(stacks: Iterable[DSv4AttentionStack]) -> dict[str, list[Any]]:
    """Kernel name -> union of warmup keys over several stacks (in first-seen order)."""
    out: dict[str, dict[Any, None]] = {}
    for s in stacks:
        for name, keys in s.warmup_keys().items():
            d = out.setdefault(name, {})
            for k in keys:
                d.setdefault(k, None)
    return {k: list(v) for k, v in out.items()}
