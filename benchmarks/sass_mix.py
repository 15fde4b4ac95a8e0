"""Static SASS analysis of the memory-bound kernels for one arch, on CPU (issue 16, deliverable 1).

For the large-size key of every sweep plan of :data:`dsv4kit.bench.PLANS` (the last of
``plan.sizes``; every point of it, so K3, K4 and the C4 ops give one key per configuration) and
both backends, this script compiles the key ahead of time for ``--arch`` (as warmup does on a
CPU machine), disassembles the cubin with the ``cuobjdump`` inside the Triton wheel and records:

* resources: registers, spills, static and dynamic shared memory, threads per CTA, and the
  theoretical occupancy on an H200 (sm_90; formula in :func:`occupancy`);
* the SASS instruction mix by class (:data:`CLASSES`, :func:`classify`), the widths of the global
  loads and stores, and per loop (backward branch) the mix of its body;
* the *main path*: one pass through the control-flow graph (back edges removed, every loop body
  once; objectives in :data:`OBJECTIVES`): the most global bytes per thread, then the fewest memory
  instructions (of a vector and a scalar copy of the same work, the vector one), then the most
  instructions; a slow-path subroutine call behind a branch is taken not to run
  (:func:`prune_slow_paths`). Also the *heavy* path (the most instructions) and the *exit* path;
* the *headline*: per launched thread, the main path with its busiest innermost loop repeated as
  often as the bytes model implies, and where only a known share of the threads works
  (:data:`WORKING_FRACTION`), that share of it plus the rest on the exit path; its instructions
  per byte of the bytes model (each DRAM byte once) and per byte its own accesses request;
* bytes in flight: along the main path, the batches of global loads issued before the first
  instruction that touches a register one of them writes (a static read of the scoreboard; an
  instruction that names a pending register, a barrier or a cp.async wait closes the batch);
* the launch at that size: CTAs (Triton: the kernel's own ``grid`` for the arguments a GPU
  process would pass; CuTeDSL: the grid formula of its host function, :func:`cute_ctas`), waves,
  and the plan's bytes model per launched thread;
* a pipe model (:func:`pipe_model`): per warp of the headline, issue cycles, the busiest
  arithmetic pipe's cycles and the DRAM cycles at the measured copy bandwidth; the ratio of the
  larger of the first two to the third says whether the instruction stream can keep up with the
  copy rate at all.

Everything is static: no GPU, no profiler, no achieved occupancy. Numbers describe the code
warmup compiles, not a measurement.

    python benchmarks/sass_mix.py --arch sm_90a --out benchmarks/results/sass_mix_sm90a [--families F,...]

Writes ``sass_mix.json`` (per kernel the numbers above, and the provenance: date, commit,
versions, arch, kernel source hash per family) and ``sass_mix.md`` (tables and, per kernel,
what bounds it: that section is written by hand between two markers, and a rerun keeps it).
``--families``: plan names or family names (default: every plan). A backend that cannot compile
here (CuTeDSL not importable) is skipped with a note. ``--size decode`` analyses each plan's
largest decode size instead (``plan.decode_sizes``, T = 256; plans without decode sizes are left
out): there the launch is latency-bound, and the load batches on the path (dependent DRAM round
trips) and the waves are what the record is for; ``--size N``, any size of every plan.

    python benchmarks/sass_mix.py --arch sm_90a --size decode --out benchmarks/results/sass_mix_sm90a_decode

``--machine h100``: the H100's measured copy bandwidth (3020 GB/s) in the pipe model and in Little's
law (the per-SM limits and the clock are the same as the H200's); default ``h200``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import platform as _platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# --------------------------------------------------------------------------- the machine model
#: H200 SXM (sm_90) figures the analysis uses. Per-SM limits are those of compute capability 9.0
#: (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"); the copy
#: bandwidth is the device-to-device copy measured in the recorded H200 runs
#: (benchmarks/results/NOTES.md: 4265-4274 GB/s); the clock is the H200's maximum boost clock.
H200 = {
    "sms": 132,
    "regs_per_sm": 65536,
    "reg_sub_partitions": 4,
    "reg_alloc_unit_per_warp": 256,
    "max_regs_per_cta": 65536,
    "max_threads_per_sm": 2048,
    "max_warps_per_sm": 64,
    "max_ctas_per_sm": 32,
    "smem_per_sm": 233472,          # 228 KiB
    "smem_reserved_per_cta": 1024,  # cudaDevAttrReservedSharedMemoryPerBlock on sm_80+
    "smem_alloc_unit": 128,
    "issue_per_sm_per_clk": 4,      # one warp instruction per scheduler (4 per SM) per clock
    "clock_ghz": 1.98,
    "copy_GBps": 4268.0,
    "assumed_dram_latency_ns": 700.0,
    "name": "H200",
}

#: H100 SXM (sm_90): the same per-SM limits (compute capability 9.0) and boost clock (1.98 GHz);
#: the copy bandwidth is the device-to-device copy of the recorded H100 runs
#: (benchmarks/results/bench_h100/README.md: 3018-3021 GB/s).
H100 = {**H200, "copy_GBps": 3020.0, "name": "H100"}

#: ``--machine``: which machine model the occupancy, waves, pipe model and bytes in flight use.
MACHINES = {"h200": H200, "h100": H100}

#: Lanes per SM per clock of each arithmetic pipe (compute capability 9.0, Programming Guide
#: "Arithmetic Instructions" throughput table): fp32 add/mul/fma 128; 32-bit integer add, shift,
#: compare, min/max, logic and multiply-add 64; warp shuffle 32; type conversions and the
#: special-function unit 16. ``PIPE_OF``: which pipe a class issues to (an approximation: packed
#: F2FP conversions are put with the other conversions, moves and selects with the integer ALU).
PIPE_LANES = {"fma": 128, "alu": 64, "imad": 64, "shfl": 32, "xu": 16}
PIPE_OF = {"fp32": "fma", "fp16x2": "fma", "int_address": "alu", "move_permute": "alu",
           "predicate_branch": "alu", "conversion": "xu", "mufu": "xu", "warp_shuffle": "shfl"}

# --------------------------------------------------------------------------- SASS parsing

#: The instruction classes, in table order.
CLASSES = ("global_load", "global_store", "global_atomic", "shared", "local", "constant", "fp32",
           "fp16x2", "mufu", "int_address", "conversion", "move_permute", "predicate_branch",
           "warp_shuffle", "uniform", "sync", "never", "nop", "other")

_OPS = {
    "global_load": {"LDG", "LD", "LDGSTS", "UTMALDG", "UBLKCP"},
    "global_store": {"STG", "ST", "UTMASTG"},
    "global_atomic": {"RED", "ATOM", "ATOMG", "REDG"},
    "shared": {"LDS", "STS", "LDSM", "STSM", "ATOMS"},
    "local": {"LDL", "STL"},
    "constant": {"LDC", "ULDC"},
    "fp32": {"FADD", "FMUL", "FFMA", "FADD32I", "FMUL32I", "FFMA32I", "FMNMX", "FCHK", "FSWZADD", "FSET"},
    "fp16x2": {"HADD2", "HMUL2", "HFMA2", "HMNMX2", "HSET2", "HADD2_32I", "HMUL2_32I", "HFMA2_32I"},
    "mufu": {"MUFU"},
    "int_address": {"IMAD", "IMUL", "IADD3", "IADD", "IADD32I", "VIADD", "LEA", "SHF", "SHL", "SHR",
                    "LOP3", "LOP", "LOP32I", "IMNMX", "VIMNMX", "VIMNMX3", "VIADDMNMX", "IABS", "POPC",
                    "FLO", "BREV", "BMSK", "SGXT", "IDP", "ISCADD", "XMAD", "IMAD32I", "IMUL32I",
                    "VABSDIFF", "VABSDIFF4"},
    "conversion": {"F2F", "F2I", "I2F", "I2I", "F2FP", "I2FP", "F2IP", "I2IP", "FRND"},
    "move_permute": {"PRMT", "MOV", "MOV32I", "SEL", "FSEL"},
    "predicate_branch": {"ISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "PLOP3", "P2R", "R2P", "BRA", "BRX",
                         "JMP", "JMX", "EXIT", "RET", "CALL", "BSSY", "BSYNC", "WARPSYNC", "BREAK", "KILL",
                         "BPT", "YIELD", "NANOSLEEP"},
    "warp_shuffle": {"SHFL", "VOTE", "REDUX", "MATCH"},
    "sync": {"BAR", "MEMBAR", "DEPBAR", "LDGDEPBAR", "ERRBAR", "FENCE", "CCTL", "CCTLL", "SYNCS",
             "ARRIVES"},
    "nop": {"NOP"},
}
_CLASS_OF = {op: cls for cls, ops in _OPS.items() for op in ops}
_UNIFORM_EXTRA = {"S2UR", "R2UR", "VOTEU"}

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_PRED = re.compile(r"^@(!?U?P[T0-6])\s+")
_REG = re.compile(r"\bR(\d+)\b(\.64)?")
_HEX = re.compile(r"^0x([0-9a-f]+)$")


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: address, guard predicate (``P0``, ``!P1``; None: always), the opcode
    with its modifiers (``LDG.E.128``) and the operands as written."""

    addr: int
    pred: str | None
    op: str
    operands: tuple[str, ...]

    @property
    def base(self) -> str:
        return self.op.split(".")[0]

    @property
    def mods(self) -> tuple[str, ...]:
        return tuple(self.op.split(".")[1:])

    @property
    def cls(self) -> str:
        return classify(self)


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """The instructions of every function in ``cuobjdump -sass`` output, by function name."""
    out: dict[str, list[Instr]] = {}
    current: list[Instr] | None = None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = _LINE.match(line)
        if m is None or current is None:
            continue
        body = m.group(2).strip()
        pred = None
        pm = _PRED.match(body)
        if pm:
            pred, body = pm.group(1), body[pm.end():]
        op, _, rest = body.partition(" ")
        operands = tuple(o.strip() for o in rest.split(",") if o.strip()) if rest.strip() else ()
        current.append(Instr(int(m.group(1), 16), pred, op, operands))
    return out


