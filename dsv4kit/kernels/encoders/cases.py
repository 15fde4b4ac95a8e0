"""Seeded cases of the store hooks E1..E5: rows of every regime of spec §2.12, caches full of the
sentinel 0xA5, slots with -1 entries, shuffled, and packed page strides.

``rows(regime, t, d, seed)`` makes the fp32 rows; :func:`make_case` one call of a hook. The
store is BIT-EXACT: a kernel's cache must equal the reference's byte for byte
(:func:`differing_bytes` is 0), the sentinel included wherever nothing was written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.formats.ds_mla import allocate_ds_cache, ds_min_page_stride
from dsv4kit.formats.indexer_cache import allocate_indexer_cache
from dsv4kit.formats.plain_row import allocate_plain_cache
from dsv4kit.kernels.encoders.reference import CACHE_ARG, HEAD_DIM, OPERANDS

__all__ = ["HOOKS", "REGIMES", "SENTINEL", "StoreCase", "differing_bytes", "make_case", "random_case", "rows",
           "written_rows"]

SENTINEL = 0xA5
HOOKS = ("store_rows_ds", "store_rows_plain", "store_rows_indexer")
REGIMES = ("zero", "tiny", "normal", "large", "saturating", "outlier", "crafted")

# Crafted values in units of a block scale of 1 (block amax 448, resp. 6): bf16 ties, e4m3 ties and
# carries, tiny negatives that round to -0, and the E2M1 thresholds.
_E4M3_CRAFTED = (
    1 + 3 * 2**-8,
    17.0,
    19.0,
    15.9,
    0.5 + 2**-10,
    -(2.0**-12),
    -(2.0**-11),
    2.0**-10,
    240.0,
    232.0,
)
_E2M1_CRAFTED = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -1.25, -5.0, 0.2, 5.5)


def rows(regime: str, t: int, d: int, seed: int = 0) -> torch.Tensor:
    """fp32 ``[t, d]`` rows of one §2.12 regime (values within the encoders' domain, §2.1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=g)
    blocks = x.view(t, d // 32, 32)
    if regime == "zero":
        x = torch.zeros(t, d)
        x[:, 1::3] = -0.0
    elif regime == "tiny":  # 2^-60 .. 2^-50, and blocks of amax in (0, 0.0273]: the D1 demo
        x = x * torch.exp2(-60 + 10 * torch.rand(t, d, generator=g))
        x[:, 64:128] = torch.randn(t, 64, generator=g) * 0.004
        x[:, 128:192] = torch.randn(t, 64, generator=g) * 0.01 if d > 128 else x[:, 128:192]
    elif regime == "large":  # up to 2^100
        e = torch.randint(60, 99, (t, d // 32, 1), generator=g).float()
        x = (blocks * torch.exp2(e)).reshape(t, d)
    elif regime == "saturating":
        k = torch.randint(-8, 9, (t, d // 32, 1), generator=g).float()
        top = torch.where(torch.rand(t, d // 32, 1, generator=g) < 0.5, 448.0, 6.0)
        blocks.mul_(0.3 * top * torch.exp2(k))
        blocks[:, :, 0] = (top * torch.exp2(k))[..., 0]  # amax exactly 448 2^k / 6 2^k
        blocks[:, 1::2, 1] = -(top * torch.exp2(k))[:, 1::2, 0] * (1 + 2.0**-7)  # next bf16 above
        x = blocks.reshape(t, d)
    elif regime == "outlier":
        blocks[:, :, 3] *= 1e4
        x = blocks.reshape(t, d)
    elif regime == "crafted":
        x = torch.zeros(t, d)
        for b in range(d // 32):
            vals = _E4M3_CRAFTED if b % 2 == 0 else _E2M1_CRAFTED
            top = 448.0 if b % 2 == 0 else 6.0
            for i in range(32):
                x[:, b * 32 + i] = top if i == 0 else vals[(i + b) % len(vals)] * (1 if i % 5 else -1)
        x *= torch.exp2(torch.randint(-4, 5, (t, 1), generator=g).float())
    elif regime != "normal":
        raise ValueError(f"unknown regime {regime!r}; regimes: {', '.join(REGIMES)}")
    return x.contiguous()


@dataclass
class StoreCase:
    """One call of ``hook``: ``args`` are the op's arguments (the cache sentinel-filled)."""

    hook: str
    args: dict[str, Any]
    label: str = ""

    @property
    def ops(self) -> Any:
        """The call's operand record (what the checks and the reference take)."""
        return OPERANDS[self.hook](**self.args)

    @property
    def cache(self) -> torch.Tensor:
        return self.args[CACHE_ARG[self.hook]]

    def fresh(self, device: torch.device | str | None = None) -> StoreCase:
        """A copy with a new sentinel-filled cache (same strides), everything on ``device``."""
        dev = torch.device(device) if device is not None else self.cache.device
        args = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in self.args.items()}
        c = self.cache
        raw = torch.full((c.untyped_storage().nbytes(),), SENTINEL, dtype=torch.uint8, device=dev)
        args[CACHE_ARG[self.hook]] = raw.view(c.dtype).as_strided(c.shape, c.stride(), c.storage_offset())
        return StoreCase(self.hook, args, self.label)


def written_rows(t: int) -> int:
    """Rows of a :func:`make_case` of ``t`` rows with a slot >= 0 (a fifth, at least one, get -1
    when ``t > 2``): what a store writes, known without building the case."""
    return t - max(1, t // 5) if t > 2 else t


def make_case(
    hook: str,
    t: int = 37,
    *,
    regime: str = "normal",
    kv_bs: int = 16,
    page_stride: int | None = None,
    fp8_scale: float | None = None,
    use_fp4: bool = False,
    seed: int = 0,
) -> StoreCase:
    """``t`` rows into a cache with room for ``t + 3`` entries (shuffled slots, some -1)."""
    g = torch.Generator().manual_seed(seed + 7)
    d = HEAD_DIM[hook]
    pages = -(-(t + 3) // kv_bs)
    slots = torch.randperm(pages * kv_bs, generator=g)[:t].to(torch.int64)
    if t > 2:
        slots[torch.randperm(t, generator=g)[: t - written_rows(t)]] = -1
    if hook == "store_rows_ds":
        cache = allocate_ds_cache(pages, kv_bs, page_stride=page_stride, fill=SENTINEL)
    elif hook == "store_rows_plain":
        dtype = torch.bfloat16 if fp8_scale is None else torch.float8_e4m3fn
        cache = allocate_plain_cache(pages, kv_bs, dtype, page_stride=page_stride, fill_byte=SENTINEL)
    else:
        cache = allocate_indexer_cache(pages, kv_bs, page_stride=page_stride, fill=SENTINEL)
    extra: dict[str, Any] = {}
    if hook == "store_rows_plain":
        extra["fp8_scale"] = None if fp8_scale is None else torch.tensor([fp8_scale], dtype=torch.float32)
    if hook == "store_rows_indexer":
        extra["use_fp4"] = use_fp4
    # The op's arguments by name, bound through its record (the hook's table: its names and order).
    args = OPERANDS[hook](rows(regime, t, d, seed), cache, slots, **extra)._asdict()
    label = (
        f"{hook} T={t} {regime} kv_bs={kv_bs} P={page_stride}"
        + (f" fp8_scale={fp8_scale}" if hook == "store_rows_plain" else "")
        + (f" fp4={use_fp4}" if hook == "store_rows_indexer" else "")
    )
    return StoreCase(hook, args, label)


def random_case(hook: str, i: int) -> StoreCase:
    """The ``i``-th seeded case of ``hook``: T, regime, kv_bs, page stride and format drawn with seed i."""
    g = torch.Generator().manual_seed(500 + i)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    kv_bs = pick((64, 16, 2, 1))
    if hook == "store_rows_ds":
        stride = pick((None, ds_min_page_stride(kv_bs) + 576))
    elif hook == "store_rows_plain":
        stride = pick((None, kv_bs * 512 + 16))
    else:
        stride = pick((None, kv_bs * 132 + 4))
    return make_case(
        hook,
        pick((1, 7, 32, 257)),
        regime=REGIMES[i % len(REGIMES)],
        kv_bs=kv_bs,
        page_stride=stride,
        fp8_scale=pick((None, 1.0, 2.0**-4, 0.37)),
        use_fp4=bool(i % 2),
        seed=i,
    )


def differing_bytes(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many bytes of the two caches' storages differ (0: BIT-EXACT, sentinel included)."""
    ra = a.as_strided((a.untyped_storage().nbytes() // a.element_size(),), (1,), 0).view(torch.uint8).cpu()
    rb = b.as_strided((b.untyped_storage().nbytes() // b.element_size(),), (1,), 0).view(torch.uint8).cpu()
    return int((ra != rb).sum())
