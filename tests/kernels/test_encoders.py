"""The store hooks E1..E5 on Triton under the CPU interpreter: BIT-EXACT against the references on
every §2.12 regime, slots -1 skipped, packed page strides, the sentinel untouched."""

from __future__ import annotations

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.kernels.encoders import SPECS
from dsv4kit.kernels.encoders.cases import HOOKS, REGIMES, differing_bytes, make_case, random_case
from dsv4kit.kernels.encoders.spec import E1, E2, E3, E4, E5, key_encoder
from dsv4kit.platform import cpu_platform

FORMATS = [
    ("store_rows_ds", {}),
    ("store_rows_plain", {}),
    ("store_rows_plain", {"fp8_scale": 0.37}),
    ("store_rows_plain", {"fp8_scale": 1.0}),
    ("store_rows_indexer", {"use_fp4": False}),
    ("store_rows_indexer", {"use_fp4": True}),
]


def _run(case):
    got, want = case.fresh(), case.fresh()
    SPECS[case.hook].op(**got.args, backend="triton")
    SPECS[case.hook].variants["default"].reference(**want.args)
    return got.cache, want.cache


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize(("hook", "fmt"), FORMATS, ids=lambda v: str(v))
def test_every_regime_is_bit_exact(hook: str, fmt: dict, regime: str) -> None:
    case = make_case(hook, 9, regime=regime, kv_bs=4, seed=len(regime), **fmt)
    got, want = _run(case)
    assert differing_bytes(got, want) == 0, case.label


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("i", range(3))
def test_random_cases_are_bit_exact(hook: str, i: int) -> None:
    case = random_case(hook, i)
    got, want = _run(case)
    assert differing_bytes(got, want) == 0, case.label


@pytest.mark.parametrize("t", [1, 2, 3, 5, 17, 33])
@pytest.mark.parametrize("kv_bs", [2, 4])
@pytest.mark.parametrize(("hook", "fmt"), FORMATS, ids=lambda v: str(v))
def test_awkward_t_and_page_alignment_are_bit_exact(hook: str, fmt: dict, kv_bs: int, t: int) -> None:
    """T not a multiple of a program's rows (the last program's tail), and for the indexer both
    page-stride paths: kv_bs 2 gives 264-byte pages (a multiple of 4 only), kv_bs 4 528 (of 16)."""
    case = make_case(hook, t, regime="saturating" if t % 2 else "normal", kv_bs=kv_bs, seed=t, **fmt)
    got, want = _run(case)
    assert differing_bytes(got, want) == 0, case.label


@pytest.mark.parametrize(("hook", "fmt"), FORMATS, ids=lambda v: str(v))
def test_padding_slots_inside_a_program_write_nothing(hook: str, fmt: dict) -> None:
    """Runs of -1 slots (whole tiles, and all but one row of a tile) next to zero rows."""
    case = make_case(hook, 40, regime="zero", kv_bs=4, **fmt)
    slots = case.args["kv_slot_mapping"]
    slots[:20] = -1
    slots[21:36] = -1
    case.args["rows"][20] = 3.0
    got, want = _run(case)
    assert differing_bytes(got, want) == 0, case.label


def test_a_row_with_slot_minus_one_writes_nothing() -> None:
    case = make_case("store_rows_ds", 5, kv_bs=2)
    case.args["kv_slot_mapping"][:] = -1
    got = case.fresh()
    SPECS["store_rows_ds"].op(**got.args)
    raw = got.cache.as_strided((got.cache.untyped_storage().nbytes(),), (1,), 0)
    assert bool((raw == 0xA5).all())


def test_crafted_rows_hit_the_spec_examples() -> None:
    """The crafted regime really contains ties, carries and -0 (the test above could not fail otherwise)."""
    case = make_case("store_rows_plain", 4, regime="crafted", fp8_scale=1.0)
    got, _ = _run(case)
    codes = got.view(torch.uint8)[case.args["kv_slot_mapping"][0] // 16, case.args["kv_slot_mapping"][0] % 16]
    assert (codes == 0x80).any(), "a small negative rounds to -0"


def test_the_key_picks_the_encoder() -> None:
    p = cpu_platform("sm_90a")
    keys = {h: SPECS[h].kernel(platform=p).get_warmup_keys() for h in HOOKS}
    assert [key_encoder(k) for h in HOOKS for k in keys[h]] == [E1, E2, E3, E4, E5]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_warmup_key_compiles_for_sm90a(hook: str) -> None:
    kernel = SPECS[hook].kernel(platform=cpu_platform("sm_90a"), backend="triton")
    for key in kernel.get_warmup_keys():
        assert kernel.compile_for(key, "sm_90a").executable is not None


def test_bad_inputs_raise_before_launch() -> None:
    case = make_case("store_rows_plain", 3, fp8_scale=0.5)
    with pytest.raises(KernelInputError, match="fp8_scale: expected a \\[1\\] fp32"):
        SPECS["store_rows_plain"].op(**{**case.args, "fp8_scale": None})
    bf = make_case("store_rows_plain", 3)
    with pytest.raises(KernelInputError, match="fp8_scale: expected None for a bfloat16 cache"):
        SPECS["store_rows_plain"].op(**{**bf.args, "fp8_scale": torch.ones(1)})
    with pytest.raises(KernelInputError, match="fp8_scale: expected a finite value > 0"):
        SPECS["store_rows_plain"].op(**{**case.args, "fp8_scale": torch.zeros(1)}, debug_checks=True)
    ds = make_case("store_rows_ds", 3)
    with pytest.raises(KernelInputError, match="rows: expected data_ptr % 16 == 0"):
        SPECS["store_rows_ds"].op(**{**ds.args, "rows": torch.zeros(3 * 512 + 1)[1:].view(3, 512)})
    with pytest.raises(KernelInputError, match="kv_slot_mapping: expected values in"):
        SPECS["store_rows_ds"].op(**{**ds.args, "kv_slot_mapping": torch.tensor([0, 1, 10**6])})
    with pytest.raises(KernelInputError, match="kv_slot_mapping: expected"):
        SPECS["store_rows_ds"].op(**{**ds.args, "kv_slot_mapping": torch.tensor([0, 1])})
    assert (
        SPECS["store_rows_ds"].op(
            **{**ds.args, "rows": torch.zeros(0, 512), "kv_slot_mapping": torch.zeros(0, dtype=torch.int64)}
        )
        is None
    )
