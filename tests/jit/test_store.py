"""ArtifactStore: hits and misses for both backends, invalidation, corruption, concurrency,
shipping, and the parallel registry warmup that fills it (all on CPU, cheap RowQuant keys)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from fresh_kernels import fresh_kernel
from triton import knobs
from triton.runtime import cache as triton_runtime_cache
from triton.runtime.cache import triton_key

from dsv4kit.backends.cutedsl import count_cute_compiles
from dsv4kit.jit import ArtifactStore, StoreWarning, WarmupRegistry
from dsv4kit.jit import store as store_mod
from dsv4kit.kernels.rowquant.cutedsl import RowQuantCuTeDSL
from dsv4kit.kernels.rowquant.triton import RowQuantTriton

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
    """An empty Triton cache directory for this test (Triton reads the variable on each compile)."""
    path = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(path))
    assert knobs.cache.dir == str(path)
    return path


@pytest.fixture
def triton_kernel():
    yield from fresh_kernel(RowQuantTriton)


@pytest.fixture
def cute_kernel():
    yield from fresh_kernel(RowQuantCuTeDSL)


def _warm(kernel, key, store):
    kernel.clear_cache()
    (report,) = kernel.compile_many([key], store=store)
    assert report.ok, report.error
    return report


class _Listener:
    """Triton's compilation listener: one ``cache_hit`` flag per compile call."""

    def __init__(self) -> None:
        self.hits: list[bool] = []

    def __call__(self, **kw) -> None:
        self.hits.append(kw["cache_hit"])


@pytest.fixture
def listener(monkeypatch):
    rec = _Listener()
    monkeypatch.setattr(knobs.compilation, "listener", rec)
    return rec


# --------------------------------------------------------------------------- hit and miss


def test_triton_hit_restores_into_an_empty_triton_cache(tmp_path, monkeypatch, triton_kernel, listener):
    store = ArtifactStore(tmp_path / "store")
    key = triton_kernel.get_warmup_keys()[0]
    triton_key()   # once per process (every Triton compile or cache lookup needs it): in neither timing
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc1"))
    miss = _warm(triton_kernel, key, store)
    assert miss.info["origin"] == "compiled" and listener.hits == [False]
    assert store.has(triton_kernel, key) and len(store.entries()) == 1
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc2"))     # a fresh machine's empty cache
    hit = _warm(triton_kernel, key, store)
    assert hit.info["origin"] == "hit" and listener.hits == [False, True]   # Triton found the files
    assert hit.seconds < miss.seconds / 3, (hit.seconds, miss.seconds)
    assert hit.info["registers"] == miss.info["registers"] and "specialization" in hit.info
    art = triton_kernel.artifact(key)
    assert ".target sm_90a" in art.text["ptx"] and art.binary["cubin"][:4] == b"\x7fELF"
    assert art.seconds == pytest.approx(miss.seconds, rel=0.5)            # the stored compile time
    assert triton_kernel.warmed_variants()                                 # the monitor's reference


def test_cutedsl_hit_loads_the_exported_module_without_compiling(tmp_path, cute_kernel):
    store = ArtifactStore(tmp_path / "store")
    key = cute_kernel.get_warmup_keys()[0]
    with count_cute_compiles() as first:
        assert _warm(cute_kernel, key, store).info["origin"] == "compiled"
    entry = store.get(cute_kernel, key)
    assert {"cute/module.o", "text/ptx", "binary/cubin"} <= set(entry.files)
    with count_cute_compiles() as second:
        hit = _warm(cute_kernel, key, store)
    assert first.count == 1 and second.count == 0 and hit.info["origin"] == "hit"
    art = cute_kernel.artifact(key)
    assert type(art.executable).__name__ == "Function"                   # a tvm_ffi.Function
    assert ".target sm_90a" in art.text["ptx"] and hit.info["registers"] > 0


def test_no_store_reports_no_origin(triton_kernel, triton_cache):
    (r,) = triton_kernel.compile_many(triton_kernel.get_warmup_keys()[:1])
    assert r.ok and "origin" not in r.info


# --------------------------------------------------------------------------- invalidation


