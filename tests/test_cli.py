"""The ``dsv4kit`` command: warmup and coverage for DSv4-Flash, exit codes and messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_main

REPO = Path(__file__).resolve().parent.parent


def test_warmup_flash_sm90a(capsys) -> None:
    rc, out, _ = run_main(capsys, "warmup", "--preset", "flash", "--arch", "sm_90a", "--no-progress",
                          "--keys")
    assert rc == 0
    assert "DSv4-Flash: 43 layers (2 SWA, 21 C4, 20 C128)" in out
    rows = [line.split() for line in out.splitlines()]
    lines = {r[0]: r for r in rows if len(r) > 3 and r[1] == "triton"}
    assert lines["IndexerQFp8Triton"][1:4] == ["triton", "21", "4"]     # backend, registrations, keys
    assert lines["DequantGatherTriton"][1:4] == ["triton", "43", "3"]
    assert lines["SavePartialStatesTriton"][1:4] == ["triton", "41", "3"]   # K4: main C4, C128, indexer
    assert "7 kernel(s), 14 key(s)" in out and "0 failure(s)" in out
    assert "(block_size=256, has_gather_lens=True)" in out             # --keys: one line per key


def test_coverage_flash_sm90a_zero_misses(capsys, tmp_path) -> None:
    plot, js = tmp_path / "cov.png", tmp_path / "cov.json"
    rc, out, _ = run_main(capsys, "coverage", "--no-progress", "--steps", "16", "--plot", str(plot),
                          "--json", str(js))
    assert rc == 0
    assert "coverage OK: 0 missed key(s), 2 dead key(s)" in out
    assert "dead   IndexerQFp8Triton (head_dim=128, rope_dim=64, num_heads=64, cos_sin_dtype=bfloat16" in out
    assert plot.stat().st_size > 10_000 and js.read_text().count('"ok": true') == 1


def test_coverage_decode_trace_names_dead_reasons(capsys) -> None:
    rc, out, _ = run_main(capsys, "coverage", "--no-progress", "--trace", "decode", "--steps", "8")
    assert rc == 0
    assert "coarsen-4 never requested by this trace (largest batch 256 tokens < 512)" in out
    assert "no prefill in this trace: K3 gathers only on the sparse-MLA prefill path" in out


def test_coverage_mxfp4_pro_sm100a(capsys) -> None:
    rc, out, _ = run_main(capsys, "coverage", "--no-progress", "--preset", "pro", "--arch", "sm_100a",
                          "--indexer-cache", "mxfp4", "--cache-dtype", "fp8", "--block-size", "64",
                          "--steps", "8")
    assert rc == 0 and "IndexerQMxfp4Triton" in out and "DequantGather" not in out.split("warmup (")[1]
    assert "coverage OK" in out


@pytest.mark.parametrize("drill,field", [
    (["--warmup-cos-sin-dtypes", "bfloat16"], "cos_sin_dtype: warmed bfloat16, requested float32"),
    (["--warmup-block-size", "64"], "block_size: warmed 64, requested 256"),
])
def test_coverage_miss_exits_1_and_names_the_field(capsys, drill, field) -> None:
    rc, out, _ = run_main(capsys, "coverage", "--no-progress", "--steps", "4", *drill)
    assert rc == 1
    assert "misconfiguration drill" in out and field in out and "coverage FAILED" in out


@pytest.mark.parametrize("argv,message", [
    (["warmup", "--preset", "dsv3"], "unknown preset 'dsv3': expected one of flash, pro"),
    (["warmup", "--arch", "sm_90"],
     "unknown arch 'sm_90': expected one of sm_90a, sm_100a (did you mean sm_90a?)"),
    (["warmup", "--arch", "sm_80"], "unknown arch 'sm_80'"),
    (["coverage", "--cache-dtype", "fp8_e5m2"], "unsupported KV cache dtype 'fp8_e5m2'"),
    (["warmup", "--block-size", "96"], "block size 96 is not a power of two"),
    (["warmup", "--block-size", "-2"], "block size -2 is not a power of two"),
    (["warmup", "--block-size", "x"], "block size 'x' is not an integer"),
    (["coverage", "--max-model-len", "4096", "--max-context", "8192"],
     "a trace of 8192 tokens is longer than the max model length (4096"),
    (["warmup", "--max-num-seqs", "512", "--max-batched-tokens", "256"], "max_num_seqs: expected <= "
                                                                         "max_num_batched_tokens"),
    (["warmup", "--max-model-len", str(2**21)], "max_model_len: expected <= 1048576"),
    (["coverage", "--steps", "0"], "expected an integer >= 1, got 0"),
    (["coverage", "--trace", "burst"], "invalid choice: 'burst'"),
    (["warmup", "--warmup-cos-sin-dtypes", "float16"], "expected a comma list of float32, bfloat16"),
    (["warmup", "--device", "cpu", "--backend", "cutedsl"], "CuTeDSL kernels run only on a GPU"),
])
def test_bad_input_exits_2(capsys, argv, message) -> None:
    rc, out, err = run_main(capsys, *argv)
    assert rc == 2
    assert message in err and "usage: dsv4kit" in err
    assert "warmup (" not in out        # nothing compiled


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_device_cuda_without_gpu_is_a_compile_only_gpu_warmup(capsys) -> None:
    """--device cuda on a CPU machine: register and compile what an sm_100a process would (CuTeDSL)."""
    rc, out, _ = run_main(capsys, "coverage", "--device", "cuda", "--arch", "sm_100a", "--no-progress",
                          "--steps", "4")
    assert rc == 0
    assert "platform cuda sm_100a: no device, compile only" in out
    assert "IndexerQFp8CuTeDSL" in out and "DequantGatherCuTeDSL" in out and "Triton " not in out
    assert "coverage OK" in out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_launch_needs_a_gpu(capsys) -> None:
    rc, _, err = run_main(capsys, "coverage", "--launch")
    assert rc == 2 and "--launch: needs a CUDA device" in err


def test_jobs_compile_in_worker_processes_into_the_store(tmp_path) -> None:
    """--jobs 2 compiles the keys in two processes into the artifact store, then loads them; a second
    run is all hits.

    Run as a user would, in a fresh process: the in-process load must find every entry the
    workers wrote (a test process that earlier tests changed could miss some and recompile)."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    cmd = [sys.executable, "-m", "dsv4kit", "warmup", "--no-progress", "--jobs", "2", "--arch", "sm_100a",
           "--cache-dir", str(tmp_path / "store")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    rc, out = proc.returncode, proc.stdout
    assert rc == 0 and "store: 0 hit(s), 14 compiled (14 in 2 worker processes, --jobs 2)" in out, \
        proc.stderr[-2000:]
    assert "0 failure(s)" in out
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "store: 14 hit(s), 0 compiled" in again.stdout, again.stderr[-2000:]


