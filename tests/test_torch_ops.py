"""The public ops as torch ops (issue 37): ``torch.ops.dsv4kit.<op_name>`` for every family, its
schema, writes and fake kernel from the family spec; the public op calls it only under
``torch.compile`` and gives the eager op's bytes there; eager calls never reach the dispatcher.

Kernels run under the Triton interpreter on CPU; every op's call is its small valid call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import dsv4kit.ops
from dsv4kit.errors import ContractError, KernelInputError
from dsv4kit.family import torch_op
from dsv4kit.kernels import families, family
from dsv4kit.model.compiled_step import same_bytes
from dsv4kit.platform import current_platform, use_platform
from dsv4kit.testing.valid_calls import valid_call

FAMILIES = families()
NAMES = [f.name for f in FAMILIES]


def _same(a: Any, b: Any) -> bool:
    """Byte equality of two op results or argument sets (tensors, tuples, dicts, None, scalars)."""
    if isinstance(a, torch.Tensor):
        return same_bytes(a, b)
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


class _Ops(TorchDispatchMode):
    """Records the name of every op that reaches the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_every_public_op_is_a_torch_op() -> None:
    assert sorted(dsv4kit.ops.__all__) == sorted(f.op_name for f in FAMILIES)
    for spec in FAMILIES:
        op = getattr(torch.ops.dsv4kit, spec.op_name).default
        args = op._schema.arguments
        assert [a.name for a in args] == [a.name for a in spec.args] + ["backend", "debug_checks"], spec.name
        written = {a.name for a in args if a.alias_info is not None and a.alias_info.is_write}
        assert written == set(spec.mutates), spec.name
        assert (str(op._schema.returns[0].type) if op._schema.returns else "()") == (
            "List[Tensor]" if spec.outputs is not None else "()"), spec.name


def test_schema_types_defaults_and_keyword_only_rows() -> None:
    s = torch_op.schema(family("indexer_q"))
    assert s.startswith("(Tensor positions, Tensor index_q, Tensor cos_sin_cache, Tensor index_weights, "
                        '*, str cache_format="fp8", float softmax_scale=')
    assert s.endswith("str? backend=None, bool? debug_checks=None) -> Tensor[]")
    k3 = torch_op.schema(family("dequant_gather"))
    assert "Tensor(a!) out, " in k3 and "Tensor? gather_lens, " in k3 and "SymInt offset=0, *" in k3
    assert "Tensor(a!)? out=None" in torch_op.schema(family("c128_compress"))
    assert "bool use_fp4_cache" in torch_op.schema(family("indexer_compress"))


@pytest.mark.parametrize("name", NAMES)
def test_torch_op_gives_the_eager_ops_bytes(name: str) -> None:
    """The torch op, called directly, runs the eager op: same result, same bytes written."""
    spec = family(name)
    eager_args, torch_args = valid_call(spec), valid_call(spec)
    want = spec.op(**eager_args)
    got = getattr(torch.ops.dsv4kit, spec.op_name)(**torch_args)
    if spec.outputs is not None:
        want = want if isinstance(want, tuple) else (want,)
        assert _same(list(want), got)
    else:
        assert got is None
    assert _same(eager_args, torch_args)


@pytest.mark.parametrize("name", NAMES)
def test_fake_kernel_needs_no_kernel(name: str) -> None:
    """Under FakeTensorMode the torch op returns the eager result's shapes and dtypes, and runs no
    kernel (a kernel launch on fake tensors would raise)."""
    spec = family(name)
    real = spec.op(**valid_call(spec))
    mode = FakeTensorMode()
    args = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in valid_call(spec).items()}
    with mode:
        fake = getattr(torch.ops.dsv4kit, spec.op_name)(**args)
    if spec.outputs is None:
        assert fake is None
        return
    real = real if isinstance(real, tuple) else (real,)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


@pytest.mark.parametrize("name", NAMES)
def test_compiled_public_op_matches_eager(name: str) -> None:
    """``torch.compile(fullgraph=True)`` of each public op: no graph break, the eager op's result
    and bytes written (aot_eager: functionalized, as Inductor sees it)."""
    spec = family(name)
    eager_args, compiled_args = valid_call(spec), valid_call(spec)
    want = spec.op(**eager_args)
    torch._dynamo.reset()
    got = torch.compile(lambda kw: spec.op(**kw), fullgraph=True, backend="aot_eager")(compiled_args)
    assert _same(want, got)
    assert _same(eager_args, compiled_args)


