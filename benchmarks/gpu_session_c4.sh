#!/usr/bin/env bash
# The device calls for the C4 compressor records (issue 12), in two phases (a call runs <= 600 s):
#     bash benchmarks/gpu_session_c4.sh numerics OUT_DIR   # store hooks and compressors, both backends
#     bash benchmarks/gpu_session_c4.sh perf OUT_DIR       # compressor bandwidth, the model replay
# Each step has its own time limit and log; a step that fails or times out does not stop the
# others. Everything ends up in OUT_DIR/records.tar.gz (the device returns few files) and
# OUT_DIR/session.log.
set -u
phase=${1:?usage: gpu_session_c4.sh numerics|perf OUT_DIR}
out=${2:?usage: gpu_session_c4.sh numerics|perf OUT_DIR}
work=$(mktemp -d)
log="$out/session.log"
step() {  # step NAME SECONDS CMD...
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${secs}s): $*" | tee -a "$log"
    timeout "$secs" "$@" > "$work/$name.log" 2>&1
    local rc=$?
    tail -n 60 "$work/$name.log" >> "$log"
    echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$log"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$log" 2>&1
case $phase in
numerics)
    step encoders 230 python3 benchmarks/encoders_gpu_check.py --out "$work/encoders_h200" --cases-per-encoder 50
    step c4_check 320 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" \
        --cases 50 --no-timing ;;
perf)
    step c4_bandwidth 260 python3 benchmarks/c4_compress.py --out "$work/c4_compress_h200" --compile-budget 60
    step replay 300 python3 benchmarks/replay_gpu.py --out "$work/replay_h200" --steps 8 --max-model-len 65536 ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
tar -C "$work" -czf "$out/records.tar.gz" .
echo "session done in ${SECONDS}s" | tee -a "$log"
