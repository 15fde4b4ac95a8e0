"""The GPU's direct launch trusts ``TritonJitKernel.specialization_check``: where it passes a call,
the warmed binary is launched without Triton's binder. Here it is held against the binder
(``variant``) for every Triton kernel of every family, over its warmup keys, with adversarial
launch arguments: dtypes of other widths, unaligned addresses, ints on each side of every class
boundary, bools, numpy ints. Sound: a pass means the binder gives the warmed specialization.
Complete on valid calls: a call of the warmed dtypes, aligned, of each int's class, passes."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from dsv4kit.backends.triton import TritonJitKernel
from dsv4kit.backends.triton_params import IntClass, Ptr, int_class
from dsv4kit.jit import launch_plans
from dsv4kit.kernels import families
from dsv4kit.testing.valid_calls import sized_call

#: Ints around every class boundary of triton 3.6 (==1, %16, int32 range), and non-ints.
INTS = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32, 2**32 + 1,
        -(2**31), -(2**31) - 1, -(2**31) - 16, 2**40, True, False, np.int64(16), np.int32(1), 16.0]
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.uint8, torch.int8, torch.int32, torch.int64,
          torch.float8_e4m3fn]

ADDRESSES = [4096, 4096 + 16, 4096 + 8, 4096 + 2, 4097]


class _Pointer:
    """What a Triton launch reads of a tensor argument: its dtype and address."""

    def __init__(self, dtype: torch.dtype, addr: int) -> None:
        self.dtype, self._addr = dtype, addr

    def data_ptr(self) -> int:
        return self._addr


def _keys_of_calls(spec, kernel: TritonJitKernel, variant: str) -> list:
    """The keys ``kernel`` dispatches for calls of several sizes (launching nothing)."""
    keys: list = []
    kernel.launch = lambda launch_spec, inputs: keys.append(launch_spec.key)  # type: ignore[method-assign]
    try:
        with launch_plans.disabled():
            for n in (1, 7, 64, 300):
                call = sized_call(spec, n)
                arg = spec.variant_arg
                if arg and call.pop(arg, spec._rows[arg].default) != variant:
                    continue
                kernel(**call, debug_checks=False)
    finally:
        del kernel.launch
    return keys


def _config_for(spec, variant: str):
    """The family's default config, a field naming another variant switched to ``variant``."""
    if spec.config_type is None:
        return None
    config = spec.config_type()
    for f in dataclasses.fields(config):
        if getattr(config, f.name) in spec.variants:
            config = dataclasses.replace(config, **{f.name: variant})
    return config


def _triton_kernels() -> list[tuple[str, TritonJitKernel, list]]:
    """Every family's Triton kernel with keys: its default config's warmup keys, and the keys of
    calls of several sizes."""
    out = []
    for spec in families():
        for name in spec.variants:
            kernel = spec.kernel(name, "cpu", "triton")
            keys = list(kernel.get_warmup_keys(_config_for(spec, name)))
            keys += _keys_of_calls(spec, kernel, name)
            out.append((f"{spec.name}-{name}", kernel, list(dict.fromkeys(keys))))
    return out


KERNELS = _triton_kernels()


def _warm_key_args(kernel: TritonJitKernel, key) -> list:
    """Launch arguments (call params) of a valid call of ``key``: the warmup's dtypes, aligned
    addresses, each int of its key's class."""
    names = kernel._call_params()
    warm = dict(zip([p.name for p in kernel.kernel_fn.params], kernel.warmup_inputs(key), strict=True))
    return [(_Pointer(warm[n].dtype, 4096) if isinstance(kernel.params[n], Ptr) else warm[n]) for n in names]


def _same_class(rng: random.Random, kernel: TritonJitKernel, key, name: str, valid):
    """``valid`` varied within its specialization class: another aligned address, another int of
    the key's class."""
    decl = kernel.params[name]
    if isinstance(decl, Ptr):
        return _Pointer(valid.dtype, 4096 + 16 * rng.randrange(1, 1000))
    if isinstance(decl, IntClass):
        want = getattr(key, decl.field)
        return rng.choice([v for v in INTS if type(v) is int and int_class(v) == want] or [valid])
    return valid


@pytest.mark.parametrize(("name", "kernel", "keys"), KERNELS, ids=[n for n, _, _ in KERNELS])
def test_specialization_check_agrees_with_triton_binder(name: str, kernel: TritonJitKernel,
                                                        keys: list) -> None:
    rng = random.Random(1234)
    assert keys, f"{name}: no keys"
    names = kernel._call_params()
    passed = failed = 0
    for key in keys:
        warmed = kernel.variant(key, kernel.warmup_inputs(key))
        ok = kernel.specialization_check(key)
        valid = _warm_key_args(kernel, key)
        assert ok(tuple(valid)), f"{name} {key}: a valid call fails the check"
        for _ in range(60):
            # every argument varied within its class, then one (or none) pushed anywhere
            args = [_same_class(rng, kernel, key, n, a) for n, a in zip(names, valid, strict=True)]
            i = rng.randrange(len(names) + 1)
            if i < len(names):
                decl = kernel.params[names[i]]
                if isinstance(decl, Ptr):
                    args[i] = _Pointer(rng.choice(DTYPES), rng.choice(ADDRESSES))
                elif isinstance(decl, IntClass):
                    args[i] = rng.choice(INTS)
            full = kernel._full_args(key, tuple(args))
            try:
                same = kernel.variant(key, full) == warmed
            except Exception:  # the binder refuses the value (a float for an int): never launched direct
                same = False
            if ok(tuple(args)):
                passed += 1
                assert same, f"{name} {key}: the check passed {args}, the binder specializes otherwise"
            else:
                failed += 1
    assert passed and failed, f"{name}: the random calls should both pass and fail ({passed} / {failed})"
