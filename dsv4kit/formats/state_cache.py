"""Compressor state cache, window pooling and RMSNorm (§2.8).

State cache: fp32 ``[num_state_blocks, sbs, 2*SW]``, ``stride(2) == 1``, ``stride(1) == 2*SW``,
``stride(0) >= sbs*2*SW`` (pool strides allowed). Row of position q of request r:
``state[bt[r, q // sbs], q % sbs] = [kv (SW) | score + ape (SW)]``. For ratio 4 each half is
split ``[A (D) | B (D)]``: A serves as the *previous* block of a window, B as the *current* one.
"""

from __future__ import annotations

import torch

from dsv4kit.errors import input_error
from dsv4kit.formats.checks import check_dtype, check_ndim, check_positive_float, check_values_in_range

__all__ = [
    "allocate_state_cache",
    "check_state_cache",
    "write_state_row",
    "window_rows",
    "pool_windows",
    "pool",
    "rmsnorm",
    "is_boundary",
]


def allocate_state_cache(
    num_blocks: int,
    sbs: int,
    state_width: int,
    *,
    block_stride: int | None = None,
    fill: float = 0.0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """fp32 ``[num_blocks, sbs, 2*state_width]`` with ``stride(0) == block_stride`` (default minimal)."""
    name = "allocate_state_cache"
    for arg, v in (("num_blocks", num_blocks), ("sbs", sbs), ("state_width", state_width)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise input_error(name, arg, "an int > 0", v)
    row = 2 * state_width
    stride = sbs * row if block_stride is None else block_stride
    if not isinstance(stride, int) or stride < sbs * row or stride % 4:
        raise input_error(name, "block_stride", f"a multiple of 4 and >= {sbs * row}", block_stride)
    buf = torch.full((num_blocks * stride,), fill, dtype=torch.float32, device=device)
    return buf.as_strided((num_blocks, sbs, row), (stride, row, 1))


def check_state_cache(kernel: str, arg: str, state: torch.Tensor, state_width: int | None = None) -> None:
    """§2.8 metadata checks: fp32, 3-D, strides ``(>= sbs*2SW, 2SW, 1)``, 16-byte aligned."""
    check_dtype(kernel, arg, state, torch.float32)
    check_ndim(kernel, arg, state, 3)
    if state_width is not None and state.shape[2] != 2 * state_width:
        raise input_error(kernel, arg, f"shape[2] == {2 * state_width}", f"shape {tuple(state.shape)}")
    s0, s1, s2 = state.stride()
    row = state.shape[2]
    if s2 != 1 or s1 != row or s0 < state.shape[1] * row:
        raise input_error(
            kernel, arg, f"strides (>= {state.shape[1] * row}, {row}, 1)", f"strides {(s0, s1, s2)}"
        )
    if state.data_ptr() % 16 != 0:
        raise input_error(kernel, arg, "data_ptr % 16 == 0", f"data_ptr % 16 == {state.data_ptr() % 16}")


def write_state_row(
    state: torch.Tensor, bt_r: torch.Tensor, q: int, kv: torch.Tensor, score_plus_ape: torch.Tensor
) -> None:
    """Store ``[kv | score_plus_ape]`` as the row of position ``q`` via the state block table row ``bt_r``."""
    name = "write_state_row"
    check_state_cache(name, "state", state)
    sw = state.shape[2] // 2
    for arg, t in (("kv", kv), ("score_plus_ape", score_plus_ape)):
        check_dtype(name, arg, t, torch.float32)
        if tuple(t.shape) != (sw,):
            raise input_error(name, arg, f"shape ({sw},)", f"shape {tuple(t.shape)}")
    check_dtype(name, "bt_r", bt_r, torch.int32)
    check_ndim(name, "bt_r", bt_r, 1)
    sbs = state.shape[1]
    if q < 0 or q // sbs >= bt_r.shape[0]:
        raise input_error(name, "q", f"a position in [0, {bt_r.shape[0] * sbs})", q)
    block = int(bt_r[q // sbs])
    if not 0 <= block < state.shape[0]:
        raise input_error(name, "bt_r", f"block ids in [0, {state.shape[0]})", block)
    state[block, q % sbs, :sw] = kv
    state[block, q % sbs, sw:] = score_plus_ape


def is_boundary(p: torch.Tensor, ratio: int) -> torch.Tensor:
    """``(p + 1) % R == 0``: only boundary tokens produce a compressed entry (§2.8)."""
    return (p + 1) % ratio == 0


def window_rows(
    state: torch.Tensor,
    block_table: torch.Tensor,
    req: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    overlap: bool,
    head_dim: int,
    *,
    kernel: str = "window_rows",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather the pooling windows of §2.8 for ``n`` tokens.

    Returns ``(k [n, W, D], s [n, W, D], included [n, W])`` with ``W = 2R`` if ``overlap`` else R;
    row j is position ``q = p - W + 1 + j`` and uses half ``h = (j >= R)`` when overlapping.
    Excluded rows (q < 0) are never read (their k and s are 0 / masked). Block-table columns and
    entries of the rows that are read are range-checked (debug checks of §2.10).
    """
    sbs = state.shape[1]
    sw = state.shape[2] // 2
    w = 2 * ratio if overlap else ratio
    j = torch.arange(w, device=positions.device)
    q = positions[:, None] - w + 1 + j[None, :]
    included = q >= 0
    qc = torch.clamp(q, min=0)
    col = qc // sbs
    check_values_in_range(kernel, "block_table (column q // sbs)", col[included], 0, block_table.shape[1])
    blocks = block_table[req[:, None].expand_as(col), col].to(torch.int64)
    check_values_in_range(kernel, "block_table", blocks[included], 0, state.shape[0])
    blocks = torch.where(included, blocks, torch.zeros_like(blocks))
    rows = state[blocks, qc % sbs]  # [n, W, 2*SW]
    h = (j >= ratio).to(torch.int64) if overlap else torch.zeros_like(j)
    d = torch.arange(head_dim, device=positions.device)
    kcol = (h[:, None] * head_dim + d[None, :]).expand(rows.shape[0], w, head_dim)
    k = torch.gather(rows, 2, kcol)
    s = torch.gather(rows, 2, kcol + sw)
    zero = torch.zeros((), dtype=torch.float32, device=rows.device)
    k = torch.where(included[..., None], k, zero)
    s = torch.where(included[..., None], s, torch.full_like(zero, float("-inf")))
    return k, s, included


def pool_windows(k: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per-column softmax pooling over the window dim: ``c[d] = sum_j softmax_j(s[:, d]) k_j[d]`` (fp32).

    ``s`` is ``-inf`` on excluded rows, so they get weight 0. Max-subtracted, as in §2.8.
    """
    m = s.amax(dim=-2, keepdim=True)
    e = torch.exp(s - m)
    w = e / e.sum(dim=-2, keepdim=True)
    return (w * k).sum(dim=-2)


def pool(
    state: torch.Tensor, bt_r: torch.Tensor, p: int, ratio: int, overlap: bool, head_dim: int
) -> torch.Tensor:
    """``pool(state, bt_r, p, R, overlap, D, sbs)`` of §2.8 for one token: fp32 ``[D]``."""
    name = "pool"
    check_state_cache(name, "state", state)
    check_dtype(name, "bt_r", bt_r, torch.int32)
    check_ndim(name, "bt_r", bt_r, 1)
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise input_error(name, "p", "an int >= 0", p)
    sw = state.shape[2] // 2
    if (2 if overlap else 1) * head_dim != sw:
        raise input_error(name, "head_dim", f"{sw // (2 if overlap else 1)} (state width {sw})", head_dim)
    pos = torch.tensor([p], dtype=torch.int64, device=state.device)
    req = torch.zeros(1, dtype=torch.int64, device=state.device)
    k, s, _ = window_rows(state, bt_r[None, :], req, pos, ratio, overlap, head_dim, kernel=name)
    return pool_windows(k, s)[0]


def rmsnorm(c: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``n_d = fl(fl(c_d * rr) * w_d)``, ``rr = 1 / sqrt(sum_d c_d^2 / D + eps)`` over the last dim (§2.8)."""
    name = "rmsnorm"
    check_dtype(name, "c", c, torch.float32)
    check_dtype(name, "weight", weight, torch.float32, torch.bfloat16)
    eps = check_positive_float(name, "eps", eps)
    if c.dim() == 0 or tuple(weight.shape) != (c.shape[-1],):
        raise input_error(
            name, "weight", f"shape ({c.shape[-1] if c.dim() else '?'},)", f"shape {tuple(weight.shape)}"
        )
    d = c.shape[-1]
    ms = (c * c).sum(dim=-1, keepdim=True) / d
    rr = 1.0 / torch.sqrt(ms + eps)
    return (c * rr) * weight.to(torch.float32)
