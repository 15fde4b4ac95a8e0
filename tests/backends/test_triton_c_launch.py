"""The Triton direct launcher's shortcut to the C ``launch`` (GPU launch plans): when it applies,
and the argument layout of the installed triton it was written against."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from triton import knobs

from dsv4kit.backends.triton import _c_launch, _no_hook


def _launcher(**over):
    attrs = dict(launch=print, global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                 launch_pdl=True)
    attrs.update(over)
    return SimpleNamespace(**attrs)


def test_c_launch_taken_without_scratch():
    assert _c_launch(_launcher()) == (print, False, True)


@pytest.mark.parametrize("scratch", ["global_scratch_size", "profile_scratch_size"])
def test_c_launch_refused_when_a_scratch_buffer_is_allocated(scratch):
    assert _c_launch(_launcher(**{scratch: 64})) is None


def test_c_launch_refused_for_another_launcher_class():
    assert _c_launch(SimpleNamespace(launch=print)) is None
    assert _c_launch(lambda *a: None) is None


def test_no_hook():
    chain = knobs.HookChain()
    assert _no_hook(None) and _no_hook(chain)
    chain.add(print)
    assert not _no_hook(chain)
    assert not _no_hook(print)                      # a hook set as a plain function


def test_installed_triton_launch_layout():
    """The shortcut passes grid (3 ints), stream, function, cooperative, pdl, 2 scratch objects,
    then packed metadata, launch metadata and the two hooks: a triton that changes this layout
    must fail here, not launch with shifted arguments."""
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    assert driver._BASE_ARGS_FORMAT == "iiiKKppOOOOOO"
    assert isinstance(knobs.runtime.launch_enter_hook, knobs.HookChain)
