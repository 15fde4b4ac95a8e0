#!/usr/bin/env bash
# One device call for the C4 compressor records (issue 12): the store hooks' and the compressors'
# numerics on both backends, the compressors' bandwidth, the model replay with them in it.
#     bash benchmarks/gpu_session_c4.sh OUT_DIR
# Each step has its own time limit and log; a step that fails or times out does not stop the
# others. Everything ends up in OUT_DIR/records.tar.gz (the device returns few files) and
# OUT_DIR/session.log.
set -u
out=${1:?usage: gpu_session_c4.sh OUT_DIR}
work=$(mktemp -d)
log="$out/session.log"
step() {  # step NAME SECONDS CMD...
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${secs}s): $*" | tee -a "$log"
    timeout "$secs" "$@" > "$work/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$work/$name.log" >> "$log"
    echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$log"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$log" 2>&1
step encoders 150 python3 benchmarks/encoders_gpu_check.py --out "$work/encoders_h200" --cases-per-encoder 50
step c4_check 240 python3 benchmarks/c4_compress_gpu_check.py --out "$work/c4_compress_h200/check.json" --cases 50
step c4_bandwidth 200 python3 benchmarks/c4_compress.py --out "$work/c4_compress_h200" --compile-budget 60
step replay 150 python3 benchmarks/replay_gpu.py --out "$work/replay_h200" --quick --steps 8 --max-model-len 16384
tar -C "$work" -czf "$out/records.tar.gz" .
echo "session done in ${SECONDS}s" | tee -a "$log"
