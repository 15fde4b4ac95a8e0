"""Triton compiles seen from outside: the monitor's pre-compile hook (a compile after warmup is
reported, and stopped in ``error`` mode) and :func:`count_triton_compiles`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from triton import knobs

from dsv4kit.backends._common import CompileCounter, in_warmup_compile
from dsv4kit.backends.triton_params import TritonVariant, _describe_hook
from dsv4kit.jit import active_monitor, register_monitor_hook

if TYPE_CHECKING:
    from dsv4kit.backends.triton import TritonJitKernel


# --------------------------------------------------------------------------- monitor hooks

# The kernel and key of the launch in progress, so a compile hook can name them.
_LAUNCH: contextvars.ContextVar[tuple[TritonJitKernel, Any] | None] = contextvars.ContextVar(
    "dsv4kit_triton_launch", default=None)


def _report(kernel: TritonJitKernel | None, fn_name: str, variant: TritonVariant | str, source: str) -> None:
    mon = active_monitor()
    if mon is None:
        return
    if kernel is None:
        mon.report_compile(fn_name, variant, [], source=source)
    else:
        mon.report_compile(kernel.name, variant, kernel.warmed_variants(), source=source)


def _install_triton_hooks(monitor: Any) -> Callable[[], None]:
    """Chain a pre-compile reporter onto Triton's hooks; the uninstaller restores them.

    Triton 3.6 calls ``knobs.runtime.jit_cache_hook`` just before compiling and
    ``jit_post_compile_hook`` just after, both with keyword arguments
    ``key, repr, fn, compile, is_manual_warmup, already_compiled``. Reporting in the
    pre-compile hook lets ``error`` mode stop the compile before it starts (raising after it
    would leave the kernel in Triton's cache, and a retry would then pass silently).
    """
    prev = knobs.runtime.jit_cache_hook

    def hook(**kw: Any) -> Any:
        if not in_warmup_compile():
            ctx = _LAUNCH.get()
            jit_fn = kw["fn"].jit_function
            spec = _describe_hook(jit_fn, kw["compile"])
            if ctx is not None and ctx[0].kernel_fn is jit_fn:
                _report(ctx[0], ctx[0].name, TritonVariant(ctx[1], spec), "triton")
            else:
                _report(None, kw["fn"].name, spec, "triton")
        return prev(**kw) if prev is not None else None

    knobs.runtime.jit_cache_hook = hook

    def uninstall() -> None:
        knobs.runtime.jit_cache_hook = prev

    return uninstall


register_monitor_hook(_install_triton_hooks)


#: Counts Triton compiles seen by ``jit_post_compile_hook``.
TritonCompileCounter = CompileCounter


@contextlib.contextmanager
def count_triton_compiles() -> Iterator[TritonCompileCounter]:
    """Count every Triton JIT compile in the block through Triton's post-compile hook.

    The hook is chained with whatever was installed and restored on exit. (A CPU-only process
    never reaches it: ahead-of-time compiles and the interpreter bypass JITFunction.run.)
    """
    counter = TritonCompileCounter()
    prev = knobs.runtime.jit_post_compile_hook

    def hook(**kw: Any) -> Any:
        counter.events.append({"fn": kw["fn"].name, "key": kw["key"], "warmup": in_warmup_compile()
                               or kw["is_manual_warmup"]})
        return prev(**kw) if prev is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield counter
    finally:
        knobs.runtime.jit_post_compile_hook = prev
