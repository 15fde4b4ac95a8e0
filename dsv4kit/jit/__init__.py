"""The warmup contract, backend-neutral.

=====================  ==========================================================
``JitKernel``          CompileKey + dispatch + warmup keys + compile + launch
``kernel_launcher``    ``__call__`` returns a launch spec; the backend launches it
``WarmupIntRange`` …   declared inputs; ``JitKernel.trace`` turns them into keys
``WarmupRegistry``     collects registrations, compiles their union, reports
``JitMonitor``         off | warn | error on any compile after warmup
``KeyLedger``          keys warmed vs requested: missed and dead keys
``ArtifactStore``      compiled artifacts on disk: warmup loads hits, stores what it compiles
=====================  ==========================================================
"""

from dsv4kit.jit.coverage import KeyLedger
from dsv4kit.jit.kernel import JitKernel, fixed, validate_compile_key
from dsv4kit.jit.launcher import Immediate, LaunchSpec, kernel_launcher
from dsv4kit.jit.monitor import CompileEvent, JitMonitor, active_monitor, register_monitor_hook
from dsv4kit.jit.registry import WarmupRegistry, active_registry
from dsv4kit.jit.report import CompileArtifact, KernelReport, KeyReport, WarmupReport, format_key
from dsv4kit.jit.space import Like, WarmupChoices, WarmupIntRange, zip_inputs
from dsv4kit.jit.store import ArtifactStore, StoreWarning

__all__ = [
    "ArtifactStore",
    "CompileArtifact",
    "CompileEvent",
    "Immediate",
    "JitKernel",
    "JitMonitor",
    "KernelReport",
    "KeyLedger",
    "KeyReport",
    "LaunchSpec",
    "Like",
    "WarmupChoices",
    "WarmupIntRange",
    "WarmupRegistry",
    "WarmupReport",
    "active_monitor",
    "active_registry",
    "fixed",
    "format_key",
    "kernel_launcher",
    "register_monitor_hook",
    "StoreWarning",
    "validate_compile_key",
    "zip_inputs",
]
