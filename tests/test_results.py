"""dsv4kit.results: finding recorded results (checkout, override, installed package), the kernel
source hash, and the status line of a record."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dsv4kit import results
from dsv4kit.results import ENV_VAR, Recorded, kernel_source_files, kernel_source_hash

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dsv4kit"
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def fake_package(root: Path) -> Path:
    """A copy of the package's kernel and backend sources (all the hash reads) under ``root``."""
    pkg = root / "dsv4kit"
    for sub in ("kernels", "backends"):
        shutil.copytree(PACKAGE / sub, pkg / sub, ignore=IGNORE)
    return pkg


def write_record(path: Path, **prov) -> Path:
    path.mkdir(parents=True)
    base = {"date": "2026-12-01T00:00:00+00:00", "commit": "0123456789abcdef", "device": "NVIDIA H200",
            "torch": "2.11.0+cu130", "triton": "3.6.0"}
    (path / "provenance.json").write_text(json.dumps(base | prov))
    return path


# --------------------------------------------------------------------------- results_dir


def test_results_dir_checkout():
    assert results.results_dir() == REPO / "benchmarks" / "results"
    assert results.candidates()[0] == ("checkout", REPO / "benchmarks" / "results")


def test_results_dir_env_override(monkeypatch, tmp_path):
    write_record(tmp_path / "mine", family="indexer_q")
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert results.results_dir() == tmp_path
    assert results.load("mine").commit == "0123456789abcdef"
    assert results.load("replay_h200") is None          # the override is the only place looked in
    assert results.not_found_message("replay_h200") == (
        f"no recorded results found (looked in: results {tmp_path / 'replay_h200'})")


