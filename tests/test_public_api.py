"""The public API: every name is imported eagerly from ``inspector``; heavy libraries are not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import inspector

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ["load_model", "available_devices", "move_model", "alias_groups", "snapshot_ties", "compare_ties",
            "retie", "offset_map", "locate", "gradient_norms", "plan_device_map", "audit_device_map",
            "placement_table", "capture_activations", "attribute", "build_report", "Finding"]


def test_the_contract_names_and_every_listed_name_are_attributes_of_the_package():
    assert set(CONTRACT) <= set(inspector.__all__)
    assert len(inspector.__all__) == len(set(inspector.__all__))
    for name in inspector.__all__:
        value = vars(inspector).get(name)  # in the module's namespace: no lazy lookup
        assert value is not None, name
        if callable(value) and not isinstance(value, type):
            assert value.__module__.startswith("inspector."), name
    assert "__getattr__" not in vars(inspector)


def test_import_inspector_leaves_the_heavy_libraries_unimported():
    # as the package docstring says: plotly only with a figure (the report sections import theirs when run)
    heavy = ["transformers", "accelerate", "captum", "plotly", "streamlit", "matplotlib"]
    code = ("import sys, inspector; "
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_attribute_without_captum_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "captum", None)  # as where the attribution extra is not installed
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    loaded = inspector.load_model("sample:cnn-bn")
    with pytest.raises(inspector.InspectorError, match=r"pip install 'captum>=0\.9,<1' \(or, in the "
                       r"model-inspector source folder, pip install '\.\[attribution\]'\)"):
        inspector.attribute(loaded, loaded.example_inputs(1), method="saliency", target=0)


def _inspector_imports(path):
    """``(line, module, names)`` for every import of ``inspector`` in ``path``, relative ones resolved."""
    import ast

    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            yield node.lineno, module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


def test_pages_ui_and_commands_import_only_public_names_of_inspector_and_its_packages():
    files = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py")), *sorted((ROOT / "ui").rglob("*.py")),
             *sorted((ROOT / "inspector" / "commands").rglob("*.py"))]
    commands = ROOT / "inspector" / "commands"
    bad = []
    for path in files:
        for line, module, names in _inspector_imports(path):
            if commands in path.parents and module.startswith("inspector.commands"):
                continue  # a command's own package: its shared argument and output helpers
            if not _public(module, names):
                bad.append(f"{path.relative_to(ROOT)}:{line}: from {module} import {', '.join(names)}")
    assert bad == []


def _public(module: str, names: list[str]) -> bool:
    """Whether ``from module import names`` takes public names only: from ``inspector`` or one of its
    packages (never a module inside one, nor a module at the top of ``inspector``), no ``_name``, no
    module other than a package, and of ``inspector.__main__`` only ``main``."""
    import importlib
    import types

    parts = module.split(".")
    if parts[0] != "inspector":
        return True  # not the library
    if module == "inspector.__main__":
        return set(names) <= {"main"}
    if any(p.startswith("_") for p in parts + names):
        return False
    if len(parts) > 2 or not ROOT.joinpath(*parts, "__init__.py").exists():
        return False
    package = importlib.import_module(module)
    return not any(isinstance(getattr(package, n, None), types.ModuleType)
                   and not hasattr(getattr(package, n), "__path__") for n in names)


@pytest.mark.parametrize(("module", "names", "public"), [
    ("inspector", ["load_model", "watch", "aliases"], True),
    ("inspector.distributed", ["check_step", "read_dcp"], True),
    ("inspector.placement", ["plan_device_map"], True),
    ("inspector.__main__", ["main"], True),
    ("inspector.loading.models", ["load_model"], False),
    ("inspector.loading.dcp", ["read_dcp"], False),
    ("inspector.utils", ["findings"], False),
    ("inspector.capture", ["storage"], False),
    ("inspector.__main__", ["command_names"], False),
    ("inspector.offsets", ["_tables"], False),
])
def test_the_public_rule_tells_internal_modules_apart(module, names, public):
    assert _public(module, names) is public


def test_tests_outside_internals_import_only_public_names_of_inspector():
    # a test that needs an internal module goes to tests/internals/, so moving a module breaks no other test
    internals = ROOT / "tests" / "internals"
    files = [p for p in sorted((ROOT / "tests").rglob("*.py")) if internals not in p.parents]
    bad = [
        f"{path.relative_to(ROOT)}:{line}: from {module} import {', '.join(names)}"
        for path in files
        for line, module, names in _inspector_imports(path)
        if not _public(module, names)
    ]
    assert bad == []


def test_the_internal_tests_are_the_ones_this_list_names():
    # tests/README.md names every file of tests/internals/ and why it reaches past the public API
    import re

    text = (ROOT / "tests" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(test_\w+\.py)` \|", text, flags=re.M))
    internals = ROOT / "tests" / "internals"
    present = {p.name for p in internals.glob("test_*.py")}
    assert listed == present, f"README lists {sorted(listed - present)} but not {sorted(present - listed)}"
    public_only = [name for name in sorted(present)
                   if all(_public(m, n) for _, m, n in _inspector_imports(internals / name))]
    assert public_only == [], f"{public_only} import only public names: move them to tests/"
    assert len(present) <= 11  # the documented list above, each with its reason


def test_no_package_binds_a_name_of_its_own_submodules_to_something_else():
    # `inspector.watch` the function would hide `inspector.watch` the package: `import inspector.x as m`
    # and attribute access then give the function, while `from inspector.x import y` gives the module's y
    import importlib
    import pkgutil
    import types

    hidden = []
    for info in [None, *pkgutil.walk_packages(inspector.__path__, "inspector.")]:
        if info is not None and not info.ispkg:
            continue
        package = inspector if info is None else importlib.import_module(info.name)
        for sub in pkgutil.iter_modules(package.__path__):
            value = vars(package).get(sub.name)
            if value is not None and not isinstance(value, types.ModuleType):
                hidden.append(f"{package.__name__}.{sub.name}")
    assert hidden == []
