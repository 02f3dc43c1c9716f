"""Layering: every module of ``inspector`` imports only from its own layer or the layers below.

The floors, bottom to top, as ``docs/architecture.md`` draws them. An import that runs back up
(also one made lazily inside a function) fails here with the file, line and both layers.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import inspector

ROOT = Path(__file__).resolve().parents[1] / "inspector"
LAYERS = [
    ("utils",),                                                         # imports nothing of the library
    ("inventory",),                                                     # the one walk
    ("sharding",),                                                      # DTensor facts
    ("loading",),                                                       # models and checkpoints in
    ("aliases", "offsets", "placement", "capture", "attribution"),      # the analyses
    ("structure",),                                                     # summary and tree: analyses combined
    ("runfiles",),                                                      # the run file, written and read back
    ("distributed", "watching"),                                        # across ranks, over steps
    ("comparison", "integrations", "runfolders"),                       # two models or runs; stacks; folders
    ("figures", "report", "labs"),                                      # what shows, exports and teaches
    ("dashboard", "commands", "__main__", "__init__"),                  # the doors: app and command line
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def _imported(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every inspector import in ``path``, relative imports resolved."""
    package = ["inspector", *path.relative_to(ROOT).parent.parts]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out += [(node.lineno, module)] + [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return [(line, m) for line, m in out if m == "inspector" or m.startswith("inspector.")]


def _layer(module: str) -> str:
    """The layer of ``inspector.<top>...``; a name the package itself binds (``inspector.load_model``)
    is the package's."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LEVEL else "__init__"


def _offenders() -> list[str]:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        own = path.relative_to(ROOT).parts[0].removesuffix(".py")
        for line, module in _imported(path):
            theirs = _layer(module)
            if LEVEL[theirs] > LEVEL[own]:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {module}, a layer above it")
    return offenders


def test_every_module_imports_only_its_own_layer_or_below():
    assert _offenders() == []


def test_every_package_and_module_of_inspector_has_a_layer():
    tops = {
        p.name.removesuffix(".py")
        for p in ROOT.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert tops <= set(LEVEL), sorted(tops - set(LEVEL))


def test_the_scan_sees_relative_and_lazy_imports():
    assert any(m == "inspector.distributed.check_step" for _, m in _imported(ROOT / "watching" / "core.py"))
    assert any(
        m == "inspector.sharding.with_rank_bytes" for _, m in _imported(ROOT / "placement" / "audits.py")
    )
    assert _layer("inspector.loading.models.load_model") == "loading" and _layer("inspector") == "__init__"


def test_the_version_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert inspector.__version__ == project["version"]
