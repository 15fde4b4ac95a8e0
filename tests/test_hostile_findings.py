"""Each finding of the hostile CPU run (issue 11) as a test that failed before its fix."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

import numpy as np
import pytest
from cli_run import run_main
from triton import knobs

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.jit import JitMonitor, WarmupRegistry
from dsv4kit.kernels.dequant_gather.cases import make_case as k3_case
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.dequant_gather.triton import DequantGatherTriton
from dsv4kit.kernels.indexer_q.cases import make_case as iq_case
from dsv4kit.kernels.indexer_q.spec import IndexerQBase
from dsv4kit.kernels.indexer_q.triton import IndexerQFp8Triton
from dsv4kit.kernels.toy import ToyRowScale
from dsv4kit.ops import dequantize_and_gather_k_cache, indexer_q_rope_quant
from dsv4kit.platform import cpu_platform

CPU = cpu_platform("sm_90a")
IQ = IndexerQBase.CompileKey
K3 = DequantGatherBase.CompileKey


# --------------------------------------------------------------------------- threads


def test_aot_compile_while_another_thread_interprets(tmp_path, monkeypatch) -> None:
    """The interpreter patches triton.language process-wide; a compile in another thread used to
    fail every time (`builder has no attribute 'get_uint8_ty'`). Both now take one lock."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))   # cold compiles: code generation runs
    iq = IndexerQFp8Triton(CPU)
    case = iq_case(3, seed=1)
    stop, errors = threading.Event(), []

    def interpret() -> None:
        while not stop.is_set():
            try:
                iq(*case.args())
            except Exception as exc:  # noqa: BLE001 - recorded, the assert below names it
                errors.append(exc)

    worker = threading.Thread(target=interpret)
    worker.start()
    try:
        k3 = DequantGatherTriton(CPU)
        for bs in (8, 32, 128):                                 # new block sizes: fresh compiles
            k3.compile_for(K3(bs, False), "sm_90a")
    finally:
        stop.set()
        worker.join()
    assert errors == []


# --------------------------------------------------------------------------- a bad index on CPU


