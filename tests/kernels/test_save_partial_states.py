"""K4 save_partial_states: Triton under the interpreter BIT-EXACT vs the reference, bad inputs,
T == 0, warmup keys, AOT compiles of both backends, no compile after warmup.

Every case starts from a state cache whose every byte is 0xA5 (§2.12), so equality with the
reference's cache also proves that padding tokens' rows, unused slots and the pool padding
between blocks are untouched; :meth:`SaveStatesCase.untouched_is_sentinel` checks it directly.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.jit import JitMonitor, KeyLedger
from dsv4kit.kernels.save_partial_states import triton as k4_triton
from dsv4kit.kernels.save_partial_states.cases import (
    LAYOUTS,
    REGIMES,
    SENTINEL_WORD,
    TEST_SHAPES,
    make_case,
    same_bits,
    state_words,
)
from dsv4kit.kernels.save_partial_states.reference import save_partial_states_reference as ref
from dsv4kit.kernels.save_partial_states.spec import (
    FLASH_STATES,
    GPU_ELEMS,
    Address,
    SavePartialStatesConfig,
    state_operands,
)
from dsv4kit.kernels.save_partial_states.triton import SavePartialStatesTriton
from dsv4kit.platform import cpu_platform, replace

NAME = "SavePartialStatesTriton"


@pytest.fixture(scope="module")
def kernel() -> SavePartialStatesTriton:
    SavePartialStatesTriton.clear_cache()
    k = SavePartialStatesTriton(cpu_platform("sm_90a"))
    k.warmup()
    yield k
    SavePartialStatesTriton.clear_cache()


def check(kernel: SavePartialStatesTriton, case, **kw) -> None:
    want = case.fresh_state()
    ref(*case.args(want))
    got = case.fresh_state()
    with JitMonitor("error"):
        assert kernel(*case.args(got), **kw) is None
    assert same_bits(got, want), case.label
    assert case.untouched_is_sentinel(got), case.label


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("config,t", TEST_SHAPES, ids=[f"{c}-T{t}" for c, t in TEST_SHAPES])
def test_bit_exact_on_spec_shapes(kernel, config, t) -> None:
    """Each regime at each spec shape, the layouts rotating (all three at every shape), pooled and
    plain caches alternating; -1 slots and shuffled slots throughout."""
    s = TEST_SHAPES.index((config, t))
    for j, regime in enumerate(REGIMES):
        check(kernel, make_case(config, t, regime=regime, layout=LAYOUTS[(j + s) % len(LAYOUTS)],
                                pooled=(j + s) % 2 == 1, seed=100 * s + j))


@pytest.mark.parametrize("config", FLASH_STATES)
def test_slot_orders_and_pools(kernel, config) -> None:
    for pooled in (False, True):
        for shuffled in (False, True):
            for padding in (False, True):
                case = make_case(config, 33, pooled=pooled, shuffled=shuffled, padding=padding, seed=5)
                check(kernel, case)


def test_against_an_independent_loop(kernel) -> None:
    """Row s gets [kv[t] | fl(score[t] + ape[p % R])], computed token by token here."""
    case = make_case((256, 4, 4), 9, layout="slices", pooled=True, seed=3)
    got = case.fresh_state()
    kernel(*case.args(got))
    want = case.fresh_state()
    for t in range(case.tokens):
        s = int(case.slot_mapping[t])
        if s >= 0:
            row = want[s // 4, s % 4]
            row[:256] = case.kv[t]
            row[256:] = case.score[t] + case.ape[int(case.positions[t]) % 4]
    assert case.rows_written < case.tokens          # some padding
    assert same_bits(got, want)


def test_both_branches_are_taken() -> None:
    """Slices and separate tensors take the 16-byte branch; the 'unaligned' layout the other one."""
    for layout, want in (("slices", 1), ("separate", 1), ("unaligned", 0)):
        for pooled in (False, True):
            c = make_case((512, 128, 8), 5, layout=layout, pooled=pooled)
            ops = state_operands(NAME, c.kv, c.score, c.ape, c.state_cache, 5)
            assert ops[-1] == want, (layout, pooled)
            for anchor in (ops[0], ops[3], ops[6], ops[9]):
                assert anchor.data_ptr() % 16 == 0 and anchor.dim() == 1
    c = make_case((512, 128, 8), 5, layout="unaligned")
    ops = state_operands(NAME, c.kv, c.score, c.ape, c.state_cache, 5)
    assert (ops[1], ops[4], ops[7]) == (1, 2, 2)          # element leads of kv, score, ape


def test_gpu_launch_args_are_addresses_of_the_warmed_specialization(kernel) -> None:
    """On a GPU platform the anchors are bare addresses (no views built per call); Triton's own
    binder gives them the specialization warmup compiled, for aligned and unaligned inputs."""
    gpu = SavePartialStatesTriton(replace(cpu_platform("sm_90a"), device="cuda"))
    key = kernel.dispatch(512, 128, 8)
    warmed = kernel.variant(key, kernel.warmup_inputs(key))
    for layout in ("slices", "unaligned"):
        c = make_case((512, 128, 8), 6, layout=layout, pooled=True)
        args = gpu.launch_args(*c.args()[:6], 6)
        assert all(isinstance(a, Address) for a in args[:3])
        lead = args[7]
        assert args[0].data_ptr() == c.kv.data_ptr() - 4 * lead and args[0].data_ptr() % 16 == 0
        assert args[4] is c.state_cache
        assert gpu.variant(key, gpu._full_args(key, args)) == warmed


def test_gpu_tiles_write_the_same_bytes(kernel, monkeypatch) -> None:
    """The GPU's small programs (and 1-token programs) write what the interpreter's large ones do."""
    for config in FLASH_STATES:
        case = make_case(config, 37, layout="slices", pooled=True, seed=8)
        want = case.fresh_state()
        kernel(*case.args(want))
        key = kernel.dispatch(*config)
        for tok in (1, k4_triton._tokens(key, GPU_ELEMS)):
            monkeypatch.setattr(SavePartialStatesTriton, "tokens_per_program", lambda self, key, tok=tok: tok)
            monkeypatch.setattr(SavePartialStatesTriton, "interpreter_constexprs",
                                lambda self, key, tok=tok: {"TOK": tok})
            got = case.fresh_state()
            kernel(*case.args(got))
            assert same_bits(got, want), (config, tok)
        monkeypatch.undo()


def test_all_padding_writes_nothing(kernel) -> None:
    case = make_case((1024, 4, 4), 6)
    case.slot_mapping.fill_(-1)
    got = case.fresh_state()
    kernel(*case.args(got))
    assert bool((state_words(got) == SENTINEL_WORD).all())


def test_same_bits_sees_signed_zero_and_nan_payloads() -> None:
    a = torch.zeros(2, 4, 8)
    assert same_bits(a, a.clone()) and not same_bits(a, -a)
    b = a.clone()
    b.view(torch.int32)[0, 0, 0] = 0x7FC00001
    c = a.clone()
    c.view(torch.int32)[0, 0, 0] = 0x7FC00002
    assert not same_bits(b, c)


# --------------------------------------------------------------------------- the contract


def test_warmup_keys_follow_the_spec() -> None:
    k = SavePartialStatesTriton(cpu_platform())
    assert [(x.state_width, x.compress_ratio, x.state_block_size) for x in k.get_warmup_keys()] == [
        (1024, 4, 4), (512, 128, 8), (256, 4, 4)]
    assert k.get_warmup_keys(SavePartialStatesConfig(states=())) == []
    twice = SavePartialStatesConfig(states=((256, 4, 4), (256, 4, 4)))
    assert k.get_warmup_keys(twice) == [k.CompileKey(256, 4, 4)]


def test_empty_batch_returns_none_without_dispatch() -> None:
    k = SavePartialStatesTriton(cpu_platform("sm_100a"))   # a target nothing here warms
    case = make_case((1024, 4, 4), 0)
    before = case.state_cache.clone()
    with KeyLedger() as ledger, JitMonitor("error") as mon:
        assert k(*case.args()) is None
    assert ledger.requested == {} and mon.events == [] and k.compiled_keys() == []
    assert same_bits(case.state_cache, before)


def test_no_compile_after_warmup(kernel) -> None:
    """Slices, separate tensors, unaligned views, pooled and odd block strides, many T: one key each."""
    plan = [(cfg, t, layout, pooled) for cfg in FLASH_STATES for t, layout, pooled in
            ((1, "slices", False), (40, "separate", True), (17, "unaligned", True), (3, "unaligned", False))]
    with KeyLedger() as ledger:
        ledger.add_warmed(kernel.name, kernel.compiled_keys())
        with JitMonitor("error") as mon:
            for i, (cfg, t, layout, pooled) in enumerate(plan):
                case = make_case(cfg, t, layout=layout, pooled=pooled, seed=i)
                kernel(*case.args())
        assert mon.events == []
    assert ledger.missed() == {}
    assert set(ledger.requested[kernel.name]) == {kernel.CompileKey(*c) for c in FLASH_STATES}


def test_unwarmed_key_is_named(kernel) -> None:
    case = make_case((256, 128, 8), 4)                    # an indexer state with the C128 geometry
    before = case.state_cache.clone()
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError, match="state_width: warmed 512, requested 256"):
        kernel(*case.args())
    assert same_bits(case.state_cache, before)


# --------------------------------------------------------------------------- bad inputs


def _misaligned_state(a):
    sc = a["state_cache"]
    buf = torch.empty(sc.numel() + 4)
    return buf[1:].as_strided(sc.shape, sc.stride())


BAD = {
    # metadata (always checked, host only)
    "kv float64": (dict(kv=lambda a: a["kv"].double()), "kv", "dtype float32"),
    "kv bf16": (dict(kv=lambda a: a["kv"].bfloat16()), "kv", "dtype float32"),
    "score bf16": (dict(score=lambda a: a["score"].bfloat16()), "score", "dtype float32"),
    "ape fp16": (dict(ape=lambda a: a["ape"].half()), "ape", "dtype float32"),
    "state_cache float64": (dict(state_cache=lambda a: a["state_cache"].double()), "state_cache", "dtype"),
    "kv width": (dict(kv=lambda a: a["kv"][:, :252]), "kv", r"shape\[1\] == state_width"),
    "score width": (dict(score=lambda a: a["score"][:, 4:]), "score", r"shape\[1\] == state_width"),
    "ape width": (dict(ape=lambda a: torch.zeros(4, 128)), "ape", r"shape\[1\] == state_width"),
    "ape rows": (dict(ape=lambda a: a["ape"][:3]), "ape", r"shape\[0\] == compress_ratio"),
    "state row width": (dict(state_cache=lambda a: torch.zeros(5, 4, 256)), "state_cache",
                        r"shape\[2\] == 512"),
    "state_block_size": (dict(state_block_size=lambda a: 8), "state_block_size", r"state_cache.shape\[1\]"),
    "state_width": (dict(state_width=lambda a: 128), "kv", r"shape\[1\] == state_width \(128\)"),
    "state_width bool": (dict(state_width=lambda a: True), "state_width", "an int"),
    "compress_ratio": (dict(compress_ratio=lambda a: 8), "compress_ratio", "4.*128"),
    "kv too few rows": (dict(kv=lambda a: a["kv"][:5]), "kv", r"at least T \(7\) rows"),
    "score too few rows": (dict(score=lambda a: a["score"][:6]), "score", r"at least T \(7\) rows"),
    "positions too few": (dict(positions=lambda a: a["positions"][:6]), "positions", "at least 7 entries"),
    "slot_mapping int32": (dict(slot_mapping=lambda a: a["slot_mapping"].int()), "slot_mapping", "int64"),
    "positions int32": (dict(positions=lambda a: a["positions"].int()), "positions", "int64"),
    "slot_mapping 2-D": (dict(slot_mapping=lambda a: a["slot_mapping"][None]), "slot_mapping", "1-D"),
    "kv column stride": (dict(kv=lambda a: a["kv"].t().contiguous().t()), "kv", r"stride\(1\) == 1"),
    "ape column stride": (dict(ape=lambda a: a["ape"].t().contiguous().t()), "ape", r"stride\(1\) == 1"),
    "positions strided": (dict(positions=lambda a: torch.zeros(20, dtype=torch.int64)[::2]), "positions",
                          "contiguous"),
    "slot_mapping strided": (dict(slot_mapping=lambda a: a["slot_mapping"].repeat_interleave(2)[::2]),
                             "slot_mapping", "contiguous"),
    "state row stride": (dict(state_cache=lambda a: torch.zeros(5, 512, 4).transpose(1, 2)), "state_cache",
                         "strides"),
    "state block stride too small": (dict(state_cache=lambda a: a["state_cache"].as_strided(
        a["state_cache"].shape, (2044, 512, 1))), "state_cache", "strides"),
    "state misaligned": (dict(state_cache=_misaligned_state), "state_cache", "data_ptr % 16 == 0"),
    "kv not a tensor": (dict(kv=lambda a: a["kv"].tolist()), "kv", "a torch.Tensor"),
    "positions on another device": (dict(positions=lambda a: a["positions"].to("meta")), "positions",
                                    "device cpu"),
    "score on another device": (dict(score=lambda a: a["score"].to("meta")), "score", "device cpu"),
    "all on meta": ({n: (lambda a, n=n: a[n].to("meta")) for n in
                     ("kv", "score", "ape", "positions", "state_cache", "slot_mapping")},
                    "state_cache", "a cpu tensor"),
    # value checks (device reads: on by default under the interpreter)
    "negative position": (dict(positions=lambda a: torch.where(a["slot_mapping"] >= 0, -3, 0)), "positions",
                          r"values in \[0, "),
    "duplicate slots": (dict(slot_mapping=lambda a: torch.where(a["slot_mapping"] >= 0, 2, -1)),
                        "slot_mapping", "unique values"),
    "slot out of range": (dict(slot_mapping=lambda a: torch.where(a["slot_mapping"] >= 0,
                                                                 20 + torch.arange(7), -1)),
                          "slot_mapping", r"values in \[0, 20\)"),
}


def _bad(**changes):
    case = make_case((256, 4, 4), 7, spare_blocks=3)       # 5 blocks of 4: slots in [0, 20)
    args = case.kwargs()
    for name, fn in changes.items():
        args[name] = fn(args)
    return case, args


@pytest.mark.parametrize("what", list(BAD))
def test_bad_inputs_raise_before_launch(what) -> None:
    changes, arg, expected = BAD[what]
    case, args = _bad(**changes)
    k = SavePartialStatesTriton(cpu_platform())
    state = case.state_cache
    before = state.clone()
    with KeyLedger() as ledger, pytest.raises(KernelInputError) as exc:
        k(**args)
    msg = str(exc.value)
    assert msg.startswith(f"{NAME}: {arg}: expected"), msg
    assert re.search(expected, msg), msg
    assert ledger.requested == {}                          # never dispatched, so never launched
    assert same_bits(state, before)


def test_storage_not_16_byte_aligned_is_refused() -> None:
    """A view whose storage itself starts off a 16-byte boundary has no aligned anchor: a clear error."""
    case = make_case((256, 4, 4), 3, layout="separate")
    raw = torch.from_numpy(np.zeros(5 * 256 + 4, dtype=np.float32)[1:])   # storage base 4 bytes in
    if raw.untyped_storage().data_ptr() % 16 == 0:
        raw = torch.from_numpy(np.zeros(5 * 256 + 4, dtype=np.float32)[2:])
    kv = raw[: 5 * 256].view(5, 256)
    with pytest.raises(KernelInputError, match="kv: expected a storage starting on a 16-byte boundary"):
        SavePartialStatesTriton(cpu_platform())(kv, *case.args()[1:])


# --------------------------------------------------------------------------- both backends compile


def test_every_triton_key_compiles_for_sm90a() -> None:
    k = SavePartialStatesTriton(cpu_platform("sm_90a"))
    for key in k.get_warmup_keys():
        art = k.compile_for(key, "sm_90a")
        ptx = art.text["ptx"]
        assert art.target == "sm_90a" and ".target sm_90a" in ptx
        assert art.info["registers"] > 0 and art.info["spills"] == 0
        assert not re.search(r"\bfma\.", ptx) and "add.rn.f32" in ptx     # spec §2.1 rule 1
        assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx        # the 16-byte branch
        spec = art.info["specialization"]
        assert "kv_stride:i64 " in spec and "block_stride:i64 " in spec and "T:i32 " in spec


def test_every_cutedsl_key_compiles_for_sm90a() -> None:
    from dsv4kit.kernels.save_partial_states.cutedsl import SavePartialStatesCuTeDSL

    k = SavePartialStatesCuTeDSL(cpu_platform("sm_90a"))
    reports = k.warmup()
    assert [r.key for r in reports] == [k.CompileKey(*c) for c in FLASH_STATES]
    for r in reports:
        art = k.artifact(r.key)
        ptx = art.text["ptx"]
        assert art.target == "sm_90a" and ".target sm_90a" in ptx
        assert art.info["registers"] > 0 and art.info["spills"] == 0
        assert not re.search(r"\bfma\.", ptx) and "add.rn.f32" in ptx
        assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx


def test_cutedsl_launch_args_match_the_fakes() -> None:
    """The runtime arguments line up with the fake signature, host-side; CPU tensors are refused."""
    from dsv4kit.kernels.save_partial_states.cutedsl import SavePartialStatesCuTeDSL

    k = SavePartialStatesCuTeDSL(cpu_platform("sm_90a"))
    case = make_case((512, 128, 8), 11, layout="slices", pooled=True)
    key = k.dispatch(512, 128, 8)
    args = k.launch_args(*case.args()[:6], 11)
    fakes = k.warmup_inputs(key)
    assert len(args) == len(fakes) - 4                      # minus the stream and the three constexprs
    kv, sc, ape, pos, state, slots, t, kv_lead, kv_s, sc_lead, sc_s, ape_lead, ape_s, bstride, vec_ok = args
    assert kv.data_ptr() == case.kv.data_ptr() and sc.data_ptr() == case.score.data_ptr()
    assert (kv_lead, sc_lead, ape_lead, vec_ok) == (0, 0, 0, 1)
    assert (kv_s, sc_s, ape_s) == (1024, 1024, 512) and bstride == case.state_cache.stride(0) == 8 * 1024 + 12
    nsb = case.state_cache.shape[0]
    assert kv.numel() == 10 * 1024 + 512 and state.numel() == (nsb - 1) * bstride + 8 * 1024
    assert pos is case.positions and slots is case.slot_mapping and t == 11
    with pytest.raises(KernelInputError, match="state_cache: expected a cuda tensor"):
        k(*case.args())
