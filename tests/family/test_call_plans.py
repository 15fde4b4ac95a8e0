"""The op layer's per-signature fast path (dsv4kit.family.plans) changes nothing a caller sees.

With every op's valid signature planned, each bad call of the bad-input matrix (and calls with
bad values of the valid types, which share the valid call's signature) must end exactly as the
full path ends: the same exception type and message, or the same outputs. A signature change
(dtype, device, scalar type, choice value, option, platform) must not reuse a plan, whether the
plan is found by its signature or by its class guard (the hot plans, tried first).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from test_bad_input_matrix import CASES, SCALAR_CASES

from dsv4kit.family import FamilySpec
from dsv4kit.family.plans import call_signature, class_guard
from dsv4kit.family.spec import OP_OPTIONS
from dsv4kit.kernels import families
from dsv4kit.platform import cpu_platform
from dsv4kit.testing.valid_calls import VALID, sized_call, twin, valid_call

SPECS = {spec.name: spec for spec in families()}


def _valid(spec: FamilySpec) -> dict[str, Any]:
    # Every argument given, defaults too: a mutated call then has the same keywords, so only the
    # mutated value can tell the two signatures apart.
    return valid_call(spec, with_defaults=True)


def _outcome(fn: Any, kwargs: dict[str, Any]) -> tuple[str, Any]:
    """What a call did: ("raised", type and message) or ("returned", the bytes of every tensor)."""
    fresh = {k: (twin(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    try:
        result = fn(**fresh)
    except Exception as exc:  # the type matters: a fast path must not turn one error into another
        return "raised", (type(exc).__name__, str(exc))
    outs = result if isinstance(result, tuple) else (result,)
    written = [t.view(torch.uint8).flatten().tolist() for t in (*outs, *fresh.values())
               if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() < 1 << 16]
    return "returned", written


@pytest.fixture(scope="module")
def planned() -> dict[str, FamilySpec]:
    """Every op with the plan of its valid call in place."""
    for spec in SPECS.values():
        spec._plans.clear()
        spec.op(**_valid(spec))
        assert len(spec._plans) == 1, spec.name
    return SPECS


def _value_mutations(spec: FamilySpec) -> list[tuple[str, str, object]]:
    """Bad values of the valid call's own scalar types: the signature stays the valid one's."""
    valid = _valid(spec)
    out: list[tuple[str, str, object]] = []
    for a in spec.args:
        v = valid.get(a.name)
        if a.choices:
            continue
        if type(v) is int and not isinstance(v, bool):
            out += [(a.name, "-1", -1), (a.name, "2**40", 2**40)]
        elif type(v) is float:
            out += [(a.name, "nan", math.nan), (a.name, "-1.0", -1.0)]
    return out


VALUE_CASES = [(spec, *m) for spec in families() for m in _value_mutations(spec)]
ALL = [(s, a, k, b) for s, a, k, b in CASES + SCALAR_CASES + VALUE_CASES]


@pytest.mark.parametrize("spec, arg, kind, bad", ALL, ids=[f"{s.name}-{a}-{k}" for s, a, k, _ in ALL])
def test_a_planned_op_ends_every_call_as_the_full_path_does(planned: dict, spec: FamilySpec, arg: str,
                                                            kind: str, bad: object) -> None:
    spec = planned[spec.name]
    call = {**_valid(spec), arg: bad}
    assert _outcome(spec.op, call) == _outcome(spec.call_checked, call)


def test_value_mutations_reach_the_fast_path(planned: dict) -> None:
    # The value cases are the ones a plan serves: their signature is the valid call's.
    spec = planned["save_partial_states"]
    valid = _valid(spec)
    names = [c for c in VALUE_CASES if c[0].name == spec.name]
    assert names, "save_partial_states has int arguments to mutate"
    rows = {a.name: a for a in spec.args}
    base = call_signature(spec.args, OP_OPTIONS, (), valid, rows)
    for _, arg, _, bad in names:
        assert call_signature(spec.args, OP_OPTIONS, (), {**valid, arg: bad}, rows) == base, arg


def test_a_planned_call_skips_binding_and_an_unplanned_one_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS["rowquant"]
    valid = VALID[spec.name](spec)
    spec._plans.clear()
    first = spec.op(**valid)
    assert len(spec._plans) == 1

    def no_bind(*_: Any, **__: Any) -> Any:
        raise AssertionError("bind ran for a planned signature")

    monkeypatch.setattr(type(spec), "bind", no_bind)
    again = spec.op(**valid)                                       # planned: no bind
    pairs = zip(first, again, strict=True)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in pairs)
    x = valid["x"]
    for changed in ({"x": x.to(torch.float16)}, {"x": x.contiguous(), "platform": cpu_platform("sm_100a")},
                    {"x": x, "debug_checks": True}, {"x": x, "backend": "triton"}):
        with pytest.raises(AssertionError, match="bind ran"):
            spec.op(**{**valid, **changed})


def _other_classes(valid: dict[str, Any]) -> list[dict[str, Any]]:
    """Calls of another signature class than ``valid`` (a dequant_gather call, every keyword given)."""
    return [
        {**valid, "out": valid["out"].to(torch.float16)},          # dtype
        {**valid, "out": valid["out"].to("meta")},                 # device
        {**valid, "block_size": float(valid["block_size"])},       # scalar type
        {**valid, "gather_lens": None},                            # None vs a tensor
        {**valid, "backend": "triton"},                            # an option (a keyword more)
        {**valid, "platform": cpu_platform("sm_90a")},             # another platform object
        dict(reversed(valid.items())),                             # keywords in another order
    ]


def test_signatures_tell_apart_what_the_op_layer_checks() -> None:
    spec = SPECS["dequant_gather"]
    rows = {a.name: a for a in spec.args}
    valid = VALID[spec.name](spec)
    sig = call_signature(spec.args, OP_OPTIONS, (), valid, rows)
    assert sig is not None
    block = valid["block_size"]
    for call in _other_classes(valid):
        assert call_signature(spec.args, OP_OPTIONS, (), call, rows) != sig
    assert call_signature(spec.args, OP_OPTIONS, (), {**valid, "block_size": block * 2}, rows) == sig
    # What a signature cannot describe takes the full path: an unknown keyword, an unhashable value.
    assert call_signature(spec.args, OP_OPTIONS, (), {**valid, "nonsense": 1}, rows) is None
    assert call_signature(spec.args, OP_OPTIONS, (), {**valid, "offset": [0]}, rows) is None


def test_the_class_guard_passes_its_signature_class_only() -> None:
    spec = SPECS["dequant_gather"]
    rows = {a.name: a for a in spec.args}
    valid = VALID[spec.name](spec)
    sig = call_signature(spec.args, OP_OPTIONS, (), valid, rows)
    guard = class_guard(sig, (), valid)
    assert guard is not None and guard((), valid)
    bigger = sized_call(spec, 7)                                   # other sizes, the same class
    assert call_signature(spec.args, OP_OPTIONS, (), bigger, rows) == sig and guard((), bigger)
    assert guard((), {**valid, "block_size": valid["block_size"] * 2})   # a type-only scalar
    for call in _other_classes(valid):
        assert not guard((), call), sorted(set(call) ^ set(valid)) or "order"
    named = list(valid)
    positional = tuple(valid.values())
    sig_pos = call_signature(spec.args, OP_OPTIONS, positional, {}, rows)
    by_position = class_guard(sig_pos, positional, {})
    assert by_position is not None and by_position(positional, {}) and not by_position((), valid)
    assert not guard(positional, {}), named


def test_a_hot_class_is_rechecked_by_the_kernel(planned: dict) -> None:
    # The hot plan of the valid class serves a call of bad sizes of that class; the kernel's own
    # checks still refuse it, naming the op.
    spec = planned["rowquant"]
    valid = _valid(spec)
    spec.op(**valid)
    assert spec._plans.hot and spec._plans.hot[0].guard((), valid)
    bad = {**valid, "x": valid["x"][:, :100]}                      # 100 columns: not a multiple of 128
    assert spec._plans.hot[0].guard((), bad)
    assert _outcome(spec.op, bad) == _outcome(spec.call_checked, bad)
    assert _outcome(spec.op, bad)[0] == "raised"
