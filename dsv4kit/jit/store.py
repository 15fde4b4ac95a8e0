"""ArtifactStore: compiled kernels kept on disk, built on one machine and loaded on another.

A store is a directory (:func:`default_cache_dir`: ``$DSV4KIT_CACHE_DIR``, else
``$XDG_CACHE_HOME/dsv4kit``, else ``~/.cache/dsv4kit``) with one entry per

    (kernel class, CompileKey, arch, backend, kernel source hash, toolchain, compile id)

under ``entries/<digest>/``: a ``manifest.json`` (identity, the artifact's inspection data,
compile seconds, the sha256 and size of every file) and the files the backend needs to load
the artifact again (Triton: the files of Triton's own cache group; CuTeDSL: the exported
TVM-FFI object, PTX and cubin).

What is in the key, and why:

* the **kernel source hash**: :func:`dsv4kit.results.kernel_source_hash` of the kernel's family
  folder (its sources, the folders it imports, the shared numerics and ``backends/*.py``);
  a kernel outside ``dsv4kit.kernels`` hashes its module's source and ``backends/*.py``.
* the **toolchain that determines the artifact**: for Triton entries the triton version and the
  ``ptxas --version`` of the entry's arch; the nvidia-cutlass-dsl and apache-tvm-ffi versions and
  the host CPU architecture for CuTeDSL entries (the exported object is host code linked against
  their runtime libraries).
* the **compile id** (backends that have one: Triton, ``TritonJitKernel.store_compile_id``): what
  Triton's own cache key is made of *except* ``triton_key()``, i.e. the Triton version, Triton's
  hash of the kernel source and its specialization (``src.hash()``), of the target and ptxas
  (``backend.hash()``), of the options and of the cache-invalidating environment variables.
  ``triton_key()`` is left out on purpose: it hashes Triton's compiled extension, whose bytes
  differ between builds of one release for two Python versions (3.11 on the CPU machine, 3.12 on
  the GPU machine, ``benchmarks/results/store_h200/``) while the binary they produce does not. A
  Triton entry is installed, on load, under the hash the *running* Triton computes for the
  compile, so its own cache lookup finds it.
* **torch is recorded, not keyed**: neither artifact contains or calls torch code. Triton's
  cache hash has no torch component and CuTeDSL's TVM-FFI functions take torch tensors
  through DLPack, a stable ABI. Keying on torch would make a store built on the CPU machine
  (torch 2.13, CPU) useless on the GPU machine (torch 2.11, same triton 3.6.0), which is the
  point of the store. The manifest keeps torch's version (and Python's) for diagnosis.

Entries are immutable: an entry whose source or toolchain changed is never read again (its
digest differs); ``verify`` lists it as stale and ``clear --stale`` drops it. (A changed compile id
alone, e.g. another cache-invalidating Triton environment variable, is a plain miss: ``verify``
cannot recompute it without the kernel's arguments.)

Concurrency and crashes: an entry is written into ``tmp/`` inside the store and renamed into
place as a whole (``os.rename`` of a directory is atomic on POSIX), so a reader sees either no
entry or a complete one. Two processes writing one entry race harmlessly: the second rename
fails and that writer drops its copy. A corrupted or truncated entry fails its checksums; the
reader warns (:class:`StoreWarning`, naming kernel, key, the path and where the bad bytes went),
moves it aside into ``corrupt/`` inside the store (kept for inspection; ``cache clear`` empties it)
and the caller rebuilds it in place.

A path that cannot hold a store (a regular file, or a folder under one) is reported by
:meth:`ArtifactStore.unusable` before anything touches it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
import uuid
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "Cleared",
    "SCHEMA",
    "ArtifactStore",
    "Entry",
    "Problem",
    "StoreIOError",
    "StoreWarning",
    "default_cache_dir",
    "key_text",
    "recorded_versions",
    "source_hash",
    "toolchain",
]

#: Environment variable that moves the default store.
ENV_VAR = "DSV4KIT_CACHE_DIR"
#: Manifest schema; a manifest of another schema is treated as stale.
SCHEMA = "dsv4kit.store/2"
MANIFEST = "manifest.json"
#: Where corrupt entries are moved for inspection (inside the store).
CORRUPT = "corrupt"

# The packages whose versions determine each backend's artifacts (see the module docstring).
_TOOLCHAIN = {"triton": ("triton",), "cutedsl": ("nvidia-cutlass-dsl", "apache-tvm-ffi")}
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


class StoreWarning(UserWarning):
    """A store entry could not be used (corrupt, unreadable) or written; warmup carries on."""


def default_cache_dir() -> Path:
    """``$DSV4KIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/dsv4kit``, else ``~/.cache/dsv4kit``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "dsv4kit"