def classify(ins: Instr) -> str:
    """The class of ``ins`` (one of :data:`CLASSES`). ``never``: guarded by ``!PT``, so it issues but
    never executes (the ``@!PT LDS RZ, [RZ]`` the compiler puts before cp.async copies, say)."""
    if ins.pred == "!PT":
        return "never"
    base = ins.base
    if base == "IMAD" and ins.mods[:1] == ("MOV",):
        return "move_permute"           # IMAD.MOV(.U32) is a register move issued to the FMA pipe
    if base == "CS2R":
        return "move_permute" if "SRZ" in ins.operands else "other"
    cls = _CLASS_OF.get(base)
    if cls is not None:
        return cls
    if base in _UNIFORM_EXTRA or (base.startswith("U") and base != "ULDC"):
        return "uniform"
    return "other"


def access_bytes(ins: Instr) -> int:
    """Bytes one thread moves with the memory instruction ``ins`` (from its width modifier)."""
    mods = set(ins.mods)
    if ins.base in ("LDSM", "STSM"):
        return 16 if "4" in mods else 8 if "2" in mods else 4
    for tok, n in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("16", 2), ("U8", 1), ("S8", 1), ("8", 1)):
        if tok in mods:
            return n
    return 4


def global_bytes(ins: Instr) -> int:
    """Global-memory bytes of ``ins`` for one thread (0 for anything else)."""
    return access_bytes(ins) if classify(ins) in ("global_load", "global_store", "global_atomic") else 0


_PTOK = re.compile(r"^!?U?P([0-6])$")


def moved_bytes(seq: Iterable[Instr],
                classes: Sequence[str] = ("global_load", "global_store", "global_atomic")) -> int:
    """Global bytes one thread moves along ``seq`` (instructions of ``classes``): an unguarded access
    counts; accesses guarded by ``Pn`` and by ``!Pn`` with no instruction naming ``Pn`` between them
    exclude each other (if-converted alternatives, e.g. a vector and a scalar copy of the same
    loads), so the larger side counts, not both. (Instructions are still all issued.)"""
    total = 0
    groups: dict[str, list[int]] = {}

    def flush(name: str) -> None:
        nonlocal total
        g = groups.pop(name, None)
        if g is not None:
            total += max(g)

    for ins in seq:
        for o in ins.operands:
            m = _PTOK.match(o.strip())
            if m:
                flush(o.strip().lstrip("!"))
        if classify(ins) not in classes:
            continue
        b = access_bytes(ins)
        if ins.pred in (None, "PT"):
            total += b
            continue
        name, neg = ins.pred.lstrip("!"), ins.pred.startswith("!")
        groups.setdefault(name, [0, 0])[int(neg)] += b
    for name in list(groups):
        flush(name)
    return total


def _is_store(ins: Instr) -> bool:
    return classify(ins) in ("global_store", "global_atomic", "shared", "local") and ins.base in (
        "STG", "ST", "STS", "STL", "RED", "REDG", "STSM")


def regs_of(ins: Instr) -> tuple[set[int], set[int]]:
    """``(written, mentioned)`` general registers of ``ins``: the first operand of a non-store is
    its destination (widened by a load's width); every ``Rn`` anywhere counts as mentioned
    (``Rn.64`` is two registers, a store's data operand as wide as the store)."""
    written: set[int] = set()
    mentioned: set[int] = set()
    width_regs = max(1, access_bytes(ins) // 4) if classify(ins) in (
        "global_load", "global_store", "global_atomic", "shared", "local") else 1
    for i, opnd in enumerate(ins.operands):
        for m in _REG.finditer(opnd):
            n = int(m.group(1))
            k = 2 if m.group(2) else 1
            is_data = (i == 0 and not _is_store(ins)) or (_is_store(ins) and i == len(ins.operands) - 1)
            if is_data and "[" not in opnd:
                k = max(k, width_regs)
            regs = set(range(n, n + k))
            mentioned |= regs
            if i == 0 and not _is_store(ins) and "[" not in opnd:
                written |= regs
    return written, mentioned


def mix(instrs: Iterable[Instr]) -> dict[str, Any]:
    """Class counts, total, the widths of global loads / stores / cp.async and shared accesses,
    the global bytes of one pass, and the most frequent opcodes."""
    instrs = list(instrs)
    classes = Counter({c: 0 for c in CLASSES})
    widths: dict[str, Counter] = {k: Counter() for k in ("LDG", "STG", "LDGSTS", "shared")}
    ops = Counter()
    for ins in instrs:
        c = classify(ins)
        classes[c] += 1
        ops[ins.base if c != "move_permute" or ins.base != "IMAD" else "IMAD.MOV"] += 1
        if c == "never":
            continue
        if ins.base in ("LDG", "LD"):
            widths["LDG"][f"{8 * access_bytes(ins)}b"] += 1
        elif ins.base in ("STG", "ST"):
            widths["STG"][f"{8 * access_bytes(ins)}b"] += 1
        elif ins.base == "LDGSTS":
            widths["LDGSTS"][f"{8 * access_bytes(ins)}b"] += 1
        elif c == "shared":
            widths["shared"][f"{ins.base}.{8 * access_bytes(ins)}b"] += 1
    load_b = moved_bytes(instrs, ("global_load",))
    store_b = moved_bytes(instrs, ("global_store", "global_atomic"))
    return {
        "total": len(instrs),
        "issued": len(instrs) - classes["nop"],
        "classes": dict(classes),
        "widths": {k: dict(sorted(v.items())) for k, v in widths.items()},
        "global_load_bytes": load_b,
        "global_store_bytes": store_b,
        "global_bytes_issued": sum(global_bytes(i) for i in instrs),
        "top_opcodes": dict(ops.most_common(12)),
    }


# --------------------------------------------------------------------------- control flow


@dataclass
class Block:
    index: int
    instrs: list[Instr]
    succ: list[int] = field(default_factory=list)

    @property
    def start(self) -> int:
        return self.instrs[0].addr

    @property
    def end(self) -> int:
        return self.instrs[-1].addr

    @property
    def has_exit(self) -> bool:
        return any(i.base in ("EXIT", "RET") for i in self.instrs)


