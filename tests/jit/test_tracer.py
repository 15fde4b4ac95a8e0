"""The dispatch tracer: declared inputs → keys, equal to calling dispatch; syntax checks."""

import itertools
import re
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4kit.errors import ContractError
from dsv4kit.jit import JitKernel, Like, WarmupChoices, WarmupIntRange, zip_inputs
from dsv4kit.jit.space import trace_dispatch

THRESHOLD = 512


class Gather(JitKernel["Gather.CompileKey"]):
    @dataclass(frozen=True)
    class CompileKey:
        block_size: int
        has_gather_lens: bool
        coarsen: int
        dtype: str

    def dispatch(self, block_size, gather_lens, num_tokens, cache, unused=None):
        coarsen = 1 if num_tokens < THRESHOLD else 4
        name = str(cache.dtype)
        return self.CompileKey(
            block_size=max(1, block_size),
            has_gather_lens=gather_lens is not None,
            coarsen=coarsen,
            dtype=name.removeprefix("torch."),
        )


def test_product_of_inputs_gives_every_key_in_order():
    keys = Gather().trace(
        block_size=[256, 64],
        gather_lens=WarmupChoices(None, "lens"),
        num_tokens=WarmupIntRange(1, 1025),
        cache=Like(dtype=WarmupChoices(torch.float32, torch.bfloat16)),
    )
    expected = list(dict.fromkeys(
        Gather().dispatch(b, g, n, Like(dtype=d))
        for b, g, n, d in itertools.product([256, 64], [None, "lens"], range(1, 1025),
                                            [torch.float32, torch.bfloat16])
    ))
    assert sorted(map(repr, keys)) == sorted(map(repr, expected))
    assert len(keys) == 2 * 2 * 2 * 2


def test_independent_fields_are_evaluated_separately():
    prog = Gather._dispatch_program
    res = trace_dispatch(prog, Gather.CompileKey, block_size=[1, 2], gather_lens=None,
                         num_tokens=WarmupIntRange(1, 100_001), cache=Like(dtype=torch.float32))
    # 100 000 evaluations for coarsen, not 100 000 x 2 for the product.
    assert res.evaluations < 100_010
    assert len(res.keys) == 4


def test_zip_inputs_move_in_lockstep_and_when_filters():
    keys = Gather().trace(
        zip_inputs(dict(block_size=256, gather_lens="lens"), dict(block_size=64, gather_lens=None),
                   dict(block_size=2, gather_lens=None)),
        num_tokens=WarmupChoices(1, 512),
        cache=Like(dtype=torch.bfloat16),
        when=lambda block_size, num_tokens: not (block_size == 2 and num_tokens >= 512),
    )
    got = {(k.block_size, k.has_gather_lens, k.coarsen) for k in keys}
    assert got == {(256, True, 1), (256, True, 4), (64, False, 1), (64, False, 4), (2, False, 1)}


def test_unread_inputs_are_dropped_and_reported():
    prog = Gather._dispatch_program
    res = trace_dispatch(prog, Gather.CompileKey, block_size=64, gather_lens=None, num_tokens=1,
                         cache=Like(dtype=torch.float32), unused=WarmupIntRange(0, 10**6))
    assert res.dropped_inputs == ("unused",)
    assert "unused" not in res.used_inputs
    assert res.evaluations < 10


def test_int_range_with_advance_and_step():
    assert list(WarmupIntRange(1, 100, advance=lambda v: 2 * v)) == [1, 2, 4, 8, 16, 32, 64]
    assert list(WarmupIntRange(0, 10, 3)) == [0, 3, 6, 9]
    with pytest.raises(ValueError, match="does not increase"):
        list(WarmupIntRange(1, 10, advance=lambda v: v))
    with pytest.raises(ValueError, match="step or advance, not both"):
        WarmupIntRange(1, 10, 2, advance=lambda v: v + 1)


