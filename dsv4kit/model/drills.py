"""Drill builders for the warmup/runtime mismatch traps of spec §2.11 (tests and notebook 05).

A drill warms one configuration of a :class:`~dsv4kit.model.stack.DSv4AttentionStack` and runs
another: the JIT monitor in ``error`` mode (an :class:`~dsv4kit.errors.UnwarmedKeyError` naming the
kernel, the requested key and the differing field, raised before anything compiles) or a
configuration / call check (a :class:`~dsv4kit.errors.KernelInputError` naming the argument)
must catch the difference. The pieces:

* :func:`build` a stack under a fresh registry, :func:`warm` its registry into a ledger (forgetting
  what was compiled before), :func:`runtime` the stack a serving process runs (no registry);
* :func:`drill` warm one registry and replay a trace on another stack, every miss kept;
  :func:`first_miss` the same, returning the monitor's first error (the replay stops there);
* :func:`raised` the exception a configuration or call check raises;
* :func:`field_phrase` the words an error uses for a differing field (what a drill looks for);
* :func:`without` a registry less some of its keys; :func:`by_kernel` misses grouped per kernel;
* :data:`TRAPS` the ten traps' one-line titles, :class:`Caught` one drill's outcome.

Everything runs on CPU: Triton compiled ahead of time for sm_90a, keys derived by each kernel's
own ``dispatch``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dsv4kit.errors import UnwarmedKeyError
from dsv4kit.jit import KeyLedger, WarmupRegistry
from dsv4kit.model.presets import DSV4_FLASH, ModelPreset
from dsv4kit.model.stack import DSv4AttentionStack
from dsv4kit.model.trace import ReplayResult, make_trace, replay
from dsv4kit.platform import Platform, cpu_platform

__all__ = [
    "CPU",
    "TRAPS",
    "Caught",
    "build",
    "by_kernel",
    "drill",
    "field_phrase",
    "first_miss",
    "raised",
    "runtime",
    "warm",
    "without",
]

#: The drills' platform: a CPU process compiling Triton ahead of time for sm_90a.
CPU = cpu_platform("sm_90a")

#: Trap number -> its title in spec §2.11.
TRAPS: dict[int, str] = {
    1: "cos_sin dtype (fp32 cache cast to bf16 with the module)",
    2: "coarsen switch at T = 512 (K1/K2)",
    3: "KV cache dtype strings (fp8_e5m2 rejected; one map for warmup and runtime)",
    4: "C128 store page geometry is in the key (packed pools)",
    5: "C128 compress requires state block size 8",
    6: "platform gating of registration (Triton vs CuTeDSL)",
    7: "save_partial_states for the indexer state (SW 256)",
    8: "indexer compressor keys only on format and weight dtype",
    9: "norm weight dtype (fp32-kept weights)",
    10: "dequant-gather: explicit gather_lens on a compressed cache",
}


@dataclass(frozen=True)
class Caught:
    """One drill's outcome: which trap, what caught it (``monitor`` or ``configuration check``),
    the field or argument the message names, and the message."""

    trap: int
    by: str
    field: str
    message: str

    @property
    def title(self) -> str:
        return TRAPS[self.trap]

    @property
    def names_field(self) -> bool:
        """The message names the field (or argument)."""
        return self.field in self.message

    @property
    def first_line(self) -> str:
        return self.message.strip().splitlines()[0] if self.message.strip() else ""

    def excerpt(self, width: int = 110) -> str:
        """The part of the message that names the field: from ``differs in`` when the monitor names a
        nearest warmed key, else around the field's first mention, else the first line."""
        text = " ".join(self.message.split())
        at = text.find("differs in ")
        if at < 0:
            at = max(0, text.find(self.field) - 30) if self.field in text else 0
        out = text[at:at + width]
        return ("..." if at else "") + out + ("..." if at + width < len(text) else "")


def build(preset: ModelPreset | str = DSV4_FLASH, platform: Platform | str = "sm_90a",
          **settings: Any) -> tuple[DSv4AttentionStack, WarmupRegistry]:
    """A stack built under a fresh registry: ``(stack, registry)`` (a str platform is a CPU one)."""
    registry = WarmupRegistry()
    with registry.activate():
        stack = DSv4AttentionStack(preset, platform, **settings)
    return stack, registry


