"""rowquant's coarse keys (4 rows per program) keep 16 bytes of x per lane in flight.

With one 8-byte load per lane both backends held 16 KB per SM in flight at full occupancy, below
the ~23 KB Little's law asks at the copy rate, and both stopped at 60 % of the copy on the H200
(``benchmarks/results/sass_mix_sm90a``). Read from the PTX of the ahead-of-time compiles: the
global loads a lane issues before its first cross-lane reduction (the amax) needs one of them.
"""

import re

import pytest

BYTES = {"ld.global.b16": 2, "ld.global.v4.b16": 8, "ld.global.v2.b32": 8, "ld.global.v4.b32": 16}


def _bytes_before_amax(ptx: str) -> int:
    body = ptx[ptx.index(".entry"):]
    first = min(body.find(op) for op in ("redux.sync", "shfl.sync") if op in body)
    return sum(BYTES[op] for op in re.findall(r"ld\.global[.\w]*", body[:first]))


@pytest.mark.parametrize("backend", ["triton", "cutedsl"])
def test_coarse_keys_have_16_bytes_per_lane_in_flight(aot_artifacts, backend):
    got = {key.rows_per_program: _bytes_before_amax(a.text["ptx"])
           for (b, arch, key), a in aot_artifacts.items() if b == backend and arch == "sm_90a"}
    assert got[4] == 16, got
    assert got[1] in (2, 8), got        # one row per program: a decode-size launch, one row's load
