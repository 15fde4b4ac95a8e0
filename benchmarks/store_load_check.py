"""A store built elsewhere, loaded here: warmup compiles nothing, and the replay after it neither.

Issues 15 and 40's check of a CPU-built store on the GPU (it runs on a CPU too, for the Triton
entries):

1. ``--import FILE``: the tar of ``dsv4kit cache export`` goes into a fresh ``--cache-dir``;
2. Triton's own cache is an empty directory, so only the store can supply compiled code;
3. for every ``--presets`` x ``--backends`` pair, ``dsv4kit coverage`` warms the preset from the
   store and replays a serving trace under the JIT monitor in ``error`` mode, while Triton's
   compilation listener counts code generation (``cache_hit=False``) and every ``cute.compile``
   call is counted;
4. ``result.json``: per run the counts, the store's hit/compiled line and the CLI's exit code;
   the check passes when, in every run, every key was a hit and nothing was compiled.

    python benchmarks/store_load_check.py --import store.tar --cache-dir /tmp/s --out OUT \
        [--device cuda] [--presets flash,pro] [--backends triton,cutedsl]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--import", dest="tar", default=None, help="a tar file written by `dsv4kit cache export`")
    p.add_argument("--cache-dir", required=True, help="the store to warm from (created by --import)")
    p.add_argument("--out", required=True, help="directory for result.json and coverage.json")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--steps", type=int, default=8, help="serving steps replayed after warmup")
    p.add_argument("--presets", default="flash", help="comma-separated presets to warm (default flash)")
    p.add_argument("--backends", default="auto",
                   help="comma-separated backends to warm: auto, triton, cutedsl (default auto)")
    return p.parse_args(argv)


def _coverage(args: argparse.Namespace, preset: str, backend: str, out: Path) -> dict[str, Any]:
    """One ``dsv4kit coverage`` run from the store, with code generation counted."""
    from triton import knobs

    from dsv4kit import cli

    out.mkdir(parents=True, exist_ok=True)
    codegen: list[str] = []
    prev = knobs.compilation.listener

    def listener(*, src: Any, metadata: Any, cache_hit: bool, **kw: Any) -> None:
        if not cache_hit:
            codegen.append(getattr(src, "name", repr(src)))
        if prev is not None:
            prev(src=src, metadata=metadata, cache_hit=cache_hit, **kw)

    cute = None
    text = io.StringIO()
    knobs.compilation.listener = listener
    try:
        with contextlib.ExitStack() as stack:
            if args.device == "cuda":
                with contextlib.suppress(Exception):  # no CuTeDSL: nothing of it can compile either
                    from dsv4kit.backends.cutedsl import count_cute_compiles
                    cute = stack.enter_context(count_cute_compiles())
            with contextlib.redirect_stdout(text):
                rc = cli.main(["coverage", "--no-progress", "--device", args.device, "--arch", args.arch,
                               "--preset", preset, "--backend", backend, "--cache-dir", args.cache_dir,
                               "--steps", str(args.steps), "--json", str(out / "coverage.json")])
    finally:
        knobs.compilation.listener = prev
    log = text.getvalue()
    (out / "coverage.log").write_text(log)
    m = re.search(r"store: (\d+) hit\(s\), (\d+) compiled", log)
    hits, compiled = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    k = re.search(r"kernel\(s\), (\d+) key\(s\)", log)
    keys = int(k.group(1)) if k else None
    cute_calls = None if cute is None else len(cute.events)
    run = {"preset": preset, "backend": backend, "coverage_rc": rc, "keys": keys, "store_hits": hits,
           "store_compiled": compiled, "triton_codegen": codegen, "cute_compile_calls": cute_calls}
    # Every key a store hit: a key Triton's own cache served would be neither a hit nor compiled.
    run["pass"] = bool(rc == 0 and hits and hits == keys and compiled == 0 and not codegen and not cute_calls)
    print(f"{preset}/{backend}: coverage rc {rc}; store {hits} hit(s), {compiled} compiled; Triton code "
          f"generation {len(codegen)}; cute.compile {cute_calls}; {'PASS' if run['pass'] else 'FAIL'}")
    return run


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Before triton is imported: its own cache must not be able to supply anything.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="empty-triton-cache-")
    from dsv4kit.bench import provenance, write_json
    from dsv4kit.jit.store import ArtifactStore, StoreIOError

    imported = None
    if args.tar:
        try:
            added, problems = ArtifactStore(Path(args.cache_dir)).import_(args.tar)
        except StoreIOError as exc:
            print(f"store_load_check: {exc}", file=sys.stderr)
            return 2
        imported = {"added": added, "problems": [str(p) for p in problems]}
    pairs = [(p, b) for p in args.presets.split(",") for b in args.backends.split(",")]
    runs = [_coverage(args, p, b, out if len(pairs) == 1 else out / f"{p}_{b}") for p, b in pairs]
    first = runs[0]
    result = {"provenance": provenance({"device_arg": args.device, "arch": args.arch}), "imported": imported,
              # The first run's counts at the top level, as the single-run record of issue 15 had them.
              **{k: first[k] for k in ("coverage_rc", "store_hits", "store_compiled", "triton_codegen",
                                       "cute_compile_calls")},
              "runs": runs, "pass": all(r["pass"] for r in runs)}
    write_json(out / "result.json", result)
    print(f"{sum(r['pass'] for r in runs)} / {len(runs)} runs pass: {'PASS' if result['pass'] else 'FAIL'}")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
