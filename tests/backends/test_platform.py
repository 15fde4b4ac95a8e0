"""dsv4kit.platform: arch names, the one backend predicate, and clear errors for bad requests."""

import sys

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.kernels.rowquant import SPEC, rowquant
from dsv4kit.platform import (
    KNOWN_ARCHS,
    Platform,
    check_arch,
    cpu_platform,
    current_platform,
    detect_platform,
    replace,
    use_platform,
)

H200 = Platform("cuda", "sm_90a", "NVIDIA H200", cutedsl=True, tvm_ffi=True)
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only code path")


def test_known_archs_and_capabilities():
    assert KNOWN_ARCHS == {"sm_90a": 90, "sm_100a": 100}
    assert cpu_platform("sm_100a").capability == 100
    assert H200.capability == 90


@pytest.mark.parametrize("bad, hint", [("sm_91z", "sm_90a, sm_100a"), ("sm_90", "did you mean sm_90a"),
                                       ("90", "sm_90a"), (90, "sm_90a")])
def test_unknown_arch_is_a_clear_error(bad, hint):
    with pytest.raises(KernelInputError, match="arch: expected one of") as info:
        check_arch(bad)
    assert hint in str(info.value)
    with pytest.raises(KernelInputError, match="arch"):
        cpu_platform(bad)


@no_gpu
def test_cpu_target_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("DSV4KIT_ARCH", raising=False)
    assert detect_platform() == cpu_platform("sm_90a")  # the documented default, not CuTeDSL's sm_100a
    monkeypatch.setenv("DSV4KIT_ARCH", "sm_100a")
    assert detect_platform().arch == "sm_100a"
    monkeypatch.setenv("DSV4KIT_ARCH", "hopper")
    with pytest.raises(KernelInputError, match="expected one of sm_90a, sm_100a, got 'hopper'"):
        detect_platform()


def test_backend_predicate():
    cpu = cpu_platform()
    assert cpu.triton_mode == "interpreter" and not cpu.cutedsl_runs
    assert cpu.select_backend("cpu") == "triton"
    assert H200.select_backend("cuda") == "cutedsl"
    assert H200.select_backend("cuda", "triton") == "triton"
    assert H200.select_backend("cpu") == "triton"  # CPU tensors: the interpreter, even on a GPU box
    assert replace(H200, cutedsl=False).select_backend("cuda") == "triton"
    assert replace(H200, arch="sm_100a").select_backend("cuda") == "cutedsl"
    old = Platform("cuda", "sm_80", "A100", cutedsl=True, tvm_ffi=True)
    assert old.select_backend("cuda") == "triton"  # CuTeDSL only where dsv4kit has a target


@pytest.mark.parametrize("platform, device, backend, message", [
    (cpu_platform(), "cuda", None, "device: expected a CUDA device"),
    (cpu_platform(), "cpu", "cutedsl", "CuTeDSL kernels run only on a GPU"),
    (replace(H200, cutedsl=False), "cuda", "cutedsl", "nvidia-cutlass-dsl importable"),
    (H200, "cuda", "tilelang", "backend: expected one of cutedsl, triton"),
    (H200, "mps", None, "device: expected cuda or cpu"),
])
def test_bad_backend_requests(platform, device, backend, message):
    with pytest.raises(KernelInputError, match=message):
        platform.select_backend(device, backend, what="rowquant")


def test_use_platform_nests_and_restores():
    outer = current_platform()
    with use_platform("sm_100a") as p:
        assert current_platform() is p and p.arch == "sm_100a"
        with use_platform(cpu_platform("sm_90a")):
            assert current_platform().arch == "sm_90a"
        assert current_platform() is p
    assert current_platform() == outer


@no_gpu
def test_op_asked_for_a_gpu_run_without_cuda():
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    # names the option to change, the tensor, and how to compile CuTeDSL without a GPU
    with pytest.raises(KernelInputError, match="rowquant: backend: expected .*--device cuda.* x on cpu"):
        rowquant(x, backend="cutedsl")
    with pytest.raises(KernelInputError, match="rowquant: device: expected a CUDA device"):
        SPEC.kernel(device="cuda")


def test_cutedsl_missing_is_a_clear_error(monkeypatch):
    from dsv4kit.backends.cutedsl import import_cute
    from dsv4kit.kernels.rowquant.cutedsl import RowQuantCuTeDSL

    with pytest.raises(KernelInputError, match="RowQuantCuTeDSL: backend: expected nvidia-cutlass-dsl"):
        RowQuantCuTeDSL(replace(cpu_platform(), cutedsl=False))
    monkeypatch.setitem(sys.modules, "cutlass.cute", None)  # what a missing package looks like to import
    with pytest.raises(KernelInputError, match="pip install nvidia-cutlass-dsl"):
        import_cute("rowquant")


def test_cuda_without_tvm_ffi_does_not_select_cutedsl():
    """CuTeDSL launches need apache-tvm-ffi; without it the default is Triton, not a late failure."""
    gpu = Platform("cuda", "sm_90a", "test gpu", cutedsl=True, tvm_ffi=False)
    assert not gpu.cutedsl_runs
    assert replace(gpu, tvm_ffi=True).cutedsl_runs
