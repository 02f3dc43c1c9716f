"""Layering: the modules below ``inspector.distributed`` never import it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "inspector"
ABOVE_DISTRIBUTED = ("distributed/", "commands/", "watch/", "comparison/", "cli_common.py",
                     "report/distributed_run.py", "__init__.py")


def _imported(path: Path) -> set[str]:
    """The absolute names of the inspector modules ``path`` imports (relative imports resolved)."""
    package = ["inspector", *path.relative_to(ROOT).parent.parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out |= {module} | {f"{module}.{a.name}" for a in node.names}
    return out


def test_only_the_layers_above_import_distributed():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "__init__.py" or rel.startswith(ABOVE_DISTRIBUTED[:-1]):
            continue
        hits = [m for m in _imported(path) if m == "inspector.distributed" or m.startswith("inspector.distributed.")]
        if hits:
            offenders.append(f"{rel}: {sorted(hits)}")
    assert offenders == []


def test_the_scan_sees_relative_imports():
    assert "inspector.distributed.check_step" in _imported(ROOT / "watch" / "core.py")
    assert "inspector.sharding.with_rank_bytes" in _imported(ROOT / "placement" / "audit.py")
