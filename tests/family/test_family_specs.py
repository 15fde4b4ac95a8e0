"""Every registered family spec is complete, laid out like every other, and drives its op."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dsv4kit.ops
from dsv4kit.errors import ContractError, KernelInputError
from dsv4kit.family import DEFAULT_VARIANT, Arg, FamilySpec, Variant
from dsv4kit.jit import WarmupRegistry
from dsv4kit.kernels import FAMILY_FOLDERS, FAMILY_NAMES, families, family
from dsv4kit.kernels.c4_compress import C4CompressConfig
from dsv4kit.kernels.c128_compress import C128CompressConfig
from dsv4kit.kernels.dequant_gather.spec import DequantGatherBase
from dsv4kit.model.hooks import check_dispatch_by_name, model_families
from dsv4kit.model.stack import DSv4AttentionStack
from dsv4kit.platform import cpu_platform

SPECS = families()
KERNELS = Path(dsv4kit.ops.__file__).parent / "kernels"
#: The files every family folder has, and no family has more (spec.py: contract + SPEC; bench.py:
#: the folder's sweep plans and bytes models).
LAYOUT = {"__init__.py", "spec.py", "reference.py", "triton.py", "cutedsl.py", "cases.py", "bench.py"}
#: A config whose warmup keys are not empty, where the default (DSv4-Flash) warms none.
EXAMPLE_CONFIG = {"c4_compress_plain": C4CompressConfig(cache_dtype="bfloat16"),
                  "c128_norm_rope_store_plain": C128CompressConfig(cache_dtype="bfloat16")}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_family_is_complete(spec: FamilySpec) -> None:
    assert spec.missing() == []
    assert getattr(dsv4kit.ops, spec.op_name) is spec.op           # the public op, from the spec
    assert list(inspect.signature(spec.op).parameters) == [a.name for a in spec.args] + [
        "backend", "debug_checks", "platform"]
    for a in spec.args:                                            # the docs come from the table
        assert f"`{a.name}`" in spec.op.__doc__
    cfg = EXAMPLE_CONFIG.get(spec.name, spec.config_type())
    kernel = spec.kernel(next(iter(spec.variants)), platform=cpu_platform("sm_90a"))
    assert kernel.get_warmup_keys(cfg), "the default config warms at least one key"
    reg = WarmupRegistry()
    with reg.activate():
        assert spec.register(cfg, variant=next(iter(spec.variants)), platform=kernel.platform) is kernel
    assert reg.keys()[kernel.name] == kernel.get_warmup_keys(cfg)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_one_layout_for_every_family(name: str) -> None:
    folder = FAMILY_FOLDERS[name]
    files = {p.name for p in (KERNELS / folder).glob("*.py")}
    assert files == LAYOUT, f"{folder}: {sorted(files ^ LAYOUT)}"
    assert family(name).name == name and family(name).package == f"dsv4kit.kernels.{folder}"


def test_model_families_have_hooks_and_are_stacked() -> None:
    model = model_families()
    assert [s.name for s in model] == ["save_partial_states", "c4_compress_ds_mla", "c4_compress_plain",
                                       "indexer_compress", "c128_compress", "c128_norm_rope_store_ds_mla",
                                       "c128_norm_rope_store_plain", "indexer_q", "dequant_gather"]
    stack = DSv4AttentionStack("flash", "sm_90a")
    plain = DSv4AttentionStack("flash", "sm_90a", cache_dtype="bf16")
    assert stack.families == model
    for spec in model:
        plain_only = spec.name in ("c4_compress_plain", "c128_norm_rope_store_plain")
        runtime = plain if plain_only else stack                           # K6, K8b: plain-row caches only
        assert any(spec.name in layer.kernels for layer in runtime.layers), spec.name
    assert not any("c4_compress_plain" in layer.kernels for layer in stack.layers)
    assert not any("c4_compress_ds_mla" in layer.kernels for layer in plain.layers)
    assert not any("c128_norm_rope_store_plain" in layer.kernels for layer in stack.layers)
    assert not any("c128_norm_rope_store_ds_mla" in layer.kernels for layer in plain.layers)
    with pytest.raises(KernelInputError, match="family: expected one of"):
        family("c4_compress")


def test_model_stack_names_no_family() -> None:
    """The stack, the trace replay and the CLI read the specs; none of them names a family."""
    root = Path(dsv4kit.ops.__file__).parent
    for rel in ("model/stack.py", "model/trace.py", "cli.py"):
        text = (root / rel).read_text()
        for spec in SPECS:
            for word in (spec.name, spec.op_name, spec.contract.__name__):
                assert word not in text, f"{rel} names {word}"


def test_op_name_and_a_single_variant_default() -> None:
    """``op_name`` defaults to the family's name; a lone :class:`Variant` is ``DEFAULT_VARIANT``."""
    args = (Arg("k_cache", "tensor", (torch.uint8,), "[n, bs, 584]"),)
    var = Variant(lambda k_cache: None, DequantGatherBase, DequantGatherBase)
    spec = FamilySpec(name="lone", spec_id="X", summary="", args=args, contract=DequantGatherBase,
                      variants=var, returns="")
    assert spec.op_name == "lone" and dict(spec.variants) == {DEFAULT_VARIANT: var}
    named = FamilySpec(name="lone", spec_id="X", summary="", args=args, contract=DequantGatherBase,
                       variants={DEFAULT_VARIANT: var}, returns="", op_name="lone_op")
    assert named.op_name == "lone_op" and dict(named.variants) == dict(spec.variants)


