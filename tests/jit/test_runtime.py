"""Launcher, executors, registry, monitor and ledger working together."""

import logging
from dataclasses import dataclass

import pytest
import torch

from dsv4kit.errors import MissingExecutorError, UnwarmedKeyError, WarmupError
from dsv4kit.jit import (
    Immediate,
    JitKernel,
    JitMonitor,
    KeyLedger,
    LaunchSpec,
    WarmupChoices,
    WarmupRegistry,
    active_registry,
    kernel_launcher,
)
from dsv4kit.jit.monitor import register_monitor_hook


class Scale(JitKernel["Scale.CompileKey"]):
    """Multiplies by a per-key factor; compile counts are observable."""

    compiles = 0

    @dataclass(frozen=True)
    class CompileKey:
        width: int
        dtype: str
        coarsen: int

    def dispatch(self, x, num_tokens):
        return self.CompileKey(width=x.shape[-1], dtype=str(x.dtype).removeprefix("torch."),
                               coarsen=1 if num_tokens < 512 else 4)

    def get_warmup_keys(self, config=None):
        from dsv4kit.jit import Like
        widths = (config or {}).get("widths", [64])
        return self.trace(x=Like(shape=(1, WarmupChoices(*widths)), dtype=torch.float32),
                          num_tokens=WarmupChoices(1, 512))

    def compile(self, key):
        if key.width == 13:
            raise RuntimeError("width 13 is unsupported")
        type(self).compiles += 1
        self._cache_executor(key, lambda x: x * key.coarsen)

    @kernel_launcher
    def __call__(self, x):
        if x.shape[0] == 0:
            return Immediate("empty")
        return self.dispatch(x, x.shape[0]), (x,)


@pytest.fixture(autouse=True)
def fresh():
    Scale.clear_cache()
    Scale.compiles = 0
    yield
    Scale.clear_cache()


def test_register_outside_a_registry_does_nothing():
    assert active_registry() is None
    Scale().register_warmup()
    assert Scale.compiles == 0


def test_registry_deduplicates_43_layers_and_warms_the_union():
    reg = WarmupRegistry()
    with reg.activate():
        for layer in range(43):
            Scale().register_warmup({"widths": [64, 128] if layer % 2 else [64]})
    assert reg.registrations["Scale"].count == 43
    assert len(reg) == 4
    report = reg.warmup(progress=False)
    assert report.ok and report.num_keys == 4 and Scale.compiles == 4
    assert report.kernels[0].registrations == 43
    assert "Scale" in report.table() and "4 key(s)" in report.table()


def test_one_class_registered_for_two_targets_keeps_both():
    reg = WarmupRegistry()
    a, b = Scale(), Scale()
    a.target, b.target = "sm_90a", "sm_100a"
    with reg.activate():
        a.register_warmup()
        b.register_warmup()
    assert set(reg.registrations) == {"Scale@sm_90a", "Scale@sm_100a"}
    reg.warmup(progress=False)
    assert len(a.compiled_keys()) == len(b.compiled_keys()) == 2


def test_capture_decorates_functions_and_classes():
    reg = WarmupRegistry()

    @reg.capture
    def build():
        Scale().register_warmup()

    @reg.capture
    class Model:
        def __init__(self):
            Scale().register_warmup({"widths": [32]})

    build()
    Model()
    assert reg.registrations["Scale"].count == 2
    assert {k.width for k in reg.keys()["Scale"]} == {64, 32}
    assert active_registry() is None


def test_failing_key_does_not_hide_the_others():
    reg = WarmupRegistry()
    with reg.activate():
        Scale().register_warmup({"widths": [13, 64, 13 + 0]})
    with pytest.raises(WarmupError) as exc:
        reg.warmup(progress=False)
    err = exc.value
    assert len(err.failures) == 2  # width 13 x coarsen {1, 4}
    assert "width 13 is unsupported" in str(err) and str(err).count("Scale") == 2
    assert Scale.compiles == 2  # both width-64 keys compiled anyway
    assert len(err.report.failures) == 2


