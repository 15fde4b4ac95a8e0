"""benchmarks/README.md: every script left in ``benchmarks/`` has a row saying why it is a script,
and every row of that table names a script that exists."""

from __future__ import annotations

import re

from benchmark_scripts import BENCHMARKS


def _table_scripts() -> list[str]:
    text = (BENCHMARKS / "README.md").read_text()
    table = text.split("| script | needs |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([\w.-]+)` \|", table, re.MULTILINE)


def test_every_script_has_its_reason_and_every_row_its_script() -> None:
    scripts = sorted(p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh"))
    rows = _table_scripts()
    assert len(rows) == len(set(rows))
    assert sorted(rows) == scripts
