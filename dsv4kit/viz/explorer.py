"""One interactive explorer for every kernel family, built from its :class:`~dsv4kit.family.FamilySpec`.

Choose a variant and a token count: :func:`probe` builds the call from the family's seeded cases
module, asks the Triton kernel's own ``dispatch`` for its CompileKey (the key the op would use), says
whether that key is warm (compiled in this process), gives the launch grid the kernel computes for
the call, then runs the public op (Triton under the CPU interpreter) and the family's PyTorch
reference on two builds of the same seeded inputs and compares every tensor they return or write,
byte for byte. :func:`explorer` shows it as widgets, and always as a static table of a few shapes
too, which is what a rendered page (the gallery) or a run without a widget frontend shows.

The only per-family knowledge here is how a token count becomes a seeded case
(:data:`CASE_BUILDERS`: one line per family folder, calling that folder's ``cases`` module).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4kit.errors import format_key
from dsv4kit.family import FamilySpec
from dsv4kit.jit import KeyLedger
from dsv4kit.platform import Platform, cpu_platform

__all__ = ["CASE_BUILDERS", "Probe", "explorer", "op_values", "plot_probes", "probe", "probes_markdown"]

#: Family folder -> (cases module, op name, tokens, seed) -> a seeded case of that folder's cases module.
CASE_BUILDERS: dict[str, Callable[[Any, str, int, int], Any]] = {
    "save_partial_states": lambda m, op, t, seed: m.make_case(t=t, seed=seed),
    "indexer_q": lambda m, op, t, seed: m.make_case(t, seed=seed),
    "dequant_gather": lambda m, op, t, seed: m.make_case([t], seed=seed),
    "c4_compress": lambda m, op, t, seed: m.make_case(op, lens=(t,), seed=seed),
    "c128_compress": lambda m, op, t, seed: (m.make_k7_case(lens=(t,), seed=seed) if op == "c128_compress"
                                             else m.make_k8_case(op, t=t, seed=seed)),
    "encoders": lambda m, op, t, seed: m.make_case(op, t, seed=seed),
    "rowquant": lambda m, op, t, seed: m.regime("normal", t, 256, seed),
}


def op_values(spec: FamilySpec, case: Any) -> dict[str, Any]:
    """The op's arguments by name from a case, whichever form its cases module gives them in."""
    if isinstance(case, torch.Tensor):
        return {spec.args[0].name: case}
    kwargs = getattr(case, "kwargs", None)
    if callable(kwargs):
        return dict(kwargs())
    args = case.args
    if isinstance(args, Mapping):
        return dict(args)
    values, _ = spec.bind(*args())
    return values