def test_results_dir_override_missing(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    assert results.results_dir() is None and results.load("replay_h200") is None
    assert results.not_found_message() == (
        f"no recorded results found (looked in: ${ENV_VAR} {tmp_path / 'nowhere'})")


def test_results_dir_none_found(tmp_path):
    pkg = tmp_path / "site-packages" / "dsv4kit"
    pkg.mkdir(parents=True)
    assert results.results_dir(pkg) is None
    msg = results.not_found_message(package_dir=pkg)
    assert msg == ("no recorded results found (looked in: "
                   f"checkout {tmp_path / 'site-packages' / 'benchmarks' / 'results'}; "
                   f"installed package {pkg / '_recorded'})")
    (pkg / "_recorded").mkdir()
    assert results.results_dir(pkg) == pkg / "_recorded"


# --------------------------------------------------------------------------- kernel_source_hash


def test_kernel_source_hash_definition(tmp_path):
    """The definition benchmark scripts record: stated here once more, byte for byte."""
    pkg = fake_package(tmp_path)
    files = sorted([*(p.relative_to(pkg).as_posix() for p in (pkg / "kernels" / "indexer_q").rglob("*.py")
                      if p.name != "bench.py"),
                    *(p.relative_to(pkg).as_posix() for p in (pkg / "backends").glob("*.py")),
                    "kernels/triton_numerics.py", "kernels/cute_numerics.py"])
    assert kernel_source_files("indexer_q", pkg) == files
    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0" + (pkg / rel).read_bytes())
    assert kernel_source_hash("indexer_q", pkg) == digest.hexdigest()


def test_kernel_source_hash_stable(tmp_path):
    a, b = fake_package(tmp_path / "a"), fake_package(tmp_path / "b")
    h = kernel_source_hash("dequant_gather", a)
    assert len(h) == 64 and int(h, 16) >= 0
    assert kernel_source_hash("dequant_gather", a) == h
    assert kernel_source_hash("dequant_gather", b) == h          # independent of where the package is
    assert kernel_source_hash("indexer_q", a) != h


@pytest.mark.parametrize("edit", ["kernels/indexer_q/reference.py", "kernels/triton_numerics.py",
                                  "kernels/cute_numerics.py", "backends/triton.py",
                                  "kernels/indexer_q/new.py"])
def test_kernel_source_hash_changes(tmp_path, edit):
    pkg = fake_package(tmp_path)
    before = kernel_source_hash("indexer_q", pkg)
    path = pkg / edit
    path.write_bytes((path.read_bytes() if path.exists() else b"") + b"\n# edited\n")
    assert kernel_source_hash("indexer_q", pkg) != before


@pytest.mark.parametrize("edit", ["kernels/dequant_gather/reference.py", "kernels/indexer_q/NOTES.md",
                                  "jit/kernel.py", "kernels/indexer_q/bench.py"])
def test_kernel_source_hash_ignores_other_files(tmp_path, edit):
    pkg = fake_package(tmp_path)
    before = kernel_source_hash("indexer_q", pkg)
    path = pkg / edit
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((path.read_bytes() if path.exists() else b"") + b"\n# edited\n")
    assert kernel_source_hash("indexer_q", pkg) == before


def test_kernel_source_hash_follows_imports_not_mentions(tmp_path):
    """A folder that imports another kernel folder hashes it too (the C4 compressors import the
    encoders); a docstring that only names one does not."""
    pkg = fake_package(tmp_path)
    spec = pkg / "kernels" / "indexer_q" / "spec.py"
    before = kernel_source_hash("indexer_q", pkg)
    spec.write_text(spec.read_text() + '\n"""See dsv4kit.kernels.dequant_gather for the gather."""\n')
    mention = kernel_source_hash("indexer_q", pkg)
    assert "kernels/dequant_gather/reference.py" not in kernel_source_files("indexer_q", pkg)
    spec.write_text(spec.read_text() + "from dsv4kit.kernels.dequant_gather import reference  # noqa\n")
    assert "kernels/dequant_gather/reference.py" in kernel_source_files("indexer_q", pkg)
    assert len({before, mention, kernel_source_hash("indexer_q", pkg)}) == 3


def test_kernel_source_hash_unknown_family():
    with pytest.raises(ValueError, match="unknown kernel family 'nope'.*indexer_q"):
        kernel_source_hash("nope")
    with pytest.raises(ValueError, match="unknown kernel family"):
        kernel_source_hash("../backends")


# --------------------------------------------------------------------------- Recorded


def test_status_current_stale_and_hashless(tmp_path):
    pkg = fake_package(tmp_path / "pkg")
    h = kernel_source_hash("indexer_q", pkg)
    line = "recorded at 0123456789 on NVIDIA H200, 2026-12-01T00:00:00+00:00"
    current = Recorded.from_path(
        write_record(tmp_path / "cur", family="indexer_q", kernel_source_hash=h), pkg)
    hashless = Recorded.from_path(write_record(tmp_path / "old"), pkg)
    assert current.family == ("indexer_q",) and current.kernel_source_hash == h
    assert current.status("indexer_q") == current.status() == line and current.current("indexer_q")
    assert hashless.status("indexer_q") == line + ", kernel source hash not recorded"
    assert not hashless.current("indexer_q") and hashless.kernel_source_hash is None
    with pytest.raises(ValueError, match="name the kernel family"):
        hashless.status()
    with pytest.raises(ValueError, match="records family indexer_q, not dequant_gather"):
        current.status("dequant_gather")

    (pkg / "kernels" / "indexer_q" / "triton.py").write_text("# changed\n")
    assert current.status("indexer_q") == line + ", kernel source changed since"
    assert not current.current("indexer_q")


def test_status_several_families(tmp_path):
    pkg = fake_package(tmp_path / "pkg")
    fams = ("indexer_q", "dequant_gather")
    rec = Recorded.from_path(write_record(
        tmp_path / "replay", kernel_source_hash={f: kernel_source_hash(f, pkg) for f in fams}), pkg)
    assert rec.family == fams and rec.current(fams) and rec.current()
    (pkg / "kernels" / "dequant_gather" / "triton.py").write_text("# changed\n")
    assert rec.current("indexer_q") and not rec.current(fams)
    assert rec.status(fams).endswith(", kernel source changed since (dequant_gather)")


def test_json_file_records(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"provenance": {"device": "NVIDIA H200", "commit": "abc",
                                                                  "date": "d"}, "numbers": [1]}))
    (tmp_path / "top.json").write_text(json.dumps({"device": "NVIDIA H200", "date": "d", "commit": "abc",
                                                   "versions": {"torch": "2.11"}, "battery": [1, 2]}))
    (tmp_path / "none.json").write_text(json.dumps({"numbers": [1]}))
    run = results.load("run.json", root=tmp_path)
    assert run.read_json()["numbers"] == [1] and run.file("run.csv") == tmp_path / "run.csv"
    top = results.load("top.json", root=tmp_path)
    assert top.versions == {"torch": "2.11"} and "battery" not in top.provenance
    assert top.status("rowquant") == "recorded at abc on NVIDIA H200, d, kernel source hash not recorded"
    with pytest.raises(ValueError, match="not a record"):
        results.load("none.json", root=tmp_path)


