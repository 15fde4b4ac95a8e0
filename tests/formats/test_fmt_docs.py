"""docs/formats.md must contain the diagrams that the code produces today."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dsv4kit.formats.diagram import ds_mla_page_diagram, mxfp4_packing_diagram

DOC = Path(__file__).resolve().parents[2] / "docs" / "formats.md"


@pytest.mark.parametrize("make", [lambda: ds_mla_page_diagram(2), mxfp4_packing_diagram])
def test_docs_contain_generated_diagram(make: Callable[[], str]) -> None:
    text = make()
    assert f"```text\n{text}\n```" in DOC.read_text(), (
        "regenerate docs/formats.md from dsv4kit/formats/diagram.py"
    )


def test_diagram_reports_spec_offsets() -> None:
    text = ds_mla_page_diagram(2)
    for line in (
        "[    0,   448)   448  token 0: 448 x e4m3 nope",
        "[  576,  1024)   448  token 1: 448 x e4m3 nope",
        "[ 1152,  1159)     7  token 0: 7 x ue8m0 scale",
        "[ 1159,  1160)     1  token 0: pad byte (= 0)",
        "[ 1168,  1728)   560  unused (untouched)",
    ):
        assert line in text
    assert "bytes 125 128 123 131" in mxfp4_packing_diagram()
