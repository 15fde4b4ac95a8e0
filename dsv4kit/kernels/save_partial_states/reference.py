"""PyTorch reference of K4: save_partial_states (kv and score + ape into the state cache)."""

from __future__ import annotations

from typing import Any

import torch

from dsv4kit.errors import input_error
from dsv4kit.family.operands import operands, with_operands
from dsv4kit.family.schema import Arg
from dsv4kit.formats.checks import (
    check_dtype,
    check_ndim,
    check_per_token,
    check_same_device,
    check_slot_values,
    check_values_in_range,
)
from dsv4kit.formats.state_cache import check_state_cache

__all__ = [
    "ARGS",
    "SavePartialStatesOperands",
    "check_save_partial_states_inputs",
    "check_save_partial_states_values",
    "save_partial_states_reference",
]

KERNEL = "save_partial_states"

#: The op's argument table (spec K4).
ARGS = (
    Arg("kv", "tensor", (torch.float32,), "[>=T, SW]", "stride(1) == 1 (usually kv_score[:, :SW])"),
    Arg("score", "tensor", (torch.float32,), "[>=T, SW]", "stride(1) == 1 (usually kv_score[:, SW:])"),
    Arg("ape", "tensor", (torch.float32,), "[R, SW]", "stride(1) == 1; row positions[t] % R is added"),
    Arg("positions", "tensor", (torch.int64,), "[>=T]", "contiguous; debug: >= 0"),
    Arg("state_cache", "tensor", (torch.float32,), "[nsb, sbs, 2*SW]",
        "strides (>= sbs*2*SW, 2*SW, 1), data_ptr % 16 == 0 (§2.8)"),
    Arg("slot_mapping", "tensor", (torch.int64,), "[T]", "state slots, -1 = padding; defines T; "
        "debug: unique, < nsb*sbs"),
    Arg("state_block_size", "int", rule="== state_cache.shape[1]"),
    Arg("state_width", "int", rule="SW; == kv.shape[1] == state_cache.shape[2] / 2"),
    Arg("compress_ratio", "int", choices=(4, 128), rule="R; == ape.shape[0]"),
)


def _check_width_rows(kernel: str, arg: str, t: torch.Tensor, width: int, rows: int | None) -> None:
    check_dtype(kernel, arg, t, torch.float32)
    check_ndim(kernel, arg, t, 2)
    if t.shape[1] != width:
        raise input_error(kernel, arg, f"shape[1] == state_width ({width})", f"shape {tuple(t.shape)}")
    if t.stride(1) != 1:
        raise input_error(kernel, arg, "stride(1) == 1", f"strides {tuple(t.stride())}")
    if rows is not None and t.shape[0] < rows:
        raise input_error(kernel, arg, f"at least T ({rows}) rows", f"shape {tuple(t.shape)}")


#: The op's operand record (:mod:`dsv4kit.family.operands`): the checks, the reference and the
#: kernel's call take one, bound once per call.
SavePartialStatesOperands = operands(KERNEL, ARGS)


def check_save_partial_states_inputs(ops: Any, *, kernel: str = KERNEL, debug_checks: bool = True) -> int:
    """K4 "Edge cases & bad inputs" checks of a call's record ``ops``; returns T
    (= ``len(slot_mapping)``)."""
    # The table's checks; numpy ints are ints here.
    kv, score, ape, positions, state_cache, slot_mapping, state_block_size, state_width, compress_ratio = (
        ops.checked(kernel))
    if compress_ratio not in (4, 128) or isinstance(compress_ratio, bool):
        raise input_error(kernel, "compress_ratio", "4 or 128", compress_ratio)
    if isinstance(state_width, bool) or not isinstance(state_width, int) or state_width <= 0:
        raise input_error(kernel, "state_width", "an int > 0", state_width)
    check_per_token(kernel, "slot_mapping", slot_mapping, torch.int64, None)
    t = slot_mapping.shape[0]
    _check_width_rows(kernel, "kv", kv, state_width, t)
    _check_width_rows(kernel, "score", score, state_width, t)
    _check_width_rows(kernel, "ape", ape, state_width, None)
    if ape.shape[0] != compress_ratio:
        raise input_error(
            kernel, "ape", f"shape[0] == compress_ratio ({compress_ratio})", f"shape {tuple(ape.shape)}"
        )
    check_per_token(kernel, "positions", positions, torch.int64, t, at_least=True)
    check_state_cache(kernel, "state_cache", state_cache, state_width)
    if state_block_size != state_cache.shape[1]:
        raise input_error(
            kernel, "state_block_size", f"state_cache.shape[1] ({state_cache.shape[1]})", state_block_size
        )
    check_same_device(
        kernel,
        {
            "kv": kv,
            "score": score,
            "ape": ape,
            "positions": positions,
            "state_cache": state_cache,
            "slot_mapping": slot_mapping,
        },
    )
    if debug_checks:
        check_save_partial_states_values(kernel, positions, state_cache, slot_mapping)
    return t


def check_save_partial_states_values(kernel: str, positions: torch.Tensor, state_cache: torch.Tensor,
                                     slot_mapping: torch.Tensor) -> None:
    """The K4 debug checks (device reads): slots >= 0 unique and in range, their positions >= 0."""
    keep = check_slot_values(kernel, "slot_mapping", slot_mapping, state_cache)
    check_values_in_range(kernel, "positions", positions[:slot_mapping.shape[0]][keep], 0, 2**63 - 1)


def _reference(ops: Any) -> None:
    """The reference on a bound call (see :func:`save_partial_states_reference`)."""
    t = check_save_partial_states_inputs(ops)
    kv, score, ape, positions, state_cache, slot_mapping, state_block_size, state_width, compress_ratio = ops
    if t == 0:
        return
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    if slots.numel() == 0:
        return
    sbs = state_block_size
    idx = torch.nonzero(keep).flatten()
    ape_rows = ape[positions[idx] % compress_ratio]
    state_cache[slots // sbs, slots % sbs, :state_width] = kv[idx]
    state_cache[slots // sbs, slots % sbs, state_width:] = score[idx] + ape_rows


_DOC = """K4: for each token with slot ``s >= 0``: ``row = state[s // sbs, s % sbs]``,
    ``row[:SW] = kv[t]``, ``row[SW:] = fl(score[t] + ape[positions[t] % R])``. Other rows untouched.
    """
save_partial_states_reference = with_operands(SavePartialStatesOperands, _reference, _DOC)
