"""Input checks shared by the format helpers and the kernel references (spec §2.10).

Every check takes the ``kernel`` name and the ``arg`` name first so that the raised
:class:`dsv4kit.errors.KernelInputError` reads ``"<kernel>: <arg>: expected <...>, got <...>"``.
Metadata checks never read device memory; the ``check_values_*`` helpers do (they are the
"debug index checks" that the references always run).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsv4kit.errors import input_error

__all__ = [
    "dtype_name",
    "check_tensor",
    "check_dtype",
    "check_ndim",
    "check_shape",
    "check_last_dim",
    "check_contiguous",
    "check_same_device",
    "check_per_token",
    "check_values_in_range",
    "check_unique",
    "check_slot_values",
    "check_read_slots",
    "check_store_rows",
    "check_store_slots",
    "check_positive_float",
    "check_paged_byte_cache",
]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the spelling used in messages and CompileKeys)."""
    return str(dtype).removeprefix("torch.")


def check_tensor(kernel: str, arg: str, t: object) -> torch.Tensor:
    """Reject anything that is not a tensor."""
    if not isinstance(t, torch.Tensor):
        raise input_error(kernel, arg, "a torch.Tensor", type(t).__name__)
    return t


def check_dtype(kernel: str, arg: str, t: torch.Tensor, *dtypes: torch.dtype) -> None:
    """Require ``t.dtype`` to be one of ``dtypes``."""
    if isinstance(t, torch.Tensor) and t.dtype in dtypes:
        return
    check_tensor(kernel, arg, t)
    if t.dtype not in dtypes:
        want = " or ".join(dtype_name(d) for d in dtypes)
        raise input_error(kernel, arg, f"dtype {want}", dtype_name(t.dtype))


def check_ndim(kernel: str, arg: str, t: torch.Tensor, ndim: int) -> None:
    """Require a rank-``ndim`` tensor."""
    if t.dim() != ndim:
        raise input_error(kernel, arg, f"{ndim}-D tensor", f"shape {tuple(t.shape)}")


def check_shape(kernel: str, arg: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    """Require ``t.shape`` to match ``shape``; ``None`` entries match any size."""
    pattern = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape, strict=True)):
        raise input_error(kernel, arg, f"shape {pattern}", f"shape {tuple(t.shape)}")


def check_last_dim(kernel: str, arg: str, t: torch.Tensor, size: int) -> None:
    """Require ``t.shape[-1] == size`` (and at least rank 1)."""
    if t.dim() == 0 or t.shape[-1] != size:
        raise input_error(kernel, arg, f"last dim {size}", f"shape {tuple(t.shape)}")


def check_contiguous(kernel: str, arg: str, t: torch.Tensor) -> None:
    """Require a contiguous tensor."""
    if not t.is_contiguous():
        raise input_error(kernel, arg, "contiguous tensor", f"strides {tuple(t.stride())}")


def check_same_device(kernel: str, tensors: dict[str, torch.Tensor | None]) -> None:
    """All given tensors on one device (§2.10); ``None`` entries are ignored."""
    first: tuple[str, torch.device] | None = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise input_error(kernel, name, f"device {first[1]} (same as {first[0]})", f"device {t.device}")


def check_per_token(
    kernel: str, arg: str, t: torch.Tensor, dtype: torch.dtype, length: int | None, *, at_least: bool = False
) -> None:
    """A 1-D contiguous per-token array of ``dtype`` with ``length`` (or ``>= length``) entries."""
    check_dtype(kernel, arg, t, dtype)
    check_ndim(kernel, arg, t, 1)
    check_contiguous(kernel, arg, t)
    if length is None:
        return
    if at_least and t.shape[0] < length:
        raise input_error(kernel, arg, f"at least {length} entries", f"shape {tuple(t.shape)}")
    if not at_least and t.shape[0] != length:
        raise input_error(kernel, arg, f"length {length}", f"shape {tuple(t.shape)}")


def check_values_in_range(kernel: str, arg: str, values: torch.Tensor, lo: int, hi: int) -> None:
    """Debug check (device read): every value in ``[lo, hi)``."""
    if values.numel() == 0:
        return
    vmin, vmax = int(values.min()), int(values.max())
    if vmin < lo or vmax >= hi:
        bad = vmin if vmin < lo else vmax
        raise input_error(kernel, arg, f"values in [{lo}, {hi})", bad)


