"""K4 save_partial_states: the contract every backend shares, and the family spec.

K4 (spec §3 K4) keys on ``(state_width, compress_ratio, state_block_size)`` only: every
stride (kv/score row strides, the state cache's block stride), T and the number of state
blocks are runtime values, so kv/score passed as column slices of one ``kv_score`` buffer or
as separate tensors, and pooled state caches, all hit the same warmed key (the deployed key
carried the strides and missed both). A backend subclass adds the kernel and its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family import FamilySpec, Variant, backend_modules
from dsv4kit.family.operands import kernel_call
from dsv4kit.family.schema import as_int
from dsv4kit.jit import Immediate, JitKernel, zip_inputs
from dsv4kit.jit.launch_plans import Address
from dsv4kit.kernels.save_partial_states.reference import (
    ARGS,
    SavePartialStatesOperands,
    check_save_partial_states_inputs,
    check_save_partial_states_values,
    save_partial_states_reference,
)

__all__ = [
    "FLASH_STATES",
    "GPU_ELEMS",
    "SPEC",
    "Address",
    "SavePartialStatesBase",
    "SavePartialStatesConfig",
    "flat_span",
    "state_operands",
]

#: (state_width, compress_ratio, state_block_size) of DSv4-Flash: main C4, main C128, indexer (trap 7).
FLASH_STATES: tuple[tuple[int, int, int], ...] = ((1024, 4, 4), (512, 128, 8), (256, 4, 4))


@dataclass(frozen=True)
class SavePartialStatesConfig:
    """The state caches a model writes: one ``(state_width, compress_ratio, state_block_size)`` each."""

    states: tuple[tuple[int, int, int], ...] = FLASH_STATES


def _none(_: Any) -> None:
    return None


class SavePartialStatesBase(JitKernel["SavePartialStatesBase.CompileKey"]):
    """Contract half of K4; a backend class adds the kernel and :meth:`launch_args`."""

    @dataclass(frozen=True)
    class CompileKey:
        """In the order of a config's ``states`` rows (``CompileKey(256, 4, 4)``: SW 256, R 4, 4 rows
        a block); every stride, T and the block count are runtime values."""

        #: SW: kv and score width; a state row is ``2 * SW`` fp32.
        state_width: int
        #: R (4 or 128): ``ape`` has R rows, indexed by ``position % R``.
        compress_ratio: int
        #: Rows per state block (``state_cache.shape[1]``): 4 for C4, 8 for C128.
        state_block_size: int

    def dispatch(self, state_width, compress_ratio, state_block_size):
        return self.CompileKey(state_width=state_width, compress_ratio=compress_ratio,
                               state_block_size=state_block_size)

    def get_warmup_keys(self, config: SavePartialStatesConfig | None = None) -> list[CompileKey]:
        cfg = config or SavePartialStatesConfig()
        if not cfg.states:
            return []
        rows = [dict(state_width=sw, compress_ratio=r, state_block_size=sbs) for sw, r, sbs in cfg.states]
        return list(dict.fromkeys(self.trace(zip_inputs(*rows))))

    # ------------------------------------------------------------------ per backend
    def launch_args(self, kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
                    state_cache: torch.Tensor, slot_mapping: torch.Tensor, t: int) -> tuple[Any, ...]:
        """The executor's arguments for one call of ``t`` tokens."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the call
    __call__ = kernel_call(
        SavePartialStatesOperands,
        """Write the state rows of every token with a slot >= 0 (spec K4); returns None.

        Metadata checks always run (host only). ``debug_checks`` (default: on under the CPU
        interpreter, where an out-of-range slot would write outside the cache, off on the GPU)
        also reads slots and positions back: slots unique and in range, positions >= 0.
        """)

    def launch_operands(self, ops: Any, debug_checks: bool | None) -> Any:
        """The launch spec of one bound call (``ops``, a :data:`SavePartialStatesOperands`)."""
        debug = (not self.platform.is_cuda) if debug_checks is None else debug_checks
        t = check_save_partial_states_inputs(ops, kernel=self.name, debug_checks=False)
        self.check_device("state_cache", ops.state_cache)
        if debug:
            check_save_partial_states_values(self.name, ops.positions, ops.state_cache, ops.slot_mapping)
        if t == 0:
            return Immediate(None)
        # numpy ints are ints (and key fields as ints)
        key = self.dispatch(as_int(ops.state_width), as_int(ops.compress_ratio), as_int(ops.state_block_size))
        # The op writes in place: whatever the executor returns, the call returns None. The first
        # six operands are the tensors, kv .. slot_mapping.
        return key, self.launch_args(*ops[:6], t), None, _none


