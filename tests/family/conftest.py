"""Fixtures of the family tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dsv4kit.jit.launch_plans import set_plan_after


@pytest.fixture(scope="module")
def plan_on_sight() -> Iterator[None]:
    """Every signature planned on its first call, for tests of the plans themselves (the default,
    a plan on the second call, is tested in test_serving_path.py)."""
    before = set_plan_after(1)
    yield
    set_plan_after(before)