def test_the_issues_example_compiles() -> None:
    x = torch.randn(4, 256).to(torch.bfloat16)
    torch._dynamo.reset()
    got = torch.compile(lambda x: dsv4kit.ops.rowquant(x), fullgraph=True, backend="eager")(x)
    assert _same(got, dsv4kit.ops.rowquant(x))


def test_eager_calls_skip_the_dispatcher() -> None:
    x = torch.randn(4, 256).to(torch.bfloat16)
    dsv4kit.ops.rowquant(x)
    with _Ops() as seen:
        dsv4kit.ops.rowquant(x)
    assert not [n for n in seen.names if n.startswith("dsv4kit.")]
    with _Ops() as seen:  # the recorder does see the torch op when it is called
        torch.ops.dsv4kit.rowquant(x)
    assert "dsv4kit.rowquant.default" in seen.names


def test_written_argument_results_are_the_arguments() -> None:
    """An op whose result aliases what it wrote: its torch op returns nothing, the public op under
    compile returns the argument (K3: ``out``) or its view (K7: ``out[:T]``), or allocates it."""
    k3 = family("dequant_gather")
    args = valid_call(k3)
    torch._dynamo.reset()
    out = torch.compile(lambda kw: k3.op(**kw), fullgraph=True, backend="aot_eager")(args)
    assert out.data_ptr() == args["out"].data_ptr()
    k7 = family("c128_compress")
    args = valid_call(k7)
    t = args["positions"].shape[0]
    compiled = torch.compile(lambda kw: k7.op(**kw), fullgraph=True, backend="aot_eager")
    got = compiled(args)
    assert got.shape == (t, 512) and got.data_ptr() == args["out"].data_ptr()
    fresh = {**valid_call(k7), "out": None}
    want = k7.op(**{**valid_call(k7), "out": None})
    got = compiled(fresh)
    assert got.shape == want.shape == (t, 512)
    boundary = (args["positions"] + 1) % 128 == 0  # only boundary rows are written
    assert boundary.any() and _same(got[boundary], want[boundary])


def test_platform_under_compile_comes_from_use_platform() -> None:
    """Under compile the torch op runs on the current platform: a ``platform`` option is refused (a
    tracer cannot tell two Platform objects apart), ``use_platform`` chooses it."""
    spec = family("rowquant")
    x = torch.randn(2, 128).to(torch.bfloat16)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="platform: expected None under torch.compile"):
        torch.compile(lambda x: spec.op(x, platform=current_platform()), fullgraph=True, backend="eager")(x)
    with use_platform(current_platform()):
        assert _same(torch.compile(lambda x: spec.op(x), fullgraph=True, backend="eager")(x), spec.op(x))


def test_bad_effects_are_contract_errors() -> None:
    k4 = family("save_partial_states")
    with pytest.raises(ContractError, match="outputs.*or mutates"):
        torch_op.register(dataclasses.replace(k4, op_name="t37_none", mutates=()))
    with pytest.raises(ContractError, match="not tensor arguments"):
        torch_op.register(dataclasses.replace(k4, op_name="t37_int", mutates=("state_width",)))
    with pytest.raises(ContractError, match="allocates"):
        torch_op.register(dataclasses.replace(k4, op_name="t37_alloc",
                                              allocates={"state_cache": lambda a: a["state_cache"]}))
    with pytest.raises(ContractError, match="is defined as"):  # a schema is defined once per name
        torch_op.register(dataclasses.replace(k4, mutates=("state_cache", "kv")))


def test_a_spec_without_effects_still_runs_eagerly() -> None:
    """A family that declares no effects keeps its eager op; only compiling it says what is missing."""
    rq = family("rowquant")
    bare = dataclasses.replace(rq, op_name="t37_bare", outputs=None)
    x = torch.randn(2, 128).to(torch.bfloat16)
    assert _same(bare.op(x), rq.op(x))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="declares neither outputs nor mutates"):
        torch.compile(lambda x: bare.op(x), fullgraph=True, backend="eager")(x)
    with pytest.raises(KernelInputError, match="unexpected keyword"):
        torch_op.compiled_call(rq)((x,), {"y": 1})