def test_out_of_range_position_with_default_arguments_is_an_error_not_a_crash() -> None:
    code = ("import torch\nfrom dsv4kit.ops import indexer_q_rope_quant\n"
            "try:\n"
            "    bf16 = torch.bfloat16\n"
            "    indexer_q_rope_quant(torch.full((5,), 2**40), torch.zeros(5, 64, 128, dtype=bf16),\n"
            "                         torch.zeros(64, 64), torch.zeros(5, 64, dtype=bf16))\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-800:]}"      # 139 was a segfault
    # raised by the kernel's value check, named after the op the user called
    want = "KernelInputError indexer_q_rope_quant: positions: expected values in [0, 64)"
    assert out.stdout.startswith(want)


# --------------------------------------------------------------------------- warmup


def test_one_bad_registered_key_is_reported_with_the_others() -> None:
    kernel = IndexerQFp8Triton(CPU)
    good = IQ(cos_sin_dtype="float32", coarsen=1)
    reg = WarmupRegistry()
    reg.register(kernel, [IQ(head_dim=64, cos_sin_dtype="float32", coarsen=1), K3(16, True), good])
    report = reg.warmup(progress=False, raise_on_failure=False)
    assert not report.ok and len(report.failures) == 2
    errors = [f.error for f in report.failures]
    assert any("KernelInputError: IndexerQFp8Triton: head_dim: expected 128 (fixed), got 64" in e
               for e in errors)
    assert any(e.startswith("TypeError: IndexerQFp8Triton: dispatch must return") for e in errors)
    assert good in kernel.compiled_keys()                       # the good key still compiled


# --------------------------------------------------------------------------- monitors


@pytest.fixture
def toy():
    ToyRowScale.clear_cache()
    k = ToyRowScale()
    k.warmup(keys=[ToyRowScale.CompileKey("float32", 128, 1)])
    yield k
    ToyRowScale.clear_cache()


def _unwarmed(k):
    return k._get_or_compile(ToyRowScale.CompileKey("float32", 256, 1))


def test_reentering_a_monitor_keeps_it_armed(toy) -> None:
    m = JitMonitor("error")
    with m:
        with m:
            pass
        assert m.armed
        with pytest.raises(UnwarmedKeyError):
            _unwarmed(toy)
    assert not m.armed


@pytest.mark.parametrize("inner_mode", ["off", "warn"])
def test_an_inner_monitor_cannot_weaken_an_outer_error(toy, inner_mode) -> None:
    with JitMonitor("error") as outer, JitMonitor(inner_mode):
        with pytest.raises(UnwarmedKeyError):
            _unwarmed(toy)
    assert len(outer.events) == 1


def test_disarming_out_of_order_restores_the_users_hook() -> None:
    def mine(**kw):
        return None

    saved = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = mine
    try:
        a, b = JitMonitor("error").arm(), JitMonitor("warn").arm()
        a.disarm()
        assert knobs.runtime.jit_cache_hook is not mine          # b is still armed
        b.disarm()
        assert knobs.runtime.jit_cache_hook is mine
    finally:
        knobs.runtime.jit_cache_hook = saved


def test_warn_mode_never_offers_a_runtime_compile_as_the_nearest_warmed_key(toy, caplog) -> None:
    with caplog.at_level(logging.WARNING, "dsv4kit.jit"), JitMonitor("warn") as m:
        toy._get_or_compile(ToyRowScale.CompileKey("float32", 256, 1))     # compiled at runtime
        toy._get_or_compile(ToyRowScale.CompileKey("float32", 256, 4))
    assert len(m.events) == 2
    assert "nearest warmed key (dtype=float32, width=128, coarsen=1)" in caplog.records[-1].getMessage()


# --------------------------------------------------------------------------- scalars and names


def test_scalars_are_validated_by_the_argument_table() -> None:
    args = iq_case(3, seed=2).args()
    for bad, got in (("0.5", "'0.5'"), (None, "None"), ([0.5], "list")):
        with pytest.raises(KernelInputError, match=f"softmax_scale: expected a real number, got {got}"):
            indexer_q_rope_quant(*args, softmax_scale=bad)
    case = k3_case([9], block_size=16)
    out, cache, seq, glen, bt, bs, off = case.args()
    dequantize_and_gather_k_cache(out, cache, seq, glen, bt, np.int64(bs), np.int64(off))   # numpy ints
    with pytest.raises(KernelInputError, match="block_size: expected an int, got '16'"):      # quoted
        dequantize_and_gather_k_cache(out, cache, seq, glen, bt, "16", off)


def test_device_errors_name_the_tensor() -> None:
    pos, q, cs, w = iq_case(3, seed=3).args()
    with pytest.raises(KernelInputError, match="positions: expected a cpu or cuda tensor, got device meta"):
        indexer_q_rope_quant(pos.to("meta"), q, cs, w)
    with pytest.raises(KernelInputError, match=r"index_q: expected device cpu \(the device of positions\)"):
        indexer_q_rope_quant(pos, q.to("meta"), cs, w)
    with pytest.raises(KernelInputError, match="backend: expected 'triton'.*'cutedsl' with positions on cpu"):
        indexer_q_rope_quant(pos, q, cs, w, backend="cutedsl")


# --------------------------------------------------------------------------- CLI


def test_cli_checks_output_paths_before_the_work(capsys, tmp_path) -> None:
    (tmp_path / "a_file").write_text("")                         # a file where a folder should be
    rc, out, err = run_main(capsys, "warmup", "--no-progress", "--json", str(tmp_path / "a_file" / "r.json"))
    assert rc == 2 and "--json: cannot create" in err and out == ""   # nothing warmed first
    rc, _, err = run_main(capsys, "coverage", "--no-progress", "--plot", str(tmp_path))
    assert rc == 2 and "is a directory" in err


def test_cli_plot_without_suffix_says_the_file_it_wrote(capsys, tmp_path) -> None:
    rc, out, _ = run_main(capsys, "coverage", "--no-progress", "--steps", "2", "--plot",
                          str(tmp_path / "cov"))
    assert rc == 0 and f"coverage figure written to {tmp_path / 'cov.png'}" in out
    assert (tmp_path / "cov.png").stat().st_size > 0


def test_cli_honours_dsv4kit_arch_and_bounds_the_block_size(capsys, monkeypatch) -> None:
    monkeypatch.setenv("DSV4KIT_ARCH", "sm_80")
    rc, _, err = run_main(capsys, "warmup", "--no-progress")
    assert rc == 2 and "$DSV4KIT_ARCH: unknown arch 'sm_80'" in err
    monkeypatch.delenv("DSV4KIT_ARCH")
    rc, _, err = run_main(capsys, "warmup", "--no-progress", "--block-size", str(2**40))
    assert rc == 2 and "larger than 65536" in err
