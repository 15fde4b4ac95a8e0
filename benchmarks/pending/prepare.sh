#!/usr/bin/env bash
# On the CPU machine: build the A/B trees ab_call.sh compares against the checkout, each a copy of
# dsv4kit/ (git-ignore them: echo '/.ab*/' >> .git/info/exclude), and carry them in the device call:
#   .ab6  HEAD + e1-stores-1/2.patch
#   .ab8  .ab6 with maxnreg 32 on E1's launches (the register cap, spilling on the slow path)
#   .ab7  HEAD + kernel-batch.patch
#   .ab3  959cc63 (before the hot-miss rule), for the CuTeDSL host A/B
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=benchmarks/pending
tree() {  # tree DIR PATCH...: HEAD with the patches applied, dsv4kit/ only
  local dir=$1; shift; local wt; wt=$(mktemp -d)
  git worktree add -q --detach "$wt" HEAD
  for p in "$@"; do git -C "$wt" apply "$PWD/$p"; done
  rm -rf "$dir" && mkdir -p "$dir" && cp -r "$wt/dsv4kit" "$dir/"
  git worktree remove --force "$wt"
}
tree .ab6 $here/e1-stores-1.patch $here/e1-stores-2.patch
tree .ab7 $here/kernel-batch.patch
rm -rf .ab8 && cp -r .ab6 .ab8
python3 - <<'PY'
p = ".ab8/dsv4kit/kernels/encoders/triton.py"
s = open(p).read()
old = '        return {"num_warps": 4}\n'
assert s.count(old) == 1, "launch_options changed: edit prepare.sh"
s = s.replace(old, '        return {"num_warps": 4, "maxnreg": 32} if key_encoder(key) == E1 else {"num_warps": 4}\n')
open(p, "w").write(s)
PY
rm -rf .ab3 && mkdir .ab3 && git archive 959cc63 dsv4kit benchmarks/host_overhead.py | tar -x -C .ab3
du -sh .ab3 .ab6 .ab7 .ab8
