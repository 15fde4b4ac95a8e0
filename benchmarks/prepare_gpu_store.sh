#!/usr/bin/env bash
# On the CPU machine, before a GPU session: build the DSv4-Flash artifact store for sm_90a (CuTeDSL
# entries from --device cuda, Triton entries from --device cpu: an entry does not depend on the
# device, only on kernel, key, arch, backend, source and toolchain) and pack it into
# .carry-store/store.tar.gz for the device call's `carry` (issue 15: CPU-built, GPU-loaded).
#     bash benchmarks/prepare_gpu_store.sh
set -euo pipefail
cd "$(dirname "$0")/.."
store=$(mktemp -d)
dsv4kit=${DSV4KIT:-.venv/bin/dsv4kit}
"$dsv4kit" warmup --no-progress --device cuda --arch sm_90a --cache-dir "$store"
"$dsv4kit" warmup --no-progress --device cpu --arch sm_90a --cache-dir "$store"
mkdir -p .carry-store
"$dsv4kit" cache export .carry-store/store.tar.gz --cache-dir "$store"
"$dsv4kit" cache verify --cache-dir "$store"
git rev-parse HEAD > .carry-store/commit
echo "store of commit $(cat .carry-store/commit): .carry-store/store.tar.gz ($(du -h .carry-store/store.tar.gz | cut -f1))"
