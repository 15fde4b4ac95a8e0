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


def regime(name: str, m: int, n: int, seed: int = 0) -> torch.Tensor:
    """A bf16 ``[m, n]`` input of one spec §2.12 regime (seeded)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(m, n, generator=g)
    if name == "normal":
        x = r
    elif name == "zero":
        x = torch.zeros(m, n)
        x[:, 1::2] = -0.0
    elif name == "tiny":
        x = torch.sign(r) * torch.exp2(torch.randint(-60, -50, (m, n), generator=g).float())
        x[:, 64:128] = 0.01 * torch.sign(r[:, 64:128])  # amax below 448 * 2**-14: the D1 floor matters
    elif name == "large":
        x = torch.sign(r) * torch.exp2(torch.randint(60, 100, (m, n), generator=g).float())
    elif name == "saturating":
        x = r.clone()
        x[:, ::128] = 448.0
        x[:, 1::128] = -448.0 * (1 + 2**-7)  # next bf16 above 448: exponent + 1
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
