"""What the viz tests of the compressor families share: a figure's texts, and a case's reference run.

``tests/conftest.py`` closes every figure after each test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def figure_texts(fig: Any) -> list[str]:
    """Every text drawn on the axes of ``fig``, axes in order."""
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def reference_run(specs: Mapping[str, Any], case: Any) -> Any:
    """A fresh copy of ``case`` after its op's reference (``specs[case.op]``) ran on it."""
    out = case.fresh()
    specs[case.op].variants["default"].reference(**out.args)
    return out
