#!/usr/bin/env bash
# The device calls for the C128 compressor records (K7, K8a, K8b), in three phases (a call runs
# <= 600 s, so each phase's step limits add up to less):
#     bash benchmarks/gpu_session_c128.sh numerics_perf OUT_DIR  # K7/K8 numerics (bandwidth: next.sh bench3)
#     bash benchmarks/gpu_session_c128.sh c4 OUT_DIR             # the C4 compressor records, rerun
#     bash benchmarks/gpu_session_c128.sh replay OUT_DIR         # model replay, streams, memcheck
# Each step has its own time limit and log; a step that fails or times out does not stop the
# others. Everything ends up in OUT_DIR/records.tar.gz (the device returns few files) and
# OUT_DIR/session.log.
set -u
usage="usage: gpu_session_c128.sh numerics_perf|c4|replay OUT_DIR"
source "$(dirname "$0")/gpu_session_lib.sh"
session_begin "$usage" "$@"
case $phase in
numerics_perf)
    step c128_check 420 python3 benchmarks/c128_compress_gpu_check.py --out "$work/c128_compress_h200" ;;
c4)
    step c4_check 300 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 50
    step c4_bandwidth 250 python3 -m dsv4kit bench --family c4_compress --rep-ms 60 \
        --json "$work/bench_h200/c4_compress.json" --plot "$work/bench_h200/c4_compress.png" ;;
replay)
    step replay 300 python3 benchmarks/replay_gpu.py --out "$work/replay_h200" --steps 8 --max-model-len 65536
    step streams 120 python3 benchmarks/check_streams.py --out "$work/streams_h200"
    step memcheck 150 compute-sanitizer --tool memcheck --report-api-errors no \
        python3 benchmarks/sanitize_cases.py --quick --json "$work/sanitizer_cases_h200/memcheck.json" ;;
*) echo "unknown phase $phase ($usage)" >&2; exit 2 ;;
esac
session_end
