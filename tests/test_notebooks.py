"""The notebooks' form, checked without running them: short import cells, titles that match the file
names, normalized cells (nbformat validates them without a warning). Running them is
``tests/test_gallery.py``'s job."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
#: A notebook's first code cell imports what it needs and calls ``tutorial.start()``: no more.
MAX_IMPORT_CELL_LINES = 10


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def test_notebooks_found() -> None:
    assert len(NOTEBOOKS) >= 8


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_import_cell_is_short(path: Path) -> None:
    cell = next(c for c in _read(path).cells if c.cell_type == "code")
    lines = [line for line in cell.source.splitlines() if line.strip()]
    assert len(lines) <= MAX_IMPORT_CELL_LINES, f"{path.name}: first code cell has {len(lines)} lines"
    assert "tutorial.start()" in cell.source, f"{path.name}: the first code cell calls tutorial.start()"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_title_names_the_notebook(path: Path) -> None:
    first = _read(path).cells[0]
    assert first.cell_type == "markdown"
    title = first.source.splitlines()[0]
    number = path.stem.split("_")[0]
    assert re.match(rf"# {re.escape(number)} · \S", title), f"{path.name}: title {title!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_are_normalized(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing cell id is a warning today, an error tomorrow
        nb = _read(path)
        nbformat.validate(nb)
    ids = [c.get("id") for c in nb.cells]
    assert all(ids) and len(set(ids)) == len(ids), f"{path.name}: cell ids missing or repeated"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_committed_outputs(path: Path) -> None:
    # Outputs live in the rendered gallery (make gallery), not in git.
    nb = _read(path)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), f"{path.name}: committed outputs"
