"""dsv4kit.bench_cli: ``bench`` (argument parsing, family selection, the CPU exit, the sweep's rows
from fake timings) and ``inspect`` (a cheap Triton key compiled for sm_90a on CPU)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from dsv4kit import bench, bench_cli
from dsv4kit.bench_schema import SCHEMA, make_row, read_results
from dsv4kit.kernels.indexer_q.bench import indexer_q_bytes
from dsv4kit.kernels.rowquant.bench import rowquant_bytes

ROWQUANT_KEY = ["n_cols=512", "x_stride_class=div16", "rows_per_program=1"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsv4kit")
    bench_cli.add_bench_parsers(p.add_subparsers(dest="command", required=True))
    return p


# --------------------------------------------------------------------------- bench: CPU parts


def test_bench_arguments():
    a = _parser().parse_args(["bench", "--family", "indexer_q,rowquant", "--family", "c4_compress_plain",
                              "--backend", "triton", "--sizes", "1,8, 4096", "--json", "x.json"])
    assert a.family == ["indexer_q", "rowquant", "c4_compress_plain"]
    assert a.sizes == (1, 8, 4096) and a.backend == "triton" and a.handler is bench_cli.cmd_bench
    assert _parser().parse_args(["bench"]).family is None


@pytest.mark.parametrize("bad", ["0", "1,x", ""])
def test_bench_bad_sizes_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["bench", "--sizes", bad])
    assert e.value.code == 2


def test_family_selection():
    assert [p.name for p in bench.select_plans(None)] == list(bench.PLANS)
    assert [p.name for p in bench.select_plans(["rowquant", "indexer_q"])] == ["indexer_q", "rowquant"]
    assert [p.name for p in bench.select_plans(["indexer_compress", "c4_compress_ds_mla"])] == ["c4_compress"]
    with pytest.raises(ValueError, match="not a family"):
        bench.select_plans(["nope"])
    assert [p.name for p in bench.select_plans(["store_rows_ds", "c128_norm_rope_store_plain"])] == [
        "c128_store", "store_rows"]


def test_a_family_without_a_plan_is_named(monkeypatch, capsys):
    monkeypatch.setattr(bench, "PLANS", {k: v for k, v in bench.PLANS.items() if k != "store_rows"})
    with pytest.raises(ValueError, match="without a sweep plan"):
        bench.select_plans(["store_rows_ds"])
    assert bench_cli.main(["bench", "--family", "store_rows_plain"]) == 2
    assert "without a sweep plan" in capsys.readouterr().err


def test_plans_are_the_family_folders_plans():
    """PLANS gathers each folder's ``bench.py`` PLANS through the specs; every family is timed by
    exactly one plan, of its own folder."""
    from dsv4kit.kernels import FAMILY_FOLDERS, families

    assert bench.family_plans() == bench.PLANS
    owner = {}
    for spec in families():
        mine = [p for p in spec.bench_plans() if spec.name in p.families]
        assert len(mine) == 1, spec.name
        owner[spec.name] = mine[0].name
        for p in spec.bench_plans():
            assert bench.PLANS[p.name] is p
            assert {FAMILY_FOLDERS[f] for f in p.families} == {spec.folder or spec.name}, p.name
    assert sorted(owner) == sorted(FAMILY_FOLDERS)


def test_the_op_path_imports_no_sweep_and_the_harness_no_family():
    import subprocess
    import sys

    for code in ("import sys, dsv4kit.ops; assert not [m for m in sys.modules if m.startswith('dsv4kit') "
                 "and m.endswith('.bench')]",
                 "import sys, dsv4kit.bench; "
                 "assert not [m for m in sys.modules if m.startswith('dsv4kit.kernels.')]"):
        subprocess.run([sys.executable, "-c", code], check=True)


def test_every_plan_builds_valid_op_arguments_on_cpu():
    """Each plan's points at its two smallest sizes build arguments the op's table accepts."""
    from dsv4kit.kernels import family

    for plan in bench.PLANS.values():
        for size in plan.default_sizes()[:1]:
            for pt in plan.points(size):
                spec = family(pt.family)
                values, _ = spec.bind(**pt.build("cpu"))
                assert pt.nbytes > 0 and pt.size == size
                if spec.variant_arg:
                    assert values[spec.variant_arg] in spec.variants


def test_every_plan_times_its_largest_size_out_of_l2():
    """Graph replays re-read one set of buffers: at each plan's largest size every point moves at
    least L2_MULTIPLE H200 L2s of bytes, or the plan says why it cannot (and only c128_store does)."""
    floor = bench.L2_MULTIPLE * bench.H200_L2_BYTES
    exempt = [p.name for p in bench.PLANS.values() if p.in_l2_why]
    assert exempt == ["c128_store"]
    for plan in bench.PLANS.values():
        if plan.in_l2_why:
            continue
        points = plan.points(max(plan.sizes))
        small = [(pt.kernel, pt.config, pt.nbytes) for pt in points if pt.nbytes < floor]
        assert not small, (plan.name, small)


def test_l2_resident_points_are_marked_in_the_log(monkeypatch):
    """A point under L2_MULTIPLE L2s is logged with an L2 mark; one above is not."""
    from dsv4kit.platform import cpu_platform

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda nbytes=0: 4000.0)
    monkeypatch.setattr(bench, "empty_kernel_us", lambda rep_ms=100: 0.5)
    monkeypatch.setattr(bench, "provenance", lambda extra=None: {"l2_cache_bytes": bench.H200_L2_BYTES})
    monkeypatch.setattr(bench, "_time", lambda fn, graph, rep_ms: (10.0, "fake", ""))
    (small,) = bench.PLANS["rowquant"].points(8)

    def points(size):  # the size's bytes claimed, the small case's arguments built
        return [bench.Point(small.family, small.kernel, small.config, size, size,
                            lambda dev: small.build("cpu"))]

    plan = bench.SweepPlan("rowquant", ("rowquant",), (), points)
    floor = bench.L2_MULTIPLE * bench.H200_L2_BYTES
    lines: list[str] = []
    bench.run_sweep([plan], backends=("triton",), sizes=(floor - 1, floor), reference=False,
                    platform=cpu_platform(), log=lines.append)
    rows = [ln.split() for ln in lines if ln.startswith("rowquant ")]
    assert len(rows) == 4, lines
    assert [r[-1] == "L2" for r in rows] == [True, True, False, False], rows


def test_bench_without_gpu_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(bench_cli, "_has_cuda", lambda: False)
    assert bench_cli.main(["bench", "--family", "indexer_q"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA device" in err and "Nothing was timed" in err and "indexer_q" in err


def test_bench_unknown_family_exits_2(capsys):
    assert bench_cli.main(["bench", "--family", "nope"]) == 2
    assert "not a family" in capsys.readouterr().err


def test_run_sweep_rows_from_fake_timings(monkeypatch):
    """The sweep's control flow on CPU: fake GPU, timings and copy; real plan points and ops."""
    from dsv4kit.platform import cpu_platform

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda nbytes=0: 4000.0)
    monkeypatch.setattr(bench, "empty_kernel_us", lambda rep_ms=100: 0.5)
    monkeypatch.setattr(bench, "provenance", lambda extra=None: {"device": "fake", "commit": "0" * 40,
                                                                  **(extra or {})})
    seen: list[bool] = []

    def timed(fn, graph, rep_ms):  # kernel, op, reference per point, in that order
        seen.append(graph)
        return (10.0, 50.0, 1000.0)[(len(seen) - 1) % 3], "fake", ""

    base = bench.PLANS["rowquant"]
    plan = bench.SweepPlan("rowquant", base.families, (8,),
                           lambda m: [bench.Point(p.family, p.kernel, p.config, p.size, p.nbytes,
                                                  lambda dev, p=p: p.build("cpu")) for p in base.points(m)],
                           decode_sizes=(1,), hash_family="rowquant")

    monkeypatch.setattr(bench, "_time", timed)
    res = bench.run_sweep([plan], backends=("triton",), compile_reference=False, platform=cpu_platform(),
                          log=lambda s: None)
    assert [r.size for r in res.rows] == [1, 1, 1, 8, 8, 8]
    assert [(r.backend, r.variant) for r in res.rows[:3]] == [
        ("triton", "kernel (graph replay)"), ("triton", "op"), ("torch", "reference (eager, validated)")]
    assert seen == [True, False, False] * 2  # the kernel row is the graph-replayed one
    k = res.rows[3]
    assert k.bytes == rowquant_bytes(8, 4096) and k.median_us == 10.0
    assert k.GBps == pytest.approx(k.bytes / 10e-6 / 1e9)
    assert k.fraction_of_copy == pytest.approx(k.GBps / 4000)
    assert [(d.size, d.kernel_us, d.over_empty_us) for d in res.decode] == [(1, 10.0, 9.5)]
    obj = res.to_json()
    assert obj["schema"] == SCHEMA and obj["provenance"]["kernel_source_hash"]["rowquant"]
    assert [h["host_us"] for h in obj["host"]] == [40.0, 40.0]


