"""One home per concern (issue 39): the kernels do not know the model, and a family's spec refers to
its kernel classes, never to their names in strings."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import dsv4kit
from dsv4kit.family import Variant
from dsv4kit.kernels import families

ROOT = Path(dsv4kit.__file__).parent
#: Packages that must not import the model, not even for types.
MODEL_FREE = ("kernels", "family")


def _imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` (under the package ``root``) imports anywhere: module level, functions,
    ``TYPE_CHECKING`` blocks; relative imports resolved against its package."""
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from dsv4kit import model`
    return out


def _model_imports(path: Path, root: Path = ROOT) -> list[str]:
    mods = _imported_modules(path, root)
    return sorted(m for m in mods if m == "dsv4kit.model" or m.startswith("dsv4kit.model."))


@pytest.mark.parametrize("package", MODEL_FREE)
def test_kernels_and_family_do_not_import_the_model(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    offenders = {str(p.relative_to(ROOT)): _model_imports(p) for p in files if _model_imports(p)}
    assert offenders == {}


def test_the_import_check_sees_every_form(tmp_path: Path) -> None:
    """The check above can fail: each way of importing the model is caught."""
    pkg = tmp_path / "dsv4kit" / "kernels"
    pkg.mkdir(parents=True)
    root = tmp_path / "dsv4kit"
    forms = ["import dsv4kit.model.stack", "from dsv4kit.model.trace import Step",
             "from dsv4kit import model", "if TYPE_CHECKING:\n    from dsv4kit.model.stack import X",
             "def f():\n    from ..model import hooks", "from ..model.hooks import HOOKS"]
    for i, src in enumerate(forms):
        f = pkg / f"m{i}.py"
        f.write_text(src + "\n")
        assert _model_imports(f, root), src
    clean = pkg / "clean.py"
    clean.write_text("from dsv4kit.family import Variant\nfrom ..jit import Like\nimport dsv4kit.models\n")
    assert _model_imports(clean, root) == []


@pytest.mark.parametrize("spec", families(), ids=lambda s: s.name)
def test_variants_refer_to_classes_not_names(spec) -> None:
    for name, var in spec.variants.items():
        for backend in ("triton", "cutedsl"):
            ref = getattr(var, backend)
            assert not isinstance(ref, str), f"{spec.name}/{name}/{backend}: a class name in a string"
            cls = var.kernel_class(backend)
            assert issubclass(cls, spec.contract) and cls.backend == backend
            assert cls.__module__ == f"{spec.package}.{backend}"


def test_a_class_or_a_loader_is_a_kernel_ref() -> None:
    from dsv4kit.kernels.rowquant.triton import RowQuantTriton

    assert Variant(print, RowQuantTriton, lambda: RowQuantTriton).kernel_class("cutedsl") is RowQuantTriton
    assert Variant(print, RowQuantTriton, RowQuantTriton).class_name("triton") == "RowQuantTriton"


def test_import_ops_imports_no_backend_module_and_no_cutlass() -> None:
    """The specs name their classes lazily: ``import dsv4kit.ops`` pays for no kernel module."""
    code = ("import sys, dsv4kit.ops\n"
            "bad = [m for m in sys.modules if m.split('.')[0] == 'cutlass' or m.startswith('dsv4kit.model')"
            " or (m.startswith('dsv4kit.kernels.') and m.rsplit('.', 1)[1] in ('triton', 'cutedsl'))]\n"
            "print(bad); assert not bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert out.returncode == 0, out.stdout + out.stderr
