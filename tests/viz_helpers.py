"""What the viz tests of the compressor families share: a figure's texts, and a case's reference run.

``tests/conftest.py`` closes every figure after each test.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.colors


def figure_texts(fig: Any) -> list[str]:
    """Every text drawn on the axes of ``fig``, axes in order."""
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def figure_text(fig: Any, *names: str) -> str:
    """The texts of ``fig`` as one string, after checking that each of ``names`` stands in it."""
    text = "\n".join(figure_texts(fig))
    missing = [n for n in names if n not in text]
    assert not missing, f"the figure does not name {missing}"
    return text


def patch_xs(ax: Any, color: str, offset: float = 0.0) -> list[int]:
    """The x of each patch of ``ax`` filled with ``color``, plus ``offset``, rounded."""
    rgb = matplotlib.colors.to_rgb(color)
    return [round(p.get_x() + offset) for p in ax.patches if p.get_facecolor()[:3] == rgb]


def reference_run(specs: Mapping[str, Any], case: Any) -> Any:
    """A fresh copy of ``case`` after its op's reference (``specs[case.op]``) ran on it."""
    out = case.fresh()
    specs[case.op].variants["default"].reference(**out.args)
    return out
