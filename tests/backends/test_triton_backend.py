"""TritonJitKernel: specialization rules, the key-coverage check, hooks, the interpreter path."""

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs
from triton._C.libtriton import native_specialize_impl
from triton.backends.nvidia.compiler import CUDABackend
from triton.runtime.jit import JITFunction, compute_cache_key

from dsv4kit.backends import triton as tb
from dsv4kit.backends.triton import (
    INT_CLASS_VALUES,
    Const,
    FakePointer,
    FromKey,
    IntClass,
    Ptr,
    Runtime,
    TritonJitKernel,
    TritonVariant,
    count_triton_compiles,
    int_class,
)
from dsv4kit.errors import ContractError, KernelInputError, UnwarmedKeyError
from dsv4kit.jit import JitKernel, JitMonitor


def _spec(v):
    return native_specialize_impl(CUDABackend, v, False, True, True)


@pytest.mark.parametrize("v", [0, 1, 2, 15, 16, 17, 32, 48, 520, 640, -16, -1, 2**31 - 16, 2**31, 2**31 + 3,
                               2**40, -(2**31) - 16])
def test_int_class_is_tritons_specialization(v):
    # The representative of v's class specializes exactly like v (type, ==1, %16).
    assert _spec(INT_CLASS_VALUES[int_class(v)]) == _spec(v)


def test_int_classes_are_distinct_and_complete():
    specs = {c: _spec(v) for c, v in INT_CLASS_VALUES.items()}
    assert len(set(specs.values())) == len(specs)
    assert specs["one"] == ("constexpr", 1)
    assert specs["div16"] == ("i32", "D") and specs["other"] == ("i32", "")
    with pytest.raises(KernelInputError, match="int_class: value"):
        int_class(2**64)


def test_fake_pointer_specializes_like_an_aligned_tensor():
    t = torch.empty(64, dtype=torch.bfloat16)
    assert t.data_ptr() % 16 == 0
    assert _spec(FakePointer(torch.bfloat16)) == _spec(t) == ("*bf16", "D")
    assert _spec(FakePointer(torch.bfloat16, aligned=False)) == _spec(t[1:]) == ("*bf16", "")


# --------------------------------------------------------------------------- key coverage


@triton.jit(do_not_specialize=["m"])
def _toy(x_ptr, n, m: tl.int32, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < m) * n, mask=offs < m)


@triton.jit(do_not_specialize=["m"])
def _toy_unannotated(x_ptr, n, m, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < m) * n, mask=offs < m)


class _ToyBase(JitKernel["_ToyBase.CompileKey"]):
    @dataclass(frozen=True)
    class CompileKey:
        n: int
        block: int

    def dispatch(self, n, block):
        return self.CompileKey(n=n, block=block)


GOOD = {"x_ptr": Ptr(torch.float32), "n": FromKey("n"), "m": Runtime(), "BLOCK": FromKey("block")}


def _make(params, fn=_toy):
    return type("Toy", (_ToyBase, TritonJitKernel), {"kernel_fn": fn, "params": params})


def test_a_covering_declaration_is_accepted():
    k = _make(GOOD)()
    key = k.CompileKey(n=16, block=32)
    assert k.warmup_inputs(key)[1:] == (16, 0, 32)


@pytest.mark.parametrize("change, message", [
    ({"n": None}, "parameter 'n' of _toy: not declared"),
    ({"n": Runtime()}, r"Triton specializes on its value \(an int on ==1, %16 and i32/i64.*does not cover"),
    ({"BLOCK": Runtime()}, "a constexpr must come from the key"),
    ({"n": FromKey("width")}, "refers to 'width', which is not a field"),
    ({"x_ptr": Ptr("x_dtype")}, "refers to 'x_dtype'"),
    ({"x_ptr": Ptr(torch.float32, aligned=False)}, "specializes on its 16-byte alignment"),
    ({"x_ptr": Runtime()}, "a pointer on 16-byte alignment"),
    ({"y": Const(1)}, r"params \['y'\] are not parameters"),
    ({"n": 16}, "expected Ptr, Runtime, IntClass, FromKey or Const"),
])
def test_a_key_missing_a_specialization_is_rejected_at_class_creation(change, message):
    params = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ContractError, match=message):
        _make(params)


