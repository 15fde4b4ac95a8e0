"""The docs in the repo: the spec and the design are the shared design folder's text, and the
README points only at files a user of this repository has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"          # the shared design folder, where this checkout has one
README = (REPO / "README.md").read_text()

# docs/<name> in this repo: the copy of <shared>/<source>, byte for byte.
COPIES = {"spec.md": "spec/KERNELS.md", "design.md": "DESIGN.md"}
ROOTS = ("docs", "notebooks", "benchmarks")


@pytest.mark.parametrize("name", sorted(COPIES))
def test_doc_copy_matches_shared(name: str) -> None:
    source = SHARED / COPIES[name]
    if not source.is_file():
        pytest.skip(f"no shared design folder here ({source} missing); CI clones may lack it")
    copy = REPO / "docs" / name
    assert copy.is_file(), f"docs/{name} missing: copy {source} there"
    assert copy.read_bytes() == source.read_bytes(), (
        f"docs/{name} differs from {source}: copy it again (cp {source} docs/{name})")


def _without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _without_fences(text))


def _link_targets(text: str) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", _without_fences(text))
    return [t.split("#", 1)[0] for t in targets if "://" not in t and not t.startswith(("#", "mailto:"))]


def _repo_paths(text: str) -> list[str]:
    """Relative paths under docs/, notebooks/ or benchmarks/, in backticks or markdown links."""
    candidates = _code_spans(text) + _link_targets(text)
    paths = {c.removeprefix("./") for c in candidates}
    return sorted(p for p in paths if re.fullmatch(rf"(?:{'|'.join(ROOTS)})/[\w./-]*", p))


def _map_rows() -> dict[str, list[str]]:
    """The Map table: for each folder row under ROOTS, the names its description mentions."""
    rows = {}
    for line in README.splitlines():
        m = re.fullmatch(r"\|\s*`([^`]+)`\s*\|(.*)\|", line.strip())
        if m and m.group(1).rstrip("/") in ROOTS:
            rows[m.group(1)] = [s for s in _code_spans(m.group(2)) if re.fullmatch(r"[\w.-]+/?", s)]
    return rows


def test_readme_paths_found() -> None:
    # The checks below must see what the README mentions today, or they check nothing.
    assert {"docs/spec.md", "docs/design.md", "benchmarks/results/"} <= set(_repo_paths(README))
    assert set(_map_rows()) == {"docs/", "notebooks/", "benchmarks/"}


def test_readme_paths_exist() -> None:
    missing = [p for p in _repo_paths(README) if not (REPO / p).exists()]
    assert missing == [], f"README.md mentions files this repository does not have: {missing}"


def test_readme_map_rows_exist() -> None:
    missing = []
    for folder, names in _map_rows().items():
        for name in names:
            path = REPO / folder / name
            if not (path.exists() or (folder == "notebooks/" and path.with_suffix(".ipynb").is_file())):
                missing.append(f"{folder}{name}")
    assert missing == [], f"README.md's Map names files this repository does not have: {missing}"


def test_readme_notebooks_exist() -> None:
    # Notebooks are named by stem (`01_indexer_q_rope_quant`) in the tables.
    stems = sorted({s for s in _code_spans(README) if re.fullmatch(r"\d\d[a-z]?_\w+", s)})
    assert stems, "expected the README to name its notebooks"
    missing = [s for s in stems if not (REPO / "notebooks" / f"{s}.ipynb").is_file()]
    assert missing == [], f"README.md names notebooks that do not exist: {missing}"
