"""K3 contract: warmup keys, registration mirroring runtime selection, the monitor, bad inputs."""

from __future__ import annotations

import pytest
import torch

from dsv4kit.errors import KernelInputError, UnwarmedKeyError
from dsv4kit.formats.ds_mla import allocate_ds_cache
from dsv4kit.jit import JitMonitor, KeyLedger, WarmupRegistry
from dsv4kit.kernels.dequant_gather import (
    SPEC,
    DequantGatherConfig,
    dequantize_and_gather_k_cache,
    get_warmup_keys,
)
from dsv4kit.kernels.dequant_gather.cases import SENTINEL, make_case, same_bits
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.kernels.dequant_gather.triton import DequantGatherTriton
from dsv4kit.model.presets import DSV4_FLASH
from dsv4kit.platform import cpu_platform, replace

Key = DequantGatherBase.CompileKey


def keys(*pairs):
    return [Key(bs, g) for bs, g in pairs]


# --------------------------------------------------------------------------- warmup keys


@pytest.mark.parametrize("config,want", [
    (None, keys((256, True), (64, False), (2, False))),
    (DSV4_FLASH, keys((256, True), (64, False), (2, False))),
    (DequantGatherConfig(cache_block_size=0), []),
    (DequantGatherConfig(cache_block_size=64), keys((64, True), (16, False), (1, False))),
    (DequantGatherConfig(cache_block_size=2), keys((2, True), (1, False))),          # both ratios -> 1
    (DequantGatherConfig(compress_ratios=(0, 0, 4, 128, 4)), keys((256, True), (64, False), (2, False))),
    (DequantGatherConfig(compress_ratios=(0, 0)), keys((256, True))),
    (DequantGatherConfig(cache_dtype="bfloat16"), []),                                  # plain-row cache
    (DequantGatherConfig(cache_dtype="fp8"), []),
])
def test_warmup_keys(config, want) -> None:
    assert get_warmup_keys(config) == want
    assert DequantGatherTriton(cpu_platform()).get_warmup_keys(config) == want   # traced through dispatch


def test_layer_keys_and_bad_config() -> None:
    assert get_warmup_keys(DSV4_FLASH, ratio=0) == keys((256, True))
    assert get_warmup_keys(DSV4_FLASH, ratio=4) == keys((256, True), (64, False))
    assert get_warmup_keys(DSV4_FLASH, ratio=128) == keys((256, True), (2, False))
    with pytest.raises(KernelInputError, match="cache_dtype"):
        get_warmup_keys(DequantGatherConfig(cache_dtype="fp8_e5m2"))
    with pytest.raises(KernelInputError, match="cache_block_size"):
        get_warmup_keys(DequantGatherConfig(cache_block_size=-1))


def test_dispatch_matches_trap_10() -> None:
    """An explicit gather_lens on a compressed cache is another key, even if equal to seq_lens."""
    k = DequantGatherTriton(cpu_platform())
    case = make_case([5], block_size=64)
    assert k.dispatch(case.k_cache, None) == Key(64, False)
    assert k.dispatch(case.k_cache, case.seq_lens) == Key(64, True)


def test_registration_mirrors_runtime() -> None:
    """43 layers register; the registry holds the spec keys once, on the kernel the op would use."""
    reg = WarmupRegistry()
    with reg.activate():
        for ratio in DSV4_FLASH.compress_ratios:
            kernel = SPEC.register(DequantGatherConfig.for_layer(DSV4_FLASH, ratio))
    assert kernel is SPEC.kernel()
    assert reg.keys() == {kernel.name: keys((256, True), (64, False), (2, False))}
    assert reg.registrations[kernel.name].count == 43
    # Without an active registry: nothing recorded, no error.
    SPEC.register(DSV4_FLASH)


def test_backend_gating() -> None:
    cpu = cpu_platform("sm_90a")
    assert SPEC.kernel(platform=cpu).backend == "triton"
    gpu = replace(cpu, device="cuda", cutedsl=True)
    assert SPEC.kernel(platform=gpu).backend == "cutedsl"
    assert SPEC.kernel(platform=gpu, backend="triton").backend == "triton"
    assert SPEC.kernel(platform=replace(gpu, cutedsl=False)).backend == "triton"
    with pytest.raises(KernelInputError, match="dequantize_and_gather_k_cache: backend: .*with out"):
        dequantize_and_gather_k_cache(*make_case([3]).args(), backend="cutedsl", platform=cpu)


# --------------------------------------------------------------------------- monitor