def test_warmup_without_raising_returns_failures():
    reg = WarmupRegistry()
    with reg.activate():
        Scale().register_warmup({"widths": [13]})
    report = reg.warmup(progress=False, raise_on_failure=False)
    assert not report.ok and {r.error for r in report.failures} == {"RuntimeError: width 13 is unsupported"}


def test_first_call_after_warmup_compiles_nothing_under_error_monitor():
    Scale().warmup({"widths": [64]})
    n = Scale.compiles
    with JitMonitor("error") as mon:
        out = Scale()(torch.ones(600, 64))
        assert torch.equal(out, torch.full((600, 64), 4.0))
    assert Scale.compiles == n and mon.events == []


def test_error_monitor_names_kernel_key_and_differing_fields():
    Scale().warmup({"widths": [64]})
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError) as exc:
        Scale()(torch.ones(3, 96))
    err = exc.value
    assert err.kernel == "Scale"
    assert err.key == Scale.CompileKey(96, "float32", 1)
    assert err.nearest == Scale.CompileKey(64, "float32", 1)
    assert err.diff == {"width": (64, 96)}
    assert "nearest warmed key" in str(err) and "width: warmed 64, requested 96" in str(err)
    assert Scale.CompileKey(96, "float32", 1) not in Scale().compiled_keys()  # stopped before compiling


def test_error_monitor_without_any_warmed_key_says_so():
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError, match="no key of this kernel was warmed"):
        Scale()(torch.ones(3, 8))


def test_warn_monitor_logs_once_per_key_and_compiles(caplog):
    Scale().warmup({"widths": [64]})
    with caplog.at_level(logging.WARNING, logger="dsv4kit.jit"), JitMonitor("warn") as mon:
        for _ in range(3):
            Scale()(torch.ones(2, 8))
        Scale()(torch.ones(2, 16))
    assert len(mon.events) == 2  # two compiles; later calls hit the cache
    assert len([r for r in caplog.records if "unwarmed key" in r.message]) == 2


def test_a_key_compiled_at_runtime_is_warmed_again_after_clear_cache():
    """A key compiled under a ``warn`` monitor is never offered as "nearest warmed"; once the class's
    executors are cleared and a warmup compiles it, it is a warmed key again (no leak between runs)."""
    with JitMonitor("warn"):
        Scale()(torch.ones(2, 64))                                    # compiled at runtime
    Scale.clear_cache()
    Scale().warmup({"widths": [64]})
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError) as exc:
        Scale()(torch.ones(2, 96))
    assert exc.value.nearest == Scale.CompileKey(64, "float32", 1)


def test_off_monitor_and_disarm():
    mon = JitMonitor("off").arm()
    Scale()(torch.ones(2, 8))
    mon.disarm()
    assert mon.events == [] and not mon.armed
    err_mon = JitMonitor("error").arm()
    err_mon.disarm()
    Scale()(torch.ones(2, 24))  # disarmed: compiles quietly
    assert Scale.CompileKey(24, "float32", 1) in Scale().compiled_keys()


def test_monitor_rejects_unknown_mode():
    with pytest.raises(ValueError, match=r"mode: expected one of \['off', 'warn', 'error'\], got 'loud'"):
        JitMonitor("loud")


def test_backend_hooks_install_on_arm_and_restore_on_disarm():
    calls = []

    def install(mon):
        calls.append("install")
        return lambda: calls.append("uninstall")

    register_monitor_hook(install)
    try:
        with JitMonitor("warn"):
            assert calls == ["install"]
        assert calls == ["install", "uninstall"]
    finally:
        from dsv4kit.jit import monitor
        monitor._HOOK_INSTALLERS.remove(install)