def test_a_dispatch_that_reads_no_op_argument_is_refused() -> None:
    class Reads(DequantGatherBase):
        def dispatch(self, k_cache, num_pages):
            return self.CompileKey(block_size=k_cache.shape[1], has_gather_lens=num_pages > 0)

    bad = FamilySpec(name="bad", spec_id="X", summary="", op_name="bad",
                     args=(Arg("k_cache", "tensor", (torch.uint8,), "[n, bs, 584]"),), contract=Reads,
                     variants={DEFAULT_VARIANT: Variant(lambda k_cache: None, Reads, Reads)}, returns="")
    with pytest.raises(ContractError, match=r"dispatch parameters \['num_pages'\]"):
        check_dispatch_by_name(bad)  # the model replays calls by name: it refuses this family
    assert check_dispatch_by_name(family("dequant_gather")) is family("dequant_gather")
    with pytest.raises(ContractError, match="several variants need variant_arg"):
        FamilySpec(name="bad", spec_id="X", summary="", op_name="bad",
                   args=(Arg("k_cache", "tensor", (torch.uint8,), "[n, bs, 584]"),), contract=Reads,
                   variants={"a": Variant(print, Reads, Reads), "b": Variant(print, Reads, Reads)},
                   returns="")


# --------------------------------------------------------------------------- the argument table


def _tensor_args(spec: FamilySpec) -> list[str]:
    return [a.name for a in spec.args if a.kind == "tensor"]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_tensor_argument_rejects_a_non_tensor_by_name(spec: FamilySpec) -> None:
    """A list (or None where None is not allowed) is a KernelInputError naming the argument, before any
    backend is chosen; never a bare TypeError from deep inside."""
    required = [a for a in spec.args if a.default is inspect.Parameter.empty]
    for arg in _tensor_args(spec):
        row = next(a for a in spec.args if a.name == arg)
        values = {a.name: torch.zeros(1, dtype=a.dtypes[0]) if a.kind == "tensor" else 1 for a in required}
        for bad in ([1, 2], "x") + (() if row.optional else (None,)):
            values[arg] = bad
            with pytest.raises(KernelInputError, match=f"{spec.op_name}: {arg}: expected a torch.Tensor"):
                spec.op(**values)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_scalars_are_typed(spec: FamilySpec) -> None:
    for a in spec.args:
        if a.kind == "int":
            n = a.choices[0] if a.choices else 16
            assert a.check("op", np.int64(n)) == n and type(a.check("op", np.int64(n))) is int
            for bad in ("16", 16.0, True, None):
                with pytest.raises(KernelInputError, match=f"op: {a.name}: expected "):
                    a.check("op", bad)
        if a.kind == "float":
            assert a.check("op", np.float32(0.5)) == 0.5
            for bad in ("0.5", None, [0.5], True):
                with pytest.raises(KernelInputError, match=f"op: {a.name}: expected a real number"):
                    a.check("op", bad)


def test_unknown_keywords_and_missing_arguments_are_input_errors() -> None:
    op = family("save_partial_states").op
    with pytest.raises(KernelInputError, match="save_partial_states: arguments: expected"):
        op(torch.zeros(1))
    with pytest.raises(KernelInputError, match="unexpected keyword argument 'slots'"):
        op(*[torch.zeros(1)] * 6, 4, 256, 4, slots=None)


def test_variant_argument_choices() -> None:
    op = family("indexer_q").op
    t = torch.zeros(1, 64, 128, dtype=torch.bfloat16)
    with pytest.raises(KernelInputError, match="cache_format: expected one of 'fp8', 'mxfp4', got 'fp4'"):
        op(torch.zeros(1, dtype=torch.int64), t, torch.zeros(8, 64), torch.zeros(1, 64, dtype=torch.bfloat16),
           cache_format="fp4")


# --------------------------------------------------------------------------- TRITON_INTERPRET


def test_triton_interpret_env_is_accepted() -> None:
    """Triton's CPU convention (TRITON_INTERPRET=1) must not break the kit: it is accepted, and the
    kit still compiles AOT and runs its own interpreter path."""
    code = ("import torch, dsv4kit.ops as ops\n"
            "from dsv4kit import TRITON_INTERPRET_SET\n"
            "from dsv4kit.kernels.rowquant import rowquant_reference\n"
            "x = torch.randn(3, 256).bfloat16()\n"
            "q, s = ops.rowquant(x)\n"
            "rq, rs = rowquant_reference(x)\n"
            "assert TRITON_INTERPRET_SET and torch.equal(q.view(torch.uint8), rq.view(torch.uint8))\n"
            "assert torch.equal(s, rs)\n"
            "print('ok')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_triton_interpret_after_triton_import_is_one_clear_line() -> None:
    code = "import triton\nimport dsv4kit\n"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert ("dsv4kit: TRITON_INTERPRET=1 was set when triton was imported; dsv4kit runs the Triton "
            "interpreter itself on CPU: unset it, or import dsv4kit before triton") in out.stderr
