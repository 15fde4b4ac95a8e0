"""Seeded rowquant inputs of every spec §2.12 regime, and the bit-exact comparison (tests, notebook 00b)."""

from __future__ import annotations

import torch

__all__ = ["REGIMES", "assert_bit_exact", "bits", "regime"]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes / words of ``t`` (so -0 and NaN payloads compare as written)."""
    return t.view({1: torch.uint8, 4: torch.int32}[t.element_size()])


def assert_bit_exact(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    """Every output identical bit for bit (dtype, shape, bytes); the message names the first difference."""
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        diff = bits(g) != bits(w)
        first = diff.nonzero()[0].tolist() if diff.any() else None
        assert not diff.any(), f"{int(diff.sum())} of {diff.numel()} differ, first at {first}"


def regime(name: str, m: int, n: int, seed: int = 0, gen: torch.Generator | None = None) -> torch.Tensor:
    """A bf16 ``[m, n]`` input of one spec §2.12 regime, built on the CPU from ``gen`` (a
    generator seeded with ``seed`` when None; a caller drawing many inputs passes its own)."""
    g = gen if gen is not None else torch.Generator().manual_seed(seed)
    r = torch.randn(m, n, generator=g)
    if name == "normal":
        x = r
    elif name == "zero":
        x = torch.zeros(m, n)
        x[:, 1::2] = -0.0
    elif name == "tiny":
        x = torch.sign(r) * torch.exp2(torch.randint(-60, -50, (m, n), generator=g).float())
        x[:, 64:128] = 0.01 * torch.sign(r[:, 64:128])  # amax below 448 * 2**-14: the D1 floor matters
    elif name == "large":  # exponents far above bf16's midrange, mantissas varied
        e = torch.randint(60, 100, (m, n), generator=g).float()
        x = torch.sign(r) * torch.exp2(e) * (1 + torch.rand(m, n, generator=g))
    elif name == "saturating":  # block amax exactly 448 * 2^k, and the next bf16 above it
        x = r.clone()
        scale = torch.exp2(torch.randint(-10, 10, (m, (n + 127) // 128), generator=g).float())  # a block each
        x[:, ::128] = 448 * scale
        x[:, 1::128] = -448 * scale[:, : x[:, 1::128].shape[1]] * (1 + 2**-7)  # exponent + 1
    elif name == "outlier":
        x = r.clone()
        x[:, ::128] *= 1e4  # drives the rest of the block to e4m3 subnormals and zero
    elif name == "crafted":
        vals = torch.tensor([448.0, 17.0, 19.0, 15.9, 1 + 3 * 2**-8, -17.0, -1e-6, 3 * 2**-9, 3 * 2**-10,
                             5 * 2**-11, 2**-7, -(2**-10)])
        x = vals.repeat(m, n // len(vals) + 1)[:, :n]
    return x.to(torch.bfloat16)


#: The spec §2.12 regimes :func:`regime` builds.
REGIMES = ["normal", "zero", "tiny", "large", "saturating", "outlier", "crafted"]
