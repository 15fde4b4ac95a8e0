"""Recorded GPU results: where they are, what they were recorded from, whether they still apply.

GPU runs are recorded under ``benchmarks/results/`` (see ``benchmarks/*.py``), each with its
provenance: device, versions, date, commit and, in newer records, ``kernel_source_hash``, the
:func:`kernel_source_hash` of the kernel family the run measured. Notebooks and tools find and
label records only through this module, in a checkout and in an installed package alike.

Where the records are (:func:`results_dir`, first match wins):

1. ``$DSV4KIT_RESULTS``, when set (authoritative: a missing directory there finds nothing);
2. a checkout: ``benchmarks/results/`` next to the directory that holds the ``dsv4kit`` package;
3. an installed package: ``dsv4kit/_recorded/``, the copy of ``benchmarks/results/`` that
   ``setup.py`` adds to the wheel at build time (it is never a file in git).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "SHIPPED_DIR",
    "Recorded",
    "candidates",
    "kernel_source_files",
    "kernel_source_hash",
    "kernel_source_provenance",
    "load",
    "not_found_message",
    "package_commit",
    "package_provenance",
    "results_dir",
]

#: Environment variable naming a results directory; when set it is the only place looked in.
ENV_VAR = "DSV4KIT_RESULTS"
#: Folder inside the installed package that holds the shipped copy of ``benchmarks/results/``.
SHIPPED_DIR = "_recorded"
#: The ``dsv4kit`` package directory this module was imported from (source tree or installed).
PACKAGE_DIR = Path(__file__).resolve().parent

# Kernel sources shared by every family, relative to the package directory.
_SHARED_SOURCES = ("kernels/triton_numerics.py", "kernels/cute_numerics.py")
# Files of a kernel folder that no kernel is built from: the folder's sweep plans (``bench.py``:
# sizes and bytes models of ``dsv4kit bench``), so that a change of sweep points stales no record.
_NOT_KERNEL_SOURCE = frozenset({"bench.py"})
_KERNEL_IMPORT = re.compile(r"^\s*(?:from|import)\s+dsv4kit\.kernels\.([a-z_0-9]+)", re.MULTILINE)
_VERSION_KEYS = ("python", "torch", "triton", "nvidia-cutlass-dsl", "apache-tvm-ffi", "cuda")
# Top-level fields that are provenance in a record without a "provenance" object.
_PROVENANCE_KEYS = ("date", "commit", "device", "arch", "sm", "sms", "memory_gib", "versions", "seed",
                    "kernel_source_hash", "family", "cpu_smoke", *_VERSION_KEYS)


# --------------------------------------------------------------------------- where records are


def candidates(package_dir: Path | None = None) -> list[tuple[str, Path]]:
    """The places :func:`results_dir` looks in, in order, each as ``(what, path)``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return [(f"${ENV_VAR}", Path(env).expanduser())]
    pkg = package_dir or PACKAGE_DIR
    return [("checkout", pkg.parent / "benchmarks" / "results"), ("installed package", pkg / SHIPPED_DIR)]


def results_dir(package_dir: Path | None = None) -> Path | None:
    """The directory of recorded results, or None when there is none (see the module docstring).

    ``package_dir`` stands in for the ``dsv4kit`` package directory (tests).
    """
    for _, path in candidates(package_dir):
        if path.is_dir():
            return path
    return None


def not_found_message(relpath: str | Path | None = None, package_dir: Path | None = None) -> str:
    """What to say when nothing is found: every place looked in (for ``relpath``, when given)."""
    root = results_dir(package_dir)
    places = [("results", root)] if root is not None and relpath is not None else candidates(package_dir)
    looked = "; ".join(f"{what} {path / relpath if relpath is not None else path}" for what, path in places)
    return f"no recorded results found (looked in: {looked})"


# --------------------------------------------------------------------------- kernel source hash


def _folder(family: str, pkg: Path) -> Path:
    from dsv4kit.kernels import FAMILY_FOLDERS

    folder = pkg / "kernels" / FAMILY_FOLDERS.get(family, family)
    if "/" in family or "\\" in family or family.startswith(".") or not (folder / "__init__.py").is_file():
        known = sorted(p.name for p in (pkg / "kernels").iterdir() if (p / "__init__.py").is_file())
        raise ValueError(f"unknown kernel family {family!r}; families: {', '.join(known)}")
    return folder


