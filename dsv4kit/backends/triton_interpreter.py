"""Running ``@triton.jit`` kernels under the Triton interpreter (the CPU platform): interpreted
twins of compiled functions, their rewrite ahead of time, and the scope in which helpers called
from an interpreted kernel are interpreted too.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator
from typing import Any

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

# --------------------------------------------------------------------------- interpreter


_INTERP_LOCK = threading.RLock()
# Keyed by id: hashing a JITFunction computes its cache key, which walks its globals and
# fails while the interpreter has triton.language patched (e.g. tl.max inside a helper).
_INTERPRETED: dict[int, InterpretedFunction] = {}


def _interpreted(fn: JITFunction) -> InterpretedFunction:
    f = _INTERPRETED.get(id(fn))
    if f is None:
        f = _INTERPRETED[id(fn)] = InterpretedFunction(fn.fn, do_not_specialize=fn.do_not_specialize,
                                                   do_not_specialize_on_alignment=fn.do_not_specialize_on_alignment)
    return f


def _rewrite_ahead(fn: JITFunction) -> None:
    """Have the interpreter rewrite ``fn`` and every ``@triton.jit`` function it calls now (it
    caches the rewrite per function, and would otherwise generate it on the first interpreted run,
    after warmup: host code generated at runtime, which the monitor reports)."""
    seen: set[int] = set()
    todo = [fn]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        _interpreted(f).rewrite()
        todo += _called_jit_functions(f)


def _called_jit_functions(fn: JITFunction) -> list[JITFunction]:
    """The ``@triton.jit`` functions ``fn`` names: globals, and attributes of the modules it names
    (``triton_numerics.mxfp4_words``)."""
    names, scope = fn.fn.__code__.co_names, fn.__globals__
    found = []
    for n in names:
        v = scope.get(n)
        if isinstance(v, types.ModuleType):
            found += [a for m in names if isinstance(a := getattr(v, m, None), JITFunction)]
        elif isinstance(v, JITFunction) and v is not fn:
            found.append(v)
    return found


def _lang_namespaces() -> tuple[Any, ...]:
    import triton.language as tl

    return (tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base)


_LANG_NAMESPACES = _lang_namespaces()


@contextlib.contextmanager
def _interpreting() -> Iterator[None]:
    """Let interpreted kernels call ``@triton.jit`` helpers that were built for compiling.

    Kernels are decorated once, as ``JITFunction`` (so that they can be compiled ahead of
    time); a ``JITFunction`` refuses to be called from Python. While the interpreter runs, a
    call is routed to an interpreted twin of the helper. Scoped and restored on exit.
    """
    with _INTERP_LOCK:
        original = JITFunction.__call__
        # The interpreter patches triton.language while it runs; a helper call patches it again
        # and never restores (triton 3.6), which would break every later AOT compile. Snapshot
        # the patched namespaces and put them back exactly.
        snapshot = [(obj, dict(vars(obj))) for obj in _LANG_NAMESPACES]

        def call(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
            return _interpreted(self)(*args, **kwargs)

        JITFunction.__call__ = call  # type: ignore[method-assign]
        try:
            yield
        finally:
            JITFunction.__call__ = original  # type: ignore[method-assign]
            for obj, saved in snapshot:
                for name in set(vars(obj)) - set(saved):
                    delattr(obj, name)
                for name, value in saved.items():
                    if vars(obj).get(name) is not value:
                        setattr(obj, name, value)