def test_source_change_invalidates(tmp_path, monkeypatch, triton_kernel, triton_cache):
    store = ArtifactStore(tmp_path / "store")
    key = triton_kernel.get_warmup_keys()[0]
    _warm(triton_kernel, key, store)
    real = store_mod.source_hash
    monkeypatch.setattr(store_mod, "source_hash",
                        lambda cls: "0" * 64 if cls is RowQuantTriton else real(cls))
    assert not store.has(triton_kernel, key)
    assert _warm(triton_kernel, key, store).info["origin"] == "compiled"
    problems = store.verify()
    assert [p.kind for p in problems] == ["stale"] and "kernel source changed" in problems[0].why
    assert _warm(triton_kernel, key, store).info["origin"] == "hit"        # the new entry


@pytest.mark.parametrize("dist", ["triton", "nvidia-cutlass-dsl", "apache-tvm-ffi"])
def test_toolchain_change_invalidates(tmp_path, monkeypatch, triton_kernel, cute_kernel, triton_cache,
                                      dist) -> None:
    store = ArtifactStore(tmp_path / "store")
    kernel = triton_kernel if dist == "triton" else cute_kernel
    key = kernel.get_warmup_keys()[0]
    _warm(kernel, key, store)
    real = store_mod._version
    monkeypatch.setattr(store_mod, "_version", lambda d: "99.0" if d == dist else real(d))
    assert _warm(kernel, key, store).info["origin"] == "compiled"
    (problem,) = store.verify()
    assert problem.kind == "stale" and f"toolchain changed: {dist}" in problem.why


def test_another_triton_build_is_a_hit_installed_under_the_running_hash(
        tmp_path, monkeypatch, triton_kernel, listener) -> None:
    """Same triton version, another ``triton_key()`` (its libtriton built for another Python, as
    the CPU machine's 3.11 and the GPU machine's 3.12): the entry's key is unchanged, and the load
    installs it under the hash *this* Triton computes, so Triton's own lookup hits."""
    store = ArtifactStore(tmp_path / "store")
    key = triton_kernel.get_warmup_keys()[0]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc-built"))
    _warm(triton_kernel, key, store)
    built = store.path_of(triton_kernel, key)
    built_hash = store.get(triton_kernel, key).meta["triton_hash"]
    monkeypatch.setattr(triton_runtime_cache, "triton_key", lambda: "libtriton of another CPython build")
    monkeypatch.setattr(store_mod.platform, "python_version", lambda: "3.12.3")
    assert store.path_of(triton_kernel, key) == built                      # the key did not move
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc-gpu"))      # the other machine's empty cache
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        hit = _warm(triton_kernel, key, store)
    ck = triton_kernel.artifact(key).executable
    assert hit.info["origin"] == "hit" and listener.hits[-1] is True       # Triton found the files
    assert ck.hash != built_hash and ck.hash == triton_kernel.compile_id(key).running_hash()
    assert ck.metadata.hash == ck.hash                                     # as Triton would have written
    group = triton_runtime_cache.get_cache_manager(ck.hash).get_group(triton_kernel.compile_id(key).group)
    assert group and str(tmp_path / "tc-gpu") in next(iter(group.values())) and store.verify() == []


def test_a_load_that_triton_compiles_is_refused_and_rebuilt(tmp_path, monkeypatch, triton_kernel,
                                                            triton_cache) -> None:
    """If the restored files are not where Triton looks, the load compiles: that is an error (the
    warning names it) and the key is rebuilt, never reported as a hit."""
    from dsv4kit.backends import triton as tb

    store = ArtifactStore(tmp_path / "store")
    key = triton_kernel.get_warmup_keys()[0]
    _warm(triton_kernel, key, store)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc-empty"))
    monkeypatch.setattr(tb, "restore_triton_group", lambda entry, h, g: None)
    with pytest.warns(StoreWarning, match="compiled instead of loading"):
        assert _warm(triton_kernel, key, store).info["origin"] == "compiled"


def test_torch_is_recorded_not_keyed(tmp_path, monkeypatch, triton_kernel, triton_cache):
    store = ArtifactStore(tmp_path / "store")
    key = triton_kernel.get_warmup_keys()[0]
    _warm(triton_kernel, key, store)
    assert store.entries()[0].manifest["recorded"]["torch"] == store_mod._version("torch")
    real = store_mod._version
    monkeypatch.setattr(store_mod, "_version", lambda d: "2.11.0" if d == "torch" else real(d))
    assert _warm(triton_kernel, key, store).info["origin"] == "hit" and store.verify() == []


