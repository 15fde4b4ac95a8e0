#!/usr/bin/env bash
# The device calls that issues 14, 15 and 16 wait for, one phase per call (a call runs <= 600 s):
#     bash benchmarks/gpu_session_next.sh pipeline OUT_DIR  # issue 14: the pipeline replay on real tensors
#     bash benchmarks/gpu_session_next.sh store OUT_DIR     # issue 15: the CPU-built store, loaded here
#     bash benchmarks/gpu_session_next.sh bench OUT_DIR     # issue 16: every family's sweep, host overhead
# Before the store phase, on the CPU machine: bash benchmarks/prepare_gpu_store.sh, then carry
# .carry-store with the call. CuTeDSL first (../shared/device/README.md: two calls). Each step
# has its own time limit and log; one that fails or times out does not stop the others.
# Everything ends up in OUT_DIR/records.tar.gz and OUT_DIR/session.log.
set -u
usage="usage: gpu_session_next.sh pipeline|store|bench OUT_DIR"
phase=${1:?$usage}
out=${2:?$usage}
source "$(dirname "$0")/gpu_session_lib.sh"
session_start "$out"
case $phase in
pipeline)
    step pipeline 560 python3 benchmarks/pipeline_gpu.py --out "$work/pipeline_h200" --timeout 120 ;;
store)
    [ -f .carry-store/store.tar.gz ] || { echo "no .carry-store/store.tar.gz: run prepare_gpu_store.sh" | tee -a "$log"; }
    step store_load 240 python3 benchmarks/store_load_check.py --import .carry-store/store.tar.gz \
        --cache-dir "$work/store" --out "$work/store_load_h200" --device cuda --steps 8
    step warmup_timing 300 python3 benchmarks/warmup_timing.py --out "$work/warmup_h200" ;;
bench)
    step bench 420 python3 -m dsv4kit bench --json "$work/bench_h200/bench.json" \
        --csv "$work/bench_h200/bench.csv" --plot "$work/bench_h200/bench.png"
    step host 150 python3 benchmarks/host_overhead.py --executor real --out "$work/host_overhead_h200" ;;
*) echo "unknown phase $phase ($usage)" >&2; exit 2 ;;
esac
session_end
