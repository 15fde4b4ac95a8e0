"""``dsv4kit cache``: look at, check, empty and ship an artifact store.

    dsv4kit cache ls      [--cache-dir DIR]     entries: kernel, key, arch, backend, size, age
    dsv4kit cache verify  [--cache-dir DIR]     checksums, source and toolchain: corrupt / stale
    dsv4kit cache clear   [--cache-dir DIR] [--stale]
    dsv4kit cache export  FILE [--cache-dir DIR]   one tar file (.tar.gz: compressed)
    dsv4kit cache import  FILE [--cache-dir DIR]   checksums verified before an entry is added

Exit codes: 0 ok; 1 ``verify`` found a corrupt or stale entry, or ``import`` met a corrupt one;
2 bad command line (e.g. ``import`` of a file that does not exist).
"""

from __future__ import annotations

import argparse
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
                       epilog="Exit codes: 0 ok, 1 corrupt/stale entries found, 2 bad command line.")
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


def cmd_ls(store: Any) -> int:
    """Print one line per entry and a total."""
    entries = store.entries()
    now = time.time()
    print(f"{'kernel':<28} {'arch':<8} {'backend':<8} {'size':>10} {'age':>8}  key")
    for e in entries:
        m = e.manifest
        print(f"{e.kernel:<28} {m.get('arch', '?'):<8} {m.get('backend', '?'):<8} {_size(e.size):>10} "
              f"{_age(now - float(m.get('created', now))):>8}  {e.key}")
    print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {_size(sum(e.size for e in entries))} "
          f"in {store.root}")
    return 0


def cmd_verify(store: Any) -> int:
    """Print every corrupt or stale entry; 1 when there is one."""
    problems = store.verify()
    for p in problems:
        print(p)
    n = len(store.entries())
    print(f"{store.root}: {n} entr{'y' if n == 1 else 'ies'}, "
          f"{sum(p.kind == 'corrupt' for p in problems)} corrupt, {sum(p.kind == 'stale' for p in problems)} "
          "stale")
    return 1 if problems else 0


def cmd_clear(store: Any, stale_only: bool) -> int:
    """Delete every entry, or only the corrupt and stale ones."""
    if stale_only:
        problems = store.verify()
        for p in problems:
            store.remove(p.path)
        print(f"removed {len(problems)} corrupt or stale entr{'y' if len(problems) == 1 else 'ies'} from "
              f"{store.root}")
        return 0
    print(f"removed {store.clear()} entr(ies) from {store.root}")
    return 0


def cmd_cache(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The ``cache`` subcommand's handler."""
    store = _store(args)
    if args.action == "ls":
        return cmd_ls(store)
    if args.action == "verify":
        return cmd_verify(store)
    if args.action == "clear":
        return cmd_clear(store, args.stale)
    if args.action == "export":
        n = store.export(args.file)
        print(f"exported {n} entr{'y' if n == 1 else 'ies'} from {store.root} to {args.file}")
        return 0
    if not Path(args.file).is_file():
        parser.error(f"import: {args.file} is not a file")
    added, problems = store.import_(args.file)
    for p in problems:
        print(p)
    print(f"imported {added} entr{'y' if added == 1 else 'ies'} into {store.root}"
          + (f"; {len(problems)} corrupt entr(ies) rejected" if problems else ""))
    return 1 if problems else 0
