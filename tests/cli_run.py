"""Run the ``dsv4kit`` command in-process, as the CLI tests do: exit code, stdout, stderr."""

from __future__ import annotations

from typing import Any

from dsv4kit.cli import main


def run_main(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` with argparse's ``SystemExit`` (bad command lines exit 2) turned into its code."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err
