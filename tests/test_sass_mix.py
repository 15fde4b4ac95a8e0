"""benchmarks/sass_mix.py: the SASS classifier, control flow, load batches and occupancy, on a small
hand-written listing and on rowquant's Triton kernel compiled for sm_90a on this CPU."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark

sm = load_benchmark("sass_mix")

# A made-up kernel in cuobjdump's format: two independent 16-byte loads, a dependent one, a loop
# (backward branch at 0x00c0), an if-converted vector / scalar pair of stores under P1 / !P1, a
# predicated exit and the padding after the last EXIT.
LISTING = """
        code for sm_90a
                Function : toy_kernel
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                   /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                       /* 0x0000000000007919 */
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;         /* 0x0000000402047981 */
        /*0030*/                   LDG.E.128 R8, desc[UR4][R2.64+0x10] ;    /* 0x0000100402087981 */
        /*0040*/                   IMAD.WIDE R12, R0, 0x4, R2 ;             /* 0x0000000400007824 */
        /*0050*/                   FADD R4, R4, R8 ;                        /* 0x0000000804047221 */
        /*0060*/                   LDG.E R14, desc[UR4][R4.64] ;            /* 0x00000004040e7981 */
        /*0070*/                   ISETP.GE.AND P0, PT, R0, 0x20, PT ;      /* 0x000000200000780c */
        /*0080*/                   IADD3 R0, R0, 0x1, RZ ;                  /* 0x0000000100007810 */
        /*0090*/                   F2FP.BF16.F32.PACK_AB R15, R14, R14 ;    /* 0x0000000e0e0f723e */
        /*00a0*/                   PRMT R16, R15, 0x7610, R16 ;             /* 0x0000761010107816 */
        /*00b0*/                   SHFL.BFLY PT, R17, R16, 0x1, 0x1f ;      /* 0x0c201f0010117f89 */
        /*00c0*/              @!P0 BRA 0x40 ;                               /* 0xfffffffc00008947 */
        /*00d0*/               @P1 STG.E.128 desc[UR4][R12.64], R4 ;        /* 0x000000040c001986 */
        /*00e0*/              @!P1 STG.E desc[UR4][R12.64], R4 ;            /* 0x000000040c009986 */
        /*00f0*/              @!P1 STG.E desc[UR4][R12.64+0x4], R5 ;        /* 0x000004050c009986 */
        /*0100*/               @P2 EXIT ;                                   /* 0x000000000000294d */
        /*0110*/                   STG.E.U8 desc[UR4][R12.64+0x8], R17 ;    /* 0x000008110c007986 */
        /*0120*/                   EXIT ;                                   /* 0x000000000000794d */
        /*0130*/                   BRA 0x130;                               /* 0xfffffffc00fc7947 */
        /*0140*/                   NOP;                                     /* 0x0000000000007918 */
        /*0150*/                   NOP;                                     /* 0x0000000000007918 */
