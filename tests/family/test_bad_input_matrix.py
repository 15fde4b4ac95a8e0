"""A bad-input matrix per public op, generated from the family spec's argument table.

For each op: a valid call (from the family's cases), then, argument by argument, every kind of
bad value that applies: a non-tensor, another dtype, one dim more or less, a ``meta`` tensor,
an innermost dim of non-unit stride, a non-numeric or bool scalar. Each must raise
:class:`KernelInputError` naming that argument, before anything is launched (the state the op
writes is unchanged); no other exception type.

Then the other kinds of issue 11 (deliverable 4): each dim of each tensor one longer (its first
slice repeated) and a view one element past its buffer's start (a 1-byte offset for uint8): a
``KernelInputError`` naming some argument, or a normal return (free dims, unconstrained
alignment), nothing else; a per-token array one short: a named error, nothing written; T == 0
(every per-token array emptied): returns, empty outputs, nothing written; out-of-range slots,
block-table entries, requests and positions with ``debug_checks=True``: a named error, cache
untouched; bools, None, objects and complex numbers for scalars, unknown choices: named errors.

The error cases run twice (``path``): ``cold``, the op's first call; and ``warm``, after the
serving fast path has planned the op at two other shapes (value checks off, the fast path's
condition): a call that differs from the planned ones must still get its named error, from the
checks every call runs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dsv4kit.errors import KernelInputError
from dsv4kit.family import FamilySpec
from dsv4kit.kernels import families
from dsv4kit.testing.fast_path import class_tables, warm_class_plans
from dsv4kit.testing.valid_calls import VALID, sized_call

OTHER_DTYPE = {torch.float32: torch.float64, torch.bfloat16: torch.float16, torch.int64: torch.int32,
               torch.int32: torch.int64, torch.uint8: torch.int8, torch.float8_e4m3fn: torch.float8_e5m2}


def _mutations(spec: FamilySpec, valid: dict) -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = []
    for a in spec.args:
        v = valid.get(a.name)
        if a.kind == "tensor":
            out.append((a.name, "a list", [1, 2]))
            if not a.optional:
                out.append((a.name, "None", None))
            if isinstance(v, torch.Tensor):
                out.append((a.name, "another dtype", v.to(OTHER_DTYPE[v.dtype])))
                out.append((a.name, "one more dim", v.unsqueeze(0)))
                if v.dim() > 1:
                    out.append((a.name, "one dim less", v[0]))
                out.append((a.name, "a meta tensor", torch.empty_strided(v.shape, v.stride(), dtype=v.dtype,
                                                                        device="meta")))
                if v.numel() > 1:    # every argument's innermost dim has unit stride (spec §2.10)
                    wide = torch.zeros((*v.shape[:-1], 2 * v.shape[-1]), dtype=v.dtype)
                    out.append((a.name, "a non-unit inner stride", wide[..., ::2]))
        elif a.kind in ("int", "float"):
            out += [(a.name, "a string", "7"), (a.name, "a bool", True), (a.name, "a list", [1])]
        elif a.kind == "str":
            out += [(a.name, "an unknown choice", "nonsense"), (a.name, "an int", 3)]
    return out


CASES = [(spec, *m) for spec in families() for m in _mutations(spec, VALID[spec.name](spec))]

_WARMED: set[str] = set()


def _warm_fast_path(spec: FamilySpec) -> None:
    """Plan ``spec``'s op at shapes other than the valid call's (once per process), and check that
    the fast path is hot: a hot op launch, and a class plan (sizes as symbols, which serves the
    valid call's new sizes unless a guard fails), served without the checked path."""
    if spec.name not in _WARMED:
        for n in (1, 1, 2, 2):  # a signature is planned on its second call
            spec.op(**sized_call(spec, n), debug_checks=False)
        warm_class_plans(spec)
        _WARMED.add(spec.name)
    assert spec._launches.hot, f"{spec.op_name}: the fast path did not warm"
    assert any(t.hot for t in class_tables(spec)), f"{spec.op_name}: no class plan"


@pytest.fixture(params=["cold", "warm"])
def path(request: pytest.FixtureRequest) -> str:
    """``cold``: the op as first called; ``warm``: after the fast path planned other shapes."""
    return request.param


def _options(spec: FamilySpec, path: str) -> dict:
    """The call options of ``path`` (warming the fast path for ``warm``)."""
    if path == "cold":
        return {}
    _warm_fast_path(spec)
    return {"debug_checks": False}


@pytest.mark.parametrize("spec, arg, kind, bad", CASES,
                         ids=[f"{s.name}-{a}-{k}" for s, a, k, _ in CASES])
def test_bad_input_is_a_named_kernel_input_error(spec: FamilySpec, arg: str, kind: str, bad: object,
                                                 path: str) -> None:
    options = _options(spec, path)
    valid = VALID[spec.name](spec)
    before = {k: v.clone() for k, v in valid.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(KernelInputError) as exc:
        spec.op(**{**valid, arg: bad}, **options)
    assert str(exc.value).startswith(f"{spec.op_name}: "), str(exc.value)  # the op, not a kernel class
    assert f": {arg}: expected" in str(exc.value) or f": {arg} " in str(exc.value), str(exc.value)
    for k, t in before.items():                                    # nothing was written
        assert torch.equal(valid[k].view(torch.uint8), t.view(torch.uint8)), k


@pytest.mark.parametrize("spec", families(), ids=lambda s: s.name)
def test_the_valid_call_runs(spec: FamilySpec) -> None:
    spec.op(**VALID[spec.name](spec))


@pytest.mark.parametrize("spec", families(), ids=lambda s: s.name)
def test_the_common_options_are_checked(spec: FamilySpec) -> None:
    valid = VALID[spec.name](spec)
    with pytest.raises(KernelInputError, match=f"{spec.op_name}: debug_checks: expected True, False or"):
        spec.op(**valid, debug_checks="yes")
    with pytest.raises(KernelInputError, match="backend: expected one of cutedsl, triton or None, got"):
        spec.op(**valid, backend="cuda")
    with pytest.raises(KernelInputError, match=f"{spec.op_name}: platform: expected a dsv4kit Platform"):
        spec.op(**valid, platform="sm_90a")


# --------------------------------------------------------------------------- issue 11, deliverable 4:
# each dim, alignment, length mismatch, T == 0, out-of-range indices, bools, non-numeric scalars.

_NAMES = {spec.name: tuple(a.name for a in spec.args) for spec in families()}

#: The per-token arrays of each op (dim 0 is T; one short must be an error), and what T == 0
#: empties with them. K4: ``slot_mapping`` defines T, ``positions``, kv and score may be longer.
PER_TOKEN: dict[str, tuple[str, ...]] = {
    "save_partial_states": ("positions", "slot_mapping"),     # kv, score: >= T rows (a view)
    "c4_compress_ds_mla": ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping"),
    "c4_compress_plain": ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping"),
    "indexer_compress": ("token_to_req", "positions", "slot_mapping", "kv_slot_mapping"),
    "c128_compress": ("token_to_req", "positions", "slot_mapping"),      # out: >= T rows
    "c128_norm_rope_store_ds_mla": ("compressed_kv", "positions", "slot_mapping", "kv_slot_mapping"),
    "c128_norm_rope_store_plain": ("compressed_kv", "positions", "slot_mapping", "kv_slot_mapping"),
    "indexer_q": ("positions", "index_q", "index_weights"),
    "dequant_gather": ("seq_lens", "gather_lens", "block_table"),      # per request
    "store_rows_ds": ("rows", "kv_slot_mapping"),
    "store_rows_plain": ("rows", "kv_slot_mapping"),
    "store_rows_indexer": ("rows", "kv_slot_mapping"),
    "rowquant": ("x",),
}

#: Index arguments and an out-of-range value for each (a function of the valid call).
def _oob(spec_name: str, v: dict) -> list[tuple[str, str, Callable[[torch.Tensor], None]]]:
    out: list[tuple[str, str, Callable[[torch.Tensor], None]]] = []
    if spec_name == "save_partial_states":
        n = v["state_cache"].shape[0] * v["state_cache"].shape[1]
        out.append(("slot_mapping", "a slot past the state cache", lambda t: t.__setitem__(0, n)))
    elif spec_name in ("c4_compress_ds_mla", "c4_compress_plain", "indexer_compress"):
        cache = v["kv_cache" if spec_name == "c4_compress_plain" else "k_cache"]
        nkv = cache.shape[0] * cache.shape[1]
        nsb = v["state_cache"].shape[0]
        nreq = v["block_table"].shape[0]
        bnd = int(torch.nonzero(v["kv_slot_mapping"] >= 0)[0])
        out.append(("kv_slot_mapping", "a kv slot past the cache", lambda t: t.__setitem__(bnd, nkv)))
        out.append(("block_table", "a block past the state cache", lambda t: t.__setitem__((0, 0), nsb)))
        # on a token that writes an entry (boundary, kv slot >= 0); a boundary position stays one
        out.append(("token_to_req", "a request past the block table", lambda t: t.__setitem__(bnd, nreq)))
        out.append(("positions", "a position past the RoPE cache",
                    lambda t: t.__setitem__(bnd, v["cos_sin_cache"].shape[0] * 8 - 1)))
    elif spec_name == "c128_compress":
        nsb, nreq = v["state_cache"].shape[0], v["block_table"].shape[0]
        bnd = int(torch.nonzero((v["positions"] + 1) % 128 == 0)[0])
        live = int(torch.nonzero(v["slot_mapping"] >= 0)[0])
        out.append(("block_table", "a block past the state cache", lambda t: t.__setitem__((0, 0), nsb)))
        out.append(("token_to_req", "a request past the block table", lambda t: t.__setitem__(bnd, nreq)))
        out.append(("positions", "a negative position", lambda t: t.__setitem__(live, -1)))
    elif spec_name.startswith("c128_norm_rope_store"):
        cache = v["kv_cache" if spec_name.endswith("plain") else "k_cache"]
        nkv = cache.shape[0] * cache.shape[1]
        bnd = int(torch.nonzero(v["kv_slot_mapping"] >= 0)[0])
        out.append(("kv_slot_mapping", "a kv slot past the cache", lambda t: t.__setitem__(bnd, nkv)))
        out.append(("positions", "a position past the RoPE cache",
                    lambda t: t.__setitem__(bnd, v["cos_sin_cache"].shape[0] * 128 - 1)))
    elif spec_name == "indexer_q":
        out.append(("positions", "a position past the RoPE cache",
                    lambda t: t.__setitem__(0, v["cos_sin_cache"].shape[0])))
        out.append(("positions", "a negative position", lambda t: t.__setitem__(0, -1)))
    elif spec_name == "dequant_gather":
        pages = v["k_cache"].shape[0]
        out.append(("block_table", "a page past the cache", lambda t: t.__setitem__((0, 0), pages)))
        out.append(("seq_lens", "a length past the block table",
                    lambda t: t.__setitem__(0, v["block_table"].shape[1] * v["block_size"] + 1)))
    elif spec_name.startswith("store_rows"):
        cache = v["cache" if spec_name == "store_rows_plain" else "k_cache"]
        n = cache.shape[0] * cache.shape[1]
        out.append(("kv_slot_mapping", "a slot past the cache", lambda t: t.__setitem__(0, n)))
    return out


def _names_some_argument(spec: FamilySpec, msg: str) -> bool:
    return any(f": {n}" in msg for n in _NAMES[spec.name])


def _grow(v: torch.Tensor, d: int) -> torch.Tensor:
    """``v`` with dim ``d`` one longer (its first slice repeated: values stay in range)."""
    if not v.shape[d]:
        return torch.zeros((*v.shape[:d], 1, *v.shape[d + 1:]), dtype=v.dtype)
    extra = v.narrow(d, 0, 1)
    return torch.cat((v, extra), dim=d)


def _offset_view(v: torch.Tensor) -> torch.Tensor:
    """``v``'s values in a view one element past a fresh buffer's start (same shape and strides):
    a 1-byte offset for uint8 tensors, 1 element for the others."""
    span = 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride(), strict=True)) if v.numel() else 0
    buf = torch.zeros(span + 1, dtype=v.dtype)
    w = buf.as_strided(v.shape, v.stride(), 1)
    w.copy_(v)
    return w


