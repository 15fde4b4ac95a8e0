"""Hot guards (dsv4kit.jit.launch_plans.SignatureGuard) accept exactly the plan's signature.

A hot guard lets a call run a plan without computing its launch signature, so it must pass only
calls whose signature equals the plan's. Two levels of proof:

* the guard alone, against :func:`launch_signature`: one signature component varied at a time
  (dtype, device, a size, a stride, the storage offset, the address mod 32 and mod 16, two
  arguments sharing a storage or not, a scalar's value and type, None for a tensor, a tensor
  subclass, requires_grad, the sign of a zero, keyword order): the guard passes iff the signature
  is equal, save where it is stricter (requires_grad, inference mode), which falls back;
* every op and its kernel object, warmed so that its hot entry serves the valid call, then each
  variation and every bad call of the bad-input matrix: the same outcome as with plans off (the
  same KernelInputError, or the same bytes written and returned), every guard pass checked against
  the call's full signature (the spy below), and the valid call served hot again afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_bad_input_matrix import CASES, SCALAR_CASES

from dsv4kit.family import FamilySpec
from dsv4kit.jit import launch_plans
from dsv4kit.jit.launch_plans import SignatureGuard, launch_signature, plans_of
from dsv4kit.kernels import families
from dsv4kit.testing.valid_calls import twin, valid_call

SPECS = {spec.name: spec for spec in families()}
OFF = {"debug_checks": False, "backend": "triton"}


pytestmark = pytest.mark.usefixtures("plan_on_sight")  # these tests are about the plans themselves


class _Sub(torch.Tensor):
    """A tensor subclass: another type, the same metadata."""


# --------------------------------------------------------------------------- the guard alone

def _span(v: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(v.shape, v.stride(), strict=True)) if v.numel() else 0


def _placed(v: torch.Tensor, offset: int = 0, shift: int = 0) -> torch.Tensor:
    """``v``'s values in fresh memory: the same sizes and strides, at storage ``offset`` (elements)
    of a storage starting ``shift`` bytes past a 64-byte aligned allocation."""
    raw = torch.zeros(shift + (offset + _span(v)) * v.itemsize + 64, dtype=torch.uint8, device=v.device)
    storage = raw.untyped_storage()[shift:] if shift else raw.untyped_storage()
    out = torch.empty(0, dtype=v.dtype, device=v.device).set_(storage, offset, v.shape, v.stride())
    with torch.no_grad():
        out.copy_(v.detach())
    return out


def _guard_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Callable[..., Any]]:
    sig, tensors = launch_signature(args, kwargs)
    guard = SignatureGuard(sig).bind(tensors)
    assert guard is not None and guard(args, kwargs) == tensors
    return sig, guard


def _base() -> tuple[tuple[Any, ...], dict[str, Any]]:
    buf = torch.arange(64.0)
    x, y = buf[:16].view(4, 4), buf[16:32]                  # sharing a storage, y at offset 16
    return (x, y, 3), {"z": torch.zeros(2, 8), "eps": 0.5, "zero": 0.0, "flag": True, "mode": "a",
                       "dt": torch.float32, "opt": None, "pair": (1, 2.0)}


def _variants() -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    out = []

    def vary(name: str, change: Callable[[list[Any], dict[str, Any]], None]) -> None:
        args, kwargs = _base()
        args = list(args)
        change(args, kwargs)
        out.append((name, tuple(args), kwargs))

    def sets(i: Any, value: Callable[[Any], Any]) -> Callable[[list[Any], dict[str, Any]], None]:
        def change(args: list[Any], kwargs: dict[str, Any]) -> None:
            where = args if isinstance(i, int) else kwargs
            where[i] = value(where[i])
        return change

    vary("the same layout, fresh memory", sets("z", _placed))
    vary("dtype", sets("z", lambda t: t.double()))
    vary("device", sets("z", lambda t: torch.empty_strided(t.shape, t.stride(), device="meta")))
    vary("a size", sets("z", lambda t: torch.zeros(2, 8)[:, :7]))
    vary("a stride", sets("z", lambda t: torch.zeros(2, 16)[:, :8]))
    vary("storage offset, same address class", sets("z", lambda t: _placed(t, offset=8)))
    vary("storage offset and address mod 32", sets("z", lambda t: _placed(t, offset=1)))
    vary("address 16 mod 32 only", sets("z", lambda t: _placed(t, shift=16)))
    vary("address 4 mod 32 only", sets("z", lambda t: _placed(t, shift=4)))
    vary("aliasing: apart instead of shared", sets(1, lambda t: _placed(t, offset=16)))
    vary("aliasing: z shares x's storage",
         lambda a, k: k.update(z=torch.empty(0).set_(a[0].untyped_storage(), 0, (2, 8), (8, 1))))
    vary("a tensor subclass", sets("z", lambda t: t.as_subclass(_Sub)))
    vary("a Parameter", sets("z", lambda t: torch.nn.Parameter(t, requires_grad=False)))
    vary("None for a tensor", sets("z", lambda t: None))
    vary("a tensor for None", sets("opt", lambda v: torch.zeros(2)))
    vary("a non-tensor for a tensor", sets("z", lambda t: t.tolist()))
    vary("an int's value", sets(2, lambda v: 4))
    vary("an int as a float", sets(2, lambda v: 3.0))
    vary("an int as a bool", sets(2, lambda v: True))
    vary("a bool as an int", sets("flag", lambda v: 1))
    vary("a bool's value", sets("flag", lambda v: False))
    vary("a float's value", sets("eps", lambda v: 0.25))
    vary("a float as an int", sets("zero", lambda v: 0))
    vary("the sign of a zero", sets("zero", lambda v: -0.0))
    vary("a float nan", sets("eps", lambda v: float("nan")))
    vary("a string's value", sets("mode", lambda v: "b"))
    vary("a dtype's value", sets("dt", lambda v: torch.float16))
    vary("a tuple's element type", sets("pair", lambda v: (1, 2)))
    vary("keyword order", lambda a, k: k.update({"eps": k.pop("eps")}))
    vary("a keyword more", lambda a, k: k.update(extra=1))
    vary("a keyword less", lambda a, k: k.pop("mode"))
    vary("a positional more", lambda a, k: a.append(1))
    vary("a positional as a keyword", lambda a, k: k.update(third=a.pop()))
    return out


STRICTER = {"requires_grad", "an inference-mode tensor"}     # the guard falls back, the table serves


@pytest.mark.parametrize("name, args, kwargs", _variants(), ids=[v[0] for v in _variants()])
def test_the_guard_passes_iff_the_signature_is_the_plans(name: str, args: tuple, kwargs: dict) -> None:
    sig, guard = _guard_of(*_base())
    described = launch_signature(args, kwargs)
    same = described is not None and described[0] == sig
    passed = guard(args, kwargs)
    assert (passed is not None) == same, (name, same)
    if same:
        assert name == "the same layout, fresh memory"
        assert passed == described[1]


def test_a_stricter_guard_falls_back_for_requires_grad_and_inference_mode() -> None:
    args, kwargs = _base()
    sig, guard = _guard_of(args, kwargs)
    grad = {**kwargs, "z": kwargs["z"].clone().requires_grad_()}
    assert launch_signature(args, grad)[0] == sig and guard(args, grad) is None
    with torch.inference_mode():
        inf = {**kwargs, "z": torch.zeros(2, 8)}
        assert launch_signature(args, inf)[0] == sig and guard(args, inf) is None
        assert SignatureGuard(sig).bind(launch_signature(args, inf)[1])(args, inf) is not None


def test_a_wrong_argument_count_is_a_miss_not_an_error() -> None:
    sig, guard = _guard_of((torch.zeros(2), torch.zeros(3)), {})
    assert guard((torch.zeros(2),), {}) is None
    assert guard((torch.zeros(2), torch.zeros(3), torch.zeros(1)), {}) is None
    assert guard((torch.zeros(2), torch.zeros(3)), {"k": 1}) is None


def test_an_op_guard_hands_the_tensors_over_in_the_kernels_order() -> None:
    args, kwargs = _base()
    sig, tensors = launch_signature(args, kwargs)
    guard = SignatureGuard(sig, (2, 0)).bind(tensors)
    assert guard(args, kwargs) == [tensors[2], tensors[0]]


# --------------------------------------------------------------------------- every op, warmed

@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """Every bound guard checked on every call: ``(passed, the call's signature is the guard's)``.
    A pass of another signature is a failure at once."""
    log: list[tuple[bool, bool]] = []
    bind = SignatureGuard.bind

    def checked(self: SignatureGuard, tensors: list[torch.Tensor]) -> Any:
        guard = bind(self, tensors)
        if guard is None:
            return None

        def spied(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            got = guard(args, kwargs)
            described = launch_signature(args, kwargs)
            same = described is not None and described[0] == self.signature
            log.append((got is not None, same))
            if got is not None:
                assert same, "a hot guard passed a call of another signature"
                want = described[1] if self.order is None else [described[1][i] for i in self.order]
                assert all(a is b for a, b in zip(got, want, strict=True))
            return got

        spied.tensors_pass = guard.tensors_pass  # type: ignore[attr-defined]
        return spied

    monkeypatch.setattr(SignatureGuard, "bind", checked)
    return log


def _outcome(fn: Callable[..., Any], call: dict[str, Any]) -> tuple[str, Any]:
    """What a call did: ("raised", type and message) or ("returned", the bytes of every tensor it
    returned or was given). The call's own tensors, not copies: aliasing is part of the call."""
    try:
        result = fn(**call)
    except Exception as exc:
        return "raised", (type(exc).__name__, str(exc))
    outs = result if isinstance(result, tuple) else (result,)
    return "returned", [t.detach().reshape(-1).view(torch.uint8).tolist() if t.is_contiguous() else
                        t.detach().contiguous().view(torch.uint8).flatten().tolist()
                        for t in (*outs, *call.values())
                        if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() < 1 << 16]