_ENDS_BLOCK = {"BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "BPT", "KILL", "CALL"}


def _target(ins: Instr) -> int | None:
    for o in reversed(ins.operands):
        m = _HEX.match(o.strip())
        if m:
            return int(m.group(1), 16)
    return None


def _guarded(ins: Instr) -> bool:
    """Whether a branch or exit may fall through: a guard predicate other than PT, or a
    condition operand besides the target (``BRA.U !UP0, 0x..``, ``BRA.DIV UR4, 0x..``)."""
    return (ins.pred not in (None, "PT")) or len(ins.operands) > 1


def build_cfg(instrs: Sequence[Instr]) -> list[Block]:
    """Basic blocks of one function, in address order, with successor indices."""
    if not instrs:
        return []
    leaders = {instrs[0].addr}
    for k, ins in enumerate(instrs):
        if ins.base in _ENDS_BLOCK:
            if k + 1 < len(instrs):
                leaders.add(instrs[k + 1].addr)
            if ins.base in ("BRA", "JMP"):
                t = _target(ins)
                if t is not None:
                    leaders.add(t)
    blocks: list[Block] = []
    for ins in instrs:
        if ins.addr in leaders or not blocks:
            blocks.append(Block(len(blocks), []))
        blocks[-1].instrs.append(ins)
    at = {b.start: b.index for b in blocks}
    for b in blocks:
        last = b.instrs[-1]
        nxt = b.index + 1 if b.index + 1 < len(blocks) else None
        if last.base in ("BRA", "JMP"):
            t = _target(last)
            if t is not None and t in at:
                b.succ.append(at[t])
            if _guarded(last) and nxt is not None:
                b.succ.append(nxt)
        elif last.base in ("EXIT", "RET", "BPT", "KILL"):
            if _guarded(last) and nxt is not None:
                b.succ.append(nxt)
        elif last.base in ("BRX", "JMX"):
            pass  # an indirect branch: its targets are not read here
        elif nxt is not None:
            b.succ.append(nxt)
    return blocks


def reachable(blocks: Sequence[Block], entry: int = 0) -> set[int]:
    seen, todo = set(), [entry]
    while todo:
        b = todo.pop()
        if b in seen:
            continue
        seen.add(b)
        todo += blocks[b].succ
    return seen


def find_loops(blocks: Sequence[Block]) -> list[dict[str, Any]]:
    """One loop per backward branch (a successor at or before the branch's block): its head, its
    latch and the reachable blocks between them in address order (structured code assumed)."""
    live = reachable(blocks)
    loops = []
    for b in blocks:
        if b.index not in live:
            continue
        for s in b.succ:
            if blocks[s].start <= b.start:
                body = [x.index for x in blocks if x.index in live and blocks[s].start <= x.start <= b.start]
                loops.append({"head": s, "latch": b.index, "blocks": body})
    for lp in loops:
        inner = [o for o in loops if o is not lp and set(o["blocks"]) < set(lp["blocks"])]
        lp["innermost"] = not inner
    return loops


#: How a single pass through the CFG is chosen (see also :func:`prune_slow_paths`):
#: ``main``: the most global bytes moved; then the fewest global memory instructions (of a vector
#: and a scalar copy of the same accesses, the vector one); then the most instructions (a guarded
#: block that moves nothing, a computation under an ``if``, is assumed to run);
#: ``heavy``: the most instructions, then the most bytes (the longest branch everywhere: what a warp
#: issues when its lanes take both sides of every branch);
#: ``exit``: the fewest instructions to an exit (what a thread with nothing to do issues).
OBJECTIVES = ("main", "heavy", "exit")
_MEMORY = ("global_load", "global_store", "global_atomic")


def _score(block: Block, objective: str = "main") -> tuple[int, ...]:
    b = moved_bytes(block.instrs)
    n = sum(1 for i in block.instrs if i.base != "NOP")
    mem = sum(1 for i in block.instrs if classify(i) in _MEMORY)
    return {"main": (b, -mem, n), "heavy": (n, b, 0), "exit": (-n, -b, 0)}[objective]


def prune_slow_paths(blocks: Sequence[Block]) -> int:
    """Drop the edges into a block that calls a subroutine from a block that could branch
    elsewhere: the call of a slow path (an IEEE division's, an integer division's by a runtime
    value) reached by a conditional branch is assumed not taken. Returns the edges dropped."""
    calls = {b.index for b in blocks if any(i.base == "CALL" for i in b.instrs)}
    dropped = 0
    for b in blocks:
        if len(b.succ) > 1 and any(s in calls for s in b.succ) and any(s not in calls for s in b.succ):
            dropped += sum(1 for s in b.succ if s in calls)
            b.succ = [s for s in b.succ if s not in calls]
    return dropped


def best_path(blocks: Sequence[Block], region: Iterable[int], entry: int, ends: Iterable[int],
              objective: str = "main") -> list[int]:
    """The forward path from ``entry`` to one of ``ends`` inside ``region`` that is best for
    ``objective`` (:data:`OBJECTIVES`; back edges are not followed, so every loop body is passed
    once)."""
    region = set(region)
    ends = set(ends) & region
    best: dict[int, tuple[int, ...]] = {entry: _score(blocks[entry], objective)}
    parent: dict[int, int] = {}
    for b in sorted(region, key=lambda i: blocks[i].start):
        if b not in best:
            continue
        for s in blocks[b].succ:
            if s in region and blocks[s].start > blocks[b].start:
                sc = _score(blocks[s], objective)
                cand = tuple(x + y for x, y in zip(best[b], sc, strict=True))
                if s not in best or cand > best[s]:
                    best[s], parent[s] = cand, b
    done = [e for e in ends if e in best]
    if not done:
        return []
    end = max(done, key=lambda e: best[e])
    path = [end]
    while path[-1] != entry:
        path.append(parent[path[-1]])
    return path[::-1]


# --------------------------------------------------------------------------- bytes in flight

_BATCH_STOP = {"BAR", "DEPBAR", "MEMBAR", "SYNCS", "WARPSYNC"}


def _complement(g1: str | None, g2: str | None) -> bool:
    """Whether guards ``g1`` and ``g2`` are ``Pn`` and ``!Pn``: the two never run for one thread."""
    return bool(g1 and g2 and g1.lstrip("!") == g2.lstrip("!") and g1.startswith("!") != g2.startswith("!"))


def load_batches(seq: Sequence[Instr]) -> list[dict[str, Any]]:
    """Batches of global loads (LDG / LD) along ``seq`` issued before a use of any of them.

    A batch opens at a load; a later load joins it unless it names a register an earlier load
    of the batch writes (a dependent load: the address comes from a pending load); any other
    instruction that names a pending register, and any barrier or cp.async wait, closes it. An
    instruction guarded by the complement of a pending load's guard does not conflict with it
    (if-converted alternatives), and such alternatives' bytes count once (:func:`moved_bytes`).
    Per batch: loads, bytes per thread, and the instructions issued while it was open.
    """
    batches: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None

    def close() -> None:
        nonlocal cur
        if cur is not None:
            batches.append({"start": cur["start"], "loads": cur["loads"], "bytes": moved_bytes(cur["seq"]),
                            "instrs_open": cur["instrs_open"]})
        cur = None

    def conflict(ins: Instr, regs: set[int]) -> bool:
        return cur is not None and any(r in cur["pending"] and not _complement(ins.pred, cur["pending"][r])
                                       for r in regs)

    for ins in seq:
        if ins.pred == "!PT":
            continue  # never executes
        written, mentioned = regs_of(ins)
        if ins.base in ("LDG", "LD"):
            if conflict(ins, mentioned):
                close()
            if cur is None:
                cur = {"start": f"{ins.addr:#06x}", "loads": 0, "instrs_open": 0, "pending": {}, "seq": []}
            cur["loads"] += 1
            cur["seq"].append(ins)
            for r in written:
                cur["pending"][r] = ins.pred
            continue
        if cur is None:
            continue
        if ins.base in _BATCH_STOP or conflict(ins, mentioned):
            close()
        else:
            cur["instrs_open"] += 1
            if any(_PTOK.match(o.strip()) for o in ins.operands):
                cur["seq"].append(ins)  # a predicate redefinition ends the pairing of guards
    close()
    return batches


def batch_summary(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not batches:
        return {"batches": 0, "max_loads": 0, "max_bytes": 0, "first_loads": 0, "first_bytes": 0,
                "byte_weighted_mean_bytes": 0.0}
    total = sum(b["bytes"] for b in batches)
    return {
        "batches": len(batches),
        "max_loads": max(b["loads"] for b in batches),
        "max_bytes": max(b["bytes"] for b in batches),
        "first_loads": batches[0]["loads"],
        "first_bytes": batches[0]["bytes"],
        # the size of the batch an average loaded byte travels in
        "byte_weighted_mean_bytes": round(sum(b["bytes"] ** 2 for b in batches) / total, 1) if total else 0.0,
    }


def cp_async_summary(seq: Sequence[Instr]) -> dict[str, Any] | None:
    """cp.async (LDGSTS) along ``seq``: bytes per thread, commit groups (LDGDEPBAR) and the depths
    of the waits (``DEPBAR.LE SB0, N``: N groups may stay in flight)."""
    n = sum(1 for i in seq if i.base == "LDGSTS")
    if not n:
        return None
    depths = sorted({int(o, 0) for i in seq if i.base == "DEPBAR" for o in i.operands[1:2]
                     if re.fullmatch(r"0x[0-9a-f]+|\d+", o)})
    groups = sum(1 for i in seq if i.base == "LDGDEPBAR")
    return {"ldgsts": n, "bytes": sum(access_bytes(i) for i in seq if i.base == "LDGSTS"),
            "commit_groups": groups, "wait_depths": depths}


# --------------------------------------------------------------------------- occupancy


def occupancy(registers: int, threads: int, smem_bytes: int, hw: Mapping[str, Any] = H200) -> dict[str, Any]:
    """Theoretical occupancy on one SM (the method of the CUDA occupancy calculator).

    warps per CTA ``W = ceil(threads / 32)``; registers per warp ``Rw = ceil(32 * regs / 256) * 256``;
    by registers: ``floor(4 * floor(16384 / Rw) / W)`` CTAs (the register file is four banks of
    16384, one per scheduler, and a warp lives in one); by warps: ``floor(64 / W)``; by shared
    memory: ``floor(233472 / ceil128(smem + 1024))`` (1 KiB is reserved per CTA); at most 32 CTAs.
    Occupancy = CTAs * W / 64.
    """
    w = max(1, -(-threads // 32))
    unit = hw["reg_alloc_unit_per_warp"]
    rw = -(-max(registers, 1) * 32 // unit) * unit
    per_bank = hw["regs_per_sm"] // hw["reg_sub_partitions"]
    if rw * w > hw["max_regs_per_cta"]:
        by_regs = 0
    else:
        by_regs = (hw["reg_sub_partitions"] * (per_bank // rw)) // w
    by_warps = hw["max_warps_per_sm"] // w
    su = hw["smem_alloc_unit"]
    smem_cta = -(-(smem_bytes + hw["smem_reserved_per_cta"]) // su) * su
    by_smem = hw["smem_per_sm"] // smem_cta
    limits = {"registers": by_regs, "warps": by_warps, "shared_memory": by_smem,
              "ctas": hw["max_ctas_per_sm"]}
    ctas = min(limits.values())
    return {
        "warps_per_cta": w, "regs_per_warp": rw, "smem_per_cta_allocated": smem_cta,
        "ctas_per_sm_limits": limits, "ctas_per_sm": ctas, "warps_per_sm": ctas * w,
        "occupancy": ctas * w / hw["max_warps_per_sm"],
        "limited_by": sorted(k for k, v in limits.items() if v == ctas),
    }


# --------------------------------------------------------------------------- pipe model


def pipe_model(classes: Mapping[str, float], imad: float, gbytes: float,
               hw: Mapping[str, Any] = H200) -> dict[str, Any]:
    """Cycles one SM spends per warp of a region with per-thread class counts ``classes`` (``imad``
    of its ``int_address`` instructions are IMADs, on their own 64-lane pipe) moving ``gbytes``
    global bytes per thread: issue (4 warp instructions per clock per SM), each arithmetic pipe
    (:data:`PIPE_LANES`: 32 lanes per warp instruction / the pipe's lanes per clock) and DRAM at
    the measured copy bandwidth. ``instr_over_dram``: the largest of issue and pipe cycles over the
    DRAM cycles; ``ceiling_fraction_of_copy``: its inverse capped at 1, the fraction of copy
    bandwidth the instruction stream allows with perfect overlap (a bound, not a prediction)."""
    issued = sum(v for k, v in classes.items() if k != "nop")
    pipes: Counter = Counter()
    for cls, n in classes.items():
        p = PIPE_OF.get(cls)
        if p is not None:
            pipes[p] += n
    pipes["alu"] -= imad
    pipes["imad"] += imad
    cycles = {p: 32 * n / PIPE_LANES[p] for p, n in pipes.items() if n > 0}
    issue = issued / hw["issue_per_sm_per_clk"]
    bytes_per_clk = hw["copy_GBps"] / (hw["sms"] * hw["clock_ghz"])
    dram = 32 * gbytes / bytes_per_clk if gbytes else 0.0
    worst = max([issue, *cycles.values()])
    busiest = "issue" if issue >= max(cycles.values(), default=0.0) else max(cycles, key=cycles.__getitem__)
    return {
        "issue_cycles": round(issue, 1), "pipe_cycles": {k: round(v, 1) for k, v in sorted(cycles.items())},
        "dram_cycles": round(dram, 1), "busiest": busiest,
        "instr_over_dram": round(worst / dram, 3) if dram else None,
        "ceiling_fraction_of_copy": round(min(1.0, dram / worst), 3) if worst and dram else None,
        "dram_bytes_per_sm_clk": round(bytes_per_clk, 2),
    }


def _imad_count(instrs: Iterable[Instr]) -> int:
    return sum(1 for i in instrs
               if i.base in ("IMAD", "IMUL", "IMAD32I", "IMUL32I") and classify(i) == "int_address")


# --------------------------------------------------------------------------- one function


def _region(m: Mapping[str, Any]) -> dict[str, Any]:
    gb = m["global_load_bytes"] + m["global_store_bytes"]
    return {"issued": m["issued"], "global_bytes": gb, "classes": m["classes"],
            "instr_per_byte": round(m["issued"] / gb, 3) if gb else None}


def _combine(terms: Sequence[tuple[float, Sequence[Instr]]]) -> dict[str, Any]:
    """Per-thread totals of a weighted sum of instruction sequences (weight: passes per thread)."""
    classes = {c: 0.0 for c in CLASSES}
    issued = sass_bytes = imad = 0.0
    for w, seq in terms:
        m = mix(seq)
        for c in CLASSES:
            classes[c] += w * m["classes"][c]
        issued += w * m["issued"]
        sass_bytes += w * (m["global_load_bytes"] + m["global_store_bytes"])
        imad += w * _imad_count(seq)
    return {"issued": issued, "sass_bytes": sass_bytes, "classes": classes, "imad": imad}


def analyze_sass(text: str, function: str | None = None, objective: str = "main",
                 model_bytes_per_thread: float | None = None,
                 working_fraction: float | None = None,
                 hw: Mapping[str, Any] = H200) -> dict[str, Any]:
    """Everything this script reads from one kernel's SASS (``cuobjdump -sass`` text).

    ``function``: the kernel's name (default: the largest function in the text). ``objective``:
    how the main path is chosen (:data:`OBJECTIVES`; every objective's path is reported).
    ``model_bytes_per_thread``: the plan's bytes model over the threads the launch starts.
    ``working_fraction``: the share of threads that run the main path where the others exit at
    once (known from the kernel's mapping; default 1).

    ``headline``, the per-thread estimate of one launch: the main path once, or, where the main
    path has an innermost loop carrying global bytes, ``P + N * L`` (``L``: the loop's part of the
    main path, ``P``: the rest) with ``N = (model bytes per working thread - P bytes) / L bytes``
    iterations when ``N >= 1.5``; with a working fraction ``f``, ``f`` times that plus ``1 - f``
    times the exit path. ``instr_per_model_byte`` divides its instructions by the model's bytes
    (each DRAM byte once: the number that compares with the issue budget); ``instr_per_sass_byte``
    by the bytes its own accesses request (more where lanes load the same data, which L1 serves).
    """
    funcs = parse_sass(text)
    if not funcs:
        raise ValueError("no SASS function found in the text")
    name = function if function in funcs else max(funcs, key=lambda f: len(funcs[f]))
    instrs = funcs[name]
    blocks = build_cfg(instrs)
    slow = prune_slow_paths(blocks)
    live = reachable(blocks)
    loops = find_loops(blocks)
    ends = [b.index for b in blocks if b.index in live and (b.has_exit or not b.succ)]
    paths = {o: best_path(blocks, live, 0, ends, o) for o in OBJECTIVES}
    path = paths[objective]
    seq = [i for b in path for i in blocks[b].instrs]
    exit_seq = [i for b in paths["exit"] for i in blocks[b].instrs]
    on_path = set(path)
    loop_rows = []
    for lp in loops:
        body = [i for b in lp["blocks"] for i in blocks[b].instrs]
        lseq = [i for b in path if b in set(lp["blocks"]) for i in blocks[b].instrs]
        m = mix(lseq)
        loop_rows.append({
            "head": f"{blocks[lp['head']].start:#06x}", "latch": f"{blocks[lp['latch']].end:#06x}",
            "innermost": lp["innermost"], "on_main_path": lp["head"] in on_path and lp["latch"] in on_path,
            "static_instrs": len(body) - sum(1 for i in body if i.base == "NOP"),
            "on_path": {**_region(m), "widths": m["widths"]}, "_seq": lseq,
        })
    pm = mix(seq)
    main = _region(pm)
    f = working_fraction if working_fraction is not None else 1.0
    work_bytes = model_bytes_per_thread / f if model_bytes_per_thread else None
    terms: list[tuple[float, Sequence[Instr]]] = [(1.0, seq)]
    region = "main path (every loop once)"
    est = None
    cands = [lp for lp in loop_rows
             if lp["on_main_path"] and lp["innermost"] and lp["on_path"]["global_bytes"]]
    if cands:
        top = max(cands, key=lambda lp: lp["on_path"]["global_bytes"])
        lb, li = top["on_path"]["global_bytes"], top["on_path"]["issued"]
        pb, pi = main["global_bytes"] - lb, main["issued"] - li
        n = (work_bytes - pb) / lb if work_bytes else None
        est = {"loop": f"{top['head']}-{top['latch']}", "loop_issued": li, "loop_bytes": lb,
               "rest_issued": pi, "rest_bytes": pb, "iterations": round(n, 2) if n is not None else None,
               "used": bool(n is not None and n >= 1.5)}
        if est["used"]:
            terms.append((n - 1, top["_seq"]))
            region = f"main path with loop {est['loop']} x {n:.1f} (iterations from the bytes model)"
    if f < 1.0:
        terms = [(w * f, q) for w, q in terms] + [(1.0 - f, exit_seq)]
        region += f"; {f:g} of the threads, the rest exit"
    tot = _combine(terms)
    denom = model_bytes_per_thread or tot["sass_bytes"]
    headline: dict[str, Any] = {
        "region": region,
        "issued": round(tot["issued"], 1),
        "sass_bytes": round(tot["sass_bytes"], 1),
        "model_bytes": model_bytes_per_thread,
        "instr_per_sass_byte": round(tot["issued"] / tot["sass_bytes"], 3) if tot["sass_bytes"] else None,
        "instr_per_model_byte": (round(tot["issued"] / model_bytes_per_thread, 3)
                                 if model_bytes_per_thread else None),
        "classes": {c: round(v, 1) for c, v in tot["classes"].items()},
        "loop_estimate": est,
        "working_fraction": working_fraction,
        "pipe_model": pipe_model(tot["classes"], tot["imad"], denom, hw),
    }
    headline["instr_per_byte"] = headline["instr_per_model_byte"] or headline["instr_per_sass_byte"]
    whole = mix(instrs)
    other = {o: {**_region(mix(i for b in p for i in blocks[b].instrs)), "blocks": len(p)}
             for o, p in paths.items()}
    return {
        "function": name,
        "objective": objective,
        "whole": whole,
        "cfg": {"blocks": len(blocks), "reachable_blocks": len(live), "loops": len(loops),
                "calls": sum(1 for i in instrs if i.base == "CALL"), "slow_path_edges_dropped": slow},
        "main_path": {**pm, **main, "blocks": len(path)},
        "paths": other,
        "loops": [{k: v for k, v in lp.items() if not k.startswith("_")} for lp in loop_rows],
        "headline": headline,
        "load_batches": batch_summary(load_batches(seq)),
        "load_batch_list": load_batches(seq)[:64],
        "cp_async": cp_async_summary(seq),
    }


# --------------------------------------------------------------------------- the kernels


def _key_dict(key: Any) -> dict[str, Any]:
    return {f.name: (str(v) if not isinstance(v, int | float | str | bool) else v)
            for f in dataclasses.fields(key) for v in [getattr(key, f.name)]}


def _described(kernel: Any, values: Mapping[str, Any]) -> tuple[Any, tuple]:
    """``(key, executor args)`` of ``kernel``'s ``__call__`` with ``values``, run up to its launch
    description (nothing launches). The kernel is built for a compile-only GPU platform, so its
    launch arguments are the GPU's (an interpreter run would choose other programs); its device
    check is skipped on this one object, so CPU tensors stand in for the GPU's."""
    kernel.check_device = lambda *a, **k: None  # this object only: CPU tensors stand in for CUDA ones
    desc = type(kernel).__call__.__wrapped__(kernel, **values, debug_checks=False)
    return (desc.key, tuple(desc.args)) if hasattr(desc, "key") else (desc[0], tuple(desc[1]))


def triton_ctas(kernel: Any, key: Any, args: tuple) -> int | None:
    try:
        return math.prod(int(g) for g in kernel.grid(key, kernel._named(args)))
    except Exception:
        return None


def cute_ctas(family: str, key: Any, values: Mapping[str, Any]) -> int | None:
    """CTAs of the CuTeDSL launch: the grid formula of each family's host function (read from
    ``dsv4kit/kernels/<folder>/cutedsl.py``, with that module's constants)."""
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    if family == "indexer_q":
        from dsv4kit.kernels.indexer_q import cutedsl as m
        q = values["index_q"]
        return cdiv(q.shape[0] * q.shape[1], m.rows_per_cta(key.coarsen))
    if family == "dequant_gather":
        from dsv4kit.kernels.dequant_gather import cutedsl as m
        out = values["out"]
        return cdiv(out.shape[1] - int(values.get("offset", 0)), m.ROWS_PER_CTA) * out.shape[0]
    if family == "save_partial_states":
        from dsv4kit.kernels.save_partial_states import cutedsl as m
        _, tpc, _ = m.launch_layout(key.state_width)
        return cdiv(values["kv"].shape[0], tpc)
    if family in ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress"):
        from dsv4kit.kernels.c4_compress import cutedsl as m
        return m.launch_grid(values["positions"].shape[0], key.head_size)[0]
    if family == "c128_compress":
        from dsv4kit.kernels.c128_compress import cutedsl as m
        t = values["positions"].shape[0]
        return cdiv(t, m.GROUP) * m.k7_slices(t) * m.NCHUNK
    if family == "rowquant":
        from dsv4kit.kernels.rowquant.spec import blocks_per_program

        x = values["x"]
        colb = blocks_per_program(key.n_cols, key.rows_per_program)
        return cdiv(x.shape[0], key.rows_per_program) * (x.shape[1] // (128 * colb))
    return None


def cute_kernel(family: str, values: Mapping[str, Any]) -> str | None:
    """The kernel a CuTeDSL launch runs where one compile holds several (a part of its name); None:
    the compile's only kernel."""
    if family in ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress"):
        from dsv4kit.kernels.c4_compress import cutedsl as m
        return "_token_cta_kernel" if m.cta_per_token(values["positions"].shape[0]) else "_token_warp_kernel"
    return None


def entry_ptx(ptx: str, name: str) -> str:
    """The PTX of the kernel whose ``.entry`` name contains ``name`` (all of ``ptx`` if none does)."""
    starts = [m.start() for m in re.finditer(r"\.entry\s", ptx)]
    for i, at in enumerate(starts):
        body = ptx[at:starts[i + 1] if i + 1 < len(starts) else len(ptx)]
        if name in body.split("(", 1)[0]:
            return body
    return ptx


_REQNTID = re.compile(r"\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")
_CFG_STRUCT = "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"
_GEP = re.compile(r"(%\w+) = llvm\.getelementptr %\w+\[([\d, ]+)\] : \(!llvm\.ptr\) -> !llvm\.ptr, "
                  + re.escape(_CFG_STRUCT))
_CONST = re.compile(r"(%\w+) = llvm\.mlir\.constant\((-?\d+) : i(?:32|64)\)")
_STORE = re.compile(r"llvm\.store (%\w+), (%\w+) : i(?:32|64)")


def ptx_threads(ptx: str) -> int | None:
    m = _REQNTID.search(ptx or "")
    return math.prod(int(g) for g in m.groups() if g) if m else None


def cute_launch_config(ir_text: str) -> dict[str, Any]:
    """Block size and dynamic shared memory of a CuTeDSL launch, read from the host code of the
    compiled module: the stores of constants into the launch-config struct (``{grid[3],
    block[3], dynamic smem i64, stream, attrs, n}``). Fields set from runtime values are None."""
    consts: dict[str, int] = {}
    geps: dict[str, tuple[int, ...]] = {}
    found: dict[tuple[int, ...], int | None] = {}
    for line in ir_text.splitlines():
        if "llvm.func " in line:
            consts, geps = {}, {}
        m = _CONST.search(line)
        if m:
            consts[m.group(1)] = int(m.group(2))
            continue
        m = _GEP.search(line)
        if m:
            geps[m.group(1)] = tuple(int(x) for x in m.group(2).split(","))
            continue
        m = _STORE.search(line)
        if m and m.group(2) in geps:
            found.setdefault(geps[m.group(2)][1:], consts.get(m.group(1)))
    block = tuple(found.get((1, i)) for i in range(3))
    return {"block": list(block) if any(b is not None for b in block) else None,
            "dynamic_smem": found.get((2,))}


def sass_tool_version(tool: Path) -> str | None:
    try:
        out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return next((ln for ln in lines if "release" in ln), lines[-1] if lines else None)


def compile_one(cls: type, key: Any, arch: str, platform: Any, kernel_hint: str | None = None
                ) -> dict[str, Any]:
    """Compile ``key`` of ``cls`` for ``arch`` ahead of time; SASS text, resources, launch config.
    ``kernel_hint``: which of a compile's kernels the launch runs (:func:`cute_kernel`)."""
    from dsv4kit.bench_cli import _sass, sass_tool

    tool = sass_tool()
    if tool is None:
        raise RuntimeError("no cuobjdump in this Triton install (triton/backends/nvidia/bin)")
    kernel = cls(platform)
    t0 = time.perf_counter()
    art = kernel.compile_for(key, arch)
    seconds = time.perf_counter() - t0
    cubin = art.binary.get("cubin")
    if cubin is None:
        raise RuntimeError(f"{cls.__name__}: the artifact holds no cubin")
    ptx = art.text.get("ptx", "")
    info = {k: v for k, v in art.info.items() if k not in ("kernels", "specialization", "per_kernel")}
    chosen = next((n for n in art.info.get("kernels") or [] if kernel_hint and kernel_hint in n), None)
    if chosen is not None:          # one kernel of several: its own resources and PTX
        info.update(art.info.get("per_kernel", {}).get(chosen, {}))
        ptx = entry_ptx(ptx, chosen)
    res: dict[str, Any] = {
        "registers": info.get("registers"), "spills": info.get("spills"),
        "local_bytes": info.get("local_bytes"), "static_shared": info.get("static_shared"),
        "compile_s": round(seconds, 2),
    }
    threads = ptx_threads(ptx)
    res["ptx_generator"] = next((ln.strip("/ ").strip() for ln in ptx.splitlines()[:12]
                                 if "Cuda compilation tools" in ln or "Generated by" in ln), None)
    if art.backend == "triton":
        res["dynamic_shared"] = info.get("shared")
        res["threads_per_cta"] = 32 * int(info["num_warps"])
        res["threads_source"] = "num_warps"
        if threads is not None and threads != res["threads_per_cta"]:
            res["threads_note"] = f"PTX .reqntid {threads} differs from num_warps"
        res["specialization"] = art.info.get("specialization")
    else:
        cfg = cute_launch_config(str(getattr(art.executable, "ir_module", "") or ""))
        res["dynamic_shared"] = cfg["dynamic_smem"]
        block = cfg["block"]
        res["threads_per_cta"] = threads or (math.prod(b for b in block if b) if block else None)
        res["threads_source"] = "PTX .reqntid" if threads else "host launch config"
        if block and all(block) and threads and math.prod(block) != threads:
            res["threads_note"] = f"host launch block {block} differs from PTX .reqntid {threads}"
        res["kernel_name"] = chosen or (art.info.get("kernels") or [None])[0]
    res["sass"] = _sass(cubin, tool)
    return res


#: Kernels where only some threads work and the rest exit at once: the working share, and why.
WORKING_FRACTION: dict[str, tuple[float, str]] = {
    # None now: the C4 Triton kernels (one program per token until 2026-12-01, a quarter of them
    # working) loop over chunks of tokens, and every program works.
}

#: Kernels whose main path is not the default ``main`` one (:data:`OBJECTIVES`), and why.
PATH_CHOICE: dict[str, tuple[str, str]] = {
    "DequantGatherCuTeDSL": (
        "heavy", "per output row, lanes 0..55 dequantize the 448 FP8 NoPE dims and lanes 56..63 copy the "
                 "bf16 RoPE dims (THREADS_PER_ROW = 64, NOPE_THREADS = 56): the longer (NoPE) branch is what "
                 "56 of 64 lanes run, and a warp holding both kinds issues both"),
}


@dataclass
class Target:
    """One kernel to analyse: a plan's point at its large size, with the key it dispatches to."""

    plan: str
    family: str
    variant: str
    config: str
    size: int
    size_axis: str
    nbytes: int
    key: Any
    triton_ctas: int | None
    values: dict[str, Any] = field(repr=False, default_factory=dict)


def plan_size(plan: Any, size: str) -> int | None:
    """The size ``--size`` names for ``plan``: "large" the last of ``plan.sizes``, "decode" the
    largest of ``plan.decode_sizes`` (None without them), else the number itself."""
    if size == "large":
        return plan.sizes[-1]
    if size == "decode":
        return max(plan.decode_sizes) if plan.decode_sizes else None
    return int(size)


def plan_targets(plans: Sequence[Any], arch: str, log: Any = print, size: str = "large") -> list[Target]:
    """Every point of each plan at the size ``size`` names (:func:`plan_size`; default its large
    size, the last of ``plan.sizes``), one per distinct (family, variant, key): the op arguments are
    built on CPU and the Triton kernel's ``__call__``, as a GPU process of ``arch`` would run it,
    says which key they dispatch to and with which grid (the two backends share the contract class,
    so its key; checked)."""
    from dsv4kit.kernels import family as family_spec
    from dsv4kit.model.stack import gpu_platform

    gplat = gpu_platform(arch)
    out: list[Target] = []
    seen: set[tuple[str, str, Any]] = set()
    for plan in plans:
        at = plan_size(plan, size)
        if at is None:
            log(f"  {plan.name}: no decode sizes, left out")
            continue
        for pt in plan.points(at):
            t0 = time.perf_counter()
            spec = family_spec(pt.family)
            args = pt.build("cpu")
            values, _ = spec.bind(**args)
            variant = values.pop(spec.variant_arg) if spec.variant_arg else "default"
            kernel = spec.kernel_class(variant, "triton")(gplat)
            key, launch = _described(kernel, values)
            if (pt.family, variant, key) in seen:
                continue
            seen.add((pt.family, variant, key))
            tgt = Target(plan.name, pt.family, variant, pt.config, at, plan.size_axis, pt.nbytes, key,
                         triton_ctas(kernel, key, launch), {})
            tgt.values = {"cute_ctas": cute_ctas(pt.family, key, values),
                          "cute_kernel": cute_kernel(pt.family, values)}
            log(f"  {pt.family} {variant} {pt.config or '-'} size {at}: {key} "
                f"({time.perf_counter() - t0:.1f} s)")
            out.append(tgt)
            del args, values, launch
    return out


def _backend_classes(spec: Any, variant: str) -> dict[str, Any]:
    out = {}
    for b in ("triton", "cutedsl"):
        try:
            out[b] = spec.kernel_class(variant, b)
        except Exception as exc:  # CuTeDSL not installed
            out[b] = exc
    return out


def wave_shape(ctas: int, per_wave: int) -> dict[str, Any]:
    """How ``ctas`` CTAs fill waves of ``per_wave`` (CTAs per SM x SMs): ``waves`` (fractional),
    ``full_waves``, ``tail_ctas`` (the last, partial wave's CTAs; 0 when the waves come out even),
    ``tail_fill`` (that wave's share of the machine) and ``wave_efficiency``: ``ctas / (ceil(waves)
    * per_wave)``, the share of CTA slots busy over the launch if every CTA took the same time (a
    static bound on the tail effect: below 1 the last wave leaves SMs idle; many CTAs per SM and
    uneven CTA durations blur it)."""
    if not ctas or not per_wave:
        return {"waves": None, "full_waves": None, "tail_ctas": None, "tail_fill": None,
                "wave_efficiency": None}
    full, tail = divmod(ctas, per_wave)
    rounds = full + (1 if tail else 0)
    return {"waves": round(ctas / per_wave, 2), "full_waves": full, "tail_ctas": tail,
            "tail_fill": round(tail / per_wave, 3) if tail else None,
            "wave_efficiency": round(ctas / (rounds * per_wave), 3)}


def analyze_target(tgt: Target, arch: str, platform: Any, log: Any = print,
                   hw: Mapping[str, Any] = H200) -> list[dict[str, Any]]:
    from dsv4kit.kernels import family as family_spec

    spec = family_spec(tgt.family)
    rows = []
    classes = _backend_classes(spec, tgt.variant)
    for backend, cls in classes.items():
        base = {"plan": tgt.plan, "family": tgt.family, "variant": tgt.variant, "config": tgt.config,
                "size": tgt.size, "size_axis": tgt.size_axis, "backend": backend, "key": _key_dict(tgt.key),
                "bytes_model": tgt.nbytes}
        if isinstance(cls, Exception):
            rows.append({**base, "skipped": f"{type(cls).__name__}: {cls}"})
            log(f"  {tgt.family} {backend}: skipped ({cls})")
            continue
        if backend == "cutedsl" and not platform.cutedsl:
            rows.append({**base, "kernel": cls.__name__,
                         "skipped": "CuTeDSL (cutlass) is not importable here"})
            continue
        if cls.CompileKey is not type(tgt.key):
            rows.append({**base, "kernel": cls.__name__,
                         "skipped": "its CompileKey is not the Triton kernel's"})
            continue
        try:
            res = compile_one(cls, tgt.key, arch, platform,
                              tgt.values.get("cute_kernel") if backend == "cutedsl" else None)
        except Exception as exc:
            rows.append({**base, "kernel": cls.__name__, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            log(f"  {cls.__name__}: compile failed: {exc}")
            continue
        sass = res.pop("sass")
        smem = (res.get("static_shared") or 0) + (res.get("dynamic_shared") or 0)
        occ = occupancy(res["registers"] or 0, res["threads_per_cta"] or 32, smem, hw)
        ctas = tgt.triton_ctas if backend == "triton" else tgt.values.get("cute_ctas")
        launch: dict[str, Any] = {"ctas": ctas, "ctas_source": "Triton grid()" if backend == "triton"
                                  else "host grid formula (cute_ctas)"}
        if ctas:
            threads = ctas * res["threads_per_cta"]
            per_wave = occ["ctas_per_sm"] * hw["sms"]
            launch.update(threads=threads, **wave_shape(ctas, per_wave),
                          bytes_model_per_thread=round(tgt.nbytes / threads, 2))
        objective, why = PATH_CHOICE.get(cls.__name__, ("main", ""))
        frac, frac_why = WORKING_FRACTION.get(cls.__name__, (None, ""))
        an = analyze_sass(sass, res.get("kernel_name"), objective, launch.get("bytes_model_per_thread"), frac,
                          hw)
        if why:
            an["objective_reason"] = why
        if frac_why:
            an["working_fraction_reason"] = frac_why
        mb = an["main_path"]["global_bytes"]
        if ctas and mb:
            launch["model_bytes_over_main_path_bytes"] = round(launch["bytes_model_per_thread"] / mb, 2)
        batch = an["load_batches"]
        resident_threads = occ["warps_per_sm"] * 32
        flight = {
            "first_batch_bytes_per_thread": batch["first_bytes"],
            "max_batch_bytes_per_thread": batch["max_bytes"],
            "byte_weighted_batch_bytes_per_thread": batch["byte_weighted_mean_bytes"],
            "resident_threads_per_sm": resident_threads,
            "loads_in_flight_per_sm_bytes": round(batch["byte_weighted_mean_bytes"] * resident_threads),
            "needed_per_sm_bytes": round(hw["copy_GBps"] * 1e9 * hw["assumed_dram_latency_ns"] * 1e-9
                                         / hw["sms"]),
        }
        if an["cp_async"]:
            flight["cp_async"] = an["cp_async"]
        rows.append({**base, "kernel": cls.__name__, "resources": res, "occupancy": occ, "launch": launch,
                     "bytes_in_flight": flight, "sass": an})
        log(f"  {cls.__name__:28s} regs {res['registers']:>3} thr {res['threads_per_cta']:>4} "
            f"occ {occ['occupancy']:.2f} instrs {an['whole']['total']:>5} "
            f"headline {an['headline']['instr_per_byte']} instr/B")
    return rows


# --------------------------------------------------------------------------- provenance and report


def provenance(arch: str, hash_families: Sequence[str], hw: Mapping[str, Any] = H200) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from dsv4kit.bench_cli import sass_tool
    from dsv4kit.results import kernel_source_hash

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    def git(*a: str) -> str:
        try:
            out = subprocess.run(["git", *a], capture_output=True, text=True, check=False, cwd=REPO)
            return out.stdout.strip()
        except OSError:
            return ""

    tool = sass_tool()
    dirty = [ln.split(maxsplit=1)[-1] for ln in git("status", "--porcelain", "--", "dsv4kit").splitlines()
             if ln.strip()]
    at_commit = None
    if dirty:  # the hash of the committed sources too: the working tree's is of files no commit holds
        with tempfile.TemporaryDirectory() as tmp:
            arch_tar = subprocess.run(["git", "archive", "HEAD", "dsv4kit"], capture_output=True, cwd=REPO,
                                      check=False).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=arch_tar, check=False)
            if (Path(tmp) / "dsv4kit").is_dir():
                at_commit = {f: kernel_source_hash(f, Path(tmp) / "dsv4kit") for f in hash_families}
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD") or "unknown",
        "uncommitted_package_files": dirty,
        "python": _platform.python_version(), "torch": torch.__version__, "triton": tv,
        "nvidia-cutlass-dsl": ver("nvidia-cutlass-dsl"), "apache-tvm-ffi": ver("apache-tvm-ffi"),
        "cuobjdump": sass_tool_version(tool) if tool else None,
        "triton_ptxas": sass_tool_version(tool.parent / "ptxas") if tool else None,
        "arch": arch, "device": "cpu (static analysis; no GPU)",
        "family": list(hash_families),
        "kernel_source_hash": {f: kernel_source_hash(f) for f in hash_families},
        "kernel_source_hash_at_commit": at_commit,
        "script": "benchmarks/sass_mix.py",
        "machine_model": dict(hw), "pipe_lanes_per_sm_clk": PIPE_LANES, "pipe_of_class": PIPE_OF,
    }


def _w(widths: Mapping[str, int]) -> str:
    return " ".join(f"{k}x{v}" for k, v in sorted(widths.items(), key=lambda kv: -int(kv[0].rstrip("b"))))


def _label(r: Mapping[str, Any]) -> str:
    lab = r["family"] if r["variant"] == "default" else f"{r['family']}/{r['variant']}"
    return f"{lab} {r['config']}".strip()


def _md_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    out += ["| " + " | ".join("-" if v is None else str(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def summary_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("kernel", "backend", "regs", "thr/CTA", "smem B", "occ (limit)", "static SASS",
            "main / heavy path", "LDG widths", "STG widths", "headline instrs/thread", "instr / model B",
            "instr / SASS B", "1st load batch B/thr", "instr time / DRAM time (busiest)")
    body = []
    for r in rows:
        if "sass" not in r:
            why = r.get("skipped") or r.get("error")
            body.append([_label(r), r["backend"], why, *[""] * (len(head) - 3)])
            continue
        res, occ, an = r["resources"], r["occupancy"], r["sass"]
        hl, pm = an["headline"], an["headline"]["pipe_model"]
        smem = (res.get("static_shared") or 0) + (res.get("dynamic_shared") or 0)
        lim = "/".join(x.replace("shared_memory", "smem").replace("registers", "regs")
                       for x in occ["limited_by"])
        body.append([
            _label(r), r["backend"], res["registers"], res["threads_per_cta"], smem,
            f"{occ['occupancy']:.2f} ({lim})", an["whole"]["issued"],
            f"{an['paths']['main']['issued']} / {an['paths']['heavy']['issued']}",
            _w(an["whole"]["widths"]["LDG"]), _w(an["whole"]["widths"]["STG"]) or "-", hl["issued"],
            hl["instr_per_model_byte"], hl["instr_per_sass_byte"], an["load_batches"]["first_bytes"],
            f"{pm['instr_over_dram']} ({pm['busiest']})"])
    return _md_table(head, body)


_COLS = ("global_load", "global_store", "shared", "fp32", "int_address", "conversion", "move_permute",
         "predicate_branch", "warp_shuffle", "uniform", "constant", "mufu", "sync")
_SHORT = ("LDG", "STG", "LDS/STS", "FP32", "int/addr", "conv", "move/PRMT", "pred/br", "SHFL", "uniform",
          "const", "MUFU", "sync")


def class_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("kernel", "backend", "region", "issued", *_SHORT, "other")
    body = []
    for r in rows:
        if "sass" not in r:
            continue
        an = r["sass"]
        regions = (("whole kernel (static)", an["whole"]["classes"], an["whole"]["issued"]),
                   ("main path", an["main_path"]["classes"], an["main_path"]["issued"]),
                   ("headline (per thread)", an["headline"]["classes"], an["headline"]["issued"]))
        for what, c, issued in regions:
            other = sum(v for k, v in c.items() if k not in _COLS and k != "nop")
            body.append([_label(r), r["backend"], what, _num(issued), *(_num(c[k]) for k in _COLS),
                         _num(other)])
    return _md_table(head, body)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"


def launch_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("kernel", "backend", "CTAs", "waves", "model B/thread", "main path B/thread", "loop iterations",
            "resident thr/SM", "load batches on path", "largest batch (loads, B)", "byte-weighted batch B",
            "loads in flight/SM (KB)", "cp.async on path")
    body = []
    for r in rows:
        if "sass" not in r:
            continue
        la, fl, b, an = r["launch"], r["bytes_in_flight"], r["sass"]["load_batches"], r["sass"]
        cp = fl.get("cp_async")
        est = an["headline"].get("loop_estimate") or {}
        body.append([
            _label(r), r["backend"], la.get("ctas"),
            la.get("waves") if la.get("wave_efficiency") in (None, 1.0)
            else f"{la['waves']} (eff {la['wave_efficiency']})", la.get("bytes_model_per_thread"),
            an["main_path"]["global_bytes"], est.get("iterations") if est.get("used") else None,
            fl["resident_threads_per_sm"], b["batches"], f"{b['max_loads']}, {b['max_bytes']}",
            b["byte_weighted_mean_bytes"], round(fl["loads_in_flight_per_sm_bytes"] / 1024, 1),
            f"{cp['ldgsts']} LDGSTS, {cp['bytes']} B, waits {cp['wait_depths']}" if cp else None])
    return _md_table(head, body)


def write_report(out: Path, data: Mapping[str, Any], findings: str = "") -> None:
    """``sass_mix.md``: how to read it, the three tables, and the hand-written findings (kept)."""
    rows = data["kernels"]
    prov = data["provenance"]
    mm = prov["machine_model"]
    need = round(mm["copy_GBps"] * mm["assumed_dram_latency_ns"] / mm["sms"] / 1e3, 1)
    bpc = mm["copy_GBps"] / (mm["sms"] * mm["clock_ghz"])
    dirty = prov["uncommitted_package_files"]
    size = prov.get("size", "large")
    at = {"large": "the plan's large size (`dsv4kit.bench.PLANS`, the last of `sizes`, every point)",
          "decode": "the plan's largest decode size (`dsv4kit.bench.PLANS`, the largest of `decode_sizes`, "
                    "every point; plans without decode sizes left out)"}.get(
        size, f"size {size} of every plan (every point)")
    where = {"large": "the large size", "decode": "the decode size"}.get(size, "that size")
    again = "" if size == "large" else f" --size {size}"
    if mm.get("name", "H200") != "H200":
        again += f" --machine {mm['name'].lower()}"
    choices = sorted({f"`{r['kernel']}`: {r['sass']['objective']} path ({r['sass']['objective_reason']})"
                      for r in rows if "sass" in r and r["sass"].get("objective_reason")})
    fracs = sorted({f"`{r['kernel']}`: {r['sass']['headline']['working_fraction']} "
                    f"({r['sass']['working_fraction_reason']})"
                    for r in rows if "sass" in r and r["sass"].get("working_fraction_reason")})
    md = [
        "# Static SASS analysis of the memory-bound kernels (sm_90a): `benchmarks/sass_mix.py`",
        "",
        f"Recorded {prov['date']} at commit `{prov['commit'][:10]}`, on CPU: nothing here is measured, "
        "everything is read from the code warmup compiles. Triton "
        f"{prov['triton']} (its ptxas: {prov.get('triton_ptxas')}), nvidia-cutlass-dsl "
        f"{prov['nvidia-cutlass-dsl']}, cuobjdump {prov['cuobjdump']}, arch "
        f"{prov['arch']}; kernel source hashes in `sass_mix.json` (`provenance.kernel_source_hash`)"
        + (f"; package files not committed at the time: {', '.join(dirty)}" if dirty else "") + ".",
        "",
        f"Per kernel: the key its op dispatches to at {at}, compiled ahead of time for the arch and "
        "disassembled with the Triton wheel's `cuobjdump`; the launch (grid, arguments) is the one a GPU "
        "process would make for those arguments. Regenerate: `python benchmarks/sass_mix.py --arch "
        f"sm_90a{again} --out benchmarks/results/{out.name}` (about 2 minutes on 2 cores).",
        "",
        "How to read it:",
        "",
        f"* **occ**: theoretical occupancy of an {mm.get('name', 'H200')} SM (resident warps / 64) "
        "and what limits it: CTAs per "
        "SM = min(registers: `floor(4 * floor(16384 / Rw) / W)` with `Rw = ceil(32 * regs / 256) * 256` "
        "registers per warp and `W` warps per CTA (four register banks, one per scheduler); warps: "
        "`floor(64 / W)`; shared memory: `floor(233472 / ceil128(smem + 1024))` (1 KiB reserved per CTA); "
        "32). Achieved occupancy needs a profiler on the GPU and is not here. `smem B` is the cubin's static "
        "shared memory plus the launch's dynamic shared memory (Triton's `shared`; CuTeDSL's from the launch "
        "config in its host code); the 1 KiB static section the sm_90 toolchain emits whenever a kernel uses "
        "shared memory may be the same 1 KiB as the reservation, so the shared-memory limit is if anything "
        "pessimistic (it binds for none of these kernels).",
        "* **static SASS**: instructions of the kernel, NOP padding excluded. **main path**: one pass "
        "through the control-flow graph, every loop body once: the most global bytes, then the fewest memory "
        "instructions (a vector copy over its scalar twin), then the most instructions (a guarded "
        "computation runs); a subroutine call behind a branch (the slow path of an IEEE or integer division) "
        "is taken not to run. **heavy path**: the most instructions (what a warp issues when its lanes take "
        "both sides of every branch). Predicated instructions count as issued; the bytes of accesses under "
        "`Pn` and `!Pn` count once.",
        "* **headline**: per launched thread: the main path, with its innermost loop repeated `N` times "
        "where it carries bytes (`N` from the bytes model: `(model bytes per working thread - bytes outside "
        "the loop) / loop bytes`, used when >= 1.5), and where only a known share of the threads works, that "
        "share of it plus the rest on the exit path. **instr / model B**: its instructions per byte of the "
        "plan's bytes model per thread (each DRAM byte once); **instr / SASS B**: per byte its own accesses "
        "request (larger where lanes load the same data, which L1 serves).",
        f"* **the budget**: at the measured copy rate ({mm['copy_GBps']:.0f} GB/s; {mm['clock_ghz']} GHz "
        f"boost, {mm['sms']} SMs) an SM moves {bpc:.1f} bytes per clock and issues at most 4 warp "
        f"instructions per clock: 128 thread-instructions per {bpc:.1f} bytes, **{128 / bpc:.1f} "
        "instructions per byte at full copy bandwidth with every issue slot used**, less where the work "
        "sits on a half-rate pipe (integer ALU, IMAD: 64 lanes per clock) or an eighth-rate one "
        "(conversions, MUFU: 16).",
        "* **instr time / DRAM time**: max(issue cycles, busiest pipe's cycles) / DRAM cycles of the "
        "headline, per warp (`pipe_model`; lanes per clock from the Programming Guide's throughput table "
        "for compute capability 9.0). Above 1 the instruction stream cannot keep up with the copy rate "
        "whatever the memory parallelism (the kernel reaches at most its inverse, `ceiling_fraction_of_copy` "
        "in the JSON); near 1 it can only with perfect overlap of memory and instructions, which a real SM "
        "does not give; well below 1 instructions are not the limit.",
        "* **load batches**: global loads a thread issues before the first instruction that needs one of "
        "them, along the main path (a static read of the scoreboard): the number of batches is about the "
        "number of dependent DRAM round trips. Loads in flight per SM = byte-weighted batch bytes x resident "
        f"threads. Little's law at the copy rate with ~{mm['assumed_dram_latency_ns']:.0f} ns of loaded DRAM "
        f"latency (an assumption, not measured here) asks for ~{need} KB in flight per SM.",
    ]
    if choices or fracs:
        md += ["", "Per-kernel choices (in the script, with the reason):", ""]
        md += [f"* {c}" for c in choices] + [f"* working share {f}" for f in fracs]
    md += [
        "",
        "## Summary",
        "",
        summary_table(rows),
        "",
        "## Instruction mix by class (per thread: static counts, the main path, the headline estimate)",
        "",
        class_table(rows),
        "",
        f"## Launch at {where}, bytes per thread, bytes in flight",
        "",
        "`model B/thread`: the plan's bytes model (every input read once, every output written once) over "
        "the threads the launch starts; `main path B/thread`: what one pass of the main path requests (its "
        "loops once).",
        "",
        launch_table(rows),
        "",
        "## What bounds each kernel",
        "",
        FINDINGS_START,
        findings.strip() or "(not written yet: the analysis of these numbers goes here, between the "
                            "markers; a rerun keeps it)",
        FINDINGS_END,
        "",
    ]
    (out / "sass_mix.md").write_text("\n".join(md) + "\n")


FINDINGS_START, FINDINGS_END = "<!-- findings: hand-written, kept by reruns -->", "<!-- /findings -->"


def kept_findings(md: Path) -> str:
    """The hand-written section between the findings markers of an existing report ('' if none)."""
    if not md.is_file():
        return ""
    text = md.read_text()
    a, b = text.find(FINDINGS_START), text.find(FINDINGS_END)
    return text[a + len(FINDINGS_START):b].strip() if 0 <= a < b else ""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "sass_mix_sm90a"))
    p.add_argument("--families", default=None, help="plan or family names, comma-separated (default: all)")
    p.add_argument("--machine", default="h200", choices=sorted(MACHINES),
                   help="machine model: copy bandwidth for the pipe model and Little's law (default h200)")
    p.add_argument("--size", default="large",
                   help="large (each plan's last size, default), decode (its largest decode size), or N")
    args = p.parse_args(argv)
    if args.size not in ("large", "decode") and not args.size.isdigit():
        print(f"sass_mix: --size {args.size!r}: large, decode or a number", file=sys.stderr)
        return 2

    from dsv4kit.bench import select_plans
    from dsv4kit.platform import KNOWN_ARCHS, cpu_platform

    if args.arch not in KNOWN_ARCHS:
        print(f"sass_mix: unknown arch {args.arch!r}; known: {', '.join(KNOWN_ARCHS)}", file=sys.stderr)
        return 2
    try:
        plans = select_plans([f for f in re.split(r"[,\s]+", args.families or "") if f])
    except ValueError as exc:
        print(f"sass_mix: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    platform = cpu_platform(args.arch)
    print(f"platform {platform}; plans: {', '.join(pl.name for pl in plans)}")
    if not platform.cutedsl:
        print("CuTeDSL (cutlass) is not importable: its kernels are skipped")
    t0 = time.perf_counter()
    targets = plan_targets(plans, args.arch, size=args.size)
    rows: list[dict[str, Any]] = []
    for tgt in targets:
        rows += analyze_target(tgt, args.arch, platform, hw=MACHINES[args.machine])
    prov = provenance(args.arch, [pl.hash_family for pl in plans], MACHINES[args.machine])
    prov["seconds"] = round(time.perf_counter() - t0, 1)
    prov["size"] = args.size
    data = {"schema": "dsv4kit.sass_mix/1", "provenance": prov, "kernels": rows}
    (out / "sass_mix.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    write_report(out, data, kept_findings(out / "sass_mix.md"))
    print(f"wrote {out / 'sass_mix.json'} and {out / 'sass_mix.md'} ({prov['seconds']} s)")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
