"""Checkers shared by the tests, the notebooks and the GPU scripts.

:mod:`dsv4kit.testing.compressor_rule`: the compressor rule of spec §2.12 (revised 2026-12-01),
with its term magnitudes, grid steps and boundary blocks.
"""

from dsv4kit.testing import compressor_rule
from dsv4kit.testing.compressor_rule import *  # noqa: F403 - the module's public names, listed once there

__all__ = list(compressor_rule.__all__)
