"""``dsv4kit cache``: look at, check, empty and ship an artifact store.

    dsv4kit cache ls      [--cache-dir DIR]     entries: kernel, key, arch, backend, size, age
    dsv4kit cache verify  [--cache-dir DIR]     checksums, source and toolchain: corrupt / stale
    dsv4kit cache clear   [--cache-dir DIR] [--stale]
    dsv4kit cache export  FILE [--cache-dir DIR]   one tar file (.tar.gz: compressed)
    dsv4kit cache import  FILE [--cache-dir DIR]   checksums verified before an entry is added

Exit codes: 0 ok; 1 ``verify`` found a corrupt or stale entry, ``import`` met a corrupt one,
``clear`` could not remove an entry (a read-only store), or a file could not be written or read
(``export`` into a read-only folder); 2 bad command line: ``--cache-dir`` is not a directory (or
lies under a regular file), ``export`` into a folder that does not exist, ``import`` of a file
that does not exist or is not a tar file. Every failure is one line naming the path and the cause.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "cmd_cache"]

_ACTIONS = {
    "ls": "list the entries: kernel, key, arch, backend, size, age",
    "verify": "check every entry's checksums, kernel source hash and toolchain; list corrupt and stale "
              "entries (exit 1 when any)",
    "clear": "delete every entry (--stale: only the corrupt and stale ones)",
    "export": "write the store into one tar file (FILE.tar.gz: gzip-compressed)",
    "import": "add the entries of a tar file written by export (checksums verified first)",
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``cache`` and its actions on the ``dsv4kit`` subparsers ``sub``."""
    p = sub.add_parser("cache", help="list, verify, clear, export or import the artifact store",
                       description=__doc__.splitlines()[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="Exit codes: 0 ok, 1 corrupt/stale entries found or an entry or file could "
                              "not be removed, read or written, 2 bad command line or path.")
    actions = p.add_subparsers(dest="action", required=True)
    for name, help_ in _ACTIONS.items():
        a = actions.add_parser(name, help=help_, description=help_)
        a.add_argument("--cache-dir", metavar="DIR", default=None,
                       help="the store (default: $DSV4KIT_CACHE_DIR, else $XDG_CACHE_HOME/dsv4kit or "
                            "~/.cache/dsv4kit)")
        if name in ("export", "import"):
            a.add_argument("file", metavar="FILE", help="the tar file")
        if name == "clear":
            a.add_argument("--stale", action="store_true", help="delete only corrupt and stale entries")
    p.set_defaults(handler=cmd_cache)
    return p


def _store(args: argparse.Namespace) -> Any:
    from dsv4kit.jit.store import ArtifactStore, default_cache_dir

    return ArtifactStore(Path(args.cache_dir) if args.cache_dir else default_cache_dir())


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.1f} {unit}"
    return f"{seconds:.0f} s"


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def cmd_ls(store: Any) -> int:
    """Print one line per entry (an entry whose manifest cannot be read as ``corrupt``) and a total."""
    entries, unreadable = store.entries(), store.unreadable()
    now = time.time()
    print(f"{'kernel':<28} {'arch':<8} {'backend':<8} {'size':>10} {'age':>8}  key")
    for e in entries:
        m = e.manifest
        print(f"{e.kernel:<28} {m.get('arch', '?'):<8} {m.get('backend', '?'):<8} {_size(e.size):>10} "
              f"{_age(now - float(m.get('created', now))):>8}  {e.key}")
    for p in unreadable:
        print(p)
    aside = len(store.quarantined())
    print(f"{_entries(len(entries) + len(unreadable))} ({len(unreadable)} corrupt), "
          f"{_size(sum(e.size for e in entries))} in {store.root}"
          + (f"; {aside} corrupt entr(ies) kept aside in {store.root / 'corrupt'}" if aside else ""))
    return 0


def cmd_verify(store: Any) -> int:
    """Print every corrupt or stale entry; 1 when there is one."""
    problems = store.verify()
    for p in problems:
        print(p)
    n = len(store.entries()) + len(store.unreadable())
    print(f"{store.root}: {_entries(n)}, "
          f"{sum(p.kind == 'corrupt' for p in problems)} corrupt, {sum(p.kind == 'stale' for p in problems)} "
          "stale")
    return 1 if problems else 0


def cmd_clear(store: Any, stale_only: bool) -> int:
    """Delete every entry, or only the corrupt and stale ones; say what was really removed and
    exit 1 when an entry could not be (a read-only store)."""
    what = "corrupt or stale " if stale_only else ""
    done = store.clear([p.path for p in store.verify()] if stale_only else None)
    for path, why in done.failed:
        print(f"could not remove {path}: {why}", file=sys.stderr)
    print(f"removed {_entries(done.removed)} {what}from {store.root}"
          + (f"; {len(done.failed)} could not be removed" if done.failed else ""))
    return 1 if done.failed else 0


def cmd_export(store: Any, file: str) -> int:
    """Write the store into one tar file."""
    n = store.export(file)
    print(f"exported {_entries(n)} from {store.root} to {file}")
    return 0


def cmd_import(store: Any, file: str) -> int:
    """Add the entries of a tar file (corrupt ones rejected: exit 1)."""
    added, problems = store.import_(file)
    for p in problems:
        print(p)
    print(f"imported {_entries(added)} into {store.root}"
          + (f"; {len(problems)} corrupt entr(ies) rejected" if problems else ""))
    return 1 if problems else 0


def _fail(action: str, message: str, code: int) -> int:
    print(f"dsv4kit cache {action}: {message}", file=sys.stderr)
    return code


def _bad_path(args: argparse.Namespace, store: Any) -> str | None:
    """A path of the command line that cannot be used, as one line (exit 2), or None."""
    why = store.unusable()
    if why is not None:
        return f"--cache-dir {why}"
    if args.action == "import":
        from dsv4kit.jit.store import _tar_problem

        problem = _tar_problem(Path(args.file))
        return None if problem is None else f"{args.file}: {problem}"
    if args.action == "export" and not Path(args.file).parent.is_dir():
        return f"{args.file}: folder {Path(args.file).parent} does not exist (or is not a folder)"
    return None


def cmd_cache(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The ``cache`` subcommand's handler."""
    from dsv4kit.jit.store import StoreIOError

    store = _store(args)
    bad = _bad_path(args, store)
    if bad is not None:
        return _fail(args.action, bad, 2)
    actions = {"ls": lambda: cmd_ls(store), "verify": lambda: cmd_verify(store),
               "clear": lambda: cmd_clear(store, args.stale), "export": lambda: cmd_export(store, args.file),
               "import": lambda: cmd_import(store, args.file)}
    try:
        return actions[args.action]()
    except StoreIOError as exc:
        return _fail(args.action, str(exc), 1)
    except OSError as exc:  # a store that cannot be read (permissions, I/O): one line, not a traceback
        where = exc.filename or store.root
        return _fail(args.action, f"{where}: {exc.strerror or exc}", 1)
