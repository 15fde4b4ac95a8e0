#!/usr/bin/env bash
# The device calls that issues 14, 15 and 16 wait for, one phase per call (a call runs <= 600 s):
#     bash benchmarks/gpu_session_next.sh pipeline OUT_DIR  # issue 14: the pipeline replay on real tensors
#     bash benchmarks/gpu_session_next.sh store OUT_DIR     # issue 15: the CPU-built store, loaded here
#     bash benchmarks/gpu_session_next.sh finish OUT_DIR    # issues 15 + 14: hash parts, warmup table, pipeline
#     bash benchmarks/gpu_session_next.sh bench1 OUT_DIR    # issue 16: launch plans, host overhead, K1/K2, rowquant
#     bash benchmarks/gpu_session_next.sh bench2 OUT_DIR    # issue 16: K3, K4, C4 (K5/K6a/K6b), C128 (K7) sweeps
#     bash benchmarks/gpu_session_next.sh bench3 OUT_DIR    # issue 16: K7 (in order), K8a/K8b, E1-E5 sweeps, host
#     bash benchmarks/gpu_session_next.sh verify OUT_DIR    # issue 16: GPU numerics of changed kernels, plans
#     bash benchmarks/gpu_session_next.sh verify2 OUT_DIR   # issue 16: E1-E5 and K7 numerics, then their sweeps
#     bash benchmarks/gpu_session_next.sh bench4 OUT_DIR    # issue 16: C4 and K1/K2 sweeps
#     bash benchmarks/gpu_session_next.sh ncu OUT_DIR       # issue 16: Nsight Compute counters (NCU_FAMILIES)
#     bash benchmarks/gpu_session_next.sh verify3 OUT_DIR   # issue 16: rowquant / K3 hardware e4m3, C4 CuTeDSL
#     bash benchmarks/gpu_session_next.sh bench5 OUT_DIR    # issue 16: their sweeps, racecheck, host overhead
#     bash benchmarks/gpu_session_next.sh c4 OUT_DIR        # issue 16: C4 CuTeDSL numerics, racecheck, sweep
#     bash benchmarks/gpu_session_next.sh final1 OUT_DIR    # issue 16: GPU numerics of the final rowquant / K3 / C4
#     bash benchmarks/gpu_session_next.sh final2 OUT_DIR    # issue 16: launch plans, C4 racecheck, C4 sweep
#     bash benchmarks/gpu_session_next.sh final3 OUT_DIR    # issue 16: rowquant / K3 sweeps, host overhead
#     bash benchmarks/gpu_session_next.sh final4 OUT_DIR    # issue 16: C4 again after its decode/prefill split moved
#     bash benchmarks/gpu_session_next.sh next OUT_DIR      # issue 16: rowquant and K3 after their load changes, host
#     bash benchmarks/gpu_session_next.sh next2 OUT_DIR     # issue 16: the C4 sweep, counters of rowquant / K3 / C4
#     bash benchmarks/gpu_session_next.sh hw1 OUT_DIR       # issue 16: store hooks' hardware casts, launch plans, host
#     bash benchmarks/gpu_session_next.sh hw2 OUT_DIR       # issue 16: the store-hook sweep, the K3 launch shapes
#     bash benchmarks/gpu_session_next.sh final5 OUT_DIR    # issue 16: CuTeDSL store shapes; rowquant, K3, C128, C4 numerics
#     bash benchmarks/gpu_session_next.sh final6 OUT_DIR    # issue 16: store hooks, K1/K2 numerics; K1/K2, store, K3 sweeps
#     bash benchmarks/gpu_session_next.sh final7 OUT_DIR    # issue 16: the C4 and K8 sweeps, host, CuTeDSL store shapes
# Before the store phase, on the CPU machine: bash benchmarks/prepare_gpu_store.sh, then carry
# .carry-store with the call. CuTeDSL first (../shared/device/README.md: two calls). Each step
# has its own time limit and log; one that fails or times out does not stop the others.
# Everything ends up in OUT_DIR/records.tar.gz and OUT_DIR/session.log.
set -u
usage="usage: gpu_session_next.sh pipeline|store|finish|bench1|bench2|bench3|verify|verify2|bench4|ncu|verify3|bench5|c4|final1|final2|final3|final4|next|next2|hw1|hw2|final5|final6|final7|next-triton OUT_DIR"
source "$(dirname "$0")/gpu_session_lib.sh"
session_begin "$usage" "$@"
host_step() {  # host_step [SECONDS]: issue 16's host-overhead table, real launches
    step host "${1:-120}" python3 benchmarks/host_overhead.py --executor real --calls 300 --repeats 5 \
        --out "$work/host_overhead_h200"
}
bench_step() {  # bench_step PLAN SECONDS [BENCH OPTIONS]: one dsv4kit bench sweep, its own JSON and figure
    step "bench_$1" "$2" python3 -m dsv4kit bench --family "$1" --rep-ms 60 \
        --json "$work/bench_h200/$1.json" --plot "$work/bench_h200/$1.png" "${@:3}"
}
case $phase in
pipeline)
    step pipeline 560 python3 benchmarks/pipeline_gpu.py --out "$work/pipeline_h200" --timeout 280 --deadline 530 \
        --jobs "${PIPELINE_JOBS:-4}" ;;
