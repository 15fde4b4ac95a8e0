#!/usr/bin/env bash
# On the GPU machine, from the repo root: bash benchmarks/pending/ab_call.sh PLAN (e: the A/B of the
# pending patches (e1: E1's half only; c: class plans off / on), trees from prepare.sh; s1-s3 on an H200: the sweep of the checkout). Results are
# tarred into $OUT/res_PLAN.tar.gz after every phase; CALL_LIMIT (s) bounds the whole call.
set -u
T0=$(date +%s); LIMIT=${CALL_LIMIT:-560}; PLAN=$1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$card" in *H200*) tag=h200;; *H100*) tag=h100;; *) tag=gpu;; esac
R=/tmp/res_$PLAN; mkdir -p $R/bench_$tag $R/verify_$tag $R/host_$tag
LOG=$R/session_${tag}_$PLAN.log
echo "$card; records *_$tag; commit $(git rev-parse HEAD 2>/dev/null || echo unknown); $(date -u +%FT%TZ)" | tee -a $LOG
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $LOG
python3 -c "import cutlass, importlib.metadata as m; print('cutlass-dsl', m.version('nvidia-cutlass-dsl'))" 2>&1 | tail -1 | tee -a $LOG
export PYTHONPATH=$PWD:${PYTHONPATH:-}
pack() { tar -czf $OUT/res_$PLAN.tar.gz -C /tmp res_$PLAN; }
phase() {  # phase NAME LIMIT CMD...
  local name=$1 lim=$2; shift 2
  local left=$((LIMIT - ($(date +%s) - T0)))
  [ $left -lt $lim ] && lim=$left
  if [ $lim -lt 25 ]; then echo "=== $name: skipped, ${left}s left" | tee -a $LOG; return; fi
  echo "=== $name (limit ${lim}s): $*" | tee -a $LOG
  local s=$(date +%s)
  timeout $lim "$@" > $R/$name.log 2>&1; local rc=$?
  tail -n 40 $R/$name.log >> $LOG
  echo "=== $name: rc=$rc in $(( $(date +%s) - s ))s" | tee -a $LOG
  pack
}
bench() { phase bench_$1 $2 python3 -m dsv4kit bench --family $1 --rep-ms 60 --json $R/bench_$tag/$1.json --plot $R/bench_$tag/$1.png; }
host_ab() {  # host_ab BACKEND: before (.ab3) / after (tree) alternated
  for i in 1 2; do
    phase host_before${i}_$1 120 env PYTHONPATH=$PWD/.ab3:$PYTHONPATH python3 .ab3/benchmarks/host_overhead.py --executor real --only regimes --calls 300 --repeats 5 --backends $1 --out $R/host_$tag/before${i}_$1
    phase host_after${i}_$1 120 python3 benchmarks/host_overhead.py --executor real --only regimes --calls 300 --repeats 5 --backends $1 --out $R/host_$tag/after${i}_$1
  done
}
e1_ab() {  # e1 (.ab6) against main: verify its E1 users, then store_rows / C4 on Triton alternated
  phase e1_verify 240 bash benchmarks/pending/in_tree.sh .ab6 python3 -m dsv4kit verify --extended --backends triton --families store_rows_ds,c4_compress_ds_mla,c128_norm_rope_store_ds_mla --cases 16 --json $R/verify_$tag/e1_verify_triton.json
  phase cap_verify 120 bash benchmarks/pending/in_tree.sh .ab8 python3 -m dsv4kit verify --extended --backends triton --families store_rows_ds --cases 16 --json $R/verify_$tag/cap_verify_triton.json
  for i in 1 2; do
    phase sr_main$i 80 python3 -m dsv4kit bench --family store_rows --backend triton --sizes 1,256,524288 --no-reference --no-compile --rep-ms 60 --json $R/bench_$tag/sr_main$i.json
    phase sr_e1$i 80 bash benchmarks/pending/in_tree.sh .ab6 python3 -m dsv4kit bench --family store_rows --backend triton --sizes 1,256,524288 --no-reference --no-compile --rep-ms 60 --json $R/bench_$tag/sr_e1$i.json
    phase sr_cap$i 80 bash benchmarks/pending/in_tree.sh .ab8 python3 -m dsv4kit bench --family store_rows --backend triton --sizes 1,256,524288 --no-reference --no-compile --rep-ms 60 --json $R/bench_$tag/sr_cap$i.json
  done
  phase c4_main1 90 python3 -m dsv4kit bench --family c4_compress --backend triton --sizes 256,262144 --no-reference --no-compile --rep-ms 60 --json $R/bench_$tag/c4_main1.json
  phase c4_e11 90 bash benchmarks/pending/in_tree.sh .ab6 python3 -m dsv4kit bench --family c4_compress --backend triton --sizes 256,262144 --no-reference --no-compile --rep-ms 60 --json $R/bench_$tag/c4_e11.json
}
kb_ab() {  # kernel-batch (.ab7) against main: host regimes on Triton, alternated
  for i in 1 2; do
    phase host_main_kb$i 90 python3 benchmarks/host_overhead.py --executor real --only regimes --calls 300 --repeats 5 --backends triton --out $R/host_$tag/main_kb$i
    phase host_kb$i 90 env PYTHONPATH=$PWD/.ab7:$PYTHONPATH python3 benchmarks/host_overhead.py --executor real --only regimes --calls 300 --repeats 5 --backends triton --out $R/host_$tag/kb$i
  done
}
cp_ab() {  # class plans: bytes against the full path, then off / on alternated (host regimes, Triton)
  phase cp_check 120 python3 benchmarks/class_plans_gpu_check.py --out $R/verify_$tag
  for i in 1 2; do
    for side in off on; do
      phase host_cp_${side}$i 110 python3 benchmarks/host_overhead.py --executor real --only regimes --calls 300 --repeats 5 --backends triton --class-plans $side --out $R/host_$tag/cp_${side}$i
    done
  done
}
case "$PLAN:$tag" in
  s1:h200) bench c4_compress 200; bench store_rows 170; bench indexer_q 150; bench c128_store 130 ;;
  s2:h200) bench rowquant 80; bench save_partial_states 100; bench dequant_gather 100; bench c128_compress 80
           phase verify_triton 200 python3 -m dsv4kit verify --extended --backends triton --cases 16 --json $R/verify_$tag/verify_extended_triton.json ;;
  s3:h200) phase verify_cutedsl 220 python3 -m dsv4kit verify --extended --backends cutedsl --cases 16 --json $R/verify_$tag/verify_extended_cutedsl.json ;;
  e:*) e1_ab; kb_ab; python3 -c "import cutlass" 2>/dev/null && host_ab cutedsl ;;
  c:*) cp_ab ;;
  e1:*) e1_ab ;;
  *) echo "no plan $PLAN for $tag" | tee -a $LOG ;;
esac
pack; cat $LOG | grep -E "^===|^[a-z_0-9]+ +(triton|cutedsl)" | tail -60
