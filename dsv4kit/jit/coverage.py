"""KeyLedger: which keys were warmed, which were requested at runtime, and the gaps.

*Missed* keys were requested but never warmed (each one is a runtime compile);
*dead* keys were warmed but never requested (compile time spent for nothing, or a
trace that does not exercise the model fully).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dsv4kit.jit.report import format_key

__all__ = ["KeyLedger", "active_ledgers", "record_request", "record_warmed"]

_ACTIVE: list[KeyLedger] = []


def active_ledgers() -> tuple[KeyLedger, ...]:
    return tuple(_ACTIVE)


def record_warmed(kernel: str, keys: Iterable[Any]) -> None:
    """Tell every active ledger that ``keys`` of ``kernel`` were warmed."""
    keys = list(keys)
    for ledger in _ACTIVE:
        ledger.add_warmed(kernel, keys)


def record_request(kernel: str, key: Any) -> None:
    """Tell every active ledger that the runtime asked ``kernel`` for ``key``."""
    for ledger in _ACTIVE:
        ledger.add_request(kernel, key)


@dataclass
class KeyLedger:
    """Per kernel: keys warmed, keys requested (with counts).

    Active inside ``with ledger:``; kernels then report warmups and requests to it.
    """

    warmed: dict[str, dict[Any, None]] = field(default_factory=dict)
    requested: dict[str, Counter] = field(default_factory=dict)

    def __enter__(self) -> KeyLedger:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)

    def add_warmed(self, kernel: str, keys: Iterable[Any]) -> None:
        d = self.warmed.setdefault(kernel, {})
        for k in keys:
            d.setdefault(k, None)

    def add_request(self, kernel: str, key: Any) -> None:
        self.requested.setdefault(kernel, Counter())[key] += 1

    @property
    def kernels(self) -> list[str]:
        return list(dict.fromkeys([*self.warmed, *self.requested]))

    def missed(self) -> dict[str, list[Any]]:
        """Requested but never warmed, per kernel (kernels with none are left out)."""
        out = {}
        for k in self.kernels:
            miss = [key for key in self.requested.get(k, {}) if key not in self.warmed.get(k, {})]
            if miss:
                out[k] = miss
        return out

    def dead(self) -> dict[str, list[Any]]:
        """Warmed but never requested, per kernel (kernels with none are left out)."""
        out = {}
        for k in self.kernels:
            dead = [key for key in self.warmed.get(k, {}) if key not in self.requested.get(k, {})]
            if dead:
                out[k] = dead
        return out

    def status(self, kernel: str) -> dict[Any, str]:
        """Every key of ``kernel`` → ``"used"`` (warmed, requested), ``"dead"`` or ``"missed"``."""
        warmed = self.warmed.get(kernel, {})
        req = self.requested.get(kernel, Counter())
        out = {key: ("used" if key in req else "dead") for key in warmed}
        out.update({key: "missed" for key in req if key not in warmed})
        return out

    def summary(self) -> str:
        """Plain-text table: per kernel, keys warmed / requested / missed / dead, then each miss."""
        head = f"{'kernel':<34} {'warmed':>6} {'requested':>9} {'missed':>6} {'dead':>5} {'calls':>7}"
        lines = [head, "-" * len(head)]
        missed, dead = self.missed(), self.dead()
        for k in self.kernels:
            req = self.requested.get(k, Counter())
            lines.append(
                f"{k:<34} {len(self.warmed.get(k, {})):>6} {len(req):>9} {len(missed.get(k, [])):>6} "
                f"{len(dead.get(k, [])):>5} {sum(req.values()):>7}"
            )
        for k, keys in missed.items():
            for key in keys:
                lines.append(f"MISSED {k} {format_key(key)}")
        return "\n".join(lines)
