# Sourced by benchmarks/gpu_session_*.sh: one device call runs steps, each with its own time limit
# and log; a step that fails or times out does not stop the others. Everything ends up in
# OUT/records.tar.gz (the device returns few files) and OUT/session.log.
#     session_begin USAGE "$@"; step NAME SECONDS CMD...; session_end
session_begin() {  # session_begin USAGE PHASE OUT: sets phase and out (USAGE when missing), starts
    usage=$1
    phase=${2:?$usage}
    out=${3:?$usage}
    session_start "$out"
}
session_start() {  # session_start OUT
    out=$1
    mkdir -p "$out"
    work=$(mktemp -d)
    log="$out/session.log"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$log" 2>&1
    # records are named after the card they were measured on (h100, h200): the lent kind varies
    dev=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | grep -o 'H[0-9]\+' | tr 'H' 'h')
    dev=${dev:-gpu}
    echo "records named *_$dev" | tee -a "$log"
}
step() {  # step NAME SECONDS CMD...
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS
    echo "=== $name (limit ${secs}s): $*" | tee -a "$log"
    timeout "$secs" "$@" > "$work/$name.log" 2>&1
    local rc=$?
    tail -n 60 "$work/$name.log" >> "$log"
    echo "=== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$log"
    # the records so far, so that a call ended by its own time limit still returns them
    cp "$log" "$work/session.log" 2>/dev/null
    tar -C "$work" -czf "$out/records.tar.gz" .
}
session_end() {
    cp "$log" "$work/session.log" 2>/dev/null
    tar -C "$work" -czf "$out/records.tar.gz" .
    echo "session done in ${SECONDS}s" | tee -a "$log"
}
