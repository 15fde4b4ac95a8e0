"""Module-scoped warmups shared by the model-level tests (compiling is the slow part)."""

from __future__ import annotations

import pytest
from model_helpers import build, warm


@pytest.fixture(scope="module")
def flash_sm90():
    """DSv4-Flash on a CPU platform compiling for sm_90a, warmed once for the module."""
    stack, registry = build()
    ledger = warm(stack, registry)
    return stack, registry, ledger
