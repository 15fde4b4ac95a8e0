#!/usr/bin/env bash
# The device calls for the C4 compressor records (issue 12), in two phases (a call runs <= 600 s):
#     bash benchmarks/gpu_session_c4.sh numerics OUT_DIR   # store hooks and compressors, both backends
#     bash benchmarks/gpu_session_c4.sh perf OUT_DIR       # compressor bandwidth, the model replay
# Each step has its own time limit and log; a step that fails or times out does not stop the
# others. Everything ends up in OUT_DIR/records.tar.gz (the device returns few files) and
# OUT_DIR/session.log.
set -u
usage="usage: gpu_session_c4.sh numerics|perf OUT_DIR"
source "$(dirname "$0")/gpu_session_lib.sh"
session_begin "$usage" "$@"
case $phase in
numerics)
    step encoders 230 python3 benchmarks/encoders_gpu_check.py --out "$work/encoders_h200" --cases-per-encoder 50
    step c4_check 320 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 50 ;;
perf)
    step c4_bandwidth 260 python3 -m dsv4kit bench --family c4_compress --rep-ms 60 \
        --json "$work/bench_h200/c4_compress.json" --plot "$work/bench_h200/c4_compress.png"
    step replay 300 python3 benchmarks/replay_gpu.py --out "$work/replay_h200" --steps 8 --max-model-len 65536 ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
session_end
