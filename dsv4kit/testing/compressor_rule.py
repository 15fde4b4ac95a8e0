"""The compressor rule of spec §2.12 (revised 2026-12-01), implemented once.

Kernels that pool with a softmax and normalize with an rsqrt (K5-K9) cannot match a reference
bit for bit; the rule says how close is close enough, per written element ``d`` of one output
tensor of one test case, with ``a`` the kernel's and ``b`` the reference's decoded value (in the
units of the fp32 row ``y``) and ``m`` the element's *term magnitude*:

* allowance ``2**-16 * m``: the fp32 rounding of the terms that produced the element (a pooled
  value that cancels can carry an fp32 error of many steps of its own binade);
* step: the grid spacing of the binade of ``max(|a|, |b|)`` in the stored format (e4m3 x block
  scale, the coarser scale if the two differ; bf16 ulp; E2M1 spacing x block scale);
* every element ``|a - b| <= step + allowance`` (+0 and -0 equal), no NaN;
* elements with ``|a - b| > allowance`` (they used the step) at most ``max(4, ceil(0.001 N))``,
  elements of boundary blocks not counted (their whole block is re-gridded);
* scale bytes equal, except in boundary blocks (:func:`boundary_blocks`).

:func:`check_compressor_rule` returns a :class:`RuleReport` that also counts the bit-identical
elements (the rule is a floor, not a target). :func:`term_magnitudes` computes ``m`` from the
reference's inputs. Pad and unwritten bytes are not this module's business: they stay BIT-EXACT.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dsv4kit.errors import input_error

__all__ = [
    "ALLOWANCE",
    "RuleReport",
    "bf16_ulp",
    "boundary_blocks",
    "check_compressor_rule",
    "e2m1_step",
    "e4m3_step",
    "rope_magnitudes",
    "step_budget",
    "term_magnitudes",
    "FP32_RULE",
    "Fp32Report",
    "check_fp32_rule",
]

#: The per-element fp32 allowance, in units of the term magnitude.
ALLOWANCE = 2.0**-16
NAME = "check_compressor_rule"


# --------------------------------------------------------------------------- grid spacings


def _binade(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) for x != 0, exactly (from the float64 exponent, never a log approximation)."""
    _, e = torch.frexp(x.abs().to(torch.float64))
    return (e - 1).to(torch.float64)


def e4m3_step(v: torch.Tensor) -> torch.Tensor:
    """e4m3 grid spacing at magnitude ``|v|`` (in units of the scale): ``2**-9`` below ``2**-6``
    (subnormals), else ``2**(binade - 3)``; magnitudes past 448 stay in the top binade."""
    v = v.abs().to(torch.float64).clamp(max=448.0)
    normal = torch.exp2(_binade(v.clamp(min=2.0**-6)) - 3)
    return torch.where(v < 2.0**-6, torch.full_like(v, 2.0**-9), normal)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """bf16 spacing at ``|x|``: ``2**(binade - 7)``, ``2**-133`` in the subnormal range."""
    x = x.abs().to(torch.float64)
    return torch.exp2(_binade(x.clamp(min=2.0**-126)) - 7)


def e2m1_step(v: torch.Tensor) -> torch.Tensor:
    """E2M1 spacing at ``|v|`` (units of the block scale): 0.5 below 2, 1 in [2, 4), 2 in [4, 6]."""
    v = v.abs().to(torch.float64)
    return torch.where(v < 2, 0.5, torch.where(v < 4, 1.0, 2.0)).to(torch.float64)


def step_budget(n: int) -> int:
    """How many elements of a case may use the step: ``max(4, ceil(0.001 N))``."""
    return max(4, math.ceil(0.001 * n))


# --------------------------------------------------------------------------- boundary blocks


