"""The gallery build: every notebook executed once (this is where CI runs the notebooks, each claim in
them an assert) and rendered to a page that holds its figures; then the index over the pages."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from dsv4kit.viz import gallery

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
# One 1x1 PNG, for the index test's thumbnail.
_PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
                        "AAAABJRU5ErkJggg==")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_page_holds_its_figures(path: Path, tmp_path: Path) -> None:
    page = gallery.render(path, tmp_path)
    assert page.images > 0, f"{path.name}: no figure in its outputs"
    body = (tmp_path / page.html_name).read_text(encoding="utf-8")
    shown = body.count("<img") + body.count("<svg")
    assert shown >= page.images, f"{path.name}: {shown} of {page.images} figures on the page"
    assert page.thumbnail is not None and (tmp_path / page.thumbnail).stat().st_size > 0
    assert page.title.startswith(path.stem.split("_")[0]) and page.summary
    assert json.loads((tmp_path / f"{path.stem}.json").read_text())["images"] == page.images


def test_index_links_every_page(tmp_path: Path) -> None:
    pages = []
    for stem in ("00_a", "01_b"):
        (tmp_path / "thumbs").mkdir(exist_ok=True)
        (tmp_path / "thumbs" / f"{stem}.png").write_bytes(_PNG)
        pages.append(gallery.Page(stem, f"{stem[:2]} · Title <{stem}>", "One line.", 2, 3.0,
                                  f"thumbs/{stem}.png"))
    body = gallery.write_index(pages, tmp_path).read_text(encoding="utf-8")
    for p in pages:
        assert f'href="{p.html_name}"' in body and f'src="{p.thumbnail}"' in body
    assert "&lt;00_a&gt;" in body and "<00_a>" not in body  # titles are escaped
    assert body.count('class="card"') == 2


def test_summary_is_the_first_sentence() -> None:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# 07 · A `toy`\n\n**What.** It scales [rows](x.md). Then more.\n")])
    assert gallery.summary_of(nb) == ("07 · A toy", "It scales rows.")
