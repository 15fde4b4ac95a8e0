"""A launch plan's view steps (``_view_step``): each way of rebuilding a view of a call tensor
gives, on a new call's tensor of the same signature, a tensor of the same geometry and dtype on
that call's storage, and the cheapest applicable way is the one chosen."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dsv4kit.jit.launch_plans import _SRC, _VIEW, _geometry, _Source, _Sources, _view_step

U8, BF16, F32, I32 = torch.uint8, torch.bfloat16, torch.float32, torch.int32

# (source factory, the view of it a launch takes, the way expected)
CASES: list[tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], torch.Tensor], str]] = [
    (lambda: torch.empty(6, 64, dtype=U8), lambda s: s, "source"),
    (lambda: torch.empty(6, 64, dtype=U8), lambda s: s.view(torch.float8_e4m3fn), "view"),
    (lambda: torch.empty(6, 64, dtype=U8), lambda s: s.view(I32), "view"),
    (lambda: torch.empty(6, 64, dtype=U8), lambda s: s[2:].view(I32), "view_strided"),
    (lambda: torch.empty(6, 64, dtype=U8), lambda s: s[1:, 4:12], "strided"),
    (lambda: torch.empty(6, 64, dtype=F32), lambda s: s.view(BF16)[:, ::2], "view_strided"),
    (lambda: torch.empty(6, 64, dtype=U8)[:, 1:], lambda s: s.view(torch.int8), "view"),
    (lambda: torch.empty(6, 64, dtype=U8)[:, 1:], lambda s: s[:, 3:].view(I32), "rebind"),
]


def _rebuilt(step: tuple, source: torch.Tensor) -> torch.Tensor:
    names = _Source()
    fn = eval(f"lambda s0: {names.expr(step)}", names.names)  # noqa: S307 - the plan's own text
    return fn(source)


@pytest.mark.parametrize("make, view, how", CASES)
def test_view_step_rebuilds_the_view_on_a_new_call(make, view, how) -> None:
    first = make()
    step = _view_step(view(first), 0, _Sources([first]))
    assert ("source" if step[0] == _SRC else step[-1]) == how
    second = make()                               # the next call: same signature, its own storage
    got = _rebuilt(step, second)
    assert _geometry(got) == _geometry(view(second))
    assert got.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()


def test_an_output_is_never_the_source_object() -> None:
    first = torch.empty(4, 8, dtype=F32)
    step = _view_step(first.view(F32), 0, _Sources([first]), as_source=False)
    assert step[0] == _VIEW
    second = torch.empty(4, 8, dtype=F32)
    got = _rebuilt(step, second)
    assert got is not second and _geometry(got) == _geometry(second)