def _imported_folders(folder: Path) -> set[str]:
    """The other kernel folders the ``.py`` files of ``folder`` import (``from dsv4kit.kernels.<x>``
    or ``import dsv4kit.kernels.<x>`` statements; a mention in a docstring is not an import)."""
    names = set()
    for f in folder.rglob("*.py"):
        if f.name in _NOT_KERNEL_SOURCE:
            continue
        names.update(_KERNEL_IMPORT.findall(f.read_text(encoding="utf-8")))
    return {n for n in names if (folder.parent / n / "__init__.py").is_file()} - {folder.name}


def kernel_source_files(family: str, package_dir: Path | None = None) -> list[str]:
    """The files :func:`kernel_source_hash` covers, relative to the package directory, sorted.

    Every ``.py`` file under the family's folder ``kernels/<folder>/`` and under every kernel
    folder it imports (transitively: the C4 compressors' hash covers the encoders they call), but
    their sweep plans (``bench.py``); ``kernels/triton_numerics.py``, ``kernels/cute_numerics.py``
    and ``backends/*.py``.
    ``family`` is a family name or a folder name.
    """
    pkg = package_dir or PACKAGE_DIR
    todo, seen = [_folder(family, pkg)], set()
    while todo:
        folder = todo.pop()
        if folder.name not in seen:
            seen.add(folder.name)
            todo += [folder.parent / n for n in _imported_folders(folder)]
    files = [f for name in seen for f in (pkg / "kernels" / name).rglob("*.py")
             if f.name not in _NOT_KERNEL_SOURCE]
    files += [*(pkg / "backends").glob("*.py"), *(pkg / s for s in _SHARED_SOURCES)]
    return sorted({f.relative_to(pkg).as_posix() for f in files if f.is_file()})


def kernel_source_hash(family: str, package_dir: Path | None = None) -> str:
    """sha256 (hex) of the source a family's kernels are built from, as this package holds it now.

    For each file of :func:`kernel_source_files`, in that (sorted) order, the hash is fed the
    file's relative path (POSIX, UTF-8), one NUL byte, then the file's bytes. It reads the
    imported package's own files, so an installed copy hashes what it would run.
    """
    pkg = package_dir or PACKAGE_DIR
    digest = hashlib.sha256()
    for rel in kernel_source_files(family, pkg):
        digest.update(rel.encode("utf-8"))
        digest.update(b"\0")
        digest.update((pkg / rel).read_bytes())
    return digest.hexdigest()


def kernel_source_provenance(families: Iterable[str]) -> dict[str, Any]:
    """The ``family`` and ``kernel_source_hash`` fields of a record measuring ``families``."""
    names = list(dict.fromkeys(families))
    return {"family": names, "kernel_source_hash": {f: kernel_source_hash(f) for f in names}}