def test_no_compile_after_warmup_over_a_trace() -> None:
    """Warm the spec keys, then replay prefill-like calls (varying strides, offsets, lengths,
    sliced metadata tensors): the monitor in error mode sees no compile and the ledger no miss."""
    k = DequantGatherTriton(cpu_platform("sm_90a"))
    ledger = KeyLedger()
    with ledger:
        k.warmup(DSV4_FLASH)
        with JitMonitor("error") as mon:
            plan = [(256, True, None), (64, False, None), (2, False, None), (64, False, 39_168),
                    (2, False, 2_304), (256, True, 150_336)]
            for i, (bs, g, stride) in enumerate(plan):
                case = make_case([3 + i, 20], [2, 20 - i] if g else None, offset=i if g else 0, block_size=bs,
                                 page_stride=stride, seed=i)
                sl = torch.tensor([0, *case.seq_lens.tolist()], dtype=torch.int32)[1:]   # unaligned view
                k(case.out, case.k_cache, sl, case.gather_lens, case.block_table, bs, case.offset)
        assert mon.events == []
    assert ledger.missed() == {}
    assert ledger.dead() == {}


def test_unwarmed_key_is_named() -> None:
    k = DequantGatherTriton(cpu_platform("sm_90a"))
    k.warmup(DSV4_FLASH)
    case = make_case([5], block_size=32)
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError, match="block_size: warmed 64, requested 32"):
        k(*case.args())
    assert bool((case.out.view(torch.uint8) == SENTINEL).all())


# --------------------------------------------------------------------------- bad inputs


def _bad(**changes):
    case = make_case([9, 20], [4, 20], offset=1, block_size=64)
    args = dict(out=case.out, k_cache=case.k_cache, seq_lens=case.seq_lens, gather_lens=case.gather_lens,
                block_table=case.block_table, block_size=64, offset=1)
    for name, fn in changes.items():
        args[name] = fn(args)
    return case, args


def _strided(stride):
    return lambda a: a["k_cache"].as_strided((2, 64, 584), (stride, 584, 1))


def _misaligned(a):
    return torch.zeros(2 * 37_440 + 16, dtype=torch.uint8)[16:].as_strided((2, 64, 584), (37_440, 584, 1))


