"""Triton compiles in the artifact store: a settled cache key per kernel function, the portable
:class:`TritonCompileId` entries are keyed by, and putting a stored cache group back into Triton's
cache (see :mod:`dsv4kit.backends.triton`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import triton
from triton import knobs
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.compiler import ASTSource
from triton.runtime import cache as triton_cache
from triton.runtime.cache import FileCacheManager, get_cache_manager
from triton.runtime.jit import JITFunction

from dsv4kit.backends.triton_params import _backend, _binder
from dsv4kit.jit.store import Entry

# --------------------------------------------------------------------------- Triton's cache key

# ``JITFunction.cache_key`` (triton 3.6) merges a callee's ``used_global_vals`` into the caller's
# *before* it computes the callee's key, so a callee hashed for the first time contributes no
# globals: a kernel's hash then depends on which kernels were hashed before it in the process
# (seen: C128StorePlainTriton for sm_100a hashed differently after a DSv4-Flash warmup than in a
# fresh process, with identical cubin and PTX). The artifact store and Triton's on-disk cache are
# keyed by that hash, so dsv4kit settles every kernel function once, callees first, before it is
# compiled: the key is then the one a process gets whatever it compiled before.
_SETTLED: set[int] = set()


def _callees(fn: JITFunction) -> list[JITFunction]:
    names = fn.fn.__code__.co_names
    return [v for n in names if isinstance(v := fn.__globals__.get(n), JITFunction) and v is not fn]


def settle_cache_key(fn: JITFunction) -> str:
    """``fn.cache_key`` computed with every callee's key (and globals) settled first; once per function."""
    if id(fn) not in _SETTLED:
        _SETTLED.add(id(fn))  # before the callees: a recursive call graph terminates
        for callee in _callees(fn):
            settle_cache_key(callee)
        with fn._hash_lock:
            fn.hash = None  # a key computed before this (callees unsettled) is recomputed
    return fn.cache_key


# --------------------------------------------------------------------------- the artifact store

# What cuobjdump reports of a cubin (dsv4kit.backends._common.cubin_resources).
_RESOURCE_FIELDS = ("registers", "spills", "local_bytes", "stack_bytes", "static_shared")


@dataclass(frozen=True)
class TritonCompileId:
    """Triton's own cache key of one compile, split where the store needs it.

    ``portable``: sha256 of the Triton version, ``src.hash()`` (kernel source, callees, signature,
    constexprs, specialization attributes), ``backend.hash()`` (ptxas version and target arch),
    ``options.hash()`` and the cache-invalidating environment variables: everything Triton's key
    holds but ``triton_key()``, the hash of its compiled extension, which differs between the
    builds of one release for two Python versions. The artifact store keys Triton entries by it.
    :meth:`running_hash` is the hash this process's Triton names the compile's cache directory by.
    """

    portable: str
    group: str                       # the metadata group's name: ``<kernel name>.json``
    parts: tuple[Any, ...] = dataclasses.field(compare=False, repr=False)  # (src, backend, options, env)

    def running_hash(self) -> str:
        """sha256 of Triton's ``get_cache_key`` for this compile, as the running Triton computes it
        (``triton_key()`` included; looked up at each call, so a patched one is seen)."""
        src, backend, options, env = self.parts
        return hashlib.sha256(triton_cache.get_cache_key(src, backend, options, env).encode()).hexdigest()


def triton_compile_id(fn: JITFunction, args: tuple[Any, ...], kwargs: Mapping[str, Any], capability: int,
                      env: Mapping[str, Any] | None = None) -> TritonCompileId:
    """The :class:`TritonCompileId` of compiling ``fn`` for ``args``, ``kwargs`` on ``capability``:
    the packing and option parsing ``triton.compile`` does before it hashes (nothing compiles)."""
    settle_cache_key(fn)
    backend = _backend(capability)
    bound, spec, opts = _binder(fn, capability)(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, dict(kwargs), bound, spec, opts)
    src = ASTSource(fn, signature, constexprs, attrs)
    parsed = backend.parse_options(dict(options.__dict__, **src.parse_options()))
    env = dict(get_cache_invalidating_env_vars() if env is None else env)
    text = "-".join((triton.__version__, src.hash(), backend.hash(), parsed.hash(), str(sorted(env.items()))))
    return TritonCompileId(hashlib.sha256(text.encode()).hexdigest(), f"{src.name[:150]}.json",
                           (src, backend, parsed, env))


# Compile ids per (kernel class, target, key, environment): the store asks for one at each lookup.
_COMPILE_IDS: dict[tuple[Any, ...], TritonCompileId] = {}


def _with_hash(metadata: bytes, triton_hash: str) -> bytes:
    """The metadata json with its ``hash`` field set to ``triton_hash``: the one Triton would have
    written itself had it compiled here (the builder's hash differs in its ``triton_key()`` part)."""
    data = json.loads(metadata)
    if data.get("hash") == triton_hash:
        return metadata
    data["hash"] = triton_hash
    return json.dumps(data).encode()


def _put_files(manager: Any, files: Mapping[str, bytes]) -> dict[str, str]:
    """Write ``files`` into the cache ``manager``'s directory, each atomically; their paths.

    Triton's ``FileCacheManager.put`` makes and removes a temporary folder per file, which is most
    of a warm start's load time on this machine's filesystem; a file written beside its final name
    and renamed is as atomic. Any other cache manager gets its own ``put``."""
    if type(manager) is not FileCacheManager:
        return {name: manager.put(data, name) for name, data in files.items()}
    os.makedirs(manager.cache_dir, exist_ok=True)
    paths = {}
    for name, data in files.items():
        path = os.path.join(manager.cache_dir, name)
        tmp = f"{path}.tmp.pid_{os.getpid()}_{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        paths[name] = path
    return paths


def restore_triton_group(entry: Entry, triton_hash: str, group_name: str) -> None:
    """Write a stored Triton cache group into Triton's cache (``knobs.cache.dir`` or its cache
    manager) under ``triton_hash``, unless it is already complete there."""
    manager = get_cache_manager(triton_hash)
    present = manager.get_group(group_name) or {}
    children = [n.removeprefix("triton/") for n in entry.files if n.startswith("triton/")]
    if group_name in present and all(c in present for c in children):
        return
    files = {c: entry.read(f"triton/{c}") for c in children}
    if group_name in files:
        files[group_name] = _with_hash(files[group_name], triton_hash)
    manager.put_group(group_name, _put_files(manager, files))


@contextlib.contextmanager
def _cache_hits() -> Iterator[list[bool]]:
    """Triton's ``cache_hit`` flag of every compile call inside, chained onto the listener that
    was installed (restored on exit)."""
    hits: list[bool] = []
    prev = knobs.compilation.listener

    def listener(**kw: Any) -> None:
        hits.append(bool(kw.get("cache_hit")))
        if prev is not None:
            prev(**kw)

    knobs.compilation.listener = listener
    try:
        yield hits
    finally:
        knobs.compilation.listener = prev


def _served_from_cache(metadata_path: str, compile_seconds: float) -> bool:
    """Whether a compile that just took ``compile_seconds`` found its group in Triton's cache:
    Triton writes the metadata json at the end of a real compile, so a file older than the
    compile's start was there before it (Triton's compile returns the same object either way)."""
    try:
        written = os.stat(metadata_path).st_mtime
    except OSError:
        return False
    return written < time.time() - compile_seconds
