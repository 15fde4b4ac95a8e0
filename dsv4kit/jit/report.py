"""Compile artifacts and warmup reports: what warmup did, key by key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsv4kit.errors import format_key

__all__ = ["CompileArtifact", "KernelReport", "KeyReport", "WarmupReport", "format_key"]


@dataclass
class CompileArtifact:
    """Everything one compiled key leaves behind (one object per key).

    ``info``: small facts for tables (registers, spills, shared memory bytes, ...).
    ``text``: inspectable text (``"ptx"``, ``"sass"``, ...); ``binary``: e.g. ``"cubin"`` bytes.
    ``executable``: what the backend's compiler returned (Triton's CompiledKernel, CuTeDSL's
    compiled function), in this process only: the same artifact type from both backends.
    """

    backend: str
    target: str
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    binary: dict[str, bytes] = field(default_factory=dict)
    executable: Any = field(default=None, compare=False, repr=False)


@dataclass
class KeyReport:
    """One key's warmup: seconds spent, what the artifact says, or why it failed."""

    kernel: str
    key: Any
    seconds: float
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class KernelReport:
    """All keys of one kernel."""

    kernel: str
    backend: str
    registrations: int
    keys: list[KeyReport] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(k.seconds for k in self.keys)

    @property
    def failures(self) -> list[KeyReport]:
        return [k for k in self.keys if not k.ok]


@dataclass
class WarmupReport:
    """What :meth:`WarmupRegistry.warmup` did, per kernel and per key."""

    kernels: list[KernelReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[KeyReport]:
        return [f for k in self.kernels for f in k.failures]

    @property
    def num_keys(self) -> int:
        return sum(len(k.keys) for k in self.kernels)

    @property
    def seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per key: kernel, backend, key, seconds, info fields, error."""
        return [
            {"kernel": k.kernel, "backend": k.backend, "key": format_key(r.key), "seconds": r.seconds,
             **r.info, "error": r.error}
            for k in self.kernels for r in k.keys
        ]

    def table(self) -> str:
        """A per-kernel summary table as plain text."""
        head = (f"{'kernel':<34} {'backend':<8} {'registered':>10} {'keys':>5} {'seconds':>8} "
                f"{'registers':>10} {'spills':>6} {'store hits':>10}")
        lines = [head, "-" * len(head)]
        for k in self.kernels:
            regs = sorted({r.info["registers"] for r in k.keys if "registers" in r.info})
            spills = max((r.info.get("spills", 0) for r in k.keys), default=0)
            reg_text = "-" if not regs else (f"{regs[0]}" if len(regs) == 1 else f"{regs[0]}-{regs[-1]}")
            # "origin" is set per key when warmup used an artifact store: "hit" or "compiled".
            origins = [r.info.get("origin") for r in k.keys]
            hits = "-" if not any(origins) else f"{origins.count('hit')}/{len(origins)}"
            lines.append(
                f"{k.kernel:<34} {k.backend:<8} {k.registrations:>10} {len(k.keys):>5} {k.seconds:>8.2f} "
                f"{reg_text:>10} {spills:>6} {hits:>10}"
            )
        lines.append(f"{len(self.kernels)} kernel(s), {self.num_keys} key(s), {self.seconds:.2f} s, "
                     f"{len(self.failures)} failure(s)")
        return "\n".join(lines)
