"""A bad-input matrix per public op, generated from the family spec's argument table.

For each op: a valid call (from the family's cases), then, argument by argument, every kind of
bad value that applies: a non-tensor, another dtype, one dim more or less, a ``meta`` tensor,
an innermost dim of non-unit stride, a non-numeric or bool scalar. Each must raise
:class:`KernelInputError` naming that argument, before anything is launched (the state the op
writes is unchanged); no other exception type.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.family import FamilySpec
from dsv4kit.kernels import families
from dsv4kit.kernels.c4_compress.cases import make_case as c4_case
from dsv4kit.kernels.dequant_gather.cases import make_case as k3_case
from dsv4kit.kernels.encoders.cases import make_case as store_case
from dsv4kit.kernels.indexer_q.cases import make_case as iq_case
from dsv4kit.kernels.rowquant.cases import regime
from dsv4kit.kernels.save_partial_states.cases import make_case as k4_case


def _bound(spec: FamilySpec, args: tuple) -> dict:
    """Positional case arguments by the op's argument names (the table's leading rows)."""
    return dict(zip((a.name for a in spec.args), args, strict=False))


#: A valid call of each op, by argument name.
VALID: dict[str, Callable[[FamilySpec], dict]] = {
    "save_partial_states": lambda spec: k4_case((256, 4, 4), 5, seed=1).kwargs(),
    "indexer_q": lambda spec: _bound(spec, iq_case(3, seed=1).args()),
    "dequant_gather": lambda spec: _bound(spec, k3_case([9, 3], [4, 3], block_size=16, seed=1).args()),
    "rowquant": lambda spec: {"x": regime("normal", 3, 256)},
    "c4_compress_ds_mla": lambda spec: c4_case(spec.name, lens=(9,), seed=1).fresh().args,
    "c4_compress_plain": lambda spec: c4_case(spec.name, lens=(9,), fp8_scale=0.5, seed=1).fresh().args,
    "indexer_compress": lambda spec: c4_case(spec.name, lens=(9,), seed=1).fresh().args,
    "store_rows_ds": lambda spec: store_case(spec.name, 5, seed=1).fresh().args,
    "store_rows_plain": lambda spec: store_case(spec.name, 5, fp8_scale=0.5, seed=1).fresh().args,
    "store_rows_indexer": lambda spec: store_case(spec.name, 5, seed=1).fresh().args,
}

OTHER_DTYPE = {torch.float32: torch.float64, torch.bfloat16: torch.float16, torch.int64: torch.int32,
               torch.int32: torch.int64, torch.uint8: torch.int8, torch.float8_e4m3fn: torch.float8_e5m2}


def _mutations(spec: FamilySpec, valid: dict) -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = []
    for a in spec.args:
        v = valid.get(a.name)
        if a.kind == "tensor":
            out.append((a.name, "a list", [1, 2]))
            if not a.optional:
                out.append((a.name, "None", None))
            if isinstance(v, torch.Tensor):
                out.append((a.name, "another dtype", v.to(OTHER_DTYPE[v.dtype])))
                out.append((a.name, "one more dim", v.unsqueeze(0)))
                if v.dim() > 1:
                    out.append((a.name, "one dim less", v[0]))
                out.append((a.name, "a meta tensor", torch.empty_strided(v.shape, v.stride(), dtype=v.dtype,
                                                                        device="meta")))
                if v.numel() > 1:    # every argument's innermost dim has unit stride (spec §2.10)
                    wide = torch.zeros((*v.shape[:-1], 2 * v.shape[-1]), dtype=v.dtype)
                    out.append((a.name, "a non-unit inner stride", wide[..., ::2]))
        elif a.kind in ("int", "float"):
            out += [(a.name, "a string", "7"), (a.name, "a bool", True), (a.name, "a list", [1])]
        elif a.kind == "str":
            out += [(a.name, "an unknown choice", "nonsense"), (a.name, "an int", 3)]
    return out


CASES = [(spec, *m) for spec in families() for m in _mutations(spec, VALID[spec.name](spec))]


@pytest.mark.parametrize("spec, arg, kind, bad", CASES,
                         ids=[f"{s.name}-{a}-{k}" for s, a, k, _ in CASES])
def test_bad_input_is_a_named_kernel_input_error(spec: FamilySpec, arg: str, kind: str, bad: object) -> None:
    valid = VALID[spec.name](spec)
    before = {k: v.clone() for k, v in valid.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(KernelInputError) as exc:
        spec.op(**{**valid, arg: bad})
    assert f": {arg}: expected" in str(exc.value) or f": {arg} " in str(exc.value), str(exc.value)
    for k, t in before.items():                                    # nothing was written
        assert torch.equal(valid[k].view(torch.uint8), t.view(torch.uint8)), k


@pytest.mark.parametrize("spec", families(), ids=lambda s: s.name)
def test_the_valid_call_runs(spec: FamilySpec) -> None:
    spec.op(**VALID[spec.name](spec))


@pytest.mark.parametrize("spec", families(), ids=lambda s: s.name)
def test_the_common_options_are_checked(spec: FamilySpec) -> None:
    valid = VALID[spec.name](spec)
    with pytest.raises(KernelInputError, match=f"{spec.op_name}: debug_checks: expected True, False or"):
        spec.op(**valid, debug_checks="yes")
    with pytest.raises(KernelInputError, match="backend: expected one of cutedsl, triton or None, got"):
        spec.op(**valid, backend="cuda")
    with pytest.raises(KernelInputError, match=f"{spec.op_name}: platform: expected a dsv4kit Platform"):
        spec.op(**valid, platform="sm_90a")