def test_executors_are_cached_per_target():
    """A key warmed for one target never serves another (a CPU process compiles for several)."""
    a, b = Scale(), Scale()
    a.target, b.target = "sm_90a", "sm_100a"
    a.warmup({"widths": [64]})
    assert len(a.compiled_keys()) == 2 and b.compiled_keys() == []
    with JitMonitor("error"), pytest.raises(UnwarmedKeyError, match="no key of this kernel was warmed"):
        b(torch.ones(3, 64))
    assert Scale().compiled_keys() == []  # the default target ("cpu") has nothing either


def test_compile_that_caches_nothing_raises_clearly():
    class Forgetful(JitKernel["Forgetful.CompileKey"]):
        @dataclass(frozen=True)
        class CompileKey:
            n: int

        def dispatch(self, n):
            return self.CompileKey(n=n)

        def compile(self, key):
            pass

        @kernel_launcher
        def __call__(self, n):
            return self.dispatch(n), ()

    with pytest.raises(MissingExecutorError, match=r"Forgetful: compile\(.*\) returned without caching"):
        Forgetful()(3)
    with pytest.raises(WarmupError, match="did not cache an executor"):
        Forgetful().warmup(keys=[Forgetful.CompileKey(1)])


def test_immediate_skips_dispatch_and_guard():
    with JitMonitor("error"):
        assert Scale()(torch.ones(0, 7)) == "empty"


def test_launch_spec_forms_and_bound_inputs():
    seen = {}

    class Spec(JitKernel["Spec.CompileKey"]):
        @dataclass(frozen=True)
        class CompileKey:
            form: int

        def dispatch(self, form):
            return self.CompileKey(form=form)

        def compile(self, key):
            self._cache_executor(key, lambda buf: buf.append(key.form) or "executor-result")

        def launch(self, spec, inputs):
            seen["inputs"] = inputs
            return super().launch(spec, inputs)

        @kernel_launcher(bind_launch_inputs=True)
        def __call__(self, form, scale=2):
            buf = []
            key = self.dispatch(form)
            if form == 2:
                return key, (buf,)
            if form == 3:
                return key, (buf,), buf
            if form == 4:
                return key, (buf,), buf, lambda out: [v * scale for v in out]
            return LaunchSpec(key, (buf,), output=buf)

    k = Spec()
    assert k(2) == "executor-result"
    assert k(3) == [3]
    assert k(4, scale=10) == [40]
    assert k(5) == [5]
    assert seen["inputs"] == {"form": 5, "scale": 2}


def test_bad_launch_spec_is_rejected():
    class Bad(JitKernel["Bad.CompileKey"]):
        @dataclass(frozen=True)
        class CompileKey:
            n: int

        def dispatch(self, n):
            return self.CompileKey(n=n)

        @kernel_launcher
        def __call__(self, n):
            return self.dispatch(n)

    with pytest.raises(TypeError, match=r"Bad: __call__ must return \(key, args\)"):
        Bad()(1)


def test_ledger_reports_missed_and_dead_keys():
    with KeyLedger() as ledger:
        Scale().warmup({"widths": [64, 128]})
        with JitMonitor("warn"):
            Scale()(torch.ones(3, 64))
            Scale()(torch.ones(3, 64))
            Scale()(torch.ones(3, 32))
    assert ledger.missed() == {"Scale": [Scale.CompileKey(32, "float32", 1)]}
    dead = set(ledger.dead()["Scale"])
    assert dead == {Scale.CompileKey(64, "float32", 4), Scale.CompileKey(128, "float32", 1),
                    Scale.CompileKey(128, "float32", 4)}
    status = ledger.status("Scale")
    assert status[Scale.CompileKey(64, "float32", 1)] == "used"
    assert ledger.requested["Scale"][Scale.CompileKey(64, "float32", 1)] == 2
    assert "MISSED Scale (width=32, dtype=float32, coarsen=1)" in ledger.summary()