# --------------------------------------------------------------------------- launch operands
# Host-side preparation both backends share (after the spec's checks passed).

#: Elements per tensor a GPU program moves (tokens x columns), and its warps: 8 per thread, two
#: 16-byte accesses per tensor. H200, T = 65536, SW 1024 / 512 / 256: 92.1 / 91.1 / 90.3 % of the
#: copy bandwidth, against 91.7 / 90.8 / 89.4 % with 2048 elements and 92.3 / 90.7 / 89.5 % with 4096.
GPU_ELEMS = 1024

_INT32_MAX = 2**31 - 1


def _lead(kernel: str, arg: str, x: torch.Tensor) -> int:
    addr = x.data_ptr()
    if addr % 4:
        raise input_error(kernel, arg, "data_ptr % 4 == 0 (fp32 elements)", f"data_ptr % 4 == {addr % 4}")
    lead = (addr % 16) // 4
    if x.storage_offset() < lead:
        raise input_error(kernel, arg, "a storage starting on a 16-byte boundary",
                          f"storage data_ptr % 16 == {x.untyped_storage().data_ptr() % 16}")
    return lead


def flat_span(kernel: str, arg: str, x: torch.Tensor, rows: int, views: bool = True) -> tuple[Any, int]:
    """``(anchor, lead)``: a 1-D view of the first ``rows`` rows of the 2-D fp32 ``x``, starting
    at ``x``'s address rounded down to 16 bytes, and the number of elements rounded off (0..3).

    Row ``r`` of ``x`` is ``anchor[lead + r * x.stride(0):][:x.shape[1]]``. The anchor reaches
    before ``x`` into its own storage only (never past it), so both backends can declare it
    16-byte aligned. Raises if ``x`` is not 4-byte aligned or its storage does not start on a
    16-byte boundary (then no such view exists). ``views=False``: an :class:`Address` instead.
    """
    lead = _lead(kernel, arg, x)
    if not views:
        return Address(x.data_ptr() - 4 * lead, x.dtype), lead
    span = (rows - 1) * x.stride(0) + x.shape[1] if rows else 0
    return x.as_strided((lead + max(span, 1),), (1,), x.storage_offset() - lead), lead


def state_operands(kernel: str, kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor,
                   state_cache: torch.Tensor, t: int, views: bool = True) -> tuple[Any, ...]:
    """The operands both backends launch with (after the spec's checks passed):
    ``(kv, kv_lead, kv_stride, score, score_lead, score_stride, ape, ape_lead, ape_stride,
    state_flat, block_stride, vec_ok)``; tensors are 1-D views, or :class:`Address` es with
    ``views=False``. Guards the int32 range of T (the kernels index tokens in int32); every
    other offset is int64 in the kernels."""
    if t > _INT32_MAX:
        raise input_error(kernel, "slot_mapping", f"at most {_INT32_MAX} tokens", t)
    kv_a, kv_lead = flat_span(kernel, "kv", kv, t, views)
    sc_a, sc_lead = flat_span(kernel, "score", score, t, views)
    ape_a, ape_lead = flat_span(kernel, "ape", ape, ape.shape[0], views)
    s0 = state_cache.stride(0)
    if views:
        nsb, sbs, row = state_cache.shape
        state_span = (nsb - 1) * s0 + sbs * row if nsb else 0
        state = state_cache.as_strided((max(state_span, 1),), (1,))   # data_ptr % 16 == 0: checked (§2.8)
    else:
        state = state_cache
    kv_s, sc_s, ape_s = kv.stride(0), score.stride(0), ape.stride(0)
    vec_ok = int(kv_lead == sc_lead == ape_lead == 0 and (kv_s | sc_s | ape_s | s0) % 4 == 0)
    return (kv_a, kv_lead, kv_s, sc_a, sc_lead, sc_s, ape_a, ape_lead, ape_s, state, s0, vec_ok)


_triton, _cutedsl = backend_modules(__package__)  # each imported on first use


SPEC = FamilySpec(
    name="save_partial_states", spec_id="K4",
    summary="kv and score + ape of every token into the compressor state cache; C4 (main and indexer) "
            "and C128 layers, every step",
    args=ARGS,
    contract=SavePartialStatesBase,
    variants=Variant(save_partial_states_reference,
                     lambda: _triton().SavePartialStatesTriton,
                     lambda: _cutedsl().SavePartialStatesCuTeDSL),
    returns="None (state_cache rows of slots >= 0 are written in place; nothing else changes)",
    device_arg="state_cache",
    config_type=SavePartialStatesConfig,
    mutates=("state_cache",),
)
