"""K4 test cases: seeded save_partial_states calls into a state cache poisoned with 0xA5.

Shared by the tests, the notebooks and the GPU benchmark so that all of them exercise the same
inputs. Every byte of the state cache (pool padding included) starts as the sentinel ``0xA5``
(§2.12): equality with the reference's cache, bit for bit, then also proves that rows of padding
tokens and of unused slots were left alone.

Layouts of ``kv`` / ``score`` (spec K4 test shapes):

* ``"slices"``: column slices ``kv_score[:, :SW]`` and ``kv_score[:, SW:]`` of one ``[T', 2 SW]``
  buffer (what the compressor's linear layer produces);
* ``"separate"``: two contiguous ``[T', SW]`` tensors;
* ``"unaligned"``: views of one flat buffer that start 1 and 2 elements past a 16-byte boundary,
  with odd row strides, an ``ape`` that starts 2 elements in, and (with ``pooled``) an odd state
  block stride: legal inputs on which no 16-byte access is possible.

``T' = T + extra_rows``: the op reads only the first T rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields, replace

import torch

from dsv4kit.formats.state_cache import allocate_state_cache
from dsv4kit.kernels.save_partial_states.spec import FLASH_STATES

__all__ = [
    "ARG_NAMES",
    "LAYOUTS",
    "REGIMES",
    "SENTINEL",
    "SENTINEL_WORD",
    "TEST_SHAPES",
    "TEST_TOKENS",
    "SaveStatesCase",
    "make_case",
    "move",
    "random_case",
    "same_bits",
    "state_words",
]

SENTINEL = 0xA5
#: The sentinel as one int32 word (0xA5A5A5A5).
SENTINEL_WORD = -0x5A5A5A5B
REGIMES = ("zero", "tiny", "normal", "large")
LAYOUTS = ("slices", "separate", "unaligned")
TEST_TOKENS = (1, 7, 32, 257, 513)
#: Spec K4 test shapes: ``((SW, R, sbs), T)`` for T in {1, 7, 32, 257, 513} x the Flash configs.
TEST_SHAPES: tuple[tuple[tuple[int, int, int], int], ...] = tuple(
    (cfg, t) for cfg in FLASH_STATES for t in TEST_TOKENS)
#: The op's arguments, in order.
ARG_NAMES = ("kv", "score", "ape", "positions", "state_cache", "slot_mapping", "state_block_size",
             "state_width", "compress_ratio")


def _span(x: torch.Tensor) -> int:
    """Elements from ``x``'s first element to one past its last (a dense-enough view's extent)."""
    if x.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride(), strict=True))


def state_words(state: torch.Tensor) -> torch.Tensor:
    """The state cache's whole extent (rows and the pool padding between blocks) as int32 words."""
    return state.as_strided((_span(state),), (1,)).view(torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of two fp32 tensors of one geometry (state caches: padding between blocks too).

    Compared as int32 words, so ``-0.0 != 0.0`` and NaN payloads count.
    """
    if a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype:
        return False
    return torch.equal(state_words(a).cpu(), state_words(b).cpu())


def move(x: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``x`` on ``device`` with its strides and storage offset kept (``Tensor.to`` compacts a
    pooled state cache, whose rows then no longer line up with the reference's)."""
    return _move(x, device, {})


def _move(x: torch.Tensor, device: torch.device | str, memo: dict[tuple[int, str], torch.Tensor],
          ) -> torch.Tensor:
    """``x`` on ``device`` with the same strides and storage offset; views of one storage stay views
    of one storage (so kv/score slices remain slices of one buffer)."""
    storage = x.untyped_storage()
    k = (storage.data_ptr(), str(device))
    if k not in memo:
        memo[k] = torch.empty(0, dtype=torch.uint8, device=x.device).set_(storage).to(device)
    return memo[k].view(x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())


@dataclass
class SaveStatesCase:
    """The arguments of one K4 call, by the op's argument names, and how they were built."""

    kv: torch.Tensor
    score: torch.Tensor
    ape: torch.Tensor
    positions: torch.Tensor
    state_cache: torch.Tensor
    slot_mapping: torch.Tensor
    state_block_size: int
    state_width: int
    compress_ratio: int
    label: str = field(default="", compare=False)

    # ------------------------------------------------------------------ arguments
    def args(self, state_cache: torch.Tensor | None = None) -> tuple:
        """Positional arguments of the op / the reference (optionally with another state cache)."""
        kw = self.kwargs(state_cache)
        return tuple(kw[n] for n in ARG_NAMES)

    def kwargs(self, state_cache: torch.Tensor | None = None) -> dict:
        kw = {f.name: getattr(self, f.name) for f in fields(self) if f.name in ARG_NAMES}
        if state_cache is not None:
            kw["state_cache"] = state_cache
        return kw

    def to(self, device: torch.device | str) -> SaveStatesCase:
        """The same case on ``device``: layouts, strides and storage offsets preserved."""
        memo: dict[tuple[int, str], torch.Tensor] = {}
        moved = {n: _move(getattr(self, n), device, memo)
                 for n in ("kv", "score", "ape", "positions", "state_cache", "slot_mapping")}
        return replace(self, **moved)

    # ------------------------------------------------------------------ state caches
    def fresh_state(self) -> torch.Tensor:
        """A new state cache of the same geometry and device, every byte the sentinel."""
        s = self.state_cache
        buf = torch.empty(max(_span(s), 1) + s.storage_offset(), dtype=torch.float32, device=s.device)
        buf.view(torch.int32).fill_(SENTINEL_WORD)
        return buf.as_strided(s.shape, s.stride(), s.storage_offset())

    def written_rows(self) -> torch.Tensor:
        """bool ``[nsb, sbs]``: the state rows the call writes (slots >= 0)."""
        nsb, sbs, _ = self.state_cache.shape
        mask = torch.zeros(nsb * sbs, dtype=torch.bool)
        slots = self.slot_mapping.cpu()
        mask[slots[slots >= 0]] = True
        return mask.view(nsb, sbs)

    def untouched_is_sentinel(self, state: torch.Tensor) -> bool:
        """Rows not written, and the pool padding between blocks, still hold the sentinel."""
        probe = self.fresh_state()
        state_words(probe).copy_(state_words(state))
        slots = self.slot_mapping.to(probe.device)
        slots = slots[slots >= 0]
        sbs = self.state_cache.shape[1]
        probe.view(torch.int32)[slots // sbs, slots % sbs] = SENTINEL_WORD      # blank the written rows
        return bool((state_words(probe) == SENTINEL_WORD).all())

    @property
    def tokens(self) -> int:
        return self.slot_mapping.shape[0]

    @property
    def rows_written(self) -> int:
        return int((self.slot_mapping >= 0).sum())


# --------------------------------------------------------------------------- values


def _values(shape: tuple[int, ...], regime: str, what: str, g: torch.Generator) -> torch.Tensor:
    """fp32 values of ``regime`` (§2.12) for ``what`` in {"kv", "score", "ape"} (§2.1 rule 4 domain)."""
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    if regime == "zero":
        return sign * 0.0                                   # +0 and -0, so both sum signs occur
    if regime == "tiny":
        return sign * torch.exp2(-60.0 + 10.0 * torch.rand(shape, generator=g))
    if regime == "normal":
        x = torch.randn(shape, generator=g)
        x.view(-1)[:: 37] = 0.0                             # some exact zeros of both signs
        x.view(-1)[5:: 41] = -0.0
        return x
    if regime == "large":
        if what == "kv":
            mag = torch.exp2(torch.randint(0, 41, shape, generator=g).to(torch.float32))
            return sign * mag * (1.0 + torch.rand(shape, generator=g)) * 0.5       # up to 2**40
        return (torch.rand(shape, generator=g) * 2.0 - 1.0) * 1e4                  # |s| <= 1e4
    raise ValueError(f"make_case: regime: expected one of {REGIMES}, got {regime!r}")


def _positions(t: int, ratio: int, rows: int, g: torch.Generator) -> torch.Tensor:
    """Positions of up to 3 requests (consecutive runs from random starts in [0, 5R)), so the ape
    row ``p % R`` wraps and positions span several multiples of R even for small T."""
    cuts = sorted(torch.randint(0, t + 1, (2,), generator=g).tolist())
    lens = [cuts[0], cuts[1] - cuts[0], t - cuts[1]]
    parts = [int(torch.randint(0, 5 * ratio, (1,), generator=g)) + torch.arange(n) for n in lens]
    pos = torch.cat(parts) if t else torch.zeros(0, dtype=torch.int64)
    extra = torch.randint(0, 5 * ratio, (rows - t,), generator=g)
    return torch.cat((pos, extra)).to(torch.int64)


def make_case(
    config: tuple[int, int, int] = FLASH_STATES[0],
    t: int = 7,
    *,
    regime: str = "normal",
    layout: str = "slices",
    pooled: bool = False,
    padding: bool = True,
    shuffled: bool = True,
    seed: int = 0,
    extra_rows: int = 2,
    spare_blocks: int = 3,
    device: torch.device | str = "cpu",
) -> SaveStatesCase:
    """One K4 call for ``config = (SW, R, sbs)`` and ``t`` tokens.

    ``padding``: about 1/8 of the tokens (at least one when ``t >= 2``) get slot -1.
    ``shuffled``: slots are a random injection into the cache (else ``0..t-1`` in order).
    ``pooled``: the state block stride is ``sbs * 2 SW + 12`` (a pool stride; ``+ 13``, odd, with
    the ``"unaligned"`` layout). The cache has ``spare_blocks`` blocks no slot touches.
    """
    sw, ratio, sbs = config
    if layout not in LAYOUTS:
        raise ValueError(f"make_case: layout: expected one of {LAYOUTS}, got {layout!r}")
    g = torch.Generator().manual_seed(seed)
    rows = t + extra_rows
    kv_v = _values((rows, sw), regime, "kv", g)
    sc_v = _values((rows, sw), regime, "score", g)
    ape_v = _values((ratio, sw), regime, "ape", g)
    if layout == "slices":
        kv_score = torch.cat((kv_v, sc_v), dim=1)
        kv, score = kv_score[:, :sw], kv_score[:, sw:]
        ape = ape_v.clone()
    elif layout == "separate":
        kv, score, ape = kv_v.clone(), sc_v.clone(), ape_v.clone()
    else:
        stride = 2 * sw + 3                                  # odd: no row starts 16-byte aligned
        buf = torch.full((rows * stride + 4,), float("nan"))
        kv = buf[1:].as_strided((rows, sw), (stride, 1))
        score = buf[2 + sw:].as_strided((rows, sw), (stride, 1))
        kv.copy_(kv_v)
        score.copy_(sc_v)
        abuf = torch.full((ratio * (sw + 2) + 2,), float("nan"))
        ape = abuf[2:].as_strided((ratio, sw), (sw + 2, 1))
        ape.copy_(ape_v)
    nsb = -(-t // sbs) + spare_blocks
    row = 2 * sw
    if layout == "unaligned" and pooled:
        bstride = sbs * row + 13
        state = torch.empty(nsb * bstride, dtype=torch.float32).as_strided((nsb, sbs, row), (bstride, row, 1))
    else:
        state = allocate_state_cache(nsb, sbs, sw, block_stride=sbs * row + 12 if pooled else None)
    state_words(state).fill_(SENTINEL_WORD)
    slots = torch.randperm(nsb * sbs, generator=g)[:t] if shuffled else torch.arange(t)
    slots = slots.to(torch.int64)
    if padding and t >= 2:
        pad = torch.randperm(t, generator=g)[: max(1, t // 8)]
        slots[pad] = -1
    positions = _positions(t, ratio, rows, g)
    label = (f"SW={sw} R={ratio} sbs={sbs} T={t} {regime} {layout}{' pooled' if pooled else ''}"
             f"{' padded' if padding else ''}{' shuffled' if shuffled else ''} seed={seed}")
    case = SaveStatesCase(kv, score, ape, positions, state, slots, sbs, sw, ratio, label=label)
    return case if torch.device(device).type == "cpu" else case.to(device)


def random_case(i: int, *, configs: tuple[tuple[int, int, int], ...] = FLASH_STATES,
                max_tokens: int = 3000) -> SaveStatesCase:
    """Case ``i`` of a seeded random sweep: config, awkward T, layout, pool, padding, regime."""
    rnd = random.Random(9000 + i)
    awkward = [1, 2, 3, 7, 31, 33, 127, 129, 255, 257, 511, 513, 1023, 1025]
    t = rnd.choice(awkward) if rnd.random() < 0.6 else rnd.randint(1, max_tokens)
    return make_case(configs[i % len(configs)], t, regime=REGIMES[(i // len(configs)) % len(REGIMES)],
                     layout=rnd.choice(LAYOUTS), pooled=rnd.random() < 0.5, padding=rnd.random() < 0.7,
                     shuffled=rnd.random() < 0.8, seed=i)
