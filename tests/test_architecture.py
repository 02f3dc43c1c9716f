"""docs/architecture.md says that each package's ``__init__`` lists its modules in its docstring: every
module and subpackage of every package of the library is named there; and what each floor may import:
its table is the order ``tests/test_layers.py`` checks every import against, and no import breaks it."""

from __future__ import annotations

import ast
import importlib.util
import re
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


def _layers_test():
    spec = importlib.util.spec_from_file_location("_layers_rules", ROOT / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _floor_table() -> list[tuple[int, tuple[str, ...], str]]:
    """``(floor, packages, may import)`` for each row of the table under "What each floor may import"."""
    text = (ROOT / "docs/architecture.md").read_text()
    section = text.split("## What each floor may import", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.match(r"\d+ ", cells[0]):
            rows.append((int(cells[0].split()[0]), tuple(re.findall(r"`([\w_]+)`", cells[1])), cells[2]))
    return rows


def test_the_floor_table_of_the_docs_is_the_order_the_imports_are_checked_against():
    layers = _layers_test()
    table = _floor_table()
    assert [packages for _, packages, _ in table] == [tuple(f) for f in layers.LAYERS]
    assert [floor for floor, _, _ in table] == list(range(len(layers.LAYERS)))
    for floor, _, may in table:  # each floor may import the floors below it, and no other
        assert may == ("nothing of the library" if floor == 0 else "floor 0" if floor == 1
                       else f"floors 0–{floor - 1}"), (floor, may)


def test_every_import_keeps_the_floor_table_and_no_two_modules_import_each_other():
    layers = _layers_test()
    assert layers._offenders() == []
    graph = layers._import_graph()
    assert [layers._circle(graph, g) for g in layers._cycles(graph)] == []