# --------------------------------------------------------------------------- corruption


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("which", ["cubin", "manifest"])
def test_corrupt_entry_is_named_and_rebuilt(tmp_path, triton_kernel, triton_cache, how, which) -> None:
    store = ArtifactStore(tmp_path / "store")
    key = triton_kernel.get_warmup_keys()[0]
    _warm(triton_kernel, key, store)
    entry = store.get(triton_kernel, key)
    target = entry.path / ("manifest.json" if which == "manifest" else
                           next(n for n in entry.files if n.endswith(".cubin")))
    _damage(target, how)
    (problem,) = store.verify()
    assert problem.kind == "corrupt" and entry.path.name in str(problem)
    with pytest.warns(StoreWarning, match=f"RowQuantTriton .*{entry.path.name}.* is corrupt"):
        assert _warm(triton_kernel, key, store).info["origin"] == "compiled"
    assert store.verify() == [] and _warm(triton_kernel, key, store).info["origin"] == "hit"


def test_entry_that_cannot_load_is_rebuilt(tmp_path, monkeypatch, cute_kernel) -> None:
    store = ArtifactStore(tmp_path / "store")
    key = cute_kernel.get_warmup_keys()[0]
    _warm(cute_kernel, key, store)

    def broken(self, key, entry):
        raise RuntimeError("cannot link")

    monkeypatch.setattr(RowQuantCuTeDSL, "load_entry", broken)
    with pytest.warns(StoreWarning, match="could not be loaded .*cannot link"):
        assert _warm(cute_kernel, key, store).info["origin"] == "compiled"


def test_writes_are_atomic(tmp_path, triton_kernel, triton_cache, monkeypatch) -> None:
    """A write that dies half-way leaves no entry (only a temp dir, which clear removes)."""
    store = ArtifactStore(tmp_path / "store")
    key = triton_kernel.get_warmup_keys()[0]

    def die(self, tmp, final):
        raise KeyboardInterrupt

    monkeypatch.setattr(ArtifactStore, "_install", die)
    with pytest.raises(KeyboardInterrupt):
        store.put(triton_kernel, key, {"a": b"x" * 10}, {})
    assert store.entries() == [] and not store.has(triton_kernel, key)


# --------------------------------------------------------------------------- concurrency and shipping

_WORKER = """
import sys
from dsv4kit.jit import ArtifactStore
from dsv4kit.kernels.rowquant.cutedsl import RowQuantCuTeDSL
from dsv4kit.kernels.rowquant.triton import RowQuantTriton
from dsv4kit.platform import cpu_platform
store = ArtifactStore(sys.argv[1])
for cls in (RowQuantTriton, RowQuantCuTeDSL):
    k = cls(cpu_platform("sm_90a"))
    for r in k.compile_many(k.get_warmup_keys()[:2], store=store):
        assert r.ok, r.error
print("ok")
"""


def test_two_concurrent_warmups_share_one_store(tmp_path) -> None:
    root = tmp_path / "store"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "tc")}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(root)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    results = [(p.returncode, out.strip()) for p, (out, _) in zip(procs, outs, strict=True)]
    assert results == [(0, "ok")] * 2, outs
    store = ArtifactStore(root)
    assert len(store.entries()) == 4 and store.verify() == []
    assert not (root / "tmp").exists() or not any((root / "tmp").iterdir())   # no leftovers


def test_export_import_round_trip(tmp_path, triton_kernel, cute_kernel, triton_cache) -> None:
    src = ArtifactStore(tmp_path / "a")
    for k in (triton_kernel, cute_kernel):
        _warm(k, k.get_warmup_keys()[0], src)
    tar = tmp_path / "store.tar.gz"
    assert src.export(tar) == 2
    dst = ArtifactStore(tmp_path / "b")
    assert dst.import_(tar) == (2, [])
    assert sorted(e.path.name for e in dst.entries()) == sorted(e.path.name for e in src.entries())
    assert dst.verify() == [] and dst.import_(tar) == (0, [])           # already there: nothing added
    for k in (triton_kernel, cute_kernel):
        assert _warm(k, k.get_warmup_keys()[0], dst).info["origin"] == "hit"


