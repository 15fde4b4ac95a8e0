import itertools
import linecache

import pytest

_counter = itertools.count()


@pytest.fixture
def define():
    """Execute class source with a file name that inspect.getsource can read back."""

    def run(src: str, namespace: dict) -> dict:
        fname = f"<dsv4kit-test-{next(_counter)}>"
        linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
        exec(compile(src, fname, "exec"), namespace)
        return namespace

    return run
