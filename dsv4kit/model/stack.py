"""DSv4AttentionStack: the attention side of a DeepSeek-V4 model, as its kernels see it.

The stack is built from a :class:`~dsv4kit.model.presets.ModelPreset` plus the runtime settings
a serving engine is started with (platform/arch, KV cache dtype, indexer cache format, cache
block size B, batch limits, max model length). Building it walks the layers and, for every
family spec in :data:`FAMILIES` (the families of :data:`dsv4kit.model.hooks.HOOKS`, in call
order), registers the family's kernel wherever its gate says the runtime calls it (the hook's
``config(stack, layer)`` is not None). Under an active :class:`~dsv4kit.jit.WarmupRegistry`
that collects the warmup keys; 43 layers registering one kernel collapse into one entry.

The stack knows no family: where each one runs (compress ratio per layer, cache dtype, indexer
format, B), which variant, and how a serving step becomes op calls all live in the family's
model hooks (``dsv4kit/model/hooks/<folder>.py``); the kernels know nothing of the model. What
the stack holds is the runtime settings, the layers, and the one platform whose backend
predicate both registration and the ops consult, so registration can never warm CuTeDSL where
Triton runs, or the reverse (trap 6). A replayed call
is bound to the kernel's ``dispatch`` by argument name (:meth:`FamilySpec.dispatch`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import Call, FamilySpec, TensorSpec
from dsv4kit.formats.cache_dtypes import (
    CACHE_DTYPES,
    INDEXER_CACHE_DTYPES,
    NORM_WEIGHT_DTYPES,
    ROPE_CACHE_DTYPES,
    normalize_cache_dtype,
)
from dsv4kit.jit import JitKernel, WarmupRegistry, WarmupReport
from dsv4kit.jit import registry as jit_registry
from dsv4kit.jit.store import ArtifactStore
from dsv4kit.model.hooks import HOOKS, ModelHooks, check_dispatch_by_name, model_families
from dsv4kit.model.presets import DSV4_FLASH, DSV4_PRO, ModelPreset
from dsv4kit.platform import BACKENDS, Platform, check_arch, cpu_platform, current_platform

if TYPE_CHECKING:
    from dsv4kit.model.trace import ReplayStats, Step

__all__ = [
    "CACHE_DTYPES",
    "FAMILIES",
    "INDEXER_CACHE_DTYPES",
    "MAX_BLOCK_SIZE",
    "PRESET_NAMES",
    "ROPE_CACHE_DTYPES",
    "AttentionLayer",
    "Call",
    "DSv4AttentionStack",
    "TensorSpec",
    "check_block_size",
    "gpu_platform",
    "normalize_cache_dtype",
    "registrations_table",
    "resolve_preset",
    "union_keys",
    "warmup",
]

STACK = "DSv4AttentionStack"

#: Short preset names of the CLI.
PRESET_NAMES: dict[str, ModelPreset] = {"flash": DSV4_FLASH, "pro": DSV4_PRO}


# --------------------------------------------------------------------------- settings checks


#: Largest cache block size B: a page of B fp8_ds_mla entries (584 bytes each) must be
#: addressable with 32-bit offsets by every kernel (2**16 * 584 < 2**31).
MAX_BLOCK_SIZE = 2**16


def check_block_size(value: object) -> int:
    """The cache block size B: a power of two up to ``MAX_BLOCK_SIZE``, or 0 (no paged KV cache)."""
    if (isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value & (value - 1))
            or value > MAX_BLOCK_SIZE):
        raise input_error(STACK, "block_size", f"a power of two up to {MAX_BLOCK_SIZE}, or 0", repr(value))
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


#: Every kernel family of a DSv4 layer, in call order (the specs of the model's hooks table).
FAMILIES: tuple[FamilySpec, ...] = model_families()


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
    backend for every family (checked by ``select_backend``). ``norm_weight_dtype``: the dtype of
    the compressors' RMSNorm weights (default the model dtype; ``float32`` when kept in fp32,
    trap 9).

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
        norm_weight_dtype: str = "bfloat16",
        families: Sequence[FamilySpec] = FAMILIES,
        hooks: Mapping[str, ModelHooks] = HOOKS,
    ) -> None:
        self.preset = resolve_preset(preset)
        if isinstance(platform, str):
            platform = cpu_platform(platform)
        self.platform: Platform = platform or current_platform()
        self.cache_dtype = cache_dtype
        self.kv_cache_dtype = normalize_cache_dtype(cache_dtype, STACK)
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
        if norm_weight_dtype not in NORM_WEIGHT_DTYPES:
            raise input_error(STACK, "norm_weight_dtype", f"one of {', '.join(NORM_WEIGHT_DTYPES)}",
                              repr(norm_weight_dtype))
        self.norm_weight_dtype = norm_weight_dtype
        self.families = tuple(families)
        missing = [f.name for f in self.families if f.name not in hooks]
        if missing:
            raise input_error(STACK, "hooks", f"model hooks for every family (none for {missing})",
                              sorted(hooks))
        self.hooks = dict(hooks)
        for fam in self.families:
            check_dispatch_by_name(fam)  # replayed calls reach dispatch by argument name

        self.registry = WarmupRegistry()
        self.layers: list[AttentionLayer] = []
        for index in range(self.preset.num_layers):
            layer = AttentionLayer(index, self.preset.ratio_of_layer(index))
            for fam in self.families:
                kernel = self._register(fam, layer)
                if kernel is not None:
                    layer.kernels[fam.name] = kernel
            self.layers.append(layer)

    def _register(self, fam: FamilySpec, layer: AttentionLayer) -> JitKernel | None:
        """Register ``fam`` for ``layer`` where the runtime calls it (its gate: a config)."""
        hooks = self.hooks[fam.name]
        config = hooks.config(self, layer)
        if config is None:
            return None
        # Catch what the family registers, keep it (self.registry) and forward it to whatever
        # registry is active, registration by registration (so counts stay per layer).
        probe = WarmupRegistry()
        with probe.activate():
            kernel = fam.register(config, variant=hooks.variant(self), backend=self.backend,
                                  platform=self.platform)
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

    def family_of(self, kernel_name: str) -> FamilySpec | None:
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
        calls = []
        for fam in self.families:
            kernel = layer.kernels.get(fam.name)
            if kernel is not None:
                sites = self.hooks[fam.name].call_sites(self, layer, step)
                calls += [Call(fam, kernel, s.name, s.args) for s in sites]
        return calls

    def launch(self, call: Call, args: Mapping[str, Any]) -> Any:
        """Run ``call``'s public op with real arguments, as the runtime would (no device-read checks)."""
        return call.family.op(**args, backend=call.kernel.backend, platform=self.platform, debug_checks=False)

    def unused(self, fam: FamilySpec) -> str | None:
        """Why this runtime never calls ``fam`` at all, or None."""
        hooks = self.hooks.get(fam.name)
        return "not part of the DSv4 attention stack" if hooks is None else hooks.unused(self)

    def not_selected(self, fam: FamilySpec, kernel: JitKernel) -> str | None:
        """Why this runtime never calls ``kernel`` of ``fam`` (family unused, another variant), or None."""
        why = self.unused(fam)
        if why is not None:
            return why
        hooks = self.hooks[fam.name]
        v = fam.variant_of(kernel)
        if v is not None and v != hooks.variant(self):
            return f"{v.upper()} variant not selected: {hooks.variant_reason(self)}"
        return None

    def explain_dead(self, fam: FamilySpec, key: Any, stats: ReplayStats) -> str | None:
        """The family's reason a warmed ``key`` was never requested by a trace, or None."""
        hooks = self.hooks.get(fam.name)
        return None if hooks is None else hooks.explain_dead(self, key, stats)

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
            lines.append(f"  {fam.spec_id} {fam.name}: {what}")
        return "\n".join(lines)

    def clear_compiled(self) -> None:
        """Forget every executor the stack's kernels compiled (cached per class and target)."""
        for kernel in self.kernels().values():
            type(kernel).clear_cache()


# --------------------------------------------------------------------------- warmup


def warmup(registry: WarmupRegistry, *, jobs: int = 1, store: ArtifactStore | None = None,
           progress: bool = True, raise_on_failure: bool = False) -> WarmupReport:
    """Warm every key of ``registry`` (see :meth:`WarmupRegistry.warmup`): keys in ``store`` are
    loaded, the others compiled (with ``jobs > 1`` in that many worker processes, CuTeDSL
    included) and stored. Returns the report (every key is attempted; failures are in it, and
    raised only with ``raise_on_failure``); ``report.wall_seconds`` is the wall time."""
    t0 = time.perf_counter()
    report = registry.warmup(progress=progress, raise_on_failure=raise_on_failure, store=store, jobs=jobs)
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