def check_unique(kernel: str, arg: str, values: torch.Tensor) -> None:
    """Debug check (device read): no value occurs twice."""
    if values.numel() != torch.unique(values).numel():
        raise input_error(kernel, arg, "unique values", "duplicates")


def check_slot_values(kernel: str, arg: str, slots: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Debug check (device read): the slots >= 0 of ``slots`` unique and below the
    ``cache.shape[0] * cache.shape[1]`` entries of a paged cache (slots < 0 are skipped).
    Returns the mask ``slots >= 0``."""
    keep = slots >= 0
    valid = slots[keep]
    check_values_in_range(kernel, arg, valid, 0, cache.shape[0] * cache.shape[1])
    check_unique(kernel, arg, valid)
    return keep


def check_read_slots(kernel: str, slots: torch.Tensor, cache: torch.Tensor) -> None:
    """The slots a reader of a paged cache reads: int64, 1-D, contiguous, each an entry of ``cache``."""
    check_per_token(kernel, "slots", slots, torch.int64, None)
    check_values_in_range(kernel, "slots", slots, 0, cache.shape[0] * cache.shape[1])


def check_store_rows(kernel: str, rows: torch.Tensor, width: int) -> None:
    """The rows a store hook encodes: fp32 ``[T, width]``, contiguous."""
    check_dtype(kernel, "rows", rows, torch.float32)
    check_shape(kernel, "rows", rows, (None, width))
    check_contiguous(kernel, "rows", rows)


def check_store_slots(kernel: str, rows: torch.Tensor, cache_arg: str, cache: torch.Tensor,
                      kv_slot_mapping: torch.Tensor) -> torch.Tensor:
    """A store hook's slots, after its rows and cache checks: the three tensors on one device,
    ``kv_slot_mapping`` int64 ``[T]`` for ``rows [T, ...]``, and (device read) its slots >= 0
    unique entries of ``cache``. Returns the mask ``kv_slot_mapping >= 0``."""
    check_same_device(kernel, {"rows": rows, cache_arg: cache, "kv_slot_mapping": kv_slot_mapping})
    check_per_token(kernel, "kv_slot_mapping", kv_slot_mapping, torch.int64, rows.shape[0])
    return check_slot_values(kernel, "kv_slot_mapping", kv_slot_mapping, cache)


def check_positive_float(kernel: str, arg: str, value: object) -> float:
    """A finite Python number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise input_error(kernel, arg, "a Python float > 0", type(value).__name__)
    v = float(value)
    if not (v > 0.0 and v != float("inf")):
        raise input_error(kernel, arg, "a finite float > 0", v)
    return v


def check_paged_byte_cache(
    kernel: str, arg: str, cache: torch.Tensor, entry_bytes: int, stride_multiple: int, align: int
) -> None:
    """A ``uint8 [num_pages, bs, entry_bytes]`` paged cache (§2.5, §2.7, §2.10).

    Strides ``(P, entry_bytes, 1)`` with ``P`` a multiple of ``stride_multiple`` and at least
    ``bs * entry_bytes``; base address aligned to ``align`` bytes.
    """
    check_dtype(kernel, arg, cache, torch.uint8)
    check_ndim(kernel, arg, cache, 3)
    if cache.shape[2] != entry_bytes:
        raise input_error(kernel, arg, f"shape[2] == {entry_bytes}", f"shape {tuple(cache.shape)}")
    s0, s1, s2 = cache.stride()
    min_stride = cache.shape[1] * entry_bytes
    if s2 != 1 or s1 != entry_bytes:
        raise input_error(kernel, arg, f"stride(1) == {entry_bytes} and stride(2) == 1",
                          f"strides {(s0, s1, s2)}")
    if s0 % stride_multiple != 0 or s0 < min_stride:
        raise input_error(kernel, arg,
                          f"page stride (stride(0)) a multiple of {stride_multiple} and >= {min_stride}",
                          f"stride(0) {s0}")
    misaligned = cache.data_ptr() % align
    if misaligned:
        raise input_error(kernel, arg, f"data_ptr % {align} == 0", f"data_ptr % {align} == {misaligned}")

