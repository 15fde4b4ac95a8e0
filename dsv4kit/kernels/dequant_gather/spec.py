"""K3 dequant-gather: the contract every backend shares (CompileKey, dispatch, warmup keys, the
call) and the family spec (its place in a DSv4 layer, the sparse-MLA prefill path:
:mod:`dsv4kit.model.hooks.dequant_gather`).

K3 (spec §3) keys on ``(block_size, has_gather_lens)`` only: the page stride, the offset, the
request count and every length are runtime values. A backend subclass adds the kernel, its
launch arguments and its device rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import FamilySpec, Variant, backend_modules
from dsv4kit.family.operands import kernel_call
from dsv4kit.family.schema import as_int
from dsv4kit.formats.cache_dtypes import normalize_cache_dtype
from dsv4kit.formats.checks import check_values_in_range
from dsv4kit.formats.ds_mla import DS_ENTRY_BYTES
from dsv4kit.jit import Immediate, JitKernel, Like, zip_inputs
from dsv4kit.kernels.dequant_gather.reference import (
    ARGS,
    KERNEL,
    DequantGatherOperands,
    check_dequant_gather_inputs,
    dequantize_and_gather_k_cache_reference,
)

__all__ = [
    "SPEC",
    "DequantGatherBase",
    "DequantGatherConfig",
    "MAX_GRID_Y",
    "check_dequant_gather_values",
    "config_fields",
    "get_warmup_keys",
    "warmup_block_sizes",
]

#: Requests go on the grid's y dimension (CUDA limit 65 535).
MAX_GRID_Y = 65_535
_I32 = 2**31


@dataclass(frozen=True)
class DequantGatherConfig:
    """The warmup inputs K3 reads (spec §2.11): cache block size B, compress ratios, cache dtype.

    ``compress_ratios`` may be the per-layer tuple of a preset (0 = sliding-window only) or
    just the set of ratios; only ratios > 1 add keys. Any object with ``cache_block_size`` and
    ``compress_ratios`` attributes (a :class:`~dsv4kit.model.presets.ModelPreset`, say) is
    accepted wherever this config is; a missing ``cache_dtype`` means ``"fp8_ds_mla"``.
    """

    cache_block_size: int = 256
    compress_ratios: tuple[int, ...] = (4, 128)
    cache_dtype: str = "fp8_ds_mla"

    @classmethod
    def for_layer(cls, config: Any, ratio: int) -> DequantGatherConfig:
        """The config of one layer of compress ``ratio`` (0 or 1: sliding-window only) of ``config``."""
        b, _, dtype = config_fields(config)
        return cls(b, (ratio,) if ratio > 1 else (), dtype)


def config_fields(config: Any) -> tuple[int, tuple[int, ...], str]:
    """``(B, sorted ratios > 1, cache_dtype)`` of a config (None: DSv4-Flash defaults)."""
    cfg = DequantGatherConfig() if config is None else config
    where = "dequant_gather warmup config"
    b = getattr(cfg, "cache_block_size", None)
    if isinstance(b, bool) or not isinstance(b, int) or b < 0:
        raise input_error(where, "cache_block_size", "an int >= 0", repr(b))
    ratios = getattr(cfg, "compress_ratios", None)
    if not isinstance(ratios, Iterable) or not all(isinstance(r, int) and r >= 0 for r in ratios):
        raise input_error(where, "compress_ratios", "ints >= 0 (0: sliding-window only)", repr(ratios))
    dtype = normalize_cache_dtype(getattr(cfg, "cache_dtype", "fp8_ds_mla"), where)
    return b, tuple(sorted({r for r in ratios if r > 1})), dtype


def warmup_block_sizes(config: Any, ratio: int | None = None) -> list[tuple[int, bool]]:
    """``(block_size, has_gather_lens)`` pairs of spec K3 for a config (one layer if ``ratio``).

    Every layer gathers its sliding window ``(B, True)``; a compressed layer of ratio R also
    gathers its compressed entries ``(max(1, B // R), False)``. B = 0 or a cache that is not
    fp8_ds_mla: none.
    """
    b, ratios, dtype = config_fields(config)
    if b == 0 or dtype != "fp8_ds_mla":
        return []
    if ratio is not None:
        ratios = (ratio,) if ratio > 1 else ()
    out = [(b, True)] + [(max(1, b // r), False) for r in ratios]
    return list(dict.fromkeys(out))


def check_dequant_gather_values(ops: Any) -> None:
    """Debug checks (device reads, spec K3) of a call's record ``ops``: ``0 <= G <= L``,
    ``offset + G <= M``, ``ceil(L / bs) <= max_blocks`` (via the reference's checks) and every page
    id the call will read in ``[0, num_pages)``. Entries past ``ceil(L / bs)`` (padding) are not
    looked at."""
    k_cache, seq_lens, gather_lens, block_table = ops.k_cache, ops.seq_lens, ops.gather_lens, ops.block_table
    check_dequant_gather_inputs(ops._replace(block_size=k_cache.shape[1]), debug_checks=True)
    nreq = seq_lens.shape[0]
    if nreq == 0 or block_table.shape[1] == 0:
        return
    bs = k_cache.shape[1]
    length = seq_lens.to(torch.int64)
    g = length if gather_lens is None else gather_lens.to(torch.int64)
    lo = (length - g) // bs                       # first block holding one of the last G entries
    hi = torch.where(g > 0, (length + bs - 1) // bs, lo)
    j = torch.arange(block_table.shape[1], device=block_table.device)
    used = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
    check_values_in_range(KERNEL, "block_table", block_table[used], 0, k_cache.shape[0])


class DequantGatherBase(JitKernel["DequantGatherBase.CompileKey"]):
    """Contract half of K3; a backend class adds the kernel, its launch arguments and device rule."""

    @dataclass(frozen=True)
    class CompileKey:
        #: Entries per page (``k_cache.shape[1]``): B for the sliding window, max(1, B // R) compressed.
        block_size: int
        #: An explicit ``gather_lens`` (the last G entries); None gathers all L entries.
        has_gather_lens: bool

    def dispatch(self, k_cache, gather_lens):
        return self.CompileKey(block_size=k_cache.shape[1], has_gather_lens=gather_lens is not None)

    def get_warmup_keys(self, config: Any = None) -> list[CompileKey]:
        """Spec K3: ``[(B, True)] + [(max(1, B // R), False) for R in sorted ratios > 1]``."""
        pairs = warmup_block_sizes(config)
        if not pairs:
            return []
        rows = [dict(k_cache=Like(shape=(1, bs, DS_ENTRY_BYTES)), gather_lens=Like(shape=(1,)) if g else None)
                for bs, g in pairs]
        return list(dict.fromkeys(self.trace(zip_inputs(*rows))))

    # ------------------------------------------------------------------ per backend
    def launch_args(
        self,
        key: CompileKey,
        out: torch.Tensor,
        k_cache: torch.Tensor,
        seq_lens: torch.Tensor,
        gather_lens: torch.Tensor | None,
        block_table: torch.Tensor,
        offset: int,
    ) -> tuple[Any, ...]:
        """The executor's arguments for one call."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the call
    __call__ = kernel_call(
        DequantGatherOperands,
        """Write ``out[b, offset + i]`` for ``i < G_b`` (spec K3); returns ``out``.

        Metadata checks always run (host only); with ``debug_checks`` the value checks of spec
        K3 run too (device reads). Nothing is launched before every check passed.
        """)

    def launch_operands(self, ops: Any, debug_checks: bool | None) -> Any:
        """The launch spec of one bound call (``ops``, a :data:`DequantGatherOperands`)."""
        nreq = check_dequant_gather_inputs(ops, debug_checks=False)
        out, k_cache, seq_lens, gather_lens, block_table, _, offset = ops
        offset = as_int(offset)  # a numpy int is an int (and launches as one)
        self.check_device("k_cache", k_cache)
        if k_cache.shape[1] < 1:
            raise input_error(KERNEL, "k_cache", "shape[1] (block size) >= 1",
                              f"shape {tuple(k_cache.shape)}")
        rows = out.shape[1]
        if nreq > MAX_GRID_Y:
            raise input_error(KERNEL, "seq_lens", f"at most {MAX_GRID_Y} requests", nreq)
        if rows >= _I32:
            raise input_error(KERNEL, "out", f"shape[1] < {_I32}", f"shape {tuple(out.shape)}")
        if offset >= _I32:
            raise input_error(KERNEL, "offset", f"an int < {_I32}", offset)
        if block_table.stride(0) >= _I32:
            raise input_error(KERNEL, "block_table", f"stride(0) < {_I32}", f"strides {block_table.stride()}")
        # Under the interpreter a bad page id would read arbitrary host memory (a crash, not a
        # wrong answer), and value checks cost little there; on the GPU they are opt-in.
        if (not self.platform.is_cuda) if debug_checks is None else debug_checks:
            check_dequant_gather_values(ops)
        if nreq == 0 or offset >= rows:
            return Immediate(out)  # nothing to write (offset == M leaves room for G == 0 only)
        key = self.dispatch(k_cache, gather_lens)
        return key, self.launch_args(key, out, k_cache, seq_lens, gather_lens, block_table, offset), out


def get_warmup_keys(config: Any = None, *, ratio: int | None = None) -> list[DequantGatherBase.CompileKey]:
    """Spec K3 warmup keys of a config (a :class:`DequantGatherConfig`, a ModelPreset, ...).

    DSv4-Flash (B = 256, ratios {4, 128}): ``(256, True), (64, False), (2, False)``; B = 0 or a
    cache dtype other than fp8_ds_mla: none. With ``ratio``: the keys of one such layer.
    """
    return [DequantGatherBase.CompileKey(bs, g) for bs, g in warmup_block_sizes(config, ratio)]


_triton, _cutedsl = backend_modules(__package__)  # each imported on first use


SPEC = FamilySpec(
    name="dequant_gather", spec_id="K3",
    summary="fp8_ds_mla -> bf16 gather for sparse-MLA prefill: window (B) and compressed (B // R) pages",
    op_name=KERNEL,  # the name its input errors give
    args=ARGS,
    contract=DequantGatherBase,
    variants=Variant(dequantize_and_gather_k_cache_reference,
                     lambda: _triton().DequantGatherTriton,
                     lambda: _cutedsl().DequantGatherCuTeDSL),
    returns="out (bf16 [B_req, M, 512]); row offset + i of request b is entry L - G + i of its pages, "
            "nothing else of out changes",
    config_type=DequantGatherConfig,
    mutates=("out",),
    result=lambda a: a["out"],
)
