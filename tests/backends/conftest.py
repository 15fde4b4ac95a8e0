"""Shared, session-scoped compiles: compiling is the slow part of these tests, so do it once."""

import pytest

from dsv4kit.jit import CompileArtifact
from dsv4kit.kernels.rowquant import RowQuantConfig
from dsv4kit.kernels.rowquant.cutedsl import RowQuantCuTeDSL
from dsv4kit.kernels.rowquant.triton import RowQuantTriton
from dsv4kit.platform import cpu_platform

#: Widths the interpreter tests run (small, the interpreter is slow).
SMALL = RowQuantConfig(widths=(128, 256, 512), max_tokens=1024)
ARCHS = ("sm_90a", "sm_100a")


@pytest.fixture(scope="session")
def rq_triton():
    """RowQuantTriton on a CPU platform (sm_90a), with every key of SMALL warmed."""
    k = RowQuantTriton(cpu_platform("sm_90a"))
    k.clear_cache()
    k.warmup(SMALL)
    return k


@pytest.fixture(scope="session")
def aot_artifacts():
    """Every key of the default config, compiled for sm_90a and sm_100a by both backends."""
    out = {}
    kernels = {"triton": RowQuantTriton(cpu_platform()), "cutedsl": RowQuantCuTeDSL(cpu_platform())}
    for backend, k in kernels.items():
        for arch in ARCHS:
            for key in k.get_warmup_keys():
                art = k.compile_for(key, arch)
                assert isinstance(art, CompileArtifact) and art.executable is not None  # one type
                out[backend, arch, key] = art
    return out