def test_cmd_bench_writes_json_csv_plot(monkeypatch, tmp_path, capsys):
    rows = [make_row("indexer_q", "indexer_q/fp8", b, v, t, indexer_q_bytes("fp8", t), us, 4000.0)
            for t in (1, 65536) for b in ("triton", "cutedsl")
            for v, us in (("kernel (graph replay)", 2.0 + t / 200), ("op", 40.0 + t / 190))]
    prov = {"device": "fake GPU", "commit": "abc", "kernel_source_hash": {"indexer_q": "h"}}
    fake = bench.BenchResult(prov, 4000.0, rows, [], 0.6)
    monkeypatch.setattr(bench_cli, "_has_cuda", lambda: True)
    monkeypatch.setattr(bench, "run_sweep", lambda plans, **kw: fake)
    out = tmp_path / "r.json"
    rc = bench_cli.main(["bench", "--family", "indexer_q", "--json", str(out),
                         "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "r.png")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "indexer_q/fp8" in text and "copy ceiling 4000 GB/s" in text
    prov, back, _, host = read_results(out)
    assert prov["kernel_source_hash"] == {"indexer_q": "h"} and len(back) == len(rows) and len(host) == 4
    assert (tmp_path / "r.csv").read_text().startswith("family,kernel,backend,variant,size,bytes,median_us")
    assert (tmp_path / "r.png").stat().st_size > 1000
    assert json.loads(out.read_text())["copy_GBps"] == 4000.0


# --------------------------------------------------------------------------- inspect


def test_inspect_regs(capsys):
    assert bench_cli.main(["inspect", "RowQuantTriton", *ROWQUANT_KEY, "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    assert "RowQuantTriton" in out and "target sm_90a" in out
    assert "registers:" in out and "spills: 0" in out


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_inspect_a_cutedsl_key(capsys, arch):
    """CuTeDSL keys compile for a named arch on CPU too; the report is the artifact's."""
    pytest.importorskip("cutlass")
    assert bench_cli.main(["inspect", "RowQuantCuTeDSL", *ROWQUANT_KEY, "--arch", arch]) == 0
    out = capsys.readouterr().out
    assert "RowQuantCuTeDSL" in out and f"target {arch}" in out
    assert "registers:" in out and "spills: 0" in out and "binaries: cubin" in out


def test_inspect_ptx_by_family_and_repr(capsys):
    key = "RowQuantBase.CompileKey(n_cols=512, x_stride_class='div16', rows_per_program=1)"
    assert bench_cli.main(["inspect", "rowquant", key, "--ptx"]) == 0
    out = capsys.readouterr().out
    assert ".target sm_90a" in out and ".entry" in out


@pytest.mark.skipif(bench_cli.sass_tool() is None, reason="no cuobjdump in this Triton wheel")
def test_inspect_sass(capsys):
    assert bench_cli.main(["inspect", "rowquant", ",".join(ROWQUANT_KEY), "--sass"]) == 0
    out = capsys.readouterr().out
    assert "sm_90a" in out and ("LDG" in out or "STG" in out)


def test_inspect_sass_without_tool_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(bench_cli, "sass_tool", lambda: None)
    assert bench_cli.main(["inspect", "rowquant", *ROWQUANT_KEY, "--sass"]) == 2
    assert "no cuobjdump" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["NoSuchKernel", "a=1"], "unknown kernel 'NoSuchKernel'"),
    (["RowQuantTriton"], "CompileKey fields: n_cols"),
    (["RowQuantTriton", "n_cols=512"], "missing field(s) x_stride_class, rows_per_program"),
    (["RowQuantTriton", *ROWQUANT_KEY, "bogus=1"], "has no field 'bogus'"),
    (["RowQuantTriton", "n_cols=abc", *ROWQUANT_KEY[1:]], "expected an integer"),
    (["RowQuantTriton", "n_cols 512"], "not understood"),
    (["rowquant", *ROWQUANT_KEY, "--variant", "other"], "unknown variant"),
    (["rowquant", *ROWQUANT_KEY, "--arch", "sm_91"], "unknown arch"),
])
def test_inspect_bad_input_exits_2(argv, message, capsys):
    assert bench_cli.main(["inspect", *argv]) == 2
    assert message in capsys.readouterr().err


def test_parse_key_types():
    from dsv4kit.kernels import family

    cls = family("indexer_q").kernel_class("fp8", "triton")
    key = bench_cli.parse_key(cls.CompileKey, ["head_dim=128, rope_dim=64, num_heads=64, "
                                               "cos_sin_dtype=float32, coarsen=1"])
    assert key == cls.CompileKey(head_dim=128, rope_dim=64, num_heads=64, cos_sin_dtype="float32", coarsen=1)
    assert bench_cli.find_kernel("indexer_q_rope_quant", "cutedsl", "mxfp4")[1:] == ("mxfp4", "cutedsl")


@pytest.mark.parametrize("plan_name", ["c4_compress", "c128_compress"])
def test_compressor_sweeps_run_tokens_in_request_order_and_compute_what_the_cases_do(plan_name):
    """The sweep sorts a compressor call's tokens by (request, position); the op on the sorted call
    writes, token for token, what it writes on the case's interleaved order (CPU interpreter)."""
    from dsv4kit.kernels import family

    for pt in bench.PLANS[plan_name].points(24):
        args = pt.build("cpu")
        key = args["token_to_req"].long() * (1 << 40) + args["positions"]
        assert torch.equal(key, key.sort().values), "tokens in (request, position) order"
        spec = family(pt.family)
        shuffled = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        perm = torch.randperm(args["positions"].shape[0], generator=torch.Generator().manual_seed(0))
        for k in ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping"):
            if shuffled.get(k) is not None:
                shuffled[k] = shuffled[k][perm].contiguous()
        a = spec.op(**args, backend="triton")
        b = spec.op(**shuffled, backend="triton")
        if a is not None:   # K7 returns its rows per token: compare in the sorted order
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)[perm.argsort()])
        for k, v in args.items():
            if isinstance(v, torch.Tensor) and k not in ("token_to_req", "positions", "slot_mapping",
                                                         "kv_slot_mapping", "out"):   # out: rows per token
                assert torch.equal(v.view(torch.uint8), shuffled[k].view(torch.uint8)), k