@triton.jit
def _toy_hw(x_ptr, BLOCK: tl.constexpr, HW_CVT: tl.constexpr = True):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * (2 if HW_CVT else 3))


_HW = {"x_ptr": Ptr(torch.float32), "BLOCK": FromKey("block")}


def test_hw_cvt_is_the_gpu_path_in_compiles_and_the_recipe_when_interpreted():
    k = _make({**_HW, "HW_CVT": Const(True)}, fn=_toy_hw)()
    key = k.CompileKey(n=1, block=16)
    assert k.warmup_inputs(key)[1:] == (16, True)
    assert k.interpreted_constexprs(key) == {"HW_CVT": False}
    assert _make(GOOD)().interpreted_constexprs(key) == {}  # no HW_CVT parameter: nothing added


@pytest.mark.parametrize("decl", [Const(False), FromKey("block")])
def test_hw_cvt_other_than_const_true_is_rejected(decl):
    with pytest.raises(ContractError, match="parameter 'HW_CVT' of _toy_hw: expected Const"):
        _make({**_HW, "HW_CVT": decl}, fn=_toy_hw)


def test_an_unannotated_runtime_int_is_rejected():
    # Without an annotation Triton passes i32 or i64 depending on the value: a hidden key field.
    with pytest.raises(ContractError, match="annotate it"):
        _make(GOOD, fn=_toy_unannotated)


def test_int_class_declaration_uses_a_representative():
    k = _make({**GOOD, "n": IntClass("block")})()  # (a silly field choice, but it is an int class name)
    with pytest.raises(KernelInputError, match="block: expected one of"):
        k.warmup_inputs(k.CompileKey(n=3, block=32))


# --------------------------------------------------------------------------- rowquant specialization


