"""CompileKey and class-creation checks of JitKernel."""

from dataclasses import dataclass

import pytest
import torch

from dsv4kit.errors import ContractError, KernelInputError
from dsv4kit.jit import JitKernel, fixed, kernel_launcher


def test_supported_field_types_are_accepted():
    class Ok(JitKernel["Ok.CompileKey"]):
        @dataclass(frozen=True)
        class CompileKey:
            a: int
            b: bool
            c: str
            d: float
            e: torch.dtype
            f: tuple[int, ...]
            g: tuple[int, str]

        def dispatch(self, x):
            return self.CompileKey(a=1, b=True, c="s", d=1.0, e=x.dtype, f=(1, 2), g=(1, "a"))

    assert Ok._dispatch_program is not None
    assert Ok._dispatch_program.reads == frozenset({"x"})


@pytest.mark.parametrize(
    "annotation", ["list[int]", "dict[str, int]", "object", "torch.Tensor", "tuple[list, ...]"]
)
def test_unsupported_field_type_is_rejected_naming_the_field(annotation):
    ns = {"dataclass": dataclass, "torch": torch, "JitKernel": JitKernel}
    src = f"""
class Bad(JitKernel):
    @dataclass(frozen=True)
    class CompileKey:
        good: int
        bad: {annotation}

    def dispatch(self, x):
        return self.CompileKey(good=1, bad=x)
"""
    with pytest.raises(ContractError, match=r"Bad.CompileKey: field 'bad': expected type int, bool, str"):
        exec(compile(src, "<test>", "exec"), ns)


def test_mutable_key_is_rejected():
    with pytest.raises(ContractError, match="expected a frozen dataclass"):
        class Mutable(JitKernel):
            @dataclass
            class CompileKey:
                a: int

            def dispatch(self, x):
                return self.CompileKey(a=x)


def test_non_dataclass_key_is_rejected():
    with pytest.raises(ContractError, match=r"expected a @dataclass\(frozen=True\) class"):
        class NotDc(JitKernel):
            class CompileKey:
                a: int

            def dispatch(self, x):
                return self.CompileKey(a=x)


def test_kernel_with_key_but_no_dispatch_is_rejected():
    with pytest.raises(ContractError, match="must define dispatch"):
        class NoDispatch(JitKernel):
            @dataclass(frozen=True)
            class CompileKey:
                a: int


class Fixed(JitKernel["Fixed.CompileKey"]):
    @dataclass(frozen=True)
    class CompileKey:
        head: int = fixed(512)
        dtype: str = "float32"

    def dispatch(self, x):
        return self.CompileKey(head=x.shape[-1], dtype=str(x.dtype).removeprefix("torch."))

    def compile(self, key):
        self._cache_executor(key, lambda x: x + 1)

    @kernel_launcher
    def __call__(self, x):
        return self.dispatch(x), (x,)


def test_fixed_field_accepts_its_value_and_rejects_others():
    Fixed.clear_cache()
    assert torch.equal(Fixed()(torch.zeros(2, 512)), torch.ones(2, 512))
    with pytest.raises(KernelInputError, match=r"Fixed: head: expected 512 \(fixed\), got 256"):
        Fixed()(torch.zeros(2, 256))
    assert Fixed().compiled_keys() == [Fixed.CompileKey(512, "float32")]
    # A key that passed is remembered; one that failed never is: it fails on every call.
    assert Fixed._checked_keys == {Fixed.CompileKey(512, "float32")}
    for _ in range(2):
        with pytest.raises(KernelInputError, match=r"Fixed: head: expected 512 \(fixed\), got 256"):
            Fixed()(torch.zeros(2, 256))
    assert torch.equal(Fixed()(torch.zeros(1, 512)), torch.ones(1, 512))