def test_import_rejects_a_corrupt_entry(tmp_path, triton_kernel, triton_cache) -> None:
    src = ArtifactStore(tmp_path / "a")
    key = triton_kernel.get_warmup_keys()[0]
    _warm(triton_kernel, key, src)
    entry = src.entries()[0]
    manifest = json.loads((entry.path / "manifest.json").read_text())
    manifest["files"][entry.files[0]]["sha256"] = "0" * 64
    (entry.path / "manifest.json").write_text(json.dumps(manifest))
    src.export(tmp_path / "s.tar")
    dst = ArtifactStore(tmp_path / "b")
    added, problems = dst.import_(tmp_path / "s.tar")
    assert added == 0 and [p.kind for p in problems] == ["corrupt"] and dst.entries() == []


@pytest.mark.parametrize("field, value", [("arch", "sm_100a"), ("key", "RowQuantBase.CompileKey(n_cols=7)"),
                                          ("toolchain", {"triton": "9.9.9"})])
def test_an_entry_whose_manifest_names_another_identity_is_corrupt(tmp_path, triton_kernel, triton_cache,
                                                                   field, value) -> None:
    """An edited manifest (or a misplaced entry) would be served for another arch, key or toolchain:
    its identity must hash to the entry's name, in the store and on import."""
    src = ArtifactStore(tmp_path / "a")
    key = triton_kernel.get_warmup_keys()[0]
    _warm(triton_kernel, key, src)
    entry = src.entries()[0]
    manifest = json.loads((entry.path / "manifest.json").read_text())
    manifest[field] = value
    (entry.path / "manifest.json").write_text(json.dumps(manifest))
    (problem,) = src.verify()
    assert problem.kind == "corrupt" and "identity" in str(problem)
    src.export(tmp_path / "s.tar")
    dst = ArtifactStore(tmp_path / "b")
    added, problems = dst.import_(tmp_path / "s.tar")
    assert added == 0 and [p.kind for p in problems] == ["corrupt"] and dst.entries() == []
    with pytest.warns(StoreWarning, match="identity hashes to"):
        assert src.get(triton_kernel, key) is None


def test_default_location_moves_with_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(store_mod.ENV_VAR, str(tmp_path / "mine"))
    assert ArtifactStore().root == tmp_path / "mine"
    monkeypatch.delenv(store_mod.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store_mod.default_cache_dir() == tmp_path / "xdg" / "dsv4kit"


# --------------------------------------------------------------------------- parallel registry warmup


def test_parallel_warmup_reports_every_key_in_registration_order(tmp_path, triton_kernel, cute_kernel,
                                                                 triton_cache) -> None:
    """Workers build the store (both backends), this process loads it; a bad key fails alone."""
    store = ArtifactStore(tmp_path / "store")
    tri_keys = triton_kernel.get_warmup_keys()[:2]
    bad = dataclasses.replace(tri_keys[0], x_stride_class="bogus")
    cute_keys = cute_kernel.get_warmup_keys()[:2]
    registry = WarmupRegistry()
    registry.register(triton_kernel, [tri_keys[0], bad, tri_keys[1]])
    registry.register(cute_kernel, cute_keys)
    t0 = time.perf_counter()
    report = registry.warmup(progress=False, raise_on_failure=False, store=store, jobs=2)
    assert time.perf_counter() - t0 < 240
    assert [r.key for r in report.kernels[0].keys] == [tri_keys[0], bad, tri_keys[1]]
    assert [r.key for r in report.kernels[1].keys] == cute_keys
    assert [f.key for f in report.failures] == [bad] and "bogus" in report.failures[0].error
    ok = [r for k in report.kernels for r in k.keys if r.ok]
    assert [r.info["origin"] for r in ok] == ["compiled"] * 4 and report.pool_keys == 4
    assert len(store.entries()) == 4 and all(triton_kernel.artifact(k) for k in tri_keys)
    again = registry.warmup(progress=False, raise_on_failure=False, store=store, jobs=2)
    assert [r.info["origin"] for k in again.kernels for r in k.keys if r.ok] == ["hit"] * 4
    assert again.pool_keys == 0
