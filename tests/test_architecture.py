"""docs/architecture.md says that each package's ``__init__`` lists its modules in its docstring: every
module and subpackage of every package of the library is named there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.parent for p in (ROOT / "inspector").rglob("__init__.py"))


def test_the_rule_is_still_the_one_the_docs_state():
    text = " ".join((ROOT / "docs/architecture.md").read_text().split())
    assert "Each package's `__init__` lists its modules in its docstring" in text
    assert len(PACKAGES) >= 19


@pytest.mark.parametrize("package", PACKAGES, ids=[str(p.relative_to(ROOT)) for p in PACKAGES])
def test_each_package_docstring_names_each_of_its_modules(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    modules += [d.name for d in package.iterdir() if (d / "__init__.py").is_file()]
    unnamed = sorted(m for m in modules if f"``{m}``" not in doc and f":mod:`.{m}`" not in doc
                     and f"{m}.py" not in doc and f"{m}/" not in doc)
    assert not unnamed, f"{package.relative_to(ROOT)}/__init__.py's docstring does not name {unnamed}"


def test_one_place_groups_tensors_for_a_fused_norm():
    """``torch._foreach_norm`` is called in inspector/utils/norms.py alone (``grouped_norms``): the watch,
    the gradient pass and check_step's local numbers and digest all go through it."""
    calls = []
    for path in (ROOT / "inspector").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_foreach_norm":
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls and all(c.startswith("inspector/utils/norms.py:") for c in calls), calls
    users = [p.relative_to(ROOT).as_posix() for p in (ROOT / "inspector").rglob("*.py")
             if "grouped_norms(" in p.read_text() and p.name != "norms.py"]
    assert sorted(users) == ["inspector/distributed/digest.py", "inspector/distributed/local.py",
                             "inspector/offsets/gradient_pass.py", "inspector/watching/layout.py"]
