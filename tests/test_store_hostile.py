"""The artifact store under hostile conditions (issue 40): a --cache-dir that is a regular file, a
read-only store, export/import to and from bad paths, an unreadable manifest, a corrupt entry moved
aside, and a key that Triton's own cache served. Each case checks the exit code and the message."""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import warnings

import pytest
from cli_run import run_main
from fresh_kernels import fresh_kernel

from dsv4kit.jit import store as store_mod
from dsv4kit.jit.store import ArtifactStore, StoreWarning
from dsv4kit.kernels.rowquant.triton import RowQuantTriton


def run(capsys, *argv: str) -> tuple[int, str, str]:
    return run_main(capsys, *argv)


@pytest.fixture
def kernel():
    yield from fresh_kernel(RowQuantTriton)


@pytest.fixture
def small_store(tmp_path, monkeypatch, kernel) -> ArtifactStore:
    """A store of two RowQuant Triton keys (cheap to compile)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc"))
    store = ArtifactStore(tmp_path / "store")
    for r in kernel.compile_many(kernel.get_warmup_keys()[:2], store=store):
        assert r.ok and r.info["origin"] == "compiled", r.error
    assert len(store.entries()) == 2
    return store


# --------------------------------------------------------------------------- --cache-dir is a file


@pytest.mark.parametrize("action", ["ls", "verify", "clear", "export", "import"])
def test_cache_commands_reject_a_cache_dir_that_is_a_file(capsys, tmp_path, action) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a store")
    extra = [str(tmp_path / "x.tar")] if action in ("export", "import") else []
    if action == "import":
        with tarfile.open(extra[0], "w"):
            pass
    rc, out, err = run(capsys, "cache", action, *extra, "--cache-dir", str(afile))
    assert rc == 2 and out == "" and err == f"dsv4kit cache {action}: --cache-dir {afile}: not a directory\n"
    rc, out, err = run(capsys, "cache", action, *extra, "--cache-dir", str(afile / "below"))
    assert rc == 2 and f"{afile} is not a directory" in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["warmup", "coverage"])
def test_warmup_and_coverage_exit_2_on_a_cache_dir_that_is_a_file(capsys, tmp_path, command) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a store")
    rc, out, err = run(capsys, command, "--no-progress", "--cache-dir", str(afile))
    assert rc == 2 and f"--cache-dir {afile}: not a directory" in err and "Traceback" not in err
    assert "warmup (" not in out                                          # it stopped before warming


def test_a_default_store_location_that_is_a_file_warns_once_and_warms_without(capsys, tmp_path,
                                                                              monkeypatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a store")
    monkeypatch.setenv(store_mod.ENV_VAR, str(afile))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc"))
    with _no_store_warnings():
        rc, out, err = run(capsys, "warmup", "--no-progress", "--jobs", "1")
    assert rc == 0 and "artifact store: none" in out
    assert err.count("warning") == 1 and f"{afile}: not a directory; warming without a store" in err


@contextlib.contextmanager
def _no_store_warnings():
    """Fail on any StoreWarning (the old behaviour: one per key)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)
        yield


# --------------------------------------------------------------------------- a read-only store


def _read_only(store: ArtifactStore, monkeypatch) -> None:
    """Make the store's entries undeletable: chmod, and where that does not bite (root) the rename
    that removes an entry raises as a read-only filesystem would."""
    for p in (store.entries_dir, store.root):
        p.chmod(0o555)
    probe = store.entries_dir / "probe"
    try:
        probe.mkdir()
    except PermissionError:
        return
    probe.rmdir()
    real = os.rename

    def rename(src, dst, *a, **kw):
        if str(src).startswith(str(store.root)):
            raise PermissionError(13, "Permission denied", str(src))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(store_mod.os, "rename", rename)


def test_clear_of_a_read_only_store_says_what_it_could_not_remove(capsys, small_store, monkeypatch) -> None:
    _read_only(small_store, monkeypatch)
    try:
        rc, out, err = run(capsys, "cache", "clear", "--cache-dir", str(small_store.root))
        assert rc == 1
        assert out.strip() == f"removed 0 entries from {small_store.root}; 2 could not be removed"
        assert err.count("could not remove") == 2 and "Permission denied" in err
        assert len(small_store.entries()) == 2                               # still there, as reported
    finally:
        for p in (small_store.root, small_store.entries_dir):
            p.chmod(0o755)


def test_clear_counts_only_what_is_gone(capsys, small_store, monkeypatch) -> None:
    victim = small_store.entries()[0].path
    real = os.rename

    def rename(src, dst, *a, **kw):
        if str(src) == str(victim):
            raise PermissionError(13, "Permission denied", str(src))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(store_mod.os, "rename", rename)
    rc, out, err = run(capsys, "cache", "clear", "--cache-dir", str(small_store.root))
    assert rc == 1 and f"removed 1 entry from {small_store.root}; 1 could not be removed" in out
    assert f"could not remove {victim}: PermissionError" in err
    assert [e.path for e in small_store.entries()] == [victim]


