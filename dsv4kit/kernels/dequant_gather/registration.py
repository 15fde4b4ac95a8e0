"""K3 registration: which kernel object serves a platform, and the keys a model registers.

Both the runtime op and warmup registration pick the backend with the same predicate,
:meth:`dsv4kit.platform.Platform.select_backend`, so a warmed kernel is the one that runs
(spec §2.11, trap 6). One kernel object per (backend, platform) is shared by every layer; its
compiled executors are shared per class anyway.
"""

from __future__ import annotations

from typing import Any

from dsv4kit.jit import registry
from dsv4kit.kernels.dequant_gather.common import DequantGatherBase, DequantGatherConfig, warmup_block_sizes
from dsv4kit.kernels.dequant_gather.reference import KERNEL
from dsv4kit.platform import Platform, current_platform

__all__ = ["DequantGatherConfig", "get_warmup_keys", "kernel_for", "register_dequant_gather"]

_KERNELS: dict[tuple[str, Platform], DequantGatherBase] = {}


def kernel_for(platform: Platform | None = None, backend: str | None = None) -> DequantGatherBase:
    """The K3 kernel object that runs on ``platform`` (default: the current one).

    ``backend`` forces ``"triton"`` or ``"cutedsl"`` (checked by ``select_backend``).
    """
    plat = platform or current_platform()
    which = plat.select_backend("cuda" if plat.is_cuda else "cpu", backend, what=KERNEL)
    return _kernel(which, plat)


def _kernel(which: str, plat: Platform) -> DequantGatherBase:
    k = _KERNELS.get((which, plat))
    if k is None:
        if which == "cutedsl":
            from dsv4kit.kernels.dequant_gather.cutedsl import DequantGatherCuTeDSL as cls
        else:
            from dsv4kit.kernels.dequant_gather.triton import DequantGatherTriton as cls
        k = _KERNELS[(which, plat)] = cls(plat)
    return k


def get_warmup_keys(config: Any = None, *, ratio: int | None = None) -> list[DequantGatherBase.CompileKey]:
    """Spec K3 warmup keys of a config (a :class:`DequantGatherConfig`, a ModelPreset, ...).

    DSv4-Flash (B = 256, ratios {4, 128}): ``(256, True), (64, False), (2, False)``; B = 0 or a
    cache dtype other than fp8_ds_mla: none. With ``ratio``: the keys of one such layer.
    """
    return [DequantGatherBase.CompileKey(bs, g) for bs, g in warmup_block_sizes(config, ratio)]


def register_dequant_gather(
    config: Any = None,
    *,
    ratio: int | None = None,
    platform: Platform | None = None,
    backend: str | None = None,
) -> DequantGatherBase:
    """Register K3's keys (one layer of compress ``ratio``, or the whole model) with the active
    :class:`~dsv4kit.jit.WarmupRegistry`, on the kernel the runtime will select; returns it.

    A no-op without an active registry, as ``register_warmup`` is.
    """
    kernel = kernel_for(platform, backend)
    keys = kernel.layer_warmup_keys(config, ratio)
    if keys:
        registry.register(kernel, keys)
    return kernel
