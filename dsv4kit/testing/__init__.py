"""Checkers shared by the tests, the notebooks and the GPU scripts.

:mod:`dsv4kit.testing.compressor_rule`: the compressor rule of spec §2.12 (revised 2026-12-01),
with its term magnitudes, grid steps and boundary blocks.
"""

from dsv4kit.testing.compressor_rule import (
    ALLOWANCE,
    RuleReport,
    bf16_ulp,
    boundary_blocks,
    check_compressor_rule,
    e2m1_step,
    e4m3_step,
    rope_magnitudes,
    step_budget,
    term_magnitudes,
)

__all__ = [
    "ALLOWANCE",
    "RuleReport",
    "bf16_ulp",
    "boundary_blocks",
    "check_compressor_rule",
    "e2m1_step",
    "e4m3_step",
    "rope_magnitudes",
    "step_budget",
    "term_magnitudes",
]
