"""Suite-wide settings: the artifact store of every test run lives in a temporary directory.

Without this, a CLI test (``dsv4kit warmup`` uses the store by default) would read and write
the user's ``~/.cache/dsv4kit``. Set before any test runs and inherited by subprocesses; a test
that needs its own store passes ``--cache-dir`` or an :class:`~dsv4kit.jit.ArtifactStore`.
"""

from __future__ import annotations

import os
import tempfile

_STORE = tempfile.mkdtemp(prefix="dsv4kit-test-store-")
os.environ["DSV4KIT_CACHE_DIR"] = _STORE


def pytest_unconfigure(config: object) -> None:
    """Remove this process' temporary store when the run ends."""
    import shutil

    shutil.rmtree(_STORE, ignore_errors=True)