# --------------------------------------------------------------------------- export and import


def test_export_into_a_missing_folder_is_one_line(capsys, small_store, tmp_path) -> None:
    target = tmp_path / "no" / "such" / "s.tar"
    rc, out, err = run(capsys, "cache", "export", str(target), "--cache-dir", str(small_store.root))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"dsv4kit cache export: {target}: folder {target.parent} does not exist")


def test_export_into_a_read_only_folder_is_one_line(capsys, small_store, tmp_path, monkeypatch) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    target = folder / "s.tar"
    try:
        if os.access(folder, os.W_OK):   # root: chmod does not bite; opening the file fails instead
            real = tarfile.open

            def refuse(name=None, *a, **kw):
                if str(name) == str(target):
                    raise PermissionError(13, "Permission denied", str(target))
                return real(name, *a, **kw)

            monkeypatch.setattr(store_mod.tarfile, "open", refuse)
        rc, out, err = run(capsys, "cache", "export", str(target), "--cache-dir", str(small_store.root))
    finally:
        folder.chmod(0o755)
    assert rc == 1 and out == ""
    assert err == f"dsv4kit cache export: cannot write {target}: Permission denied\n"
    assert not target.exists()


def test_import_of_a_garbage_file_is_one_line(capsys, tmp_path) -> None:
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(os.urandom(4096))
    rc, out, err = run(capsys, "cache", "import", str(garbage), "--cache-dir", str(tmp_path / "s"))
    assert rc == 2 and out == "" and err == f"dsv4kit cache import: {garbage}: not a tar file\n"


def test_import_of_a_truncated_tar_is_one_line(capsys, small_store, tmp_path) -> None:
    tar = tmp_path / "s.tar.gz"
    small_store.export(tar)
    data = tar.read_bytes()
    tar.write_bytes(data[: len(data) // 2])
    rc, out, err = run(capsys, "cache", "import", str(tar), "--cache-dir", str(tmp_path / "dst"))
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"dsv4kit cache import: cannot import {tar}: a damaged tar file")
    assert ArtifactStore(tmp_path / "dst").entries() == []


def test_import_into_a_file_path_is_one_line(capsys, small_store, tmp_path) -> None:
    tar = tmp_path / "s.tar"
    small_store.export(tar)
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, out, err = run(capsys, "cache", "import", str(tar), "--cache-dir", str(afile))
    assert rc == 2 and err == f"dsv4kit cache import: --cache-dir {afile}: not a directory\n"


# --------------------------------------------------------------------------- corrupt entries


def test_ls_lists_an_entry_whose_manifest_is_unreadable_as_corrupt(capsys, small_store) -> None:
    bad = small_store.entries()[0].path
    (bad / "manifest.json").write_text("{ not json")
    rc, out, err = run(capsys, "cache", "ls", "--cache-dir", str(small_store.root))
    assert rc == 0 and f"corrupt: {bad.name} ({bad.name}): manifest unreadable (JSONDecodeError" in out
    assert "2 entries (1 corrupt)" in out
    rc, out, _ = run(capsys, "cache", "verify", "--cache-dir", str(small_store.root))
    assert rc == 1 and "2 entries, 1 corrupt, 0 stale" in out


def test_a_corrupt_entry_is_moved_aside_with_its_bytes(small_store, kernel) -> None:
    key = kernel.get_warmup_keys()[0]
    path = small_store.path_of(kernel, key)
    cubin = next(n for n in json.loads((path / "manifest.json").read_text())["files"] if n.endswith(".cubin"))
    (path / cubin).write_bytes(b"garbage")
    with pytest.warns(StoreWarning, match=r"is corrupt .*; moved to .*corrupt/"):
        assert small_store.get(kernel, key) is None
    (aside,) = small_store.quarantined()
    assert aside.name.startswith(path.name) and (aside / cubin).read_bytes() == b"garbage"
    assert not path.exists()
    assert small_store.clear().removed == 1 and small_store.quarantined() == []


# --------------------------------------------------------------------------- Triton's own cache


def test_a_key_served_by_tritons_own_cache_is_not_reported_compiled(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc"))
    args = ["warmup", "--no-progress", "--keys", "--jobs", "1"]
    rc, out, _ = run(capsys, *args, "--cache-dir", str(tmp_path / "first"))
    assert rc == 0 and "store: 0 hit(s), 14 compiled\n" in out
    rc, out, _ = run(capsys, *args, "--cache-dir", str(tmp_path / "second"))   # Triton's cache is full
    assert rc == 0 and "store: 0 hit(s), 0 compiled, 14 loaded (triton cache)" in out
    key_lines = [line for line in out.splitlines() if line.startswith("  ") and "  regs " in line]
    assert len(key_lines) == 14 and all(line.endswith("  loaded (triton cache)") for line in key_lines)
    table = {line[:44].strip(): line.split() for line in out.splitlines()}
    assert table["loaded from Triton's own cache"][-2] == "14" and table["compiled"][-2] == "0"
    assert "start-up and imports (before warmup)" in table and "toolchain setup (once per process)" in table