"""


def test_parse_and_classify_the_listing():
    funcs = sm.parse_sass(LISTING)
    assert list(funcs) == ["toy_kernel"]
    ins = funcs["toy_kernel"]
    assert len(ins) == 22
    by_op = {i.addr: sm.classify(i) for i in ins}
    assert by_op[0x20] == by_op[0x60] == "global_load"
    assert by_op[0xd0] == by_op[0x110] == "global_store"
    assert by_op[0x40] == "int_address" and by_op[0x50] == "fp32" and by_op[0x90] == "conversion"
    assert by_op[0xa0] == "move_permute" and by_op[0xb0] == "warp_shuffle" and by_op[0x00] == "constant"
    assert by_op[0x70] == by_op[0xc0] == "predicate_branch" and by_op[0x140] == "nop"
    assert [sm.access_bytes(i) for i in ins if i.addr in (0x20, 0x60, 0xd0, 0xe0, 0x110)] == [16, 4, 16, 4, 1]
    widths = {op: sm.access_bytes(sm.Instr(0, None, op, ("R2", "desc[UR4][R4.64]")))
              for op in ("LDG.E.64", "LDG.E.LTC128B.128", "STG.E.U16", "LDG.E.S8", "LDSM.16.M88.4",
                         "LDGSTS.E")}
    assert widths == {"LDG.E.64": 8, "LDG.E.LTC128B.128": 16, "STG.E.U16": 2, "LDG.E.S8": 1,
                      "LDSM.16.M88.4": 16, "LDGSTS.E": 4}
    assert sm.classify(sm.Instr(0, "!PT", "LDS", ("RZ", "[RZ]"))) == "never"
    assert sm.classify(sm.Instr(0, None, "IMAD.MOV.U32", ("R1", "RZ", "RZ", "R2"))) == "move_permute"
    assert sm.classify(sm.Instr(0, None, "UIADD3", ("UR4", "UR5", "0x1", "URZ"))) == "uniform"
    m = sm.mix(ins)
    assert sum(m["classes"].values()) == m["total"] == 22
    assert m["issued"] == 20
    assert m["widths"]["LDG"] == {"128b": 2, "32b": 1}
    assert m["widths"]["STG"] == {"128b": 1, "32b": 2, "8b": 1}
    # The P1 / !P1 stores exclude each other: 16 bytes count, not 16 + 8.
    assert m["global_store_bytes"] == 16 + 1 and m["global_bytes_issued"] == 36 + 25


def test_cfg_loop_paths_and_load_batches():
    ins = sm.parse_sass(LISTING)["toy_kernel"]
    blocks = sm.build_cfg(ins)
    loops = sm.find_loops(blocks)
    assert len(loops) == 1
    assert blocks[loops[0]["head"]].start == 0x40 and blocks[loops[0]["latch"]].end == 0xc0
    an = sm.analyze_sass(LISTING, model_bytes_per_thread=100.0)
    assert an["cfg"]["loops"] == 1
    main = an["main_path"]
    assert main["issued"] == 19 and main["global_bytes"] == 32 + 4 + 17
    # the loop (0x40..0xc0: 4 bytes a pass) makes up the model's 100 bytes: (100 - 49) / 4 passes
    est = an["headline"]["loop_estimate"]
    assert est["used"] and est["loop_bytes"] == 4 and est["iterations"] == pytest.approx((100 - 49) / 4)
    assert an["headline"]["instr_per_model_byte"] == pytest.approx(an["headline"]["issued"] / 100.0, rel=1e-3)
    assert an["paths"]["exit"]["issued"] < an["paths"]["main"]["issued"]
    # Two 16-byte loads in flight together; the third one's address comes from the first: a new batch.
    batches = sm.load_batches([i for i in ins if i.addr <= 0x60])
    assert [(b["loads"], b["bytes"]) for b in batches] == [(2, 32), (1, 4)]


def test_occupancy_formula():
    # 128 registers, one warp: 4096 registers per warp, 4 per bank -> 16 CTAs, a quarter of 64 warps.
    o = sm.occupancy(128, 32, 9280)
    assert (o["ctas_per_sm"], o["occupancy"], o["limited_by"]) == (16, 0.25, ["registers"])
    # 64 registers x 256 threads: 8 warps per bank, 4 CTAs of 8 warps.
    assert sm.occupancy(64, 256, 5120)["occupancy"] == 0.5
    # 30 registers x 128 threads: the 64-warp limit binds first.
    o = sm.occupancy(30, 128, 1040)
    assert o["occupancy"] == 1.0 and "warps" in o["limited_by"]
    # shared memory: 100 KiB per CTA leaves room for two
    assert sm.occupancy(32, 128, 100 * 1024)["ctas_per_sm"] == 2


def test_cute_launch_config_reads_constants():
    s = sm._CFG_STRUCT
    ir = "\n".join([
        "llvm.func @host(%arg0: i32) {",
        "%9 = llvm.mlir.constant(8192 : i64) : i64",
        "%8 = llvm.mlir.constant(128 : i32) : i32",
        "%7 = llvm.mlir.constant(1 : i32) : i32",
        f"%17 = llvm.getelementptr %14[0, 1, 0] : (!llvm.ptr) -> !llvm.ptr, {s}",
        "llvm.store %8, %17 : i32, !llvm.ptr",
        f"%18 = llvm.getelementptr %14[0, 1, 1] : (!llvm.ptr) -> !llvm.ptr, {s}",
        "llvm.store %7, %18 : i32, !llvm.ptr",
        f"%20 = llvm.getelementptr %14[0, 2] : (!llvm.ptr) -> !llvm.ptr, {s}",
        "llvm.store %9, %20 : i64, !llvm.ptr",
        f"%21 = llvm.getelementptr %14[0, 0, 0] : (!llvm.ptr) -> !llvm.ptr, {s}",
        "llvm.store %arg0, %21 : i32, !llvm.ptr",
    ])
    assert sm.cute_launch_config(ir) == {"block": [128, 1, None], "dynamic_smem": 8192}


def test_rowquant_triton_sm90a_sass():
    """The classifier on real SASS: rowquant's Triton kernel, compiled for sm_90a here (no GPU)."""
    from dsv4kit.bench_cli import sass_tool
    from dsv4kit.kernels import family
    from dsv4kit.platform import cpu_platform

    if sass_tool() is None:
        pytest.skip("no cuobjdump in this Triton install")
    cls = family("rowquant").kernel_class("default", "triton")
    key = cls.CompileKey(n_cols=4096, x_stride_class="div16", rows_per_program=4)
    res = sm.compile_one(cls, key, "sm_90a", cpu_platform("sm_90a"))
    an = sm.analyze_sass(res["sass"], model_bytes_per_thread=24.25)
    whole = an["whole"]
    assert sum(whole["classes"].values()) == whole["total"] > 50
    assert whole["classes"]["global_load"] >= 1 and whole["classes"]["global_store"] >= 1
    assert whole["classes"]["other"] <= 0.05 * whole["total"], whole["top_opcodes"]  # the classes cover it
    assert set(whole["widths"]["LDG"]) <= {"128b", "64b", "32b", "16b", "8b"} and whole["widths"]["LDG"]
    assert an["main_path"]["global_bytes"] > 0 and an["headline"]["instr_per_model_byte"] > 0
    assert an["load_batches"]["batches"] >= 1
    assert res["threads_per_cta"] == 128 and res["registers"] > 0  # 4 warps, a half-warp per tile row
    occ = sm.occupancy(res["registers"], res["threads_per_cta"], res["static_shared"] + res["dynamic_shared"])
    assert 0 < occ["occupancy"] <= 1