# --------------------------------------------------------------------------- identity


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def toolchain(backend: str, arch: str | None = None) -> dict[str, str]:
    """The versions that are part of an entry's key for ``backend`` on ``arch`` (see the module
    docstring)."""
    out = {d: _version(d) for d in _TOOLCHAIN.get(backend, ())}
    if backend == "cutedsl":
        out["host"] = platform.machine()
    if backend == "triton":
        out["ptxas"] = _ptxas_release(arch)
    return out


@functools.cache
def _ptxas_release(arch: str | None) -> str:
    """The release line of ``ptxas --version`` as Triton runs it for ``arch`` (Blackwell has its
    own ptxas), or ``absent``. One subprocess per arch and process; Triton caches it too."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version

        from dsv4kit.platform import arch_capability

        text = get_ptxas_version(arch_capability(arch) if arch else 90)
    except Exception:  # no ptxas (or no NVIDIA backend): every such installation agrees
        return "absent"
    lines = [ln.strip() for ln in str(text).splitlines() if "release" in ln]
    return lines[0] if lines else hashlib.sha256(str(text).encode()).hexdigest()[:16]


def recorded_versions() -> dict[str, str]:
    """Versions kept in every manifest for diagnosis only (not part of the key)."""
    return {"torch": _version("torch"), "python": platform.python_version()}


@functools.cache
def _family_hash(folder: str) -> str:
    from dsv4kit.results import kernel_source_hash

    return kernel_source_hash(folder)


@functools.cache
def _backends_hash() -> str:
    digest = hashlib.sha256()
    for f in sorted((_PACKAGE_DIR / "backends").glob("*.py")):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def source_hash(cls: type) -> str | None:
    """The source hash of a kernel class: its family's, or its module's (None: no source)."""
    parts = cls.__module__.split(".")
    if parts[:2] == ["dsv4kit", "kernels"] and len(parts) > 3:
        return _family_hash(parts[2])
    try:
        src = inspect.getsource(sys.modules[cls.__module__])
    except (OSError, TypeError, KeyError):
        try:
            src = inspect.getsource(cls)
        except (OSError, TypeError):
            return None
    return hashlib.sha256(src.encode() + b"\0" + _backends_hash().encode()).hexdigest()


def key_text(key: Any) -> str:
    """A canonical text of a CompileKey: class name and every field's ``repr``, in order."""
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        fields = ", ".join(f"{f.name}={getattr(key, f.name)!r}" for f in dataclasses.fields(key))
        return f"{type(key).__qualname__}({fields})"
    return repr(key)


def _compile_id(kernel: Any, key: Any) -> str | None:
    """The backend's compile id of ``key`` (see the module docstring), or None when it has none."""
    hook = getattr(kernel, "store_compile_id", None)
    return None if hook is None else str(hook(key))


def _identity(kernel: Any, key: Any) -> dict[str, Any] | None:
    cls = type(kernel)
    src = source_hash(cls)
    if src is None:
        return None
    try:
        compile_id = _compile_id(kernel, key)
    except Exception:  # a key the kernel cannot bind (a bad key): it fails, unstored, when compiled
        return None
    return {"schema": SCHEMA, "kernel": cls.__name__, "class": f"{cls.__module__}:{cls.__qualname__}",
            "key": key_text(key), "arch": kernel.target, "backend": kernel.backend,
            "source_hash": src, "toolchain": toolchain(kernel.backend, kernel.target),
            "compile": compile_id}


def _digest(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:40]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- entries


@dataclass
class Entry:
    """One stored artifact: its directory and manifest (checksums verified when it was read)."""

    path: Path
    manifest: dict[str, Any]

    @property
    def kernel(self) -> str:
        return str(self.manifest.get("kernel", "?"))

    @property
    def key(self) -> str:
        return str(self.manifest.get("key_display") or self.manifest.get("key", "?"))

    @property
    def meta(self) -> dict[str, Any]:
        """What the backend recorded to load the artifact again."""
        return dict(self.manifest.get("meta", {}))

    @property
    def files(self) -> list[str]:
        return list(self.manifest.get("files", {}))

    @property
    def size(self) -> int:
        return sum(int(f["size"]) for f in self.manifest.get("files", {}).values())

    def file(self, name: str) -> Path:
        """The path of a stored file (for loaders that want a path)."""
        return self.path / name

    def read(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def describe(self) -> str:
        return f"{self.kernel} {self.key} [{self.manifest.get('arch')}, {self.manifest.get('backend')}]"


@dataclass
class Problem:
    """An entry ``verify`` objects to: ``kind`` is ``corrupt`` or ``stale``."""

    path: Path
    kind: str
    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.what} ({self.path.name}): {self.why}"


