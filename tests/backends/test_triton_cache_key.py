"""Triton's cache key of a kernel must not depend on what the process hashed before.

triton 3.6 merges a callee's globals into its caller's key before it hashes the callee, so the
first kernel to reach a helper hashes without the helper's globals and a later one with them.
``settle_cache_key`` hashes callees first: the key is the same in either order. Two copies of one
module (fresh ``JITFunction`` objects each, same source) stand for two processes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from dsv4kit.backends.triton import settle_cache_key

SOURCE = '''
import triton
import triton.language as tl

_WIDTH = tl.constexpr(8)
_BIAS = tl.constexpr(3)


@triton.jit
def leaf(x):
    return x + _BIAS


@triton.jit
def helper(x):
    return leaf(x) * _WIDTH


@triton.jit
def first_kernel(p):
    tl.store(p, helper(tl.load(p)))


@triton.jit
def second_kernel(p):
    tl.store(p, helper(tl.load(p)) * 2)
'''


def _module(tmp_path: Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_triton_alone_keys_a_kernel_by_what_was_hashed_before(tmp_path: Path) -> None:
    # Why the settling exists: the same kernel, hashed first or after another user of its helper.
    fresh, after = _module(tmp_path, "order_a"), _module(tmp_path, "order_b")
    _ = after.first_kernel.cache_key                          # hashes helper and leaf on the way
    assert fresh.second_kernel.cache_key != after.second_kernel.cache_key


def test_a_settled_key_is_the_same_whatever_was_hashed_before(tmp_path: Path) -> None:
    fresh, after, stale = (_module(tmp_path, n) for n in ("settle_a", "settle_b", "settle_c"))
    _ = after.first_kernel.cache_key                          # unsettled hashing first, as Triton would
    _ = stale.second_kernel.cache_key                         # a key computed before settling is redone
    keys = {settle_cache_key(m.second_kernel) for m in (fresh, after, stale)}
    assert len(keys) == 1
    # and the settled key of the other kernel agrees across the copies too
    assert len({settle_cache_key(m.first_kernel) for m in (fresh, after, stale)}) == 1
