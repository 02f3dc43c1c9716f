"""Layering: every module of ``inspector`` imports only from its own layer or the layers below.

The floors, bottom to top, as ``docs/architecture.md`` draws them. An import that runs back up
(also one made lazily inside a function) fails here with the file, line and both layers.

And no two modules of ``inspector`` import each other, directly or round a longer circle. Every import
counts: at the top of a module, lazily inside a function, and under ``if TYPE_CHECKING:`` (a lazy import
only puts the circle off to the first call, and a type-only one still ties the two modules together).
An import of ``pkg.mod`` or ``from pkg import mod`` points at ``mod``; ``from pkg import name`` at
``pkg/__init__.py``; the packages a dotted name passes through are not counted (Python runs their
``__init__`` first, but that is the package handing on its modules' names, never a module's choice).
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
    ("distributed", "replaying", "watching"),                           # across ranks, over steps
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
    before = ROOT / "watching" / "rules" / "before.py"
    assert any(m == "inspector.distributed.check.local_step" for _, m in _imported(before))
    assert any(
        m == "inspector.sharding.with_rank_bytes" for _, m in _imported(ROOT / "placement" / "audits.py")
    )
    assert _layer("inspector.loading.models.load_model") == "loading" and _layer("inspector") == "__init__"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line}, by the rules of this file's docstring, for the package at
    ``root`` (``inspector``)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name in modules]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                           for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan), each in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _circle(graph: dict[str, dict[str, int]], group: list[str]) -> str:
    """One circle through ``group``, as ``a:line -> b:line -> ... -> a``."""
    start, inside = group[0], set(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                steps = [*paths[v], start]
                return " -> ".join(f"{a}:{graph[a][b]}" for a, b in zip(steps, steps[1:], strict=False)) \
                    + f" -> {start}"
            if w in inside and w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return ", ".join(group)


def test_no_import_cycle_between_modules_of_inspector():
    graph = _import_graph()
    assert [_circle(graph, g) for g in _cycles(graph)] == []


def test_the_cycle_scan_finds_a_circle_and_counts_lazy_and_type_only_imports():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _circle(graph, ["a", "b", "c"]) == "a:1 -> b:2 -> c:3 -> a"
    real = _import_graph()
    assert "inspector.distributed.check" in real["inspector.watching.rules.before"]  # lazy, inside a check
    assert "inspector.runfiles.captured" in real["inspector.watching.core"]  # lazy
    assert "inspector.runfiles.tables" in real["inspector.runfiles.reading"]
    assert real["inspector.report.model"].keys() >= {"inspector.report.render", "inspector.report.data"}
    assert not any(m.startswith("inspector.watching") for m in real["inspector.distributed"])


def test_a_circle_closed_lazily_or_only_for_types_is_a_circle(tmp_path):
    pkg = tmp_path / "inspector"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import A\n")  # the package hands on a name
    lazy = "class A:\n    def b(self):\n        from .b import B\n        return B\n"  # a lazy import, line 3
    types_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"  # line 3
    (pkg / "sub" / "a.py").write_text(lazy)
    (pkg / "sub" / "b.py").write_text(types_only)
    (pkg / "c.py").write_text("from .sub import A\n")  # imports the package, not a module of it: no circle
    graph = _import_graph(pkg)
    assert graph["inspector.sub.a"] == {"inspector.sub.b": 3}
    assert graph["inspector.sub.b"] == {"inspector.sub.a": 3}
    assert graph["inspector.c"] == {"inspector.sub": 1}
    assert _cycles(graph) == [["inspector.sub.a", "inspector.sub.b"]]
    assert _circle(graph, ["inspector.sub.a", "inspector.sub.b"]) == \
        "inspector.sub.a:3 -> inspector.sub.b:3 -> inspector.sub.a"


def test_the_version_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert inspector.__version__ == project["version"]
