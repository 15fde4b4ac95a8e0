"""What this process can do: the one place that decides device, compile target and backend.

A :class:`Platform` says whether a CUDA device is present (and its arch), or whether this is a
CPU-only process that runs Triton kernels under the interpreter and compiles every kernel
ahead of time for a target chosen by the user (``DSV4KIT_ARCH``, default ``sm_90a``).
Registration and every op consult :func:`current_platform`; nothing relies on a compiler's
own default arch (CuTeDSL silently assumes ``sm_100a`` when it finds no GPU).

:meth:`Platform.select_backend` is the single backend-selection predicate of spec §2.11:
an explicit ``backend=`` wins (and is checked); otherwise CuTeDSL on CUDA when it is importable
and the arch is one it targets, Triton on any other CUDA device, the Triton interpreter on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from dsv4kit.errors import input_error

__all__ = [
    "ARCH_ENV",
    "BACKENDS",
    "DEFAULT_CPU_ARCH",
    "KNOWN_ARCHS",
    "Platform",
    "arch_capability",
    "available_cores",
    "check_arch",
    "cpu_platform",
    "current_platform",
    "detect_platform",
    "replace",
    "use_platform",
]

def available_cores(cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPU cores this process may use: its affinity set, capped by a cgroup v2 CPU quota when one
    is set (a container limited to 2 CPUs of a 64-core host reports 64 in ``os.cpu_count()``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = open(cgroup_cpu_max).read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


#: Compile targets dsv4kit knows, with their compute capability (Triton's ``GPUTarget.arch``).
#: The ``a`` suffix: arch-specific features (wgmma, tcgen05); code for one runs on that arch only.
KNOWN_ARCHS: dict[str, int] = {"sm_90a": 90, "sm_100a": 100}
DEFAULT_CPU_ARCH = "sm_90a"
ARCH_ENV = "DSV4KIT_ARCH"
BACKENDS = ("cutedsl", "triton")

Backend = Literal["cutedsl", "triton"]


def check_arch(arch: object, where: str = "platform") -> str:
    """Return ``arch`` if it is a known compile target, else raise a clear ``KernelInputError``."""
    if not isinstance(arch, str) or arch not in KNOWN_ARCHS:
        hint = ""
        if isinstance(arch, str) and f"{arch}a" in KNOWN_ARCHS:
            hint = f" (did you mean {arch}a?)"
        raise input_error(where, "arch", f"one of {', '.join(KNOWN_ARCHS)}{hint}", repr(arch))
    return arch


def arch_capability(arch: str) -> int:
    """``"sm_90a"`` -> 90 (the number Triton's ``GPUTarget`` wants)."""
    return KNOWN_ARCHS[check_arch(arch)]


def _arch_of_capability(major: int, minor: int) -> str:
    # Hopper and Blackwell code uses arch-specific features, hence the "a" variants.
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


@functools.cache
def _importable(module: str) -> bool:
    # find_spec on the top-level name does not import the (slow to import) package.
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class Platform:
    """What this process can do.

    ``device``: ``"cuda"`` when a CUDA device is visible, else ``"cpu"``.
    ``arch``: the compile target: the device's arch on CUDA, the chosen target on CPU.
    ``cutedsl`` / ``tvm_ffi``: whether nvidia-cutlass-dsl / apache-tvm-ffi are importable.
    """

    device: Literal["cuda", "cpu"]
    arch: str
    device_name: str
    cutedsl: bool
    tvm_ffi: bool

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def capability(self) -> int:
        """Compute capability as Triton spells it (90 for sm_90a)."""
        return int(self.arch.removeprefix("sm_").rstrip("a"))

    @property
    def triton_mode(self) -> Literal["gpu", "interpreter"]:
        """How Triton kernels run here: compiled on the GPU, or under the CPU interpreter."""
        return "gpu" if self.is_cuda else "interpreter"

    @property
    def cutedsl_runs(self) -> bool:
        """CuTeDSL kernels can run (not just compile) in this process.

        Launching goes through apache-tvm-ffi, so without it CuTeDSL is not selected by default
        (it would compile, then fail at the first launch).
        """
        return self.is_cuda and self.cutedsl and self.tvm_ffi and self.arch in KNOWN_ARCHS

    def require_cuda(self, what: str) -> None:
        """Raise a clear error when a GPU run was asked for and there is no CUDA device."""
        if not self.is_cuda:
            raise input_error(what, "device", "a CUDA device (this run needs a GPU)",
                              f"none: torch {torch.__version__} sees no CUDA device")

    def require_cutedsl(self, what: str) -> None:
        """Raise a clear error when CuTeDSL was asked for and is not installed."""
        if not self.cutedsl:
            raise input_error(what, "backend", "nvidia-cutlass-dsl importable "
                              "(pip install nvidia-cutlass-dsl==4.8.1)", "cutlass is not importable")

    def select_backend(self, device: torch.device | str, backend: str | None = None,
                       what: str = "dsv4kit") -> Backend:
        """The backend that runs ``what`` for tensors on ``device`` (spec §2.11).

        Used by both warmup registration and runtime dispatch, so they cannot disagree.
        """
        dev = torch.device(device).type
        if dev not in ("cuda", "cpu"):
            raise input_error(what, "device", "cuda or cpu", dev)
        if backend is not None and backend not in BACKENDS:
            raise input_error(what, "backend", f"one of {', '.join(BACKENDS)} or None", repr(backend))
        if dev == "cuda":
            self.require_cuda(what)
        if backend == "cutedsl":
            self.require_cutedsl(what)
            if dev != "cuda":
                raise input_error(what, "device", "cuda (CuTeDSL kernels run only on a GPU)", dev)
            return "cutedsl"
        if backend == "triton":
            return "triton"
        if dev == "cuda" and self.cutedsl_runs:
            return "cutedsl"
        return "triton"


def cpu_platform(arch: str = DEFAULT_CPU_ARCH) -> Platform:
    """A CPU-only platform compiling for ``arch`` (Triton runs under the interpreter)."""
    return Platform("cpu", check_arch(arch, "cpu_platform"), "cpu",
                    _importable("cutlass"), _importable("tvm_ffi"))


def detect_platform(arch: str | None = None) -> Platform:
    """Look at this process: the CUDA device if there is one, else CPU compiling for ``arch``.

    ``arch`` (or ``$DSV4KIT_ARCH``) only chooses the target of a CPU-only process; on CUDA
    the device decides, and asking for another arch there is an error, not a silent override.
    """
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        dev_arch = _arch_of_capability(major, minor)
        if arch is not None and arch != dev_arch:
            raise input_error("detect_platform", "arch", f"{dev_arch} (the arch of this CUDA device)", arch)
        return Platform("cuda", dev_arch, torch.cuda.get_device_name(),
                        _importable("cutlass"), _importable("tvm_ffi"))
    return cpu_platform(arch or os.environ.get(ARCH_ENV) or DEFAULT_CPU_ARCH)


_OVERRIDE: list[Platform] = []


@functools.cache
def _detected() -> Platform:
    return detect_platform()


def current_platform() -> Platform:
    """The platform every registration and op consults (innermost :func:`use_platform` wins)."""
    return _OVERRIDE[-1] if _OVERRIDE else _detected()


@contextlib.contextmanager
def use_platform(platform: Platform | str) -> Iterator[Platform]:
    """Run a block as if on ``platform`` (a :class:`Platform`, or an arch for a CPU platform).

    Kernels bind their platform when constructed, so construct them inside the block.
    """
    p = cpu_platform(platform) if isinstance(platform, str) else platform
    if not isinstance(p, Platform):
        raise input_error("use_platform", "platform", "a Platform or an arch name", type(p).__name__)
    _OVERRIDE.append(p)
    try:
        yield p
    finally:
        _OVERRIDE.remove(p)


def replace(platform: Platform, **changes: object) -> Platform:
    """A copy of ``platform`` with some fields changed (e.g. ``cutedsl=False`` in tests)."""
    if "arch" in changes:
        check_arch(changes["arch"], "platform.replace")
    return dataclasses.replace(platform, **changes)  # type: ignore[arg-type]