def _build(spec: FamilySpec, tokens: int, seed: int) -> dict[str, Any]:
    folder = spec.folder or spec.name
    cases = importlib.import_module(f"{spec.package}.cases")
    return op_values(spec, CASE_BUILDERS[folder](cases, spec.op_name, tokens, seed))


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    # The whole storage: an op that writes outside its view must show up too.
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def _tensors(result: Any, values: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    out = {n: v for n, v in values.items() if isinstance(v, torch.Tensor)}
    returned = result if isinstance(result, tuple | list) else (result,)
    out |= {f"returned[{i}]": r for i, r in enumerate(returned) if isinstance(r, torch.Tensor)}
    return out


@dataclass(frozen=True)
class Probe:
    """What one call does: the ``kernel`` and its ``key``, whether the key was ``warm`` before the
    call, the launch ``grid``, and per tensor the bytes that differ from the reference's (``diffs``:
    name -> (differing, total)); ``error``: why the call could not run, or None."""

    family: str
    variant: str
    tokens: int
    kernel: str
    key: str
    warm: bool
    grid: tuple[int, ...] | None
    diffs: Mapping[str, tuple[int, int]]
    error: str | None = None

    @property
    def bit_exact(self) -> bool:
        return self.error is None and all(d == 0 for d, _ in self.diffs.values())

    def verdict(self) -> str:
        if self.error is not None:
            return f"not run: {self.error}"
        bad = {n: d for n, d in self.diffs.items() if d[0]}
        if not bad:
            return f"bit-exact ({len(self.diffs)} tensors)"
        return "; ".join(f"{n}: {d} of {t} bytes differ" for n, (d, t) in bad.items())


@functools.cache
def _cpu(arch: str) -> Platform:
    return cpu_platform(arch)


def _dispatched(spec: FamilySpec, kernel: Any, values: Mapping[str, Any]) -> Any:
    """The key by the contract's ``dispatch`` on the op's arguments (None: it reads other names)."""
    try:
        return spec.dispatch(kernel, values)
    except (KeyError, TypeError):
        return None


def _run(spec: FamilySpec, kernel: Any, values: dict[str, Any], cpu: Platform) -> tuple[Any, Any, Any]:
    """Run the op, recording the key it requested and the grid it launched (None: not seen)."""
    grids: list[tuple[int, ...]] = []
    cls = type(kernel)
    launch_grid, own = cls.grid, "grid" in cls.__dict__

    def recording(self: Any, key: Any, args: Mapping[str, Any]) -> tuple[int, ...]:
        grids.append(tuple(launch_grid(self, key, args)))
        return grids[-1]

    # on the class, this call only: the executor that launches may be another instance's (executors
    # are cached per kernel class and target, and closed over the instance that compiled the key)
    cls.grid = recording
    try:
        with KeyLedger() as ledger:
            result = spec.op(**values, backend="triton", platform=cpu)
    finally:
        if own:
            cls.grid = launch_grid
        else:
            del cls.grid
    keys = list(ledger.requested.get(kernel.name, {}))
    return result, keys[0] if keys else None, grids[0] if grids else None


def probe(spec: FamilySpec, tokens: int, variant: str | None = None, *, seed: int = 0,
          arch: str = "sm_90a", run: bool = True) -> Probe:
    """Key, warm state, grid and (``run``) numerics of one call of ``spec``'s op with ``tokens``."""
    cpu = _cpu(arch)
    values = _build(spec, tokens, seed)
    if spec.variant_arg is not None:
        values[spec.variant_arg] = variant = variant or values[spec.variant_arg]
    variant = variant or "default"
    call_values = {k: v for k, v in values.items() if k != spec.variant_arg}
    kernel = spec.kernel(variant, "cpu", "triton", cpu)
    compiled = set(kernel.compiled_keys())
    key, grid = _dispatched(spec, kernel, call_values), None
    diffs: dict[str, tuple[int, int]] = {}
    error = None
    if run:
        try:
            result, requested, grid = _run(spec, kernel, values, cpu)
            key = requested if requested is not None else key
            got = _tensors(result, values)
            ref_values = {k: v for k, v in _build(spec, tokens, seed).items() if k != spec.variant_arg}
            want = _tensors(spec.variants[variant].reference(**ref_values), ref_values)
            for name, g in got.items():
                gb, wb = _storage_bytes(g), _storage_bytes(want[name])
                diffs[name] = (int((gb != wb).sum()) if gb.shape == wb.shape else gb.numel(), gb.numel())
        except Exception as exc:  # shown, not hidden: the explorer is for looking
            error = f"{type(exc).__name__}: {exc}"
    shown = format_key(key) if key is not None else "(known once the kernel runs)"
    return Probe(spec.name, variant, tokens, kernel.name, shown, key in compiled, grid, diffs, error)


def plot_probes(probes: Sequence[Probe], title: str = "") -> Any:
    """Bars per call: the bytes compared with the reference, the differing ones in red."""
    import matplotlib.pyplot as plt

    labels = [f"{p.variant} T={p.tokens}" for p in probes]
    total = [sum(t for _, t in p.diffs.values()) for p in probes]
    bad = [sum(d for d, _ in p.diffs.values()) for p in probes]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(probes) + 1.2))
    ax.barh(labels, total, color="tab:green", label="identical to the reference")
    ax.barh(labels, bad, color="tab:red", label="differing")
    ax.set_xlabel("bytes compared (every tensor the op returns or writes, whole storage)")
    ax.set_title(title or "one call per bar, against the PyTorch reference")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    return fig


def probes_markdown(probes: Sequence[Probe]) -> str:
    """A markdown table of probes: one row per call."""
    rows = ["| variant | T | kernel | CompileKey | warm before the call | grid | against the reference |",
            "|---|---|---|---|---|---|---|"]
    for p in probes:
        grid = "×".join(map(str, p.grid)) if p.grid else "—"
        rows.append(f"| {p.variant} | {p.tokens} | {p.kernel} | `{p.key}` | {'yes' if p.warm else 'no'} "
                    f"| {grid} | {p.verdict()} |")
    return "\n".join(rows)


def explorer(spec: FamilySpec, tokens: Sequence[int] = (1, 7, 33), *, max_tokens: int = 64,
             seed: int = 0) -> list[Probe]:
    """Show ``spec``'s explorer: the static table of ``tokens`` (every variant), then the widgets.

    Returns the static table's probes, so a notebook can assert on what it shows.
    """
    import ipywidgets as widgets
    from IPython.display import Markdown, display

    variants = list(spec.variants)
    static = [probe(spec, t, v, seed=seed) for v in variants for t in tokens]
    display(Markdown(f"**{spec.spec_id} `{spec.op_name}`**, one call per row (Triton under the CPU "
                     f"interpreter, sm_90a keys; seed {seed}):\n\n" + probes_markdown(static)))
    display(plot_probes(static, f"{spec.op_name}: each call against the reference"))

    def show(variant: str, num_tokens: int, run: bool) -> None:
        display(Markdown(probes_markdown([probe(spec, num_tokens, variant, seed=seed, run=run)])))

    display(widgets.interactive(
        show, variant=widgets.Dropdown(options=variants, description="variant"),
        num_tokens=widgets.IntSlider(value=tokens[0], min=1, max=max_tokens, description="tokens T"),
        run=widgets.Checkbox(value=True, description="run the kernel")))
    return static