@pytest.mark.parametrize("nested", [True, False])
def test_a_cpu_smoke_record_says_so(tmp_path, nested):
    """A script's --cpu-smoke output left among the records is never read as a GPU measurement."""
    prov = {"device": "cpu", "commit": "abc", "date": "d", "cpu_smoke": True}
    (tmp_path / "smoke.json").write_text(json.dumps({"provenance": prov} if nested else prov))
    rec = results.load("smoke.json", root=tmp_path)
    assert rec.provenance["cpu_smoke"] is True
    assert rec.status("rowquant").startswith("CPU SMOKE RUN, not a GPU measurement: recorded at abc on cpu")


@pytest.mark.parametrize("relpath, family", [("indexer_q_h200.json", "indexer_q"),
                                             ("dequant_gather", "dequant_gather"),
                                             ("replay_h200", ("save_partial_states", "indexer_q",
                                                              "dequant_gather")),
                                             ("save_partial_states_h200", "save_partial_states"),
                                             ("backends_h200.json", "rowquant")])
def test_checkout_records(relpath, family):
    rec = results.load(relpath)
    assert rec is not None, results.not_found_message(relpath)
    assert rec.device == "NVIDIA H200" and rec.versions["triton"] == "3.6.0"
    assert rec.status(family).startswith(f"recorded at {rec.commit[:10]} on NVIDIA H200, {rec.date}")
    assert rec.date.startswith(("2026-11-30T", "2026-12-01T", "2026-12-02T", "2026-12-03T", "2026-12-04T"))


# --------------------------------------------------------------------------- installed package


def _source_copy(dest: Path) -> Path:
    """What a user without the git history builds from: the packaging files, the package, the results."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(PACKAGE, dest / "dsv4kit", ignore=IGNORE)
    shutil.copytree(REPO / "benchmarks" / "results", dest / "benchmarks" / "results")
    return dest


def test_installed_package_ships_results(tmp_path):
    src, site, elsewhere = _source_copy(tmp_path / "src"), tmp_path / "site", tmp_path / "cwd"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "PYTHONPATH")}
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(site), str(src)],
                   check=True, cwd=elsewhere, env=env, capture_output=True)
    probe = ("import json, dsv4kit, dsv4kit.results as r; rec = r.load('replay_h200'); "
             "print(json.dumps({'pkg': dsv4kit.__file__, 'dir': str(r.results_dir()), "
             "'status': rec.status(('indexer_q', 'dequant_gather')), "
             "'configs': len(rec.read_json('report.json')['results']), "
             "'hash': r.kernel_source_hash('indexer_q')}))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, cwd=elsewhere, capture_output=True,
                         text=True, env=env | {"PYTHONPATH": str(site)}).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert Path(got["pkg"]).parent == site / "dsv4kit"
    assert got["dir"] == str(site / "dsv4kit" / results.SHIPPED_DIR)
    assert got["status"].startswith(f"recorded at {results.load('replay_h200').commit[:10]} on NVIDIA H200")
    want = json.loads((REPO / "benchmarks/results/replay_h200/report.json").read_text())
    assert got["configs"] == len(want["results"])
    assert got["hash"] == kernel_source_hash("indexer_q", src / "dsv4kit")   # the installed files, hashed
    shipped, recorded = site / "dsv4kit" / results.SHIPPED_DIR, src / "benchmarks" / "results"
    # pip byte-compiles a record's own .py (a collector): its __pycache__ is the install's, not a result
    installed = sorted(p.relative_to(shipped) for p in shipped.rglob("*") if "__pycache__" not in p.parts)
    assert installed == sorted(p.relative_to(recorded) for p in recorded.rglob("*"))


def test_sdist_carries_results(tmp_path):
    src, out = _source_copy(tmp_path / "src"), tmp_path / "dist"
    out.mkdir()
    build = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
    name = subprocess.run([sys.executable, "-c", build], check=True, cwd=src, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    with tarfile.open(out / name) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "MANIFEST.in", "benchmarks/results/replay_h200/report.json",
            "benchmarks/results/dequant_gather/provenance.json"} <= names
