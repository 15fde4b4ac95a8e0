"""Provenance comes from the package itself (issue 40): a tree that is not its own git checkout
(an unpacked sdist, a tree exported into another repository) says ``commit: unknown``, never the
commit of the repository that encloses it, and always carries its version and kernel source hashes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4kit import __version__, results

PACKAGE = Path(results.__file__).resolve().parent
GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="needs git")


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _enclosing_repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository with one commit, which knows nothing of dsv4kit."""
    outer = tmp_path / "outer"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "README").write_text("another project\n")
    _git(outer, "add", "README")
    _git(outer, "commit", "-q", "-m", "x")
    return outer, _git(outer, "rev-parse", "HEAD")


def _copy_package(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "dsv4kit", ignore=shutil.ignore_patterns("__pycache__", "_recorded"))
    return dest / "dsv4kit"


def test_a_tree_inside_another_repository_has_an_unknown_commit(tmp_path) -> None:
    outer, enclosing = _enclosing_repo(tmp_path)
    pkg = _copy_package(outer / "vendor" / "dsv4kit-0.1.0")
    assert results.package_commit(pkg) == "unknown" != enclosing


def test_a_tree_at_the_root_of_another_repository_that_does_not_track_it_is_unknown(tmp_path) -> None:
    outer, enclosing = _enclosing_repo(tmp_path)
    pkg = _copy_package(outer)                                  # toplevel == the package's parent
    assert results.package_commit(pkg) == "unknown"
    _git(outer, "add", "dsv4kit")
    _git(outer, "commit", "-q", "-m", "track it")
    assert results.package_commit(pkg) == _git(outer, "rev-parse", "HEAD") != enclosing  # its own checkout


def test_a_tree_outside_any_repository_has_an_unknown_commit(tmp_path) -> None:
    pkg = _copy_package(tmp_path / "sdist")
    assert results.package_commit(pkg) == "unknown"


def test_the_package_provenance_names_version_and_every_kernel_folder(tmp_path) -> None:
    pkg = _copy_package(tmp_path / "sdist")
    prov = results.package_provenance(pkg)
    assert prov["commit"] == "unknown" and prov["dsv4kit"]["version"] == __version__
    hashes = prov["dsv4kit"]["kernel_source_hash"]
    assert hashes["dequant_gather"] == results.kernel_source_hash("dequant_gather")


def test_bench_records_from_a_tree_inside_another_repository_say_unknown(tmp_path) -> None:
    """End to end: ``dsv4kit.bench.provenance`` run from the enclosing repository's directory, the
    package imported from the exported tree (as ``dsv4kit bench`` would run there)."""
    outer, enclosing = _enclosing_repo(tmp_path)
    tree = outer / "exported"
    _copy_package(tree)
    env = {k: v for k, v in os.environ.items() if k != "DSV4KIT_COMMIT"}
    env["PYTHONPATH"] = str(tree)
    code = (f"import json, dsv4kit.bench as b; assert b.__file__.startswith({str(tree)!r}), b.__file__; "
            "print(json.dumps(b.provenance()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=outer, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    prov = json.loads(out.stdout.strip().splitlines()[-1])
    assert prov["commit"] == "unknown" != enclosing
    assert prov["dsv4kit"]["version"] == __version__ and prov["dsv4kit"]["kernel_source_hash"]


def test_this_checkout_reports_its_own_commit() -> None:
    root = PACKAGE.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                         text=True)
    if head.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
        pytest.skip("not run from this project's own checkout")
    assert results.package_commit() == head.stdout.strip()
