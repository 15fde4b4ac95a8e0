#!/usr/bin/env bash
# The device calls still to make, one phase per call (a call runs <= 600 s):
#     bash benchmarks/gpu_session_next.sh pipeline OUT_DIR  # issue 14: the pipeline replay on real tensors
#     bash benchmarks/gpu_session_next.sh store OUT_DIR     # issue 15: the CPU-built store, loaded here
#     bash benchmarks/gpu_session_next.sh finish OUT_DIR    # issues 15 + 14: hash parts, warmup table, pipeline
#     bash benchmarks/gpu_session_next.sh ncu OUT_DIR       # issue 16: Nsight Compute counters (NCU_FAMILIES)
#     bash benchmarks/gpu_session_next.sh checks OUT_DIR    # issue 16: GPU numerics of the changed families, the plans
#     bash benchmarks/gpu_session_next.sh sweeps1 OUT_DIR   # issue 16: store-hook, K1/K2, K7 sweeps
#     bash benchmarks/gpu_session_next.sh sweeps2 OUT_DIR   # issue 16: the C4 and K8 sweeps
#     bash benchmarks/gpu_session_next.sh sweeps3 OUT_DIR   # issue 16: rowquant / K3 numerics, their and K4's sweeps, host
#     bash benchmarks/gpu_session_next.sh sanitize OUT_DIR  # memcheck and racecheck of every family's quick cases
# The phases of earlier sessions (bench1-5, verify*, c4, final1-10, hw1, hw2, next, next2, shapes) are in git
# history; NOTES.md names the commit each ran at. Before the store phase, on the CPU machine: bash
# benchmarks/prepare_gpu_store.sh, then carry .carry-store with the call. CuTeDSL first
# (../shared/device/README.md: two calls). Each step has its own time limit and log; one that fails
# or times out does not stop the others, and the records so far are saved after every step.
# Everything ends up in OUT_DIR/records.tar.gz and OUT_DIR/session.log.
set -u
usage="usage: gpu_session_next.sh pipeline|store|finish|ncu|checks|sweeps1|sweeps2|sweeps3|sanitize OUT_DIR"
source "$(dirname "$0")/gpu_session_lib.sh"
session_begin "$usage" "$@"
host_step() {  # host_step [SECONDS]: issue 16's host-overhead table, real launches
    step host "${1:-120}" python3 benchmarks/host_overhead.py --executor real --calls 300 --repeats 5 \
        --out "$work/host_overhead_$dev"
}
bench_step() {  # bench_step PLAN SECONDS [BENCH OPTIONS]: one dsv4kit bench sweep, its own JSON and figure
    step "bench_$1" "$2" python3 -m dsv4kit bench --family "$1" --rep-ms 60 \
        --json "$work/bench_$dev/$1.json" --plot "$work/bench_$dev/$1.png" "${@:3}"
}
case $phase in
pipeline)
    step pipeline 560 python3 benchmarks/pipeline_gpu.py --out "$work/pipeline_$dev" --timeout 280 --deadline 530 \
        --jobs "${PIPELINE_JOBS:-4}" ;;
store)
    [ -f .carry-store/store.tar.gz ] || { echo "no .carry-store/store.tar.gz: run prepare_gpu_store.sh" | tee -a "$log"; }
    step store_load 150 python3 benchmarks/store_load_check.py --import .carry-store/store.tar.gz \
        --cache-dir "$work/store" --out "$work/store_load_$dev" --device cuda --steps 8
    # the pipeline replay on real tensors, warmed from that store with Triton's own cache empty
    TRITON_CACHE_DIR=$(mktemp -d) step pipeline_store 190 python3 benchmarks/pipeline_gpu.py \
        --out "$work/pipeline_store_$dev" --configs flash-default --cache-dir "$work/store" \
        --jobs 2 --timeout 180 --deadline 180
    step warmup_timing 220 python3 benchmarks/warmup_timing.py --out "$work/warmup_$dev" ;;
finish)  # issue 15's Triton hash parts and H200 warmup table, then issue 14's pipeline (fewer seconds)
    step triton_hash 30 python3 benchmarks/triton_hash_parts.py --out "$work/store_load_$dev/triton_hash_parts.json"
    step warmup_timing 140 python3 benchmarks/warmup_timing.py --out "$work/warmup_$dev"
    step pipeline 440 python3 benchmarks/pipeline_gpu.py --out "$work/pipeline_$dev" --timeout 300 --deadline 420 \
        --jobs "${PIPELINE_JOBS:-5}" ;;
ncu)
    step ncu 560 python3 benchmarks/ncu_profile.py --out "$work/ncu_$dev" --timeout 550 \
        --families "${NCU_FAMILIES:-c4_compress,indexer_q,dequant_gather,c128_compress,rowquant}" ;;
checks)  # GPU numerics of every changed family (bytes or the compressor rule, compiles after warmup), the plans
    step encoders_check 70 python3 benchmarks/encoders_gpu_check.py --out "$work/encoders_$dev" --cases-per-encoder 48
    step indexer_q_check 80 python3 benchmarks/indexer_q_gpu_check.py --out "$work/indexer_q_$dev" --cases 30
    step c4_check 175 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_$dev/check.json" \
        --cases 30
    step c128_check 80 python3 benchmarks/c128_compress_gpu_check.py --out "$work/c128_compress_$dev" --cases 30
    step launch_plans 45 python3 benchmarks/launch_plans_gpu_check.py --out "$work/launch_plans_$dev" ;;
sweeps1)  # the kernels changed last: the store hooks (out of L2 at T = 524288), K1/K2, K7
    bench_step store_rows 240
    bench_step indexer_q 120
    bench_step c128_compress 70 ;;
sweeps2)  # the C4 sweep (out of L2 at T = 262144) and K8's
    bench_step c4_compress 330
    bench_step c128_store 150 ;;
sweeps3)  # the kernels whose code did not change (their records' hashes went stale), the host table
    step rowquant_check 40 python3 benchmarks/verify_backends.py --commit "${DSV4KIT_COMMIT:-unknown}" --out "$work/backends_$dev"
    step k3_check 40 python3 benchmarks/dequant_gather_gpu_check.py --out "$work/dequant_gather_$dev" --cases 60
    bench_step dequant_gather 70
    bench_step rowquant 60
    bench_step save_partial_states 90
    host_step 60 ;;
sanitize)  # compute-sanitizer over every family, both backends (--quick cases): bounds and shared-memory races
    for tool in memcheck racecheck; do
        step "$tool" 220 compute-sanitizer --tool "$tool" --report-api-errors no python3 benchmarks/sanitize_cases.py \
            --quick --json "$work/sanitizer_cases_$dev/$tool.json"
    done ;;
*) echo "unknown phase $phase ($usage)" >&2; exit 2 ;;
esac
session_end
