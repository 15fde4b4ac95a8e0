"""Figures and tables for the notebooks (matplotlib only): :mod:`~dsv4kit.viz.coverage` (key spaces,
coverage), :mod:`~dsv4kit.viz.recorded` (recorded GPU results), :mod:`~dsv4kit.viz.compressor` (the
C4 compressors K5, K6, K9, and the pieces every compressor figure uses), :mod:`~dsv4kit.viz.c128`
(the C128 compressor K7, K8a, K8b), :mod:`~dsv4kit.viz.pipeline` (the pipeline replay on real
tensors, coverage over every family, the §2.11 drills, the recorded GPU pipeline run),
:mod:`~dsv4kit.viz.source` (the kit's own source, whole or cut between marker lines),
:mod:`~dsv4kit.viz.verify` (the ``dsv4kit verify`` verdict as a table) and
:mod:`~dsv4kit.viz.torch_ops` (an attention step as torch ops, the recorded torch.compile run).

The public names of the compressor and pipeline modules are also importable from here (``from
dsv4kit.viz import plot_window, plot_c128_window, plot_pipeline``); they load on first use, so
importing another viz module does not import the compressor kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY_MODULES = ("compressor", "c128", "pipeline", "bench")


def __getattr__(name: str) -> Any:
    for mod_name in _LAZY_MODULES:
        mod = importlib.import_module(f"dsv4kit.viz.{mod_name}")
        if name == mod_name:
            return mod
        if name in mod.__all__:
            return getattr(mod, name)
    raise AttributeError(f"module 'dsv4kit.viz' has no attribute {name!r}")


def __dir__() -> list[str]:
    names = set(globals())
    for mod_name in _LAZY_MODULES:
        names |= {mod_name, *importlib.import_module(f"dsv4kit.viz.{mod_name}").__all__}
    return sorted(names)