def boundary_blocks(amax: torch.Tensor, exponent: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Blocks whose scale may legitimately differ: ``E(bf16(a (1 - 1e-6))) != E(bf16(a (1 + 1e-6)))``
    with ``a`` the reference block amax before bf16 rounding and ``E`` the format's exponent
    function (e.g. the Q8 ``clog2(fl(max(a, 1e-4) / 448))``)."""
    a = amax.to(torch.float64)
    lo = (a * (1 - 1e-6)).to(torch.float32).to(torch.bfloat16).to(torch.float32)
    hi = (a * (1 + 1e-6)).to(torch.float32).to(torch.bfloat16).to(torch.float32)
    return exponent(lo) != exponent(hi)


# --------------------------------------------------------------------------- term magnitudes


def term_magnitudes(k: torch.Tensor, s: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                    cos_sin: torch.Tensor | None = None, rope_dims: int = 64) -> torch.Tensor:
    """``m`` of §2.12 for pooled rows: ``P_d = sum_j w_j |k_j[d]|``, ``n_d = rr |w_norm[d]| P_d`` (rr the
    RMSNorm factor of the pooled row), and for each GPT-J pair ``(e, o)`` of the last ``rope_dims``
    dims rotated with ``(c, s)``: ``m_e = |c| n_e + |s| n_o``, ``m_o = |c| n_o + |s| n_e``.

    ``k``, ``s``: ``[n, W, D]`` window rows and scores (excluded rows have score ``-inf``), as
    :func:`dsv4kit.formats.state_cache.window_rows` returns them; ``cos_sin``: ``[n, 64]`` rows
    ``[cos | sin]`` or None (no RoPE, e.g. K7). Computed in float64: a magnitude, not a result.
    """
    k64, s64 = k.to(torch.float64), s.to(torch.float64)
    w = torch.softmax(s64, dim=-2)
    p = (w * k64.abs()).sum(dim=-2)
    c = (w * k64).sum(dim=-2)
    rr = 1.0 / torch.sqrt((c * c).mean(dim=-1, keepdim=True) + eps)
    n = rr * norm_weight.to(torch.float64).abs() * p
    return rope_magnitudes(n, cos_sin, rope_dims)


def rope_magnitudes(n: torch.Tensor, cos_sin: torch.Tensor | None, rope_dims: int = 64) -> torch.Tensor:
    """The RoPE step of :func:`term_magnitudes` on normalized magnitudes ``n`` ``[..., D]`` (K8 starts
    here, with ``P_d = |compressed_kv[t, d]|``)."""
    if cos_sin is None:
        return n
    half = rope_dims // 2
    cs = cos_sin.to(torch.float64).abs()
    c, sn = cs[..., :half], cs[..., half:]
    m = n.clone()
    ne, no = n[..., -rope_dims::2], n[..., -rope_dims + 1::2]
    m[..., -rope_dims::2] = c * ne + sn * no
    m[..., -rope_dims + 1::2] = c * no + sn * ne
    return m


# --------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class RuleReport:
    """What the rule saw in one output tensor of one test case."""

    n: int                    #: decoded elements written
    bit_identical: int        #: a and b identical (+0 and -0 count as identical)
    within_allowance: int     #: |a - b| <= allowance (bit-identical included)
    used_step: int            #: allowance < |a - b| <= step + allowance, boundary blocks excluded
    budget: int               #: max(4, ceil(0.001 N))
    violations: int           #: |a - b| > step + allowance, or a NaN
    scale_mismatches: int     #: elements whose block scales differ outside boundary blocks
    first_violation: str = ""

    @property
    def ok(self) -> bool:
        return self.violations == 0 and self.scale_mismatches == 0 and self.used_step <= self.budget

    def summary(self) -> str:
        verdict = "conforms" if self.ok else "FAILS"
        text = (f"compressor rule {verdict}: {self.bit_identical}/{self.n} bit-identical, "
                f"{self.within_allowance} within the fp32 allowance, {self.used_step} used the step "
                f"(budget {self.budget}), {self.violations} violation(s), {self.scale_mismatches} scale "
                f"mismatch(es)")
        return text + (f"; first: {self.first_violation}" if self.first_violation else "")

    def assert_ok(self) -> None:
        """Raise AssertionError with :meth:`summary` unless the case conforms."""
        if not self.ok:
            raise AssertionError(self.summary())


def _same_shape(arg: str, t: torch.Tensor | None, shape: torch.Size) -> None:
    if t is not None and t.shape != shape:
        raise input_error(NAME, arg, f"shape {tuple(shape)}", f"shape {tuple(t.shape)}")


def check_compressor_rule(
    a: torch.Tensor,
    b: torch.Tensor,
    m: torch.Tensor,
    step: Callable[[torch.Tensor], torch.Tensor],
    *,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    boundary: torch.Tensor | None = None,
) -> RuleReport:
    """Apply the rule to decoded kernel values ``a`` and reference values ``b`` (same shape, any
    float dtype, units of ``y``) with term magnitudes ``m``.

    ``step(x)`` gives the format's grid spacing at ``|x|`` in units of the scale (:func:`e4m3_step`,
    :func:`e2m1_step`, or :func:`bf16_ulp` with no scales). ``scale_a`` / ``scale_b``: each element's
    block scale as decoded (broadcast to ``a``'s shape; None for formats without scales); the
    coarser of the two sets the step. ``boundary``: per element, whether its block is a boundary
    block (:func:`boundary_blocks`, broadcast like the scales): its scale may differ and its
    elements are not counted against the budget.
    """
    for arg, t in (("b", b), ("m", m), ("scale_a", scale_a), ("scale_b", scale_b), ("boundary", boundary)):
        _same_shape(arg, t, a.shape)
    a64, b64, m64 = a.to(torch.float64), b.to(torch.float64), m.to(torch.float64)
    diff = (a64 - b64).abs()                       # +0 - -0 == 0: signed zeros compare equal
    nan = torch.isnan(a64) | torch.isnan(b64) | torch.isnan(m64)
    if scale_a is None:
        scale = torch.ones_like(a64)
        mismatch = torch.zeros_like(nan)
    else:
        sa, sb = scale_a.to(torch.float64), scale_b.to(torch.float64)
        scale = torch.maximum(sa, sb)
        mismatch = sa != sb
    at_boundary = torch.zeros_like(nan) if boundary is None else boundary.to(torch.bool)
    mag = torch.maximum(a64.abs(), b64.abs()) / scale
    step64 = step(mag).to(torch.float64) * scale
    allowance = ALLOWANCE * m64
    bad = nan | (diff > step64 + allowance)
    used = (diff > allowance) & ~bad & ~at_boundary
    first = ""
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        first = (f"element {i}: kernel {a64.flatten()[i].item()!r}, reference {b64.flatten()[i].item()!r}, "
                 f"step {step64.flatten()[i].item():.3g}, allowance {allowance.flatten()[i].item():.3g}")
    n = a.numel()
    return RuleReport(
        n=n,
        bit_identical=int(((diff == 0) & ~nan).sum()),
        within_allowance=int(((diff <= allowance) & ~nan).sum()),
        used_step=int(used.sum()),
        budget=step_budget(n),
        violations=int(bad.sum()),
        scale_mismatches=int((mismatch & ~at_boundary).sum()),
        first_violation=first,
    )


# --------------------------------------------------------------------------- the FP32 rule (K7)

#: The FP32 rule's bound: ``|c_kernel - c_ref| <= FP32_RULE * max_j |k_j[d]|`` per element.
FP32_RULE = 1e-5


@dataclass(frozen=True)
class Fp32Report:
    """What the FP32 rule (K7) saw in one test case."""

    n: int                    #: elements judged
    bit_identical: int        #: kernel and reference identical (+0 and -0 count as identical)
    violations: int           #: |a - b| > 1e-5 max_j |k_j[d]|, or a NaN
    worst: float              #: max over elements of |a - b| / (1e-5 max_j |k_j[d]|) (0 where both are 0)
    first_violation: str = ""

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def summary(self) -> str:
        verdict = "conforms" if self.ok else "FAILS"
        text = (f"FP32 rule {verdict}: {self.bit_identical}/{self.n} bit-identical, worst "
                f"{self.worst:.3g} of the bound, {self.violations} violation(s)")
        return text + (f"; first: {self.first_violation}" if self.first_violation else "")

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())


def check_fp32_rule(a: torch.Tensor, b: torch.Tensor, kmax: torch.Tensor) -> Fp32Report:
    """The FP32 rule of §2.12 on kernel rows ``a`` and reference rows ``b`` (fp32, same shape), with
    ``kmax`` the per-element ``max_j |k_j[d]|`` over the pooled rows. Any NaN fails."""
    _same_shape("b", b, a.shape)
    _same_shape("kmax", kmax, a.shape)
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    bound = FP32_RULE * kmax.to(torch.float64)
    diff = (a64 - b64).abs()
    nan = torch.isnan(a64) | torch.isnan(b64)
    bad = nan | (diff > bound)
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / bound)
    first = ""
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        first = (f"element {i}: kernel {a64.flatten()[i].item()!r}, reference {b64.flatten()[i].item()!r}, "
                 f"bound {bound.flatten()[i].item():.3g}")
    return Fp32Report(
        n=a.numel(),
        bit_identical=int(((diff == 0) & ~nan).sum()),
        violations=int(bad.sum()),
        worst=float(ratio[~nan].max()) if (~nan).any() and a.numel() else 0.0,
        first_violation=first,
    )

