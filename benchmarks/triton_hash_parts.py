#!/usr/bin/env python3
"""What Triton's compile hash is made of, for one DSv4-Flash key, on this machine.

    python3 benchmarks/triton_hash_parts.py [--out FILE.json]

Triton 3.6 names a compiled kernel (and its cache directory) by sha256 of
``triton_key() - src.hash() - backend.hash() - options.hash() - env vars``. An artifact-store entry
built on one machine loads on another only where that hash is equal (issue 15), so this prints
each part for K7 (``C128CompressTriton``, sm_90a) to diff two machines' outputs. It stops inside
``triton.compile`` right after the hash (nothing is compiled) and needs no GPU.

``store_compile_id`` is what the artifact store keys a Triton entry by since issue 40: the same
parts with the Triton version in place of ``triton_key()`` (``TritonCompileId.portable``), so it is
equal on two machines whose ``triton_key()`` differs only by the Python build of ``libtriton``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Stop(Exception):
    pass


def parts() -> dict[str, str]:
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-hash-"))
    import triton.compiler.compiler as cc
    from triton.runtime.cache import triton_key

    from dsv4kit.kernels.c128_compress.triton import C128CompressTriton
    from dsv4kit.model.stack import DSv4AttentionStack
    from dsv4kit.platform import cpu_platform

    got: dict[str, str] = {}
    orig = cc.get_cache_key

    def spy(src, backend, options, env_vars):  # type: ignore[no-untyped-def]
        key = orig(src, backend, options, env_vars)
        got.update(hash=hashlib.sha256(key.encode()).hexdigest(), triton_key=triton_key(),
                   src_hash=src.hash(), backend_hash=backend.hash(), options_hash=options.hash(),
                   env_vars=str(sorted(env_vars.items())), options=repr(options))
        raise _Stop

    cc.get_cache_key = spy
    key = DSv4AttentionStack("flash", cpu_platform("sm_90a")).warmup_keys()["C128CompressTriton"][0]
    try:
        C128CompressTriton().compile(key)
    except _Stop:
        pass
    finally:
        cc.get_cache_key = orig
    got["triton_key_sha256"] = hashlib.sha256(got.get("triton_key", "").encode()).hexdigest()
    if "hash" in got:
        import triton

        text = "-".join((triton.__version__, got["src_hash"], got["backend_hash"], got["options_hash"],
                         got["env_vars"]))
        got["store_compile_id"] = hashlib.sha256(text.encode()).hexdigest()
        got["store_compile_id_check"] = C128CompressTriton().compile_id(key).portable
    import sysconfig

    got["python"] = sys.version.split()[0]
    got["ext_suffix"] = str(sysconfig.get_config_var("EXT_SUFFIX"))  # the libtriton triton_key hashes
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    p = parts()
    text = json.dumps(p, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in p.items() if k != "triton_key"}, indent=1))
    return 0 if "hash" in p else 1


if __name__ == "__main__":
    raise SystemExit(main())
