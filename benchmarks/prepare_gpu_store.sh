#!/usr/bin/env bash
# On the CPU machine, before a GPU session: build the artifact store of DSv4-Flash and DSv4-Pro for
# sm_90a, both backends (CuTeDSL entries from --device cuda --backend cutedsl, Triton entries from
# --device cpu --backend triton: an entry does not depend on the device, only on kernel, key, arch,
# backend, source, toolchain and, for Triton, the compile id that leaves out the Python-specific
# triton_key(), so entries built here under Python 3.11 load under the GPU machine's 3.12) and pack
# it into .carry-store/store.tar.gz for the device call's `carry` (issues 15 and 40).
#     bash benchmarks/prepare_gpu_store.sh
set -euo pipefail
cd "$(dirname "$0")/.."
store=$(mktemp -d)
dsv4kit=${DSV4KIT:-.venv/bin/dsv4kit}
for preset in flash pro; do
  "$dsv4kit" warmup --no-progress --preset "$preset" --device cuda --backend cutedsl --arch sm_90a --cache-dir "$store"
  "$dsv4kit" warmup --no-progress --preset "$preset" --device cpu --backend triton --arch sm_90a --cache-dir "$store"
done
mkdir -p .carry-store
"$dsv4kit" cache export .carry-store/store.tar.gz --cache-dir "$store"
"$dsv4kit" cache verify --cache-dir "$store"
git rev-parse HEAD > .carry-store/commit
echo "store of commit $(cat .carry-store/commit): .carry-store/store.tar.gz ($(du -h .carry-store/store.tar.gz | cut -f1))"
