"""rowquant's coarse keys (4 rows per program) cover several column blocks per program, every
block's load issued before the first amax.

With one 128-wide block of 4 rows per program (1 KB) both backends launched 512 Ki CTAs at
T = 65536 x 4096; the SMs' CTA launch rate held achieved occupancy at 36-39 % and both stopped at
60 % of the copy on the H200 (``benchmarks/results/ncu_h200``). Read from the PTX of the
ahead-of-time compiles: the global loads a lane issues before its first cross-lane reduction
(the amax) needs one of them, against the bytes a program reads per lane.
"""

import re

import pytest

from dsv4kit.kernels.rowquant.spec import blocks_per_program

BYTES = {"ld.global.b16": 2, "ld.global.v4.b16": 8, "ld.global.v2.b32": 8, "ld.global.v4.b32": 16}


def _bytes_before_amax(ptx: str) -> int:
    body = ptx[ptx.index(".entry"):]
    first = min(body.find(op) for op in ("redux.sync", "shfl.sync") if op in body)
    return sum(BYTES[op] for op in re.findall(r"ld\.global[.\w]*", body[:first]))


def test_blocks_per_program_divides_the_row() -> None:
    widths = (128, 384, 512, 1024, 1536, 4096, 7168)
    assert [blocks_per_program(n, 4) for n in widths] == [1, 1, 4, 8, 4, 8, 8]
    assert blocks_per_program(4096, 1) == 1          # a decode launch keeps one block


@pytest.mark.parametrize("backend", ["triton", "cutedsl"])
def test_coarse_keys_load_every_block_of_the_program_first(aot_artifacts, backend):
    got = {(key.rows_per_program, key.n_cols): _bytes_before_amax(a.text["ptx"])
           for (b, arch, key), a in aot_artifacts.items() if b == backend and arch == "sm_90a"}
    coarse = {n: v for (rows, n), v in got.items() if rows == 4}
    # 4 rows x colb blocks x 256 bytes over 128 threads: colb x 8 bytes per lane, all before the amax
    assert coarse == {n: 8 * blocks_per_program(n, 4) for n in coarse} and len(coarse) == 2, got
    assert {v for (rows, _), v in got.items() if rows == 1} <= {2, 8}, got  # a decode launch: one load
