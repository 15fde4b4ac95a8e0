"""ArtifactStore: compiled kernels kept on disk, built on one machine and loaded on another.

A store is a directory (:func:`default_cache_dir`: ``$DSV4KIT_CACHE_DIR``, else
``$XDG_CACHE_HOME/dsv4kit``, else ``~/.cache/dsv4kit``) with one entry per

    (kernel class, CompileKey, arch, backend, kernel source hash, toolchain)

under ``entries/<digest>/``: a ``manifest.json`` (identity, the artifact's inspection data,
compile seconds, the sha256 and size of every file) and the files the backend needs to load
the artifact again (Triton: the files of Triton's own cache group; CuTeDSL: the exported
TVM-FFI object, PTX and cubin).

What is in the key, and why:

* the **kernel source hash**: :func:`dsv4kit.results.kernel_source_hash` of the kernel's family
  folder (its sources, the folders it imports, the shared numerics and ``backends/*.py``);
  a kernel outside ``dsv4kit.kernels`` hashes its module's source and ``backends/*.py``.
* the **toolchain that determines the artifact**: for Triton entries the triton version and a
  digest of Triton's own ``triton_key()`` (the cubin, its launch metadata and Triton's cache hash
  all come from them; ``triton_key()`` hashes Triton's compiler sources and its compiled
  extension, which differs per Python ABI: an entry built under CPython 3.11 is a plain miss under
  3.12, not a load that Triton would refuse, seen on the H200, ``benchmarks/results/store_h200/``); the
  nvidia-cutlass-dsl and apache-tvm-ffi versions and the host CPU architecture for CuTeDSL
  entries (the exported object is host code linked against their runtime libraries).
* **torch is recorded, not keyed**: neither artifact contains or calls torch code. Triton's
  cache hash has no torch component and CuTeDSL's TVM-FFI functions take torch tensors
  through DLPack, a stable ABI. Keying on torch would make a store built on the CPU machine
  (torch 2.13, CPU) useless on the GPU machine (torch 2.11, same triton 3.6.0), which is the
  point of the store. The manifest keeps torch's version (and Python's) for diagnosis.

Entries are immutable: an entry whose source or toolchain changed is never read again (its
digest differs); ``verify`` lists it as stale and ``clear --stale`` drops it.

Concurrency and crashes: an entry is written into ``tmp/`` inside the store and renamed into
place as a whole (``os.rename`` of a directory is atomic on POSIX), so a reader sees either no
entry or a complete one. Two processes writing one entry race harmlessly: the second rename
fails and that writer drops its copy. A corrupted or truncated entry fails its checksums; the
reader warns (:class:`StoreWarning`, naming kernel, key and path), moves it aside and the
caller rebuilds it.
"""

from __future__ import annotations

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "SCHEMA",
    "ArtifactStore",
    "Entry",
    "Problem",
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
SCHEMA = "dsv4kit.store/1"
MANIFEST = "manifest.json"

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


def toolchain(backend: str) -> dict[str, str]:
    """The versions that are part of an entry's key for ``backend`` (see the module docstring)."""
    out = {d: _version(d) for d in _TOOLCHAIN.get(backend, ())}
    if backend == "cutedsl":
        out["host"] = platform.machine()
    if backend == "triton":
        out["triton_key"] = _triton_key_digest()
    return out


@functools.cache
def _triton_key_digest() -> str:
    """sha256 (16 hex) of Triton's ``triton_key()``: what Triton's cache hash takes from the
    installation (compiler sources, the ``libtriton`` build). Triton computes it for every
    compile or cache lookup anyway (about 0.5 s, once per process)."""
    from triton.runtime.cache import triton_key

    return hashlib.sha256(triton_key().encode()).hexdigest()[:16]


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


def _identity(kernel: Any, key: Any) -> dict[str, Any] | None:
    cls = type(kernel)
    src = source_hash(cls)
    if src is None:
        return None
    return {"schema": SCHEMA, "kernel": cls.__name__, "class": f"{cls.__module__}:{cls.__qualname__}",
            "key": key_text(key), "arch": kernel.target, "backend": kernel.backend,
            "source_hash": src, "toolchain": toolchain(kernel.backend)}


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
_IDENTITY_FIELDS = ("schema", "kernel", "class", "key", "arch", "backend", "source_hash", "toolchain")


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
class ArtifactStore:
    """A directory of compiled artifacts; see the module docstring."""

    root: Path = field(default_factory=default_cache_dir)

    def __post_init__(self) -> None:
        self.root = Path(self.root).expanduser()

    @property
    def entries_dir(self) -> Path:
        return self.root / "entries"

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
        warnings.warn(f"dsv4kit artifact store: entry of {kernel.name} {key} at {path} is corrupt "
                      f"({why}); it is rebuilt", StoreWarning, stacklevel=2)
        self._discard(path)
        return None

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
                self._discard(final)
        raise OSError(f"could not install store entry {final}")

    def _discard(self, path: Path) -> None:
        """Move ``path`` aside (atomic), then delete it; a concurrent discard is harmless."""
        aside = self._tmp(f"discard-{path.name}")
        try:
            os.rename(path, aside)
        except OSError:
            return
        shutil.rmtree(aside, ignore_errors=True)

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

    def remove(self, path: Path) -> None:
        """Delete one entry (by its directory)."""
        self._discard(path)

    def clear(self) -> int:
        """Delete every entry (and leftovers of interrupted writes); returns the entries removed."""
        n = sum(1 for _ in self._entry_dirs())
        for path in list(self._entry_dirs()):
            self._discard(path)
        shutil.rmtree(self.root / "tmp", ignore_errors=True)
        return n

    # ------------------------------------------------------------------ shipping
    def export(self, file: str | Path) -> int:
        """Write every entry into one tar file (gzip when its name ends in .gz); returns the count."""
        entries = self.entries()
        mode = "w:gz" if str(file).endswith((".gz", ".tgz")) else "w"
        with tarfile.open(file, mode) as tar:
            for e in entries:
                tar.add(e.path, arcname=f"entries/{e.path.name}")
        return len(entries)

    def import_(self, file: str | Path) -> tuple[int, list[Problem]]:
        """Add the entries of a tar file made by :meth:`export`; every checksum is verified first.

        Returns (entries added, problems); an entry that fails its checksums is not added.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="import.", dir=self._tmp("import").parent))
        added, problems = 0, []
        try:
            with tarfile.open(file) as tar:
                tar.extractall(work, filter="data")
            for path in sorted((work / "entries").glob("*")) if (work / "entries").is_dir() else []:
                manifest, why = _problem_of(path)
                if why is not None:
                    problems.append(Problem(path, "corrupt", path.name, why))
                    continue
                final = self.entries_dir / path.name
                if not final.exists():
                    self._install(path, final)
                    added += 1
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return added, problems


def _stale_reason(manifest: Mapping[str, Any]) -> str | None:
    """Why an entry no longer matches this installation (None: it is current)."""
    if manifest.get("schema") != SCHEMA:
        return f"schema {manifest.get('schema')!r}, expected {SCHEMA!r}"
    now = toolchain(str(manifest.get("backend")))
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