def _tensor_args(spec: FamilySpec) -> list[tuple[str, torch.Tensor]]:
    v = VALID[spec.name](spec)
    return [(a.name, v[a.name]) for a in spec.args
            if a.kind == "tensor" and isinstance(v.get(a.name), torch.Tensor)]


DIM_CASES = [(spec, n, d) for spec in families() for n, t in _tensor_args(spec) for d in range(t.dim())]


def _error_or_return(spec: FamilySpec, call: dict) -> None:
    """The call raises a KernelInputError naming an argument, or returns: nothing else."""
    try:
        spec.op(**call)
    except KernelInputError as exc:
        assert _names_some_argument(spec, str(exc)), str(exc)


@pytest.mark.parametrize("spec, arg, dim", DIM_CASES, ids=[f"{s.name}-{a}-dim{d}" for s, a, d in DIM_CASES])
def test_each_dim_one_longer_is_an_error_or_a_call(spec: FamilySpec, arg: str, dim: int, path: str) -> None:
    options = _options(spec, path)
    valid = VALID[spec.name](spec)
    _error_or_return(spec, {**valid, arg: _grow(valid[arg], dim), **options})


ALIGN_CASES = [(spec, n) for spec in families() for n, t in _tensor_args(spec) if t.numel()]


@pytest.mark.parametrize("spec, arg", ALIGN_CASES, ids=[f"{s.name}-{a}" for s, a in ALIGN_CASES])
def test_a_misaligned_view_is_an_error_or_a_call(spec: FamilySpec, arg: str, path: str) -> None:
    options = _options(spec, path)
    valid = VALID[spec.name](spec)
    _error_or_return(spec, {**valid, arg: _offset_view(valid[arg]), **options})


