"""``dsv4kit warmup --cache-dir`` (hit/compiled per key) and ``dsv4kit cache``: ls, verify, clear,
export, import."""

from __future__ import annotations

import pytest
from cli_run import run_main

from dsv4kit.cli import main
from dsv4kit.jit import store as store_mod


def run(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and everything the command printed (stdout, then stderr)."""
    rc, out, err = run_main(capsys, *argv)
    return rc, out + err


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A store filled by one cold CLI warmup (DSv4-Flash, CPU, sm_90a), and that run's output."""
    root = tmp_path_factory.mktemp("store")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton")))
    try:
        rc = main(["warmup", "--no-progress", "--keys", "--jobs", "1", "--cache-dir", str(root)])
    finally:
        mp.undo()
    assert rc == 0
    return root


def test_second_warmup_is_all_hits(capsys, filled, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "empty-triton-cache"))
    rc, out = run(capsys, "warmup", "--no-progress", "--keys", "--cache-dir", str(filled))
    assert rc == 0 and "store: 14 hit(s), 0 compiled" in out and f"artifact store: {filled}" in out
    key_lines = [line for line in out.splitlines() if "  regs " in line]
    assert len(key_lines) == 14 and all(line.rstrip().endswith(" hit") for line in key_lines)
    table = {line.split()[0]: line.split() for line in out.splitlines() if " triton " in line}
    assert table["IndexerQFp8Triton"][-1] == "4/4" and table["DequantGatherTriton"][-1] == "3/3"


def test_no_cache_and_cache_dir_select_the_store(tmp_path) -> None:
    from dsv4kit.cli import _store, build_parser

    parse = build_parser().parse_args
    assert _store(parse(["warmup", "--no-cache"])) is None
    assert _store(parse(["coverage", "--cache-dir", str(tmp_path)])).root == tmp_path
    assert _store(parse(["warmup"])).root == store_mod.default_cache_dir()


def test_ls_and_verify_clean(capsys, filled) -> None:
    rc, out = run(capsys, "cache", "ls", "--cache-dir", str(filled))
    assert rc == 0 and "14 entries" in out and "DequantGatherTriton" in out and "sm_90a" in out
    assert "(block_size=256, has_gather_lens=True)" in out
    rc, out = run(capsys, "cache", "verify", "--cache-dir", str(filled))
    assert rc == 0 and "14 entries, 0 corrupt, 0 stale" in out


def test_verify_lists_stale_and_corrupt(capsys, filled, tmp_path, monkeypatch) -> None:
    tar = tmp_path / "s.tar"
    assert run(capsys, "cache", "export", str(tar), "--cache-dir", str(filled))[0] == 0
    copy = tmp_path / "copy"
    rc, out = run(capsys, "cache", "import", str(tar), "--cache-dir", str(copy))
    assert rc == 0 and "imported 14 entries" in out
    real = store_mod.source_hash
    monkeypatch.setattr(store_mod, "source_hash",
                        lambda cls: "f" * 64 if cls.__name__ == "DequantGatherTriton" else real(cls))
    victim = next(e for e in store_mod.ArtifactStore(copy).entries() if e.kernel == "C128CompressTriton")
    (victim.path / next(n for n in victim.files if n.endswith(".ptx"))).write_text("garbage")
    rc, out = run(capsys, "cache", "verify", "--cache-dir", str(copy))
    assert rc == 1 and "14 entries, 1 corrupt, 3 stale" in out
    assert out.count("stale: DequantGatherTriton") == 3 and "corrupt: C128CompressTriton" in out
    assert "kernel source changed" in out and "has 7 bytes, the manifest says" in out
    rc, out = run(capsys, "cache", "clear", "--stale", "--cache-dir", str(copy))
    assert rc == 0 and "removed 4" in out
    assert run(capsys, "cache", "verify", "--cache-dir", str(copy))[0] == 0
    rc, out = run(capsys, "cache", "clear", "--cache-dir", str(copy))
    assert rc == 0 and "removed 10" in out and store_mod.ArtifactStore(copy).entries() == []


def test_import_of_a_missing_file_is_a_usage_error(capsys, tmp_path) -> None:
    rc, out = run(capsys, "cache", "import", str(tmp_path / "nope.tar"), "--cache-dir", str(tmp_path))
    assert rc == 2 and out.strip() == f"dsv4kit cache import: {tmp_path / 'nope.tar'}: no such file"


@pytest.mark.parametrize("cores, jobs", [(1, 1), (2, 1), (3, 3), (16, 16)])
def test_jobs_default_is_the_available_cores_above_two(monkeypatch, cores, jobs) -> None:
    from dsv4kit import platform
    from dsv4kit.cli import build_parser

    monkeypatch.setattr(platform, "available_cores", lambda: cores)
    assert build_parser().parse_args(["warmup"]).jobs == jobs


def test_available_cores_follows_a_cgroup_quota(tmp_path) -> None:
    from dsv4kit.platform import available_cores

    unlimited = available_cores(str(tmp_path / "absent"))
    (tmp_path / "cpu.max").write_text("200000 100000\n")          # 2 CPUs of quota
    assert available_cores(str(tmp_path / "cpu.max")) == min(2, unlimited)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(str(tmp_path / "cpu.max")) == unlimited
    (tmp_path / "cpu.max").write_text("50000 100000\n")           # half a CPU: still one worker
    assert available_cores(str(tmp_path / "cpu.max")) == 1