def test_size_picks_the_large_the_decode_or_a_given_size(capsys: pytest.CaptureFixture[str]) -> None:
    from dsv4kit.bench import select_plans

    c4, rq = select_plans(["c4_compress", "rowquant"])
    assert sm.plan_size(c4, "large") == c4.sizes[-1]
    assert sm.plan_size(c4, "decode") == max(c4.decode_sizes) == 256
    assert sm.plan_size(rq, "decode") is None and sm.plan_size(rq, "77") == 77   # rowquant: no decode sizes
    assert sm.main(["--size", "small", "--families", "rowquant"]) == 2
    assert "--size 'small'" in capsys.readouterr().err


def test_wave_shape_and_machine_models():
    # 2048 one-warp CTAs at 16 CTAs per SM on 132 SMs: 2112 slots, one partial wave.
    w = sm.wave_shape(2048, 16 * 132)
    assert (w["full_waves"], w["tail_ctas"], w["waves"]) == (0, 2048, 0.97)
    assert w["wave_efficiency"] == pytest.approx(2048 / 2112, abs=1e-3)
    # 3 full waves and a tenth: the fourth wave is nearly empty.
    w = sm.wave_shape(3 * 264 + 26, 264)
    assert (w["full_waves"], w["tail_ctas"]) == (3, 26)
    assert w["tail_fill"] == pytest.approx(26 / 264, abs=1e-3)
    assert w["wave_efficiency"] == pytest.approx((3 * 264 + 26) / (4 * 264), abs=1e-3)
    assert sm.wave_shape(528, 264)["wave_efficiency"] == 1.0 and sm.wave_shape(0, 264)["waves"] is None
    # The H100 model differs from the H200's only in the copy bandwidth: same occupancy, and the same
    # instruction stream needs a smaller share of the (longer) DRAM time on the H100.
    assert {k for k in sm.H100 if sm.H100[k] != sm.H200[k]} == {"copy_GBps", "name"}
    assert sm.occupancy(78, 128, 3072, sm.H100) == sm.occupancy(78, 128, 3072, sm.H200)
    classes = {c: 0 for c in sm.CLASSES} | {"fp32": 100, "global_load": 4}
    r200 = sm.pipe_model(classes, 0, 64.0, sm.H200)["instr_over_dram"]
    r100 = sm.pipe_model(classes, 0, 64.0, sm.H100)["instr_over_dram"]
    assert r100 == pytest.approx(r200 * 3020 / 4268, rel=1e-2)