def _entry(spec: FamilySpec, how: str) -> tuple[Callable[..., Any], Callable[[], dict[str, Any]]]:
    """The callable (the op, or its kernel object) and a maker of its valid call (fresh tensors)."""
    if how == "op":
        return spec.op, lambda: {**valid_call(spec, with_defaults=True), **OFF}
    call = {**valid_call(spec, with_defaults=True), **OFF}
    variant = call.pop(spec.variant_arg) if spec.variant_arg else "default"
    kernel = spec.kernel(variant, torch.device("cpu"), call.pop("backend"))

    def make() -> dict[str, Any]:
        c = {**valid_call(spec, with_defaults=True), "debug_checks": False}
        c.pop(spec.variant_arg, None)
        return c

    return kernel, make


def _scalar_variants(value: Any) -> list[tuple[str, Any]]:
    tp = type(value)
    if tp is bool:
        return [("the other bool", not value), ("the bool as an int", int(value))]
    if tp is int:
        out = [("the int + 1", value + 1), ("the int as a float", float(value))]
        return out + ([("the int as a bool", bool(value))] if value in (0, 1) else [])
    if tp is float:
        out = [("the float doubled", value * 2 or 1.0), ("the float's negative", -value)]
        return out + ([("the float as an int", int(value))] if value.is_integer() else [])
    return []