def _read_manifest(path: Path) -> dict[str, Any]:
    data = json.loads((path / MANIFEST).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ValueError("manifest has no file list")
    return data


def _check_files(path: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why the files of ``path`` do not match ``manifest`` (None: they match)."""
    for name, want in manifest["files"].items():
        f = path / name
        if not f.is_file():
            return f"file {name} is missing"
        data = f.read_bytes()
        if len(data) != want.get("size"):
            return f"file {name} has {len(data)} bytes, the manifest says {want.get('size')}"
        if _sha256(data) != want.get("sha256"):
            return f"file {name} fails its sha256 checksum"
    return None


#: The manifest fields an entry's directory name is the digest of (see :func:`_identity`).
_IDENTITY_FIELDS = ("schema", "kernel", "class", "key", "arch", "backend", "source_hash", "toolchain",
                    "compile")


def _problem_of(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, why corrupt): a manifest that cannot be read is itself corruption, and so is one
    whose identity is not the entry's name (an edited manifest, a renamed or misplaced entry: it
    would be served for another kernel, key, arch or toolchain)."""
    try:
        manifest = _read_manifest(path)
    except (OSError, ValueError) as exc:
        return None, f"manifest unreadable ({type(exc).__name__}: {exc})"
    identity = {k: manifest.get(k) for k in _IDENTITY_FIELDS}
    if _digest(identity) != path.name:
        return manifest, f"the manifest's identity hashes to {_digest(identity)}, not to the entry's name"
    return manifest, _check_files(path, manifest)


# --------------------------------------------------------------------------- the store


@dataclass
class Cleared:
    """What :meth:`ArtifactStore.clear` did: entries really removed, and those that could not be."""

    removed: int
    failed: list[tuple[Path, str]] = field(default_factory=list)


class StoreIOError(OSError):
    """A store operation failed on a path; ``str()`` is one line naming the path and the cause."""

    def __init__(self, what: str, path: Path | str, cause: BaseException | str) -> None:
        why = cause if isinstance(cause, str) else (getattr(cause, "strerror", None) or str(cause)
                                                    or type(cause).__name__)
        super().__init__(f"{what} {path}: {why}")
        self.path = Path(path)


def _unusable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be (or become) a directory: it, or a folder above it, is not one."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                return "not a directory" if p == path else f"{p} is not a directory"
            return None
    return None


@dataclass
class ArtifactStore:
    """A directory of compiled artifacts; see the module docstring."""

    root: Path = field(default_factory=default_cache_dir)

    def __post_init__(self) -> None:
        self.root = Path(self.root).expanduser()

    @property
    def entries_dir(self) -> Path:
        return self.root / "entries"

    def unusable(self) -> str | None:
        """One line saying why :attr:`root` cannot hold a store (it, or a folder above it, is a
        regular file), or None. A root that does not exist yet is usable: writes create it."""
        why = _unusable_dir(self.root)
        return None if why is None else f"{self.root}: {why}"

    def _tmp(self, tag: str) -> Path:
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp / f"{tag}.{os.getpid()}.{uuid.uuid4().hex[:12]}"

    # ------------------------------------------------------------------ lookups
    def path_of(self, kernel: Any, key: Any) -> Path | None:
        """Where the entry of ``kernel``'s ``key`` lives (None: the kernel has no source to hash)."""
        ident = _identity(kernel, key)
        return None if ident is None else self.entries_dir / _digest(ident)

    def has(self, kernel: Any, key: Any) -> bool:
        """An entry exists (its checksums are not read: :meth:`get` does that)."""
        path = self.path_of(kernel, key)
        return path is not None and (path / MANIFEST).is_file()

    def get(self, kernel: Any, key: Any) -> Entry | None:
        """The verified entry of ``key``, or None; a corrupt one is warned about and moved aside."""
        path = self.path_of(kernel, key)
        if path is None or not path.is_dir():
            return None
        manifest, why = _problem_of(path)
        if why is None and manifest is not None:
            return Entry(path, manifest)
        aside = self.quarantine(path)
        where = f"moved to {aside}" if aside is not None else "it could not be moved aside"
        warnings.warn(f"dsv4kit artifact store: entry of {kernel.name} {key} at {path} is corrupt "
                      f"({why}); {where}; it is rebuilt", StoreWarning, stacklevel=2)
        return None

    def quarantine(self, path: Path) -> Path | None:
        """Move a corrupt entry into ``corrupt/`` (its bytes kept for inspection); its new path, or
        None when it could not be moved (a read-only store) or is already gone."""
        dest = self.root / CORRUPT / f"{path.name}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, dest)
        except OSError:
            return None
        return dest

    # ------------------------------------------------------------------ writing
    def put(self, kernel: Any, key: Any, files: Mapping[str, bytes], meta: Mapping[str, Any],
            display: str | None = None) -> Entry | None:
        """Write an entry atomically; returns it (None: the kernel's source cannot be hashed).

        When another process wrote the same entry first, its (equivalent) entry is kept.
        """
        ident = _identity(kernel, key)
        if ident is None:
            return None
        final = self.entries_dir / _digest(ident)
        manifest = {**ident, "key_display": display or str(key), "created": time.time(),
                    "recorded": recorded_versions(), "meta": dict(meta),
                    "files": {n: {"sha256": _sha256(b), "size": len(b)} for n, b in files.items()}}
        tmp = self._tmp(final.name)
        try:
            tmp.mkdir(parents=True)
            for name, data in files.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_bytes(data)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
            self._install(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return Entry(final, manifest)

    def _install(self, tmp: Path, final: Path) -> None:
        self.entries_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                os.rename(tmp, final)
                return
            except OSError:
                if not final.exists():
                    continue  # it was moved aside between our rename and this check: retry
                _, why = _problem_of(final)
                if why is None:
                    return  # another writer won with a good entry
                self.quarantine(final)
        raise OSError(f"could not install store entry {final}")

    def _discard(self, path: Path) -> str | None:
        """Move ``path`` aside (atomic), then delete it. None when ``path`` is gone afterwards (a
        concurrent discard is harmless), else why it is still there."""
        try:
            aside = self._tmp(f"discard-{path.name}")
            os.rename(path, aside)
        except OSError as exc:
            return None if not path.exists() else f"{type(exc).__name__}: {exc.strerror or exc}"
        shutil.rmtree(aside, ignore_errors=True)  # moved out of entries/: no longer an entry
        return None

    # ------------------------------------------------------------------ listing and checking
    def entries(self) -> list[Entry]:
        """Every entry whose manifest can be read (checksums not verified), oldest first."""
        out = []
        for path in self._entry_dirs():
            try:
                out.append(Entry(path, _read_manifest(path)))
            except (OSError, ValueError):
                continue
        return sorted(out, key=lambda e: float(e.manifest.get("created", 0)))

    def unreadable(self) -> list[Problem]:
        """The entries :meth:`entries` leaves out because their manifest cannot be read (corrupt)."""
        out = []
        for path in self._entry_dirs():
            try:
                _read_manifest(path)
            except (OSError, ValueError) as exc:
                out.append(Problem(path, "corrupt", path.name,
                                   f"manifest unreadable ({type(exc).__name__}: {exc})"))
        return out

    def quarantined(self) -> list[Path]:
        """The corrupt entries moved aside into ``corrupt/`` (kept for inspection)."""
        folder = self.root / CORRUPT
        return sorted(folder.iterdir()) if folder.is_dir() else []

    def _entry_dirs(self) -> Iterator[Path]:
        if self.entries_dir.is_dir():
            yield from sorted(p for p in self.entries_dir.iterdir() if p.is_dir())

    def verify(self) -> list[Problem]:
        """Corrupt entries (checksums) and stale ones (source hash or toolchain changed)."""
        problems = []
        for path in self._entry_dirs():
            manifest, why = _problem_of(path)
            what = Entry(path, manifest).describe() if manifest else path.name
            if why is not None:
                problems.append(Problem(path, "corrupt", what, why))
                continue
            assert manifest is not None
            stale = _stale_reason(manifest)
            if stale is not None:
                problems.append(Problem(path, "stale", what, stale))
        return problems

    def remove(self, path: Path) -> bool:
        """Delete one entry (by its directory); False when it is still there afterwards."""
        return self._discard(path) is None

    def clear(self, paths: Iterable[Path] | None = None) -> Cleared:
        """Delete ``paths`` (default: every entry, the leftovers of interrupted writes and the
        corrupt entries kept aside); counts only what is really gone."""
        everything = paths is None
        todo = list(self._entry_dirs()) if paths is None else list(paths)
        done = Cleared(0)
        for path in todo:
            why = self._discard(path)
            if why is None:
                done.removed += 1
            else:
                done.failed.append((path, why))
        if everything:
            for extra in ("tmp", CORRUPT):
                shutil.rmtree(self.root / extra, ignore_errors=True)
        return done

    # ------------------------------------------------------------------ shipping
    def export(self, file: str | Path) -> int:
        """Write every entry into one tar file (gzip when its name ends in .gz); returns the count.

        Raises :class:`StoreIOError` (one line: the path and the cause) when the file cannot be
        written; no partial file is left behind.
        """
        file = Path(file)
        why = _unusable_dir(file.parent) or (None if file.parent.is_dir() else "no such folder")
        if why is not None:
            raise StoreIOError("cannot write", file, f"folder {file.parent}: {why}")
        entries = self.entries()
        mode = "w:gz" if file.name.endswith((".gz", ".tgz")) else "w"
        try:
            with tarfile.open(file, mode) as tar:
                for e in entries:
                    tar.add(e.path, arcname=f"entries/{e.path.name}")
        except OSError as exc:
            with contextlib.suppress(OSError):
                file.unlink()
            raise StoreIOError("cannot write", file, exc) from None
        return len(entries)

    def import_(self, file: str | Path) -> tuple[int, list[Problem]]:
        """Add the entries of a tar file made by :meth:`export`; every checksum is verified first.

        Returns (entries added, problems); an entry that fails its checksums is not added.
        Raises :class:`StoreIOError` when ``file`` is not a readable tar file or the store cannot
        be written (one line: the path and the cause).
        """
        why = _tar_problem(Path(file))
        if why is not None:
            raise StoreIOError("cannot import", file, why)
        why = self.unusable()
        if why is not None:
            raise StoreIOError("cannot import into", self.root, why.removeprefix(f"{self.root}: "))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="import.", dir=self._tmp("import").parent))
        except OSError as exc:
            raise StoreIOError("cannot import into", self.root, exc) from None
        try:
            return self._import_from(file, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _import_from(self, file: str | Path, work: Path) -> tuple[int, list[Problem]]:
        added, problems = 0, []
        try:
            with tarfile.open(file) as tar:
                tar.extractall(work, filter="data")
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise StoreIOError("cannot import", file, f"a damaged tar file ({exc})") from None
        except OSError as exc:
            raise StoreIOError("cannot import", file, exc) from None
        for path in sorted((work / "entries").glob("*")) if (work / "entries").is_dir() else []:
            manifest, why = _problem_of(path)
            if why is not None:
                problems.append(Problem(path, "corrupt", path.name, why))
                continue
            final = self.entries_dir / path.name
            if not final.exists():
                try:
                    self._install(path, final)
                except OSError as exc:
                    raise StoreIOError("cannot import into", self.root, exc) from None
                added += 1
        return added, problems


def _tar_problem(file: Path) -> str | None:
    """Why ``file`` is not a tar file this store could import (None: it looks like one)."""
    if not file.exists():
        return "no such file"
    if not file.is_file():
        return "not a regular file"
    try:
        return None if tarfile.is_tarfile(file) else "not a tar file"
    except OSError as exc:
        return exc.strerror or str(exc)


def _stale_reason(manifest: Mapping[str, Any]) -> str | None:
    """Why an entry no longer matches this installation (None: it is current)."""
    if manifest.get("schema") != SCHEMA:
        return f"schema {manifest.get('schema')!r}, expected {SCHEMA!r}"
    now = toolchain(str(manifest.get("backend")), manifest.get("arch"))
    then = manifest.get("toolchain", {})
    changed = [f"{k} {then.get(k)} -> {v}" for k, v in now.items() if then.get(k) != v]
    if changed:
        return "toolchain changed: " + ", ".join(changed)
    cls = _class_of(str(manifest.get("class", "")))
    if cls is None:
        return f"kernel class {manifest.get('class')} is not importable"
    if source_hash(cls) != manifest.get("source_hash"):
        return "kernel source changed since it was compiled"
    return None


def _class_of(dotted: str) -> type | None:
    import importlib

    module, _, name = dotted.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except Exception:  # a module that no longer exists, or fails to import: the entry is stale
        return None
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) else None
