"""CuTeDSLJitKernel on a CPU-only machine: explicit-arch compiles, artifacts, the cute.compile hook."""

import re

import pytest
import torch

from dsv4kit.backends.cutedsl import compile_options, count_cute_compiles, import_cute
from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.jit import JitMonitor
from dsv4kit.kernels.rowquant.cutedsl import RowQuantCuTeDSL
from dsv4kit.platform import cpu_platform

cute = import_cute()


@pytest.fixture(scope="module")
def rq_cute():
    k = RowQuantCuTeDSL(cpu_platform("sm_90a"))
    k.clear_cache()
    k.warmup(keys=[k.dispatch(512, 512, 1)])
    return k


def test_options_always_name_the_arch():
    assert compile_options("sm_90a", True).split() == ["--gpu-arch", "sm_90a", "--enable-tvm-ffi"]
    assert compile_options("sm_100a", False) == "--gpu-arch sm_100a"
    with pytest.raises(KernelInputError, match="cute.compile: arch: expected one of sm_90a, sm_100a"):
        compile_options("sm_120", True)


def test_unknown_arch_fails_before_the_compiler(rq_cute):
    key = rq_cute.compiled_keys()[0]
    with count_cute_compiles() as c, pytest.raises(KernelInputError, match="arch: expected one of"):
        rq_cute.compile_for(key, "sm_89")
    assert c.count == 0


def test_warmup_keeps_artifacts_and_executor(rq_cute):
    key = rq_cute.compiled_keys()[0]
    art = rq_cute.artifact(key)
    assert art.backend == "cutedsl" and art.target == "sm_90a"
    assert ".target sm_90a" in art.text["ptx"] and art.binary["cubin"][:4] == b"\x7fELF"
    assert art.info["registers"] > 0 and art.info["spills"] == 0 and art.info["tvm_ffi"] is True
    # spec §2.1 rule 1: explicitly rounded products (NVVM may contract a plain mul.f32 into an FMA)
    assert "fma" not in art.text["ptx"] and "mul.rn.f32" in art.text["ptx"]
    assert not re.search(r"\bmul\.f32", art.text["ptx"])
    assert callable(rq_cute._executor_cache()[key])


def test_stray_cute_compile_is_stopped_before_it_starts(rq_cute):
    key = rq_cute.compiled_keys()[0]
    original = cute.compile
    with count_cute_compiles() as c:
        with JitMonitor("error"):
            assert cute.compile is not original
            with pytest.raises(UnwarmedKeyError, match=r"_rowquant_host: compile after warmup"):
                cute.compile(type(rq_cute).jit_fn, *rq_cute.warmup_inputs(key))
        assert c.count == 0  # the monitor (armed inside the counter) raised before the real compile
    assert cute.compile is original  # restored on disarm


def test_runtime_miss_raises_before_compiling_with_the_nearest_key(rq_cute):
    unwarmed = rq_cute.dispatch(512, 520, 1)  # a row stride that is not a multiple of 16
    with count_cute_compiles() as c, JitMonitor("error"), pytest.raises(UnwarmedKeyError) as info:
        rq_cute._get_or_compile(unwarmed)
    assert c.count == 0
    assert info.value.nearest == rq_cute.dispatch(512, 512, 1)
    assert info.value.diff == {"x_stride_class": ("div16", "other")}


def test_warn_mode_compiles_once_and_reports_once():
    k = RowQuantCuTeDSL(cpu_platform("sm_90a"))
    key = k.dispatch(128, 128, 600)
    k._executor_cache().pop(key, None)
    with count_cute_compiles() as c, JitMonitor("warn") as mon:
        k._get_or_compile(key)
        k._get_or_compile(key)
    assert c.count == 1 and [e.source for e in mon.events] == ["jit"]  # no second report from the wrapper
    k._executor_cache().pop(key, None)


def test_running_needs_cuda(rq_cute):
    with pytest.raises(KernelInputError, match="RowQuantCuTeDSL: x: expected a cuda tensor"):
        rq_cute(torch.zeros(1, 512, dtype=torch.bfloat16))
