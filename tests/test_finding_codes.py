"""The registry of finding codes is the whole list: every code the library's source names is in it,
every code in it is named in a page of docs/, and docs/findings.md lists each with its severity."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from inspector.utils import BATCH_LABEL, CODES, ROOT_LABEL

ROOT = Path(__file__).resolve().parent.parent
SEVERITIES = {"error", "warning", "info"}
# functions that take (code, severity, ...) and build Findings, by the name they are called with
CODE_FIRST = {"Finding", "_named", "_c", "coded"}


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _codes_in(tree: ast.AST) -> set[tuple[str, int]]:
    """(code, line) for each code written in the source: the first argument of ``Finding(...)`` and of
    any call whose second argument is a severity literal, ``code=...``, the code argument of a
    ``_listed(items, code, severity, ...)`` call, the keys of a ``_SEVERITY`` table and the strings
    compared with a finding's ``.code``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            args = node.args
            if args and (name in CODE_FIRST or (len(args) > 1 and _str(args[1]) in SEVERITIES)):
                if (code := _str(args[0])) is not None:
                    out.add((code, node.lineno))
            if name == "_listed" and len(args) > 1 and (code := _str(args[1])) is not None:
                out.add((code, node.lineno))
            for kw in node.keywords:
                if kw.arg == "code" and (code := _str(kw.value)) is not None:
                    out.add((code, node.lineno))
        elif isinstance(node, ast.Compare) and getattr(node.left, "attr", None) == "code":
            for comp in node.comparators:
                items = comp.elts if isinstance(comp, (ast.Tuple, ast.Set, ast.List)) else [comp]
                out |= {(c, node.lineno) for c in map(_str, items) if c is not None}
    return out


def _used() -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    for path in sorted((ROOT / "inspector").rglob("*.py")):
        if path.name == "codes.py":
            continue
        for code, line in _codes_in(ast.parse(path.read_text(), str(path))):
            used.setdefault(code, []).append(f"{path.relative_to(ROOT)}:{line}")
    return used


def test_the_scan_finds_codes_where_the_library_writes_them():
    # the scan itself can fail: a known code in each way the library writes one
    used = _used()
    assert {"tie-broken", "loss-spike", "left-at-init", "missing", "run-file-truncated"} <= set(used)
    assert len(used) >= 90


def test_every_code_the_library_uses_is_in_the_registry():
    missing = {c: where for c, where in _used().items() if c not in CODES}
    assert not missing, f"add these codes to inspector/utils/codes.py (CODES) and docs/findings.md: {missing}"


def test_every_code_in_the_registry_is_used_and_named_in_the_docs():
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    unnamed = [c for c in CODES if f"`{c}`" not in docs]
    assert not unnamed, f"name these codes in docs/ (docs/findings.md lists every code): {unnamed}"
    used = set(_used())
    map_codes = {"param-unplaced", "buffer-unplaced", "tie-split", "meta-leftover", "buffer-stranded"}
    unused = sorted(set(CODES) - used - map_codes)  # these five come from the audit table's column
    assert not unused, f"codes in the registry that nothing reports: {unused}"


def test_docs_findings_lists_each_code_with_its_registry_severity():
    text = (ROOT / "docs/findings.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (\w+)( \(recurs\))? \|", text, re.MULTILINE)
    listed = {code: (severity, bool(rec)) for code, severity, rec in rows}
    assert listed == {c.code: (c.severity, c.recurs == "episode") for c in CODES.values()}


@pytest.mark.parametrize("entry", list(CODES.values()), ids=list(CODES))
def test_each_entry_says_what_it_means_and_what_to_do(entry):
    assert entry.severity in SEVERITIES and entry.meaning and entry.action
    assert entry.recurs in ("once", "episode", "every")


def test_one_root_label_and_one_batch_label():
    """No module writes the root or the batch under another label than the one in utils/labels.py."""
    others = {"(root)", "(model)", "(batch)", "(input)"}
    stray = []
    sources = [*(ROOT / "inspector").rglob("*.py"), *(ROOT / "ui").rglob("*.py"), *ROOT.glob("pages/*.py")]
    for path in sources:
        if path.name == "labels.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _str(node) in others:
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno} {_str(node)!r}")
    assert not stray, f"use ROOT_LABEL or BATCH_LABEL (inspector.utils) instead: {stray}"
    assert (ROOT_LABEL, BATCH_LABEL) == ("(model)", "(batch)")
