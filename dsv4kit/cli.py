"""The ``dsv4kit`` command: warm a model's kernels, then replay a workload and report coverage.

Until the DSv4 attention stack lands (issue 7) the model is the toy stack of
:mod:`dsv4kit.kernels.toy`; the commands and their output format stay the same.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence

import torch

from dsv4kit.jit import JitMonitor, KeyLedger, WarmupRegistry
from dsv4kit.kernels.toy import ToyConfig, ToyModel

ARCHES = ("sm_90a", "sm_100a")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsv4kit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    commands = {
        "warmup": "compile every registered key and print a per-kernel table",
        "coverage": "warm up, replay a workload under the monitor, report missed and dead keys",
    }
    for name, help_ in commands.items():
        s = sub.add_parser(name, help=help_)
        s.add_argument("--arch", choices=ARCHES, default="sm_90a", help="compile target (default sm_90a)")
        s.add_argument("--layers", type=int, default=43, help="layers in the model (default 43)")
        s.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        if name == "coverage":
            s.add_argument("--steps", type=int, default=200, help="workload steps to replay (default 200)")
            s.add_argument("--seed", type=int, default=0)
    return p


def _warm(args: argparse.Namespace) -> tuple[ToyModel, KeyLedger]:
    registry = WarmupRegistry()
    ledger = KeyLedger()
    with registry.activate():
        model = ToyModel(args.layers, ToyConfig())
    with ledger:
        report = registry.warmup(progress=not args.no_progress, raise_on_failure=False)
    print(f"warmup for {args.arch}:")
    print(report.table())
    if not report.ok:
        for f in report.failures:
            print(f"FAILED {f.kernel} {f.key}: {f.error}", file=sys.stderr)
        raise SystemExit(1)
    return model, ledger


def _replay(model: ToyModel, ledger: KeyLedger, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    with ledger, JitMonitor("error"):
        for _ in range(steps):
            tokens = rng.choice([1, rng.randint(1, 64), rng.randint(64, model.config.max_tokens)])
            dtype = rng.choice(model.config.dtypes)
            model.layers[0](torch.randn(tokens, model.config.width).to(dtype))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.layers < 1:
        _parser().error(f"--layers: expected a positive int, got {args.layers}")
    model, ledger = _warm(args)
    if args.command == "coverage":
        _replay(model, ledger, args.steps, args.seed)
        print(f"\ncoverage over {args.steps} replayed steps:")
        print(ledger.summary())
        if ledger.missed():
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