@settings(max_examples=60, deadline=None)
@given(
    block_size=st.integers(-3, 1 << 20),
    gl=st.sampled_from([None, "x"]),
    n=st.integers(1, 1 << 20),
    dt=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_traced_key_equals_dispatch(block_size, gl, n, dt):
    cache = Like(dtype=dt)
    traced = Gather().trace(block_size=block_size, gather_lens=WarmupChoices(gl), num_tokens=n, cache=cache)
    assert traced == [Gather().dispatch(block_size, gl, n, cache)]


# --------------------------------------------------------------------------- rejections


@pytest.fixture
def define_body(define):
    def run(body: str):
        src = f"""
class K(JitKernel):
    @dataclass(frozen=True)
    class CompileKey:
        a: int

    def dispatch(self, x, y=0):
{body}
"""
        define(src, {"JitKernel": JitKernel, "dataclass": dataclass})

    return run


@pytest.mark.parametrize(
    "body, what, quoted",
    [
        ("        if x:\n            y = 1\n        return self.CompileKey(a=y)", "statement `if`", "if x:"),
        ("        for i in x:\n            y = i\n        return self.CompileKey(a=y)",
         "a loop", "for i in x:"),
        ("        while x:\n            y = 1\n        return self.CompileKey(a=y)", "a loop", "while x:"),
        ("        return self.CompileKey(a=sum([i for i in x]))", "a comprehension", "sum([i for i in x])"),
        ("        return self.CompileKey(a=len({1, 2}))", "a set or dict literal", "len({1, 2})"),
        ("        return self.CompileKey(a=len({'k': x}))", "a set or dict literal", "len({'k': x})"),
        ("        return self.CompileKey(a=f(**x))", "a \\*\\*kwargs call", "f(**x)"),
        ("        return self.CompileKey(a=(lambda: 1)())", "Lambda", "lambda"),
        ("        return x", "the last statement must be", "return x"),
    ],
)
def test_unsupported_syntax_is_rejected_quoting_the_source(define_body, body, what, quoted):
    with pytest.raises(ContractError) as exc:
        define_body(body)
    msg = str(exc.value)
    assert "K.dispatch: unsupported syntax" in msg
    assert re.search(what, msg), msg
    assert quoted in msg
    assert "dispatch may contain" in msg  # the list of what is supported


def test_several_returns_are_rejected(define_body):
    with pytest.raises(ContractError, match="exactly one return, found 2"):
        define_body("        return self.CompileKey(a=1) if x else self.CompileKey(a=2)\n"
                "        return self.CompileKey(a=3)")


def test_unknown_key_field_is_rejected(define_body):
    with pytest.raises(ContractError, match="CompileKey has no field 'b'"):
        define_body("        return self.CompileKey(a=1, b=2)")


def test_star_args_dispatch_is_rejected(define):
    with pytest.raises(ContractError, match=r"named parameters only"):
        define("""
class K(JitKernel):
    @dataclass(frozen=True)
    class CompileKey:
        a: int

    def dispatch(self, *xs):
        return self.CompileKey(a=1)
""", {"JitKernel": JitKernel, "dataclass": dataclass})


def test_warmup_input_that_dispatch_does_not_take_is_rejected():
    with pytest.raises(ValueError, match=r"input\(s\) \['num_tokenz'\] are not parameters of dispatch"):
        Gather().trace(block_size=1, gather_lens=None, num_tokenz=1, num_tokens=1,
                       cache=Like(dtype=torch.float32))


def test_duplicate_input_across_zip_and_keyword_is_rejected():
    with pytest.raises(ValueError, match="'block_size' is given both in zip_inputs\\(\\) and as a keyword"):
        Gather().trace(zip_inputs(dict(block_size=1, gather_lens=None)), block_size=2, num_tokens=1,
                       cache=Like(dtype=torch.float32))


def test_input_in_two_zip_groups_is_rejected():
    with pytest.raises(ValueError, match="appears in two zip_inputs"):
        Gather().trace(zip_inputs(dict(block_size=1)), zip_inputs(dict(block_size=2)), gather_lens=None,
                       num_tokens=1, cache=Like(dtype=torch.float32))


def test_zip_rows_with_different_names_are_rejected():
    with pytest.raises(ValueError, match=r"row 1: expected the names \['a', 'b'\], got \['a'\]"):
        zip_inputs(dict(a=1, b=2), dict(a=3))


def test_field_reading_an_undeclared_input_is_rejected():
    with pytest.raises(ValueError, match="key field 'coarsen' reads 'num_tokens', which has no warmup input"):
        Gather().trace(block_size=1, gather_lens=None, cache=Like(dtype=torch.float32))


def test_when_reading_an_undeclared_input_is_rejected():
    with pytest.raises(ValueError, match=r"`when` reads \['nope'\]"):
        Gather().trace(block_size=1, gather_lens=None, num_tokens=1, cache=Like(dtype=torch.float32),
                       when=lambda nope: True)


def test_like_strides_are_callable_like_a_tensor_and_can_be_axes():
    from dsv4kit.jit.space import _expand

    x = Like(shape=(4, 8), stride=(8, 1))
    assert x.stride(0) == 8 and x.stride() == (8, 1) and x == Like(shape=(4, 8), stride=(8, 1))
    expanded = _expand(Like(shape=(4, 8), stride=(WarmupChoices(8, 16), 1)))
    assert [e.stride(0) for e in expanded] == [8, 16]