store)
    [ -f .carry-store/store.tar.gz ] || { echo "no .carry-store/store.tar.gz: run prepare_gpu_store.sh" | tee -a "$log"; }
    step store_load 150 python3 benchmarks/store_load_check.py --import .carry-store/store.tar.gz \
        --cache-dir "$work/store" --out "$work/store_load_h200" --device cuda --steps 8
    # the pipeline replay on real tensors, warmed from that store with Triton's own cache empty
    TRITON_CACHE_DIR=$(mktemp -d) step pipeline_store 190 python3 benchmarks/pipeline_gpu.py \
        --out "$work/pipeline_store_h200" --configs flash-default --cache-dir "$work/store" \
        --jobs 2 --timeout 180 --deadline 180
    step warmup_timing 220 python3 benchmarks/warmup_timing.py --out "$work/warmup_h200" ;;
finish)  # issue 15's Triton hash parts and H200 warmup table, then issue 14's pipeline (fewer seconds)
    step triton_hash 30 python3 benchmarks/triton_hash_parts.py --out "$work/store_load_h200/triton_hash_parts.json"
    step warmup_timing 140 python3 benchmarks/warmup_timing.py --out "$work/warmup_h200"
    step pipeline 440 python3 benchmarks/pipeline_gpu.py --out "$work/pipeline_h200" --timeout 300 --deadline 420 \
        --jobs "${PIPELINE_JOBS:-5}" ;;
bench1)
    step launch_plans 120 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_h200"
    host_step
    bench_step indexer_q 140
    bench_step rowquant 140 ;;
bench2)
    [ -n "${WITH_HOST:-}" ] && host_step
    bench_step dequant_gather 120
    bench_step save_partial_states 120
    bench_step c4_compress 200
    bench_step c128_compress 120 ;;
bench3)
    host_step
    bench_step c128_compress 120
    bench_step c128_store 150
    bench_step store_rows 150 ;;
verify)
    step c4_check 240 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 30 --no-recip-weights
    step indexer_q_check 150 python3 benchmarks/indexer_q_gpu_check.py --out "$work/indexer_q_h200" --cases 30
    step launch_plans 120 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_h200" ;;
verify2)  # the store hooks (E1-E5) and K7 changed: every byte / the rule on the GPU first, then the sweeps
    step encoders_check 150 python3 benchmarks/encoders_gpu_check.py --out "$work/encoders_h200" --cases-per-encoder 48
    step c128_check 200 python3 benchmarks/c128_compress_gpu_check.py --out "$work/c128_compress_h200" --cases 30
    bench_step store_rows 110
    bench_step c128_compress 110 ;;
bench4)
    bench_step c4_compress 200
    bench_step indexer_q 140
    [ -n "${WITH_NCU:-}" ] && step ncu 240 python3 benchmarks/ncu_profile.py --out "$work/ncu_h200" --timeout 230 ;;
ncu)
    step ncu 560 python3 benchmarks/ncu_profile.py --out "$work/ncu_h200" --timeout 550 \
        --families "${NCU_FAMILIES:-c4_compress,indexer_q,dequant_gather,c128_compress,rowquant}" ;;
verify3)  # rowquant and K3 use the hardware e4m3 conversions, C4 CuTeDSL a CTA per token: bytes first
    step rowquant_check 120 python3 benchmarks/verify_backends.py --out "$work/backends_h200"
    step k3_check 120 python3 benchmarks/dequant_gather_gpu_check.py --out "$work/dequant_gather_h200" --cases 60
    step c4_check 200 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 30 --no-recip-weights
    step launch_plans 60 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_h200" ;;
bench5)
    step c4_racecheck 120 compute-sanitizer --tool racecheck --report-api-errors no python3 benchmarks/sanitize_cases.py \
        --quick --families c4_compress_ds_mla,c4_compress_plain,indexer_compress --backends cutedsl
    bench_step c4_compress 200
    bench_step rowquant 60
    bench_step dequant_gather 70
    host_step ;;
c4)  # one C4 CuTeDSL revision: the rule on the GPU, shared-memory races, the sweep
    step c4_check 200 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 30 --no-recip-weights
    step c4_racecheck 120 compute-sanitizer --tool racecheck --report-api-errors no python3 benchmarks/sanitize_cases.py \
        --quick --families c4_compress_ds_mla,c4_compress_plain,indexer_compress --backends cutedsl
    bench_step c4_compress 200 ;;
final1)  # the final rowquant / K3 / C4 code: every byte (the rule for C4) on the GPU
    step rowquant_check 100 python3 benchmarks/verify_backends.py --out "$work/backends_h200"
    step k3_check 110 python3 benchmarks/dequant_gather_gpu_check.py --out "$work/dequant_gather_h200" --cases 60
    step c4_check 270 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 30 --no-recip-weights ;;
