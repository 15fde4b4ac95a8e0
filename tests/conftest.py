"""Suite-wide settings: the artifact store of every test run lives in a temporary directory.

Without this, a CLI test (``dsv4kit warmup`` uses the store by default) would read and write
the user's ``~/.cache/dsv4kit``. Set before any test runs and inherited by subprocesses; a test
that needs its own store passes ``--cache-dir`` or an :class:`~dsv4kit.jit.ArtifactStore`.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

_STORE = tempfile.mkdtemp(prefix="dsv4kit-test-store-")
os.environ["DSV4KIT_CACHE_DIR"] = _STORE


def pytest_unconfigure(config: object) -> None:
    """Remove this process' temporary store when the run ends."""
    import shutil

    shutil.rmtree(_STORE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _close_figures():
    """Close every matplotlib figure a test left open (the viz tests draw many)."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def _helper_calls_patch_once() -> None:
    """Triton 3.6's interpreter re-patches ``triton.language`` on every ``@triton.jit`` helper call
    (``InterpretedFunction.__call__`` -> ``_patch_lang``: every builtin of each module wrapped
    again) although the kernel's own launch patched the same modules already; the re-patch
    installs the same functions. Here a helper call whose ``triton.language`` modules are all
    patched skips it (this suite: 297 -> 252 s on 2 cores); any other call patches as before.
    Only the suite's speed changes: the kit and the notebooks run Triton's interpreter as it is.
    """
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpretedFunction.__call__
    langs: dict[int, tuple[object, ...]] = {}

    def call(self: interpreter.InterpretedFunction, *args: object, **kwargs: object) -> object:
        mods = langs.get(id(self.fn))
        if mods is None:
            mods = langs[id(self.fn)] = tuple(v for v in self.fn.__globals__.values()
                                              if v is tl or v is tl.core)
        if not mods or any(tl.core.is_builtin(m.load) for m in mods):
            return original(self, *args, **kwargs)  # not (all) patched: Triton's own path
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as Triton's own __call__ reports it
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.InterpretedFunction.__call__ = call  # type: ignore[method-assign]


_helper_calls_patch_once()
