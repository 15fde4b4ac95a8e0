"""The rendered gallery: every notebook executed on this machine, one HTML page each, and an index.

    python -m dsv4kit.viz.gallery [--out build/gallery] [NOTEBOOK ...]     # what `make gallery` runs

Each notebook runs once, top to bottom, in a fresh kernel (cells tagged ``raises-exception`` may
raise, as under nbmake; any other error fails the build). Its page is the executed notebook as
HTML with every figure inline; the index lists each page with its title, a one-line summary and
a thumbnail (the notebook's first figure). ``tests/test_gallery.py`` builds every page and checks
that each holds its figures, so CI executes each notebook exactly once.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

__all__ = ["CELL_TIMEOUT", "Page", "build", "count_images", "execute", "render", "summary_of", "write_index"]

#: Seconds one cell may take (nbmake's limit in the Makefile before the gallery replaced it).
CELL_TIMEOUT = 300
_IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")


@dataclass(frozen=True)
class Page:
    """One rendered notebook: its ``stem``, ``title`` and ``summary``, the ``images`` its outputs hold,
    the ``seconds`` it took to execute, and its ``thumbnail`` file (None: no PNG figure)."""

    stem: str
    title: str
    summary: str
    images: int
    seconds: float
    thumbnail: str | None

    @property
    def html_name(self) -> str:
        return f"{self.stem}.html"


def execute(path: Path, timeout: int = CELL_TIMEOUT) -> tuple[nbformat.NotebookNode, float]:
    """The notebook at ``path`` executed in a fresh kernel from its own folder, and the seconds it took."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - t0


def _image_outputs(nb: nbformat.NotebookNode) -> list[dict[str, str]]:
    return [out["data"] for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if any(t in out.get("data", {}) for t in _IMAGE_TYPES)]


def count_images(nb: nbformat.NotebookNode) -> int:
    """How many figures the notebook's outputs hold."""
    return len(_image_outputs(nb))


def _plain(markdown: str) -> str:
    text = re.sub(r"[*_`]", "", markdown)
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip()


def summary_of(nb: nbformat.NotebookNode) -> tuple[str, str]:
    """``(title, one-line summary)``: the first heading, and the first sentence of the prose after it."""
    lines = nb.cells[0].source.splitlines() if nb.cells else [""]
    title = _plain(lines[0].lstrip("#"))
    prose = " ".join(line.strip() for line in lines[1:] if line.strip())
    prose = re.sub(r"^\*\*[^*]+\*\*\s*", "", prose)  # a bold lead-in ("**Where it sits.**") is no summary
    sentence = re.split(r"(?<=[.!?])\s", _plain(prose), maxsplit=1)[0]
    return title, sentence


def render(path: Path, out: Path, timeout: int = CELL_TIMEOUT) -> Page:
    """Execute ``path``, write its page (``out/<stem>.html``), thumbnail and record (``<stem>.json``)."""
    from nbconvert import HTMLExporter

    nb, seconds = execute(path, timeout)
    out.mkdir(parents=True, exist_ok=True)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    (out / f"{path.stem}.html").write_text(body, encoding="utf-8")
    pngs = [d["image/png"] for d in _image_outputs(nb) if "image/png" in d]
    thumb = None
    if pngs:
        thumb = f"thumbs/{path.stem}.png"
        (out / "thumbs").mkdir(exist_ok=True)
        (out / thumb).write_bytes(base64.b64decode(pngs[0]))
    title, summary = summary_of(nb)
    page = Page(path.stem, title, summary, count_images(nb), round(seconds, 1), thumb)
    (out / f"{path.stem}.json").write_text(json.dumps(asdict(page), indent=1), encoding="utf-8")
    return page


_INDEX_HEAD = """<!doctype html>
<html><head><meta charset="utf-8"><title>dsv4kit notebooks</title>
<style>
body { font-family: system-ui, sans-serif; max-width: 64rem; margin: 2rem auto; padding: 0 1rem; }
.card { display: flex; gap: 1.25rem; align-items: center; border-bottom: 1px solid #ddd; padding: 1rem 0; }
.card img { width: 16rem; height: 10rem; object-fit: contain; border: 1px solid #eee; }
.card h2 { margin: 0 0 .4rem; font-size: 1.15rem; }
.meta { color: #666; font-size: .85rem; }
</style></head><body>
<h1>dsv4kit notebooks</h1>
<p>Each notebook executed on a CPU (Triton kernels under the interpreter; GPU numbers are the
recorded runs of <code>benchmarks/results/</code>, labelled as recorded). Built by
<code>make gallery</code>.</p>
"""


def write_index(pages: Sequence[Page], out: Path) -> Path:
    """Write ``out/index.html``: a card per page (thumbnail, title, summary, figures, seconds)."""
    cards = []
    for p in pages:
        img = (f'<img src="{html.escape(p.thumbnail)}" alt="first figure of {html.escape(p.stem)}">'
               if p.thumbnail else "")
        cards.append(f'<div class="card"><a href="{html.escape(p.html_name)}">{img}</a><div>'
                     f'<h2><a href="{html.escape(p.html_name)}">{html.escape(p.title)}</a></h2>'
                     f"<p>{html.escape(p.summary)}</p>"
                     f'<p class="meta">{p.images} figures · executed in {p.seconds:.0f} s</p></div></div>')
    index = out / "index.html"
    index.write_text(_INDEX_HEAD + "\n".join(cards) + "\n</body></html>\n", encoding="utf-8")
    return index


def build(notebooks: Sequence[Path], out: Path, timeout: int = CELL_TIMEOUT) -> list[Page]:
    """Render every notebook into ``out`` and write the index; returns the pages in order."""
    pages = []
    for path in notebooks:
        page = render(path, out, timeout)
        print(f"{page.stem}: {page.images} figures, {page.seconds:.1f} s", flush=True)
        pages.append(page)
    write_index(pages, out)
    return pages


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.viz.gallery",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=Path("build/gallery"))
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT, help="seconds per cell")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted(Path("notebooks").glob("*.ipynb"))
    if not notebooks:
        parser.error("no notebooks given and none in notebooks/")
    build(notebooks, args.out, args.timeout)
    print(f"gallery: {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