final2)  # the launch plans, C4 CuTeDSL's shared memory (both kernels), the C4 sweep
    step launch_plans 60 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_h200"
    step c4_racecheck 110 compute-sanitizer --tool racecheck --report-api-errors no python3 benchmarks/sanitize_cases.py \
        --quick --families c4_compress_ds_mla,c4_compress_plain,indexer_compress --backends cutedsl
    bench_step c4_compress 270 ;;
final3)  # the rowquant and K3 sweeps, the host-overhead table
    bench_step rowquant 80
    bench_step dequant_gather 90
    host_step ;;
final4)  # C4 CuTeDSL with the decode kernel up to T = 4096: the rule, races, the sweep
    step c4_check 230 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 30 --no-recip-weights
    step c4_racecheck 60 compute-sanitizer --tool racecheck --report-api-errors no python3 benchmarks/sanitize_cases.py \
        --quick --families c4_compress_ds_mla,c4_compress_plain,indexer_compress --backends cutedsl
    bench_step c4_compress 260 ;;
next)  # rowquant (16 bytes per lane in flight) and K3 (rope row loaded with the codes): bytes, then
    # sweeps; the launch plans on every path, the host overhead with the plan body's pieces
    step rowquant_check 90 python3 benchmarks/verify_backends.py --commit "${DSV4KIT_COMMIT:-unknown}" --out "$work/backends_h200"
    step k3_check 110 python3 benchmarks/dequant_gather_gpu_check.py --out "$work/dequant_gather_h200" --cases 60
    bench_step rowquant 80
    bench_step dequant_gather 90
    step launch_plans 70 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_h200"
    host_step ;;
next2)  # the C4 sweep (its docstring changed: a fresh kernel-source hash), then the counters
    bench_step c4_compress 210
    step ncu 320 python3 benchmarks/ncu_profile.py --out "$work/ncu_h200" --timeout 310 \
        --families "${NCU_FAMILIES:-rowquant,dequant_gather,c4_compress}" ;;
hw1)  # the Triton store hooks round by the GPU's casts: every byte first; the direct C launch
    step encoders_check 170 python3 benchmarks/encoders_gpu_check.py --out "$work/encoders_h200" --cases-per-encoder 48
    step launch_plans 80 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_h200"
    host_step ;;
hw2)  # the store-hook sweep, then the K3 Triton launch shapes at the largest size
    bench_step store_rows 150
    step k3_tuning 250 python3 benchmarks/shape_tuning.py k3 --out "$work/shape_tuning_h200" ;;
final5)  # the CuTeDSL store hooks' rows per warp; GPU numerics of rowquant, K3, K8 (C128), C4; plans
    step store_cute_shapes 100 python3 benchmarks/shape_tuning.py store-cute --out "$work/shape_tuning_h200"
    step rowquant_check 40 python3 benchmarks/verify_backends.py --commit "${DSV4KIT_COMMIT:-unknown}" --out "$work/backends_h200"
    step k3_check 40 python3 benchmarks/dequant_gather_gpu_check.py --out "$work/dequant_gather_h200" --cases 60
    step c128_check 80 python3 benchmarks/c128_compress_gpu_check.py --out "$work/c128_compress_h200" --cases 30
    step c4_check 170 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 30 --no-recip-weights
    step launch_plans 45 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_h200" ;;
final6)  # GPU numerics of the store hooks and K1/K2, then the K1/K2, store-hook and K3 sweeps
    step encoders_check 70 python3 benchmarks/encoders_gpu_check.py --out "$work/encoders_h200" --cases-per-encoder 48
    step indexer_q_check 80 python3 benchmarks/indexer_q_gpu_check.py --out "$work/indexer_q_h200" --cases 30
    bench_step indexer_q 120
    bench_step store_rows 150
    bench_step dequant_gather 70 ;;
final7)  # what final6 left: the C4 and K8 sweeps, the host table, the CuTeDSL store shapes
    bench_step c4_compress 210
    host_step 60
    bench_step c128_store 150
    step store_cute_shapes 100 python3 benchmarks/shape_tuning.py store-cute --out "$work/shape_tuning_h200" ;;
next-triton)  # the same without the CuTeDSL bundle (Triton rows only; a short device budget)
    step rowquant_check 60 python3 benchmarks/verify_backends.py --triton-only --commit "${DSV4KIT_COMMIT:-unknown}" --out "$work/backends_h200"
    step k3_check 90 python3 benchmarks/dequant_gather_gpu_check.py --out "$work/dequant_gather_h200" --cases 60
    bench_step rowquant 70 --backend triton --rep-ms 40
    bench_step dequant_gather 80 --backend triton --rep-ms 40 ;;
*) echo "unknown phase $phase ($usage)" >&2; exit 2 ;;
esac
session_end