def runtime(preset: ModelPreset | str = DSV4_FLASH, platform: Platform = CPU,
            **settings: Any) -> DSv4AttentionStack:
    """The stack a serving process runs (built under no registry: its registrations go nowhere)."""
    return DSv4AttentionStack(preset, platform, **settings)


def warm(stack: DSv4AttentionStack, registry: WarmupRegistry, ledger: KeyLedger | None = None) -> KeyLedger:
    """Warm ``registry`` into ``ledger`` (returned). With a new ledger, first forget what earlier
    runs compiled for these kernel classes; a second warmup into the same ledger adds to the first
    (one kernel class may serve both, e.g. K9's FP8 and MXFP4 keys). A failed warmup raises."""
    if ledger is None:
        stack.clear_compiled()
        for reg in registry.registrations.values():
            type(reg.kernel).clear_cache()
    ledger = ledger or KeyLedger()
    with ledger:
        report = registry.warmup(progress=False)
    if not report.ok:
        raise RuntimeError(f"drill warmup failed:\n{report.table()}")
    return ledger


def _warmed(rt: DSv4AttentionStack, registry: WarmupRegistry, warm_stack: DSv4AttentionStack) -> KeyLedger:
    """Forget every executor of ``rt``'s kernels, then compile ``registry`` only: the ledger."""
    rt.clear_compiled()
    return warm(warm_stack, registry)


def drill(rt: DSv4AttentionStack, registry: WarmupRegistry, warm_stack: DSv4AttentionStack,
          kind: str = "prefill", steps: int = 2, seed: int = 1) -> tuple[ReplayResult, KeyLedger]:
    """Warm ``registry`` (built with ``warm_stack``) and replay a seeded ``kind`` trace on ``rt`` in
    ``error`` mode, every miss kept: ``(result, ledger)``."""
    ledger = _warmed(rt, registry, warm_stack)
    result = replay(rt, make_trace(kind, rt, steps=steps, seed=seed), ledger=ledger, mode="error")
    return result, ledger


def first_miss(rt: DSv4AttentionStack, registry: WarmupRegistry, warm_stack: DSv4AttentionStack,
               kind: str = "prefill", steps: int = 2, seed: int = 1) -> UnwarmedKeyError:
    """Warm ``registry``, replay on ``rt`` and return the monitor's first error (the replay stops
    there). Raises AssertionError when nothing missed, or when the missed key got compiled."""
    ledger = _warmed(rt, registry, warm_stack)
    try:
        replay(rt, make_trace(kind, rt, steps=steps, seed=seed), ledger=ledger, mode="error",
               stop_on_miss=True)
    except UnwarmedKeyError as err:
        if err.key in rt.kernels()[err.kernel].compiled_keys():
            raise AssertionError(f"{err.kernel}: {err.key} was compiled before the monitor stopped it"
                                 ) from err
        return err
    raise AssertionError("the replay missed no key: the misconfiguration went unnoticed")


def raised(expected: type[BaseException] | tuple[type[BaseException], ...], fn: Callable[..., Any],
           *args: Any, **kwargs: Any) -> BaseException:
    """Call ``fn(*args, **kwargs)`` and return the ``expected`` exception it raises (a configuration
    or call check); AssertionError when it raises none."""
    try:
        fn(*args, **kwargs)
    except expected as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} raised no {expected}")


def field_phrase(field: str, warmed: Any, requested: Any) -> str:
    """How an :class:`UnwarmedKeyError` names a differing field: ``"<field>: warmed <a>, requested <b>"``
    (dtypes without the ``torch.`` prefix)."""
    a, b = (str(v).removeprefix("torch.") for v in (warmed, requested))
    return f"{field}: warmed {a}, requested {b}"


def by_kernel(misses: Iterable[UnwarmedKeyError]) -> dict[str, set[Any]]:
    """Kernel name -> the keys missed on it."""
    out: dict[str, set[Any]] = {}
    for e in misses:
        out.setdefault(e.kernel, set()).add(e.key)
    return out


def without(registry: WarmupRegistry, drop: Callable[[str, Any], bool]) -> WarmupRegistry:
    """A copy of ``registry`` without the (kernel name, key) pairs ``drop`` selects."""
    out = WarmupRegistry()
    for name, reg in registry.registrations.items():
        keys = [k for k in reg.keys if not drop(name, k)]
        if keys:
            out.register(reg.kernel, keys)
    return out