#: The argument whose length is T (the others must be at least / exactly as long).
T_ARG = {"save_partial_states": "slot_mapping"}
LEN_CASES = [(spec, n) for spec in families() for n in PER_TOKEN[spec.name]
             if len(PER_TOKEN[spec.name]) > 1 and n != T_ARG.get(spec.name)
             and isinstance(VALID[spec.name](spec).get(n), torch.Tensor)]


@pytest.mark.parametrize("spec, arg", LEN_CASES, ids=[f"{s.name}-{a}" for s, a in LEN_CASES])
def test_a_per_token_array_one_short_is_an_error(spec: FamilySpec, arg: str, path: str) -> None:
    options = _options(spec, path)
    valid = VALID[spec.name](spec)
    before = {k: v.clone() for k, v in valid.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(KernelInputError) as exc:
        t_arg = T_ARG.get(spec.name)
        t = valid[t_arg].shape[0] if t_arg else valid[arg].shape[0]
        spec.op(**{**valid, arg: valid[arg][: t - 1]}, **options)
    assert _names_some_argument(spec, str(exc.value)), str(exc.value)
    for k, t in before.items():
        assert torch.equal(valid[k].view(torch.uint8), t.view(torch.uint8)), k


@pytest.mark.parametrize("spec", families(), ids=lambda s: s.name)
def test_zero_tokens_return_empty_and_write_nothing(spec: FamilySpec) -> None:
    valid = VALID[spec.name](spec)
    call = {k: (v[:0] if k in PER_TOKEN[spec.name] and isinstance(v, torch.Tensor) else v)
            for k, v in valid.items()}
    before = {k: v.clone() for k, v in call.items() if isinstance(v, torch.Tensor)}
    ret = spec.op(**call)
    for t in (ret if isinstance(ret, tuple) else (ret,)):
        if isinstance(t, torch.Tensor) and spec.name != "dequant_gather":   # K3 returns its ``out``
            assert t.shape[0] == 0, t.shape
    for k, t in before.items():
        assert torch.equal(call[k].view(torch.uint8), t.view(torch.uint8)), k


OOB_CASES = [(spec, a, k, f) for spec in families() for a, k, f in _oob(spec.name, VALID[spec.name](spec))]


@pytest.mark.parametrize("spec, arg, kind, mutate", OOB_CASES,
                         ids=[f"{s.name}-{a}-{k}" for s, a, k, _ in OOB_CASES])
def test_an_out_of_range_index_is_an_error_with_debug_checks(spec: FamilySpec, arg: str, kind: str,
                                                              mutate: Callable) -> None:
    valid = VALID[spec.name](spec)
    bad = valid[arg].clone()
    mutate(bad)
    before = {k: v.clone() for k, v in valid.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(KernelInputError) as exc:
        spec.op(**{**valid, arg: bad}, debug_checks=True)
    assert _names_some_argument(spec, str(exc.value)), str(exc.value)
    for k, t in before.items():                                    # the cache is untouched
        assert torch.equal(valid[k].view(torch.uint8), t.view(torch.uint8)), k


def _scalar_mutations(spec: FamilySpec) -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = []
    for a in spec.args:
        if a.kind in ("int", "float"):
            out += [(a.name, "None", None), (a.name, "an object", object()), (a.name, "a complex", 1j)]
        elif a.kind == "bool":
            out += [(a.name, "a string", "yes"), (a.name, "an int 2", 2), (a.name, "None", None),
                    (a.name, "a list", [True])]
        elif a.kind == "str":
            out += [(a.name, "an unknown choice (case)", "FP8"), (a.name, "None", None)]
    return out


SCALAR_CASES = [(spec, *m) for spec in families() for m in _scalar_mutations(spec)]


@pytest.mark.parametrize("spec, arg, kind, bad", SCALAR_CASES,
                         ids=[f"{s.name}-{a}-{k}" for s, a, k, _ in SCALAR_CASES])
def test_a_bad_scalar_is_a_named_error(spec: FamilySpec, arg: str, kind: str, bad: object, path: str) -> None:
    options = _options(spec, path)
    valid = VALID[spec.name](spec)
    with pytest.raises(KernelInputError) as exc:
        spec.op(**{**valid, arg: bad}, **options)
    assert f": {arg}: expected" in str(exc.value) or f": {arg} " in str(exc.value), str(exc.value)