def test_entry_point_and_module() -> None:
    """The installed ``dsv4kit`` script and ``python -m dsv4kit`` both run the CLI."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    exe = Path(sys.executable).parent / "dsv4kit"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "dsv4kit"]
    ok = subprocess.run([*cmd, "warmup", "--no-progress"], capture_output=True, text=True, env=env, cwd=REPO)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "0 failure(s)" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "dsv4kit", "warmup", "--cache-dtype", "fp8_e5m2"],
                         capture_output=True, text=True, env=env, cwd=REPO)
    assert bad.returncode == 2 and "unsupported KV cache dtype 'fp8_e5m2'" in bad.stderr


def test_warmup_failure_exits_1(capsys, monkeypatch) -> None:
    """A key that fails to compile: every other key is still tried, the table says so, exit code 1."""
    from dsv4kit.kernels.dequant_gather.triton import DequantGatherTriton

    real = DequantGatherTriton.compile

    def broken(self, key):
        if key.block_size == 2:
            raise RuntimeError("ptxas exploded")
        return real(self, key)

    monkeypatch.setattr(DequantGatherTriton, "compile", broken)
    # --no-cache: a store hit would load the key without calling compile.
    rc, out, err = run_main(capsys, "warmup", "--no-progress", "--no-cache")
    assert rc == 1
    assert "14 key(s)" in out and "1 failure(s)" in out
    assert "FAILED DequantGatherTriton" in err and "ptxas exploded" in err
    rc, out, _ = run_main(capsys, "coverage", "--no-progress", "--no-cache", "--steps", "2")
    assert rc == 1 and "coverage" not in out.split("failure(s)")[-1]    # no replay after a failed warmup