def _call_variants(make: Callable[[], dict[str, Any]]) -> list[tuple[str, Callable[[dict], None]]]:
    """One change each to a valid call: per tensor its layout, type, requires_grad; per scalar its
    value and type; one pair of tensors made to share a storage."""
    out: list[tuple[str, Callable[[dict], None]]] = []
    call = make()
    tensors = [n for n, v in call.items() if isinstance(v, torch.Tensor)]
    for n in tensors:
        def put(fn: Callable[[torch.Tensor], Any], n: str = n) -> Callable[[dict], None]:
            return lambda c: c.__setitem__(n, fn(c[n]))
        out += [(f"{n}: the same layout, fresh memory", put(_placed)),
                (f"{n}: storage offset +1", put(lambda t: _placed(t, offset=1))),
                (f"{n}: storage offset +32 bytes", put(lambda t: _placed(t, offset=32 // t.itemsize))),
                (f"{n}: address 16 mod 32", put(lambda t: _placed(t, shift=16))),
                (f"{n}: a tensor subclass", put(lambda t: t.as_subclass(_Sub))),
                (f"{n}: requires_grad", put(lambda t: _placed(t).requires_grad_()
                                            if t.is_floating_point() else t))]
    if len(tensors) > 1:
        a, b = tensors[0], tensors[-1]

        def share(c: dict) -> None:  # a and b in one fresh storage, values kept (b's offset moves too)
            ta, tb = c[a], c[b]
            start = -(-_span(ta) * ta.itemsize // 64) * 64
            raw = torch.zeros(start + _span(tb) * tb.itemsize + 64, dtype=torch.uint8).untyped_storage()
            for n, t, off in ((a, ta, 0), (b, tb, start // tb.itemsize)):
                c[n] = torch.empty(0, dtype=t.dtype).set_(raw, off, t.shape, t.stride()).copy_(t)
        out.append((f"{b} in {a}'s storage", share))
    for n, v in call.items():
        for what, value in _scalar_variants(v):
            out.append((f"{n}: {what}", lambda c, n=n, value=value: c.__setitem__(n, value)))
    return out


def _warm(fn: Callable[..., Any], make: Callable[[], dict[str, Any]], spy: list[tuple[bool, bool]]) -> None:
    """Call until the valid call is served by a hot guard (at most four calls)."""
    for _ in range(4):
        mark = len(spy)
        fn(**make())
        if any(passed for passed, _ in spy[mark:]):
            return
    raise AssertionError("the valid call never took the hot path")


def _clear(spec: FamilySpec) -> None:
    spec._launches.clear()
    for k in spec._kernels.values():
        plans_of(k).clear()


@pytest.mark.parametrize("how", ["op", "kernel"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_after_warming_every_variation_ends_as_with_plans_off(spy: list, name: str, how: str) -> None:
    spec = SPECS[name]
    _clear(spec)
    fn, make = _entry(spec, how)
    _warm(fn, make, spy)
    for what, change in _call_variants(make):
        call = make()
        change(call)
        got = _outcome(fn, call)
        with launch_plans.disabled():
            call = make()
            change(call)
            want = _outcome(fn, call)
        assert got == want, what
        _warm(fn, make, spy)          # the valid call is still served hot after it
    assert all(same for passed, same in spy if passed)


BAD = [(s, a, k, b) for s, a, k, b in CASES + SCALAR_CASES]


@pytest.mark.parametrize("spec, arg, kind, bad", BAD, ids=[f"{s.name}-{a}-{k}" for s, a, k, _ in BAD])
def test_after_warming_every_bad_call_is_still_a_kernel_input_error(spy: list, spec: FamilySpec, arg: str,
                                                                   kind: str, bad: object) -> None:
    _clear(spec)
    fn, make = _entry(spec, "op")
    _warm(fn, make, spy)

    def fresh() -> Any:  # a tensor may be written to: each run gets its own copy
        return twin(bad) if isinstance(bad, torch.Tensor) else bad

    got = _outcome(fn, {**make(), arg: fresh()})
    with launch_plans.disabled():
        want = _outcome(fn, {**make(), arg: fresh()})
    assert got == want
    if got[0] == "raised":
        assert got[1][0] == "KernelInputError", got
    _warm(fn, make, spy)


def test_a_hot_call_computes_no_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS["dequant_gather"]
    _clear(spec)
    for how in ("op", "kernel"):
        fn, make = _entry(spec, how)
        for _ in range(3):
            fn(**make())
    want = _outcome(spec.op, _entry(spec, "op")[1]())

    def no_signature(*_: Any) -> Any:
        raise AssertionError("a signature was computed")

    monkeypatch.setattr("dsv4kit.family.spec.launch_signature", no_signature)
    monkeypatch.setattr("dsv4kit.jit.launcher.launch_signature", no_signature)
    for how in ("op", "kernel"):
        fn, make = _entry(spec, how)
        assert _outcome(fn, make())[0] == "returned"
    assert _outcome(spec.op, _entry(spec, "op")[1]()) == want
    with pytest.raises(AssertionError, match="signature was computed"):
        spec.op(**{**_entry(spec, "op")[1](), "offset": 1})      # another signature: the lookup


def test_removing_a_plan_removes_its_hot_entries() -> None:
    spec = SPECS["rowquant"]
    _clear(spec)
    fn, make = _entry(spec, "kernel")
    fn(**make())
    table = plans_of(fn)
    assert len(table.hot) == 1
    sig = next(iter(table))
    del table[sig]
    assert not table.hot
    fn(**make())
    assert len(table.hot) == 1
    table.clear()
    assert not table.hot
    fn(**make())
    table.pop(next(iter(table)))
    assert not table.hot