BAD = {
    "k_cache not uint8": (dict(k_cache=lambda a: a["k_cache"].view(torch.int8)), "k_cache: expected dtype"),
    "k_cache last dim": (dict(k_cache=lambda a: a["k_cache"][:, :, :576]), r"expected shape\[2\] == 584"),
    "page stride not a multiple of 576": (dict(k_cache=_strided(37_448)), "page stride"),
    "page stride too small": (dict(k_cache=_strided(36_864)), "page stride"),
    "k_cache misaligned": (dict(k_cache=_misaligned), "data_ptr % 32"),
    "block size 0": (dict(k_cache=lambda a: torch.zeros(1152, dtype=torch.uint8).as_strided(
        (1, 0, 584), (1152, 584, 1)), block_size=lambda a: 0), r"\(block size\) >= 1"),
    "block_size mismatch": (dict(block_size=lambda a: 32), r"block_size: expected k_cache.shape\[1\] == 64"),
    "out not bf16": (dict(out=lambda a: a["out"].float()), "out: expected dtype bfloat16"),
    "out last dim": (dict(out=lambda a: a["out"][..., :256].contiguous()), r"out: expected shape\[2\]"),
    "out non-contiguous": (dict(out=lambda a: a["out"].transpose(0, 1)), "out: expected contiguous"),
    "out misaligned": (dict(out=lambda a: torch.empty(a["out"].numel() + 1, dtype=torch.bfloat16)[1:].view(
        a["out"].shape)), "out: expected data_ptr % 16 == 0"),
    "out too few requests": (dict(out=lambda a: a["out"][:1]), r"out: expected shape\[0\] >= nreq"),
    "seq_lens int64": (dict(seq_lens=lambda a: a["seq_lens"].long()), "seq_lens: expected dtype int32"),
    "gather_lens int64": (dict(gather_lens=lambda a: a["gather_lens"].long()), "gather_lens: expected dtype"),
    "gather_lens length": (dict(gather_lens=lambda a: a["gather_lens"][:1]), "gather_lens: expected len"),
    "block_table int64": (dict(block_table=lambda a: a["block_table"].long()), "block_table: expected dtype"),
    "block_table rows": (dict(block_table=lambda a: a["block_table"][:1]), r"block_table: expected shape"),
    "negative offset": (dict(offset=lambda a: -1), "offset: expected an int >= 0"),
    "seq_lens not a tensor": (dict(seq_lens=lambda a: [9, 20]), "seq_lens: expected a torch.Tensor"),
    # value checks (device reads: debug_checks, on by default under the interpreter)
    "gather_lens > seq_lens": (dict(gather_lens=lambda a: torch.tensor([10, 20], dtype=torch.int32)),
                               "gather_lens: expected 0 <= G <= L"),
    "offset + G beyond M": (dict(offset=lambda a: a["out"].shape[1] - 3), r"out: expected offset \+ G <= M"),
    "block_table too short": (dict(block_table=lambda a: a["block_table"][:, :0]),
                              r"block_table: expected ceil\(L / bs\) <= max_blocks"),
    "page id out of range": (dict(block_table=lambda a: torch.where(a["block_table"] >= 0, 99, -1).int()),
                             r"block_table: expected values in \[0, "),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_inputs_raise_before_launch(what) -> None:
    changes, msg = BAD[what]
    case, args = _bad(**changes)
    out = args["out"]
    before = out.clone() if isinstance(out, torch.Tensor) else None
    with KeyLedger() as ledger, pytest.raises(KernelInputError, match=msg):
        dequantize_and_gather_k_cache(**args)
    assert ledger.requested == {}          # never dispatched, so never launched
    assert same_bits(out, before)


def test_device_mismatch() -> None:
    case = make_case([3], block_size=64)
    meta = case.seq_lens.to("meta")
    with pytest.raises(KernelInputError, match="seq_lens: expected device cpu"):
        dequantize_and_gather_k_cache(case.out, case.k_cache, meta, None, case.block_table, 64)


def test_value_checks_opt_out() -> None:
    """With debug_checks=False nothing reads device values: a too-short block table is then the
    caller's undefined behavior (not exercised here), while metadata errors still raise."""
    case, args = _bad(seq_lens=lambda a: a["seq_lens"].long())
    with pytest.raises(KernelInputError, match="seq_lens"):
        dequantize_and_gather_k_cache(**args, debug_checks=False)


def test_allocated_cache_is_accepted() -> None:
    cache = allocate_ds_cache(1, 64, page_stride=39_168)
    assert cache.stride(0) == 39_168


# --------------------------------------------------------------------------- both backends compile


@pytest.mark.parametrize("backend", ["triton", "cutedsl"])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_warmup_keys_compile(backend, arch) -> None:
    """Every DSv4-Flash key compiles ahead of time for the named arch, with a register report."""
    from dsv4kit.kernels.dequant_gather.cutedsl import DequantGatherCuTeDSL

    cls = DequantGatherTriton if backend == "triton" else DequantGatherCuTeDSL
    kernel = cls(cpu_platform(arch))
    reports = kernel.warmup(DSV4_FLASH)
    assert [r.key for r in reports] == keys((256, True), (64, False), (2, False))
    for r in reports:
        art = kernel.artifact(r.key)
        assert art.target == arch
        assert 0 < art.info["registers"] <= 128 and art.info["spills"] == 0
        ptx = art.text["ptx"]
        assert f".target {arch}" in ptx
        assert "st.global.v4" in ptx          # 16-byte stores of 8 bf16


def test_cutedsl_launch_args_match_the_fakes() -> None:
    """The runtime arguments line up with the fake signature, host-side (no GPU needed)."""
    from dsv4kit.kernels.dequant_gather.cutedsl import DequantGatherCuTeDSL

    kernel = DequantGatherCuTeDSL(cpu_platform())
    case = make_case([9, 70], [4, 70], offset=2, block_size=64, page_stride=39_168)
    key = kernel.dispatch(case.k_cache, case.gather_lens)
    args = kernel.launch_args(key, *case.args()[:5], case.offset)
    fakes = kernel.warmup_inputs(key)
    assert len(args) == len(fakes) - 3                 # minus the stream and the two constexprs
    out, cache, seq, gat, bt, bt_stride, rows, offset, stride, per_cta, splits = args
    assert out.dtype == torch.int16 and out.data_ptr() == case.out.data_ptr()
    assert out.numel() == case.out.numel()
    assert cache.data_ptr() == case.k_cache.data_ptr() and cache.dim() == 1
    assert cache.numel() == (case.k_cache.shape[0] - 1) * 39_168 + 64 * 584
    assert gat is case.gather_lens and seq is case.seq_lens
    assert bt.dim() == 1 and bt_stride == case.block_table.stride(0)
    assert torch.equal(bt[bt_stride: bt_stride + case.block_table.shape[1]], case.block_table[1])
    assert (rows, offset, stride) == (case.out.shape[1], 2, 39_168)
    assert splits * per_cta >= rows - offset > (splits - 1) * per_cta
    with pytest.raises(KernelInputError, match="k_cache: expected a cuda tensor"):
        kernel(*case.args())
