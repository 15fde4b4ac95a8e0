"""Packaging hook: ship the recorded GPU results inside the package (everything else is in pyproject.toml).

``benchmarks/results/`` holds the recorded GPU runs (see ``dsv4kit/results.py``). Git keeps them
there only; at build time this hook copies them into the wheel as ``dsv4kit/_recorded/``, so a
plain ``pip install .`` keeps them. ``MANIFEST.in`` puts them into the sdist, so a wheel built from
the sdist has them too. Editable installs copy nothing: they read the checkout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RESULTS = Path("benchmarks") / "results"   # relative to the source tree, where setuptools runs
SHIPPED = Path("dsv4kit") / "_recorded"    # dsv4kit.results.SHIPPED_DIR, inside the package


class BuildPyWithResults(build_py):
    """build_py, then a copy of ``benchmarks/results/`` into ``<build_lib>/dsv4kit/_recorded/``."""

    def _ships(self) -> bool:
        return not getattr(self, "editable_mode", False) and RESULTS.is_dir()

    def run(self) -> None:
        super().run()
        if not self._ships():
            if not RESULTS.is_dir():
                self.warn(f"{RESULTS} not found: the package ships no recorded results")
            return
        target = Path(self.build_lib) / SHIPPED
        shutil.rmtree(target, ignore_errors=True)       # no stale files from an earlier build
        shutil.copytree(RESULTS, target, ignore=shutil.ignore_patterns(".*", "__pycache__"))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self._ships():
            target = Path(self.build_lib) / SHIPPED
            outputs += [str(target / p.relative_to(RESULTS)) for p in sorted(RESULTS.rglob("*"))
                        if p.is_file() and not any(part.startswith(".") for part in p.parts)]
        return outputs


setup(cmdclass={"build_py": BuildPyWithResults})
