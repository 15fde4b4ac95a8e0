"""benchmarks/triton_hash_parts.py: the parts it prints are the ones Triton's hash is made of.

Its record (``benchmarks/results/store_h200/triton_hash_parts_*.json``) says which part differs
between the CPU machine and the H200; that reading holds only while Triton 3.6 composes its hash
the way the script assumes, which this checks on the installed Triton (nothing is compiled).
"""

from __future__ import annotations

import hashlib
import json

from benchmark_scripts import load_benchmark


def test_the_parts_compose_tritons_hash_and_are_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc"))
    script = load_benchmark("triton_hash_parts")
    out = tmp_path / "parts.json"
    assert script.main(["--out", str(out)]) == 0
    p = json.loads(out.read_text())
    key = f"{p['triton_key']}-{p['src_hash']}-{p['backend_hash']}-{p['options_hash']}-{p['env_vars']}"
    assert hashlib.sha256(key.encode()).hexdigest() == p["hash"]
    assert p["triton_key_sha256"] == hashlib.sha256(p["triton_key"].encode()).hexdigest()
    assert p["ext_suffix"].startswith(".cpython-") and "arch='sm90'" in p["options"]
    assert not list((tmp_path / "tc").rglob("*.cubin"))       # it stops at the hash: nothing compiled
