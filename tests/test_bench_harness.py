"""The timing harness is ordered after the caller's stream (the K3 full-sweep fault, NOTES.md).

Runs on CPU: ``torch.cuda``'s streams, events and graphs are replaced by fakes that record the
order of calls. A call of the timed function counts as *ordered* when it runs on the caller's
stream, on a stream that waited for the caller's stream, or after a device-wide synchronize.
``triton.testing.do_bench_cudagraph``, which ``bench_median_ms`` called before the fix, makes its
first calls on a fresh stream that waited for nothing: these tests fail with it.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from dsv4kit import bench


class _Stream:
    count = 0

    def __init__(self, name: str | None = None, device=None, **_):
        _Stream.count += 1
        self.name = name or f"side{_Stream.count}"
        self.waited: set[str] = set()
        self.device = device or "cuda:0"
        self.cuda_stream = _Stream.count

    def wait_stream(self, other: _Stream) -> None:
        self.waited.add(other.name)
        self.waited |= other.waited

    def wait_event(self, event) -> None:
        self.waited.add(event.stream.name)

    def synchronize(self) -> None:
        pass


class _Fake:
    """The parts of torch.cuda the harnesses use, with an ordering ledger."""

    def __init__(self):
        self.caller = _Stream("caller")
        self.current = self.caller
        self.synced = False          # a device-wide synchronize since the caller queued its writes
        self.capturing = False
        self.calls: list[dict] = []  # one entry per call of the timed function
        fake = self

        class Event:
            def __init__(self, enable_timing=False, **_):
                self.stream = fake.current

            def record(self, stream=None):
                self.stream = stream or fake.current

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return 2.0

        class CUDAGraph:
            def replay(self):
                pass

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None, **_):
            fake.synchronize()       # torch.cuda.graph synchronizes the device on entry
            prev, fake.current = fake.current, stream or _Stream("capture")
            fake.capturing = True
            try:
                yield
            finally:
                fake.capturing = False
                fake.current = prev

        @contextlib.contextmanager
        def stream_ctx(s):
            prev, fake.current = fake.current, s
            try:
                yield
            finally:
                fake.current = prev

        self.Event, self.CUDAGraph, self.graph, self.stream = Event, CUDAGraph, graph, stream_ctx

    def synchronize(self, *_):
        self.synced = True

    def current_stream(self, *_):
        return self.current

    def fn(self):
        s = self.current
        by_wait = s is not self.caller and self.caller.name in s.waited
        ordered = s is self.caller or by_wait or self.synced
        self.calls.append({"stream": s.name, "ordered": ordered, "by_wait": by_wait,
                           "captured": self.capturing})


@pytest.fixture
def fake(monkeypatch):
    f = _Fake()
    for name in ("Event", "CUDAGraph", "graph", "stream", "synchronize", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(f, name))
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    return f


def test_graph_timing_waits_for_the_callers_stream(fake):
    ms = bench.bench_median_ms(fake.fn, graph=True, rep_ms=10)
    eager = [c for c in fake.calls if not c["captured"]]
    assert eager, "the harness makes eager calls before capturing"
    bad = [c for c in fake.calls if not c["ordered"]]
    assert not bad, (f"{len(bad)} of {len(fake.calls)} calls of fn ran on a stream that had not waited for "
                     f"the caller's stream (first on {bad[0]['stream']}): fn's inputs may not be written yet")
    # The first call runs off the caller's stream, ordered by a wait (not by luck or a device sync).
    assert eager[0]["stream"] != "caller" and eager[0]["by_wait"]
    assert ms == pytest.approx(2.0 / 25)  # 10 ms / (2 ms / 5 calls) = 25 calls in a replay of 2 ms


def test_graph_timing_leaves_the_caller_ordered_after_it(fake):
    bench.bench_median_ms(fake.fn, graph=True, rep_ms=10)
    sides = {c["stream"] for c in fake.calls if not c["captured"]}
    assert sides <= fake.caller.waited, "the caller's stream must wait for the harness's stream"


def test_graph_timing_is_not_tritons_unordered_harness(fake):
    """Triton's do_bench_cudagraph (the harness before the fix) fails the ordering check."""
    triton_testing = pytest.importorskip("triton.testing")
    fake.calls.clear()
    triton_testing.do_bench_cudagraph(fake.fn, rep=10, return_mode="median")
    assert not fake.calls[0]["ordered"]      # documents the race the fix removes


def test_no_cuda_for_names_the_script_and_the_smoke_mode(monkeypatch, capsys):
    import torch

    from dsv4kit.bench import no_cuda_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert no_cuda_for("x_gpu_check") is True
    err = capsys.readouterr().err
    assert err.startswith("x_gpu_check: needs a CUDA device") and "--cpu-smoke" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert no_cuda_for("x_gpu_check") is False and capsys.readouterr().err == ""