def test_warmup_specialization_is_what_a_runtime_call_specializes(rq_triton):
    # The CPU-side proof of "no compile after warmup": for every warmed key, the arguments of a
    # real call specialize exactly like warmup's fake ones (same Triton cache key).
    k = rq_triton
    for key in k.compiled_keys():
        m = 1 if key.rows_per_program == 1 else 600
        x = torch.zeros(m, key.n_cols, dtype=torch.bfloat16)
        q = torch.empty(m, key.n_cols, dtype=torch.uint8)
        s = torch.empty(m, key.n_cols // 128)
        real = k._full_args(key, k.launch_args(x, q, s))
        fake = list(k.warmup_inputs(key))
        warmed = k.warmed_variants()[k.compiled_keys().index(key)]
        assert k.variant(key, real) == k.variant(key, fake) == warmed
        kw = tb._run_kwargs(k.kernel_fn, k._options(key))
        keys = [compute_cache_key({}, *tb._binder(k.kernel_fn, 90)(*a, **kw)[1:]) for a in (real, fake)]
        assert keys[0] == keys[1]


def test_clear_cache_forgets_warmed_specializations():
    k = _make(GOOD)()
    k.compile(k.CompileKey(n=16, block=32))
    assert len(k.warmed_variants()) == 1 and len(k.compiled_keys()) == 1
    type(k).clear_cache()
    assert k.warmed_variants() == [] and k.compiled_keys() == []


def test_launch_options_keep_fp_fusion_off(rq_triton):
    key = rq_triton.compiled_keys()[0]
    art = rq_triton.artifact(key)
    assert art.info["enable_fp_fusion"] is False and "enable_fp_fusion=False" in art.info["specialization"]
    assert "fma" not in art.text["ptx"] and "mul.rn.f32" in art.text["ptx"]


# --------------------------------------------------------------------------- hooks


def _hook_payload(k, key, args):
    """What Triton 3.6 hands jit_cache_hook for a compile of ``args`` (built by Triton's own code)."""
    fn = k.kernel_fn
    kwargs = tb._run_kwargs(fn, k._options(key))
    bound, spec, opts = tb._binder(fn, 90)(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(tb._backend(90), kwargs, bound, spec, opts)
    return (compute_cache_key({}, spec, opts), signature, 0, constexprs, options, [attrs])


def test_precompile_hook_chains_reports_and_restores(rq_triton):
    k = rq_triton
    key = k.compiled_keys()[0]
    args = list(k.warmup_inputs(key))
    args[0] = FakePointer(torch.bfloat16, aligned=False)  # a specialization warmup did not compile
    calls = []

    def existing(**kw):
        calls.append(kw["repr"])

    knobs.runtime.jit_cache_hook = existing
    try:
        with JitMonitor("warn") as mon:
            assert knobs.runtime.jit_cache_hook is not existing
            k.kernel_fn._call_hook(knobs.runtime.jit_cache_hook, *_hook_payload(k, key, args), False)
            assert len(calls) == 1  # the hook that was there still runs
            assert [e.source for e in mon.events] == ["triton"]
        assert knobs.runtime.jit_cache_hook is existing  # restored on disarm
        with JitMonitor("error"):
            token = tb._LAUNCH.set((k, key))  # as during k's launch of key
            try:
                with pytest.raises(UnwarmedKeyError) as info:
                    k.kernel_fn._call_hook(knobs.runtime.jit_cache_hook, *_hook_payload(k, key, args), False)
            finally:
                tb._LAUNCH.reset(token)
        err = info.value
        assert err.kernel == "RowQuantTriton" and isinstance(err.key, TritonVariant)
        assert err.nearest == TritonVariant(key, k.artifact(key).info["specialization"])
        assert set(err.diff) == {"specialization"}
        warmed_spec, requested_spec = err.diff["specialization"]
        assert "x_ptr:*bf16:D" in warmed_spec and "x_ptr:*bf16 " in requested_spec
        assert len(calls) == 1  # error mode raised before the chained hook (and before compiling)
    finally:
        knobs.runtime.jit_cache_hook = None


def test_compile_counter_chains_and_restores():
    seen = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw["key"])
    try:
        prev = knobs.runtime.jit_post_compile_hook
        with count_triton_compiles() as c:
            fn = type("F", (), {"name": "f"})
            knobs.runtime.jit_post_compile_hook(key="k", fn=fn, is_manual_warmup=False)
        assert c.count == 1 and c.runtime_count == 1 and seen == ["k"]
        assert knobs.runtime.jit_post_compile_hook is prev
    finally:
        knobs.runtime.jit_post_compile_hook = None


# --------------------------------------------------------------------------- interpreter


def _unaligned(m, n):
    buf = torch.zeros(m * n + 8, dtype=torch.bfloat16)
    return buf[1 : 1 + m * n].view(m, n)


def test_interpreter_reports_a_specialization_miss(rq_triton):
    k = rq_triton
    key = k.dispatch(128, 128, 2)
    x = _unaligned(2, 128)  # bypasses the op's alignment check: straight to the executor
    q, s = torch.empty(2, 128, dtype=torch.uint8), torch.empty(2, 1)
    exe = k._get_or_compile(key)
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError, match=r"differs in specialization"):
        exe(*k.launch_args(x, q, s))
    with JitMonitor("warn") as mon:
        exe(*k.launch_args(x, q, s))  # warn mode: runs, and says so once
    assert [e.source for e in mon.events] == ["triton"]


def test_triton_interpret_env_is_accepted_at_import():
    # TRITON_INTERPRET=1 (Triton's CPU habit) would turn @triton.jit into an InterpretedFunction,
    # which cannot be compiled ahead of time; dsv4kit runs the interpreter itself, so importing the
    # kit first switches it off and the kernels stay JITFunctions (tests/family runs one).
    code = ("import dsv4kit.kernels.rowquant.triton as t\n"
            "from triton.runtime.jit import JITFunction\n"
            "assert isinstance(t.RowQuantTriton.kernel_fn, JITFunction)\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_interpreter_scope_restores_jitfunction():
    original = JITFunction.__call__
    with tb._interpreting():
        assert JITFunction.__call__ is not original
    assert JITFunction.__call__ is original
    with pytest.raises(RuntimeError, match="outside of the scope of a kernel"):
        _toy(None, 1, 1, 1)