# --------------------------------------------------------------------------- this package


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS`` stdout stripped, or None when git fails or is absent."""
    try:
        run = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def package_commit(package_dir: Path | None = None) -> str:
    """The git commit of the checkout this package is, or ``unknown``.

    Git is trusted only where its toplevel is the directory that holds the package (this project's
    repository root) and that repository tracks the package: a tree unpacked from an sdist, or
    exported into another repository, would otherwise be labelled with the commit of whatever
    repository encloses it.
    """
    pkg = (package_dir or PACKAGE_DIR).resolve()
    root = pkg.parent
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root:
        return "unknown"
    if _git(root, "ls-files", "--error-unmatch", f"{pkg.name}/__init__.py") is None:
        return "unknown"
    return _git(root, "rev-parse", "HEAD") or "unknown"


def _family_folders(pkg: Path) -> list[str]:
    return sorted(p.name for p in (pkg / "kernels").iterdir() if (p / "__init__.py").is_file())


def package_provenance(package_dir: Path | None = None) -> dict[str, Any]:
    """What this package says of itself, whatever directory it runs from: ``commit``
    (:func:`package_commit`) and ``dsv4kit``: its version and the :func:`kernel_source_hash` of
    every kernel folder (what a GPU record was measured with, even when the commit is unknown)."""
    from dsv4kit import __version__

    pkg = package_dir or PACKAGE_DIR
    return {"commit": package_commit(pkg),
            "dsv4kit": {"version": __version__,
                        "kernel_source_hash": {f: kernel_source_hash(f, pkg) for f in _family_folders(pkg)}}}


# --------------------------------------------------------------------------- one record


@dataclass(frozen=True)
class Recorded:
    """One recorded run: a JSON file (with a ``provenance`` object, or provenance fields at its top
    level) or a directory with ``provenance.json``.

    ``package_dir`` is the package whose kernel sources :meth:`status` compares with (default:
    this one).
    """

    path: Path
    provenance: Mapping[str, Any]
    package_dir: Path | None = field(default=None, compare=False)

    @classmethod
    def from_path(cls, path: Path | str, package_dir: Path | None = None) -> Recorded:
        """Read the record at ``path``; ValueError when it carries no provenance."""
        path = Path(path)
        if path.is_dir():
            prov = json.loads((path / "provenance.json").read_text())
        else:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError(f"{path}: not a record (a JSON object is expected)")
            prov = data.get("provenance") or {k: data[k] for k in _PROVENANCE_KEYS if k in data}
        if not isinstance(prov, dict) or not {"date", "commit", "device"} & set(prov):
            raise ValueError(f"{path}: not a record (no device, date or commit in its provenance)")
        return cls(path, prov, package_dir)

    # provenance ------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        return str(self.provenance.get("device", "unknown device"))

    @property
    def date(self) -> str:
        return str(self.provenance.get("date", "unknown date"))

    @property
    def commit(self) -> str:
        return str(self.provenance.get("commit", "unknown commit"))

    @property
    def versions(self) -> dict[str, str]:
        """Software versions of the run (``versions`` object and top-level version fields)."""
        found = {k: str(v) for k, v in dict(self.provenance.get("versions") or {}).items() if v is not None}
        found.update({k: str(self.provenance[k]) for k in _VERSION_KEYS
                      if self.provenance.get(k) is not None})
        return found

    @property
    def kernel_source_hash(self) -> str | dict[str, str] | None:
        """The recorded hash: one string (for :attr:`family`), a family -> hash map, or None."""
        return self.provenance.get("kernel_source_hash")

    @property
    def family(self) -> tuple[str, ...]:
        """The kernel families the run measured, as recorded (empty when not recorded)."""
        fam = self.provenance.get("family")
        if fam is None and isinstance(self.kernel_source_hash, dict):
            return tuple(self.kernel_source_hash)
        return (fam,) if isinstance(fam, str) else tuple(fam or ())

    # files -----------------------------------------------------------------------------------

    def file(self, name: str) -> Path:
        """A file of this record: inside a directory record, next to a JSON-file record."""
        return (self.path if self.path.is_dir() else self.path.parent) / name

    def read_json(self, name: str | None = None) -> Any:
        """A JSON file of the record (default: a JSON-file record's own file)."""
        return json.loads((self.file(name) if name else self.path).read_text())

    # still current? --------------------------------------------------------------------------

    def recorded_hash(self, family: str) -> str | None:
        """The kernel source hash recorded for ``family``, or None when none was recorded."""
        if self.family and family not in self.family:
            raise ValueError(f"{self.path} records family {', '.join(self.family)}, not {family}")
        h = self.kernel_source_hash
        return h.get(family) if isinstance(h, dict) else h

    def _families(self, family: str | Sequence[str] | None) -> tuple[str, ...]:
        fams = self.family if family is None else (family,) if isinstance(family, str) else tuple(family)
        if not fams:
            raise ValueError(f"{self.path} records no family: name the kernel family to compare with")
        return fams

    def status(self, family: str | Sequence[str] | None = None) -> str:
        """``recorded at <commit> on <device>, <date>`` and whether ``family``'s kernel source changed.

        A record of a ``--cpu-smoke`` run says so first. The suffix is ``, kernel source hash not
        recorded`` when the record has no hash (for any of the families), ``, kernel source
        changed since`` when a recorded hash differs from
        :func:`kernel_source_hash` now (naming the families when several are compared), and
        nothing when the record is :meth:`current`. ``family`` defaults to the recorded one.
        """
        fams = self._families(family)
        line = f"recorded at {self.commit[:10]} on {self.device}, {self.date}"
        if self.provenance.get("cpu_smoke"):  # a script's CPU rehearsal, kept by mistake: say so first
            line = "CPU SMOKE RUN, not a GPU measurement: " + line
        recorded = {f: self.recorded_hash(f) for f in fams}
        if any(h is None for h in recorded.values()):
            return line + ", kernel source hash not recorded"
        changed = [f for f, h in recorded.items() if h != kernel_source_hash(f, self.package_dir)]
        if not changed:
            return line
        return line + ", kernel source changed since" + (f" ({', '.join(changed)})" if len(fams) > 1 else "")

    def current(self, family: str | Sequence[str] | None = None) -> bool:
        """True when a hash is recorded for ``family`` (each of them) and equals the source now."""
        fams = self._families(family)
        return all(self.recorded_hash(f) == kernel_source_hash(f, self.package_dir) for f in fams)


def load(relpath: str | Path, root: Path | None = None) -> Recorded | None:
    """The record at ``relpath`` under ``root`` (default :func:`results_dir`), or None when absent."""
    root = root if root is not None else results_dir()
    if root is None or not (root / relpath).exists():
        return None
    return Recorded.from_path(root / relpath)
