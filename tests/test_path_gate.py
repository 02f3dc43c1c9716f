"""Every path a page accepts goes through the one gate, ``inspector.utils.paths.confined``.

An AST walk over ``pages/*.py`` and ``ui/*.py``: a value typed into a text field (``text_input``,
``text_area``) or read from the address (``query_params``) is followed through assignments and the
module's own functions' returns; passed to any call that is not a Streamlit element, an escaping
function or a plain conversion, it must first go through a gate function (one that calls
``confined``, checked below). Text fields that are no paths (filters, names, budgets) are listed by
key, with why. The walk is flow-insensitive: a name that ever holds an unchecked path stays tainted,
so a checked path gets a name of its own.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import streamlit as st

ROOT = Path(__file__).resolve().parent.parent

# Functions that put a path through ``confined`` before anything opens it (each is checked to).
GATES = {
    "confined": "inspector.utils.paths",
    "allowed_run_path": "inspector.runfolders.access",
    "checked_path": "ui.runs",
    "server_path": "ui.paths",
    "server_source": "ui.paths",
    "get_loaded": "ui.models",
    "load_selection": "ui.sidebar",
    "open_run": "ui.training",
    "file_key": "ui.training",
    "watch_file": "ui.training",
    "_previewable": "ui.sidebar",
}
# Calls that only show, escape or convert text: a path passed to them opens nothing.
HARMLESS = {"markdown_text", "markdown_code", "visible_text", "plot_text", "terminal_text", "str", "len",
            "bool", "repr", "int", "float", "isinstance", "parse_size", "dict", "Selection", "replace",
            "filter_rows", "getattr", "print"}
HARMLESS |= {n for n in dir(st) if not n.startswith("_")}  # st.error(...), col.caption(...)

# Calls and methods whose result is no text (a length, a truth value): nothing of the path goes on.
NO_TEXT = {"len", "bool", "isinstance", "int", "float", "startswith", "endswith", "isdigit", "isidentifier"}

# Text fields that hold no path: key (or file:function for keys made at run time) -> what they hold.
NOT_PATHS = {
    "cap_patterns": "module names and glob patterns",
    "report_budget": "a device budget",
    "lab_student": "a student's name",
    "lab_teacher_key": "a password",
    "mi_max_size": "a size",
    "home_tree_search": "a search text",
    "ui/tables.py:paged_table": "a row filter",
    "ui/labs_view.py:*": "a lab's answers",
    "ui/device_map.py:audit_a_map": "a device map as JSON text (load_device_map parses, never opens)",
}
# Address parameters that hold no path.
NOT_PATH_PARAMS = {"sample", "device", "dtype", "page", "section",
                   "labs"}  # a random token naming a student's lab record on the server, never a file

SOURCES = ("text_input", "text_area")


def _name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Call) and _name(f) == "fragment" and f.args and isinstance(f.args[0], ast.Name):
        return f.args[0].id  # st.fragment(live, ...)(args): a call of live
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _key(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "key" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    return None


def _param_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return None


class _Unit:
    """One function (or a module's top level): which names hold an unchecked path."""

    def __init__(self, where: str, fn: str, body: list[ast.stmt],
                 tainted_returns: dict[str, frozenset[int] | None], local: dict[str, list[str]],
                 given: dict[str, set[str]]) -> None:
        self.where, self.fn, self.body = where, fn, body
        self.returns, self.params, self.local, self.given = tainted_returns, set(), local, given
        self.tainted: set[str] = {"__path__", *given.get(fn, ())}

    def _nodes(self):
        for stmt in self.body:
            yield from ast.walk(stmt)

    def is_source(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and _name(node) in SOURCES:
            key = _key(node)
            return not (key in NOT_PATHS or f"{self.where}:{self.fn}" in NOT_PATHS
                        or f"{self.where}:*" in NOT_PATHS)
        if isinstance(node, ast.Call) and _name(node) in self.returns:
            return self.returns[_name(node)] is None  # a tuple's items are followed one by one in spread()
        target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "get" else node.value if isinstance(node, ast.Subscript) else None
        if target is not None and self._is_params(target):
            return _param_key(node) not in NOT_PATH_PARAMS
        return False

    def _is_params(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "query_params") or (
            isinstance(node, ast.Name) and node.id in self.params)

    def dirty(self, expr: ast.AST) -> bool:
        """Whether ``expr`` holds an unchecked path (a gate's call is clean, whatever it is given)."""
        if isinstance(expr, ast.Call) and (_name(expr) in GATES or _name(expr) in NO_TEXT):
            return False
        if isinstance(expr, ast.Compare) or (isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not)):
            return False  # a truth value
        if isinstance(expr, ast.IfExp):
            return self.dirty(expr.body) or self.dirty(expr.orelse)  # the test only chooses
        if self.is_source(expr):
            return True
        if isinstance(expr, ast.Name) and expr.id in self.tainted:
            return True
        return any(self.dirty(child) for child in ast.iter_child_nodes(expr))

    def spread(self) -> None:
        for node in self._nodes():  # aliases of the address's parameters
            if isinstance(node, ast.Assign) and self._is_params(node.value):
                self.params.update(t.id for t in node.targets if isinstance(t, ast.Name))
        changed = True
        while changed:
            changed = False
            for node in self._nodes():
                if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) or \
                        node.value is None:
                    continue
                for target, value in self._pairs(node):
                    if self.dirty(value):
                        for n in ast.walk(target):
                            if isinstance(n, ast.Name) and n.id not in self.tainted:
                                self.tainted.add(n.id)
                                changed = True

    def _pairs(self, node: ast.AST):
        """(target, value) of an assignment, item by item where both sides are tuples (or the value
        is a call of this file's functions that returns a tuple with some items unchecked)."""
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        for target in targets:
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and \
                    len(target.elts) == len(value.elts):
                yield from zip(target.elts, value.elts, strict=True)
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Call) and \
                    self.returns.get(_name(value)) is not None:
                dirty_items = self.returns[_name(value)]
                for i, t in enumerate(target.elts):
                    yield t, (ast.Name(id="__path__") if i in dirty_items else ast.Constant(value=None))
            else:
                yield target, value

    def hand_on(self) -> dict[str, set[str]]:
        """The parameters of this file's own functions that this unit gives an unchecked path."""
        out: dict[str, set[str]] = {}
        for node in self._nodes():
            if isinstance(node, ast.Call) and _name(node) in self.local and _name(node) not in GATES:
                names = self.local[_name(node)]
                out.setdefault(_name(node), set()).update(
                    [names[i] for i, a in enumerate(node.args) if i < len(names) and self.dirty(a)]
                    + [k.arg for k in node.keywords if k.arg and self.dirty(k.value)])
        return out

    def leaks(self) -> list[str]:
        """Calls that get an unchecked path (a call of this file's own function is followed inside)."""
        out = []
        for node in self._nodes():
            if not isinstance(node, ast.Call) or _name(node) in GATES or _name(node) in HARMLESS \
                    or _name(node) in self.local:
                continue
            if isinstance(node.func, ast.Attribute) and self.dirty(node.func.value) and not any(
                    self.dirty(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                continue  # a method of the text itself (path.strip()): the result is checked where it goes
            if any(self.dirty(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                out.append(f"{self.where}:{node.lineno} {self.fn}: {ast.unparse(node)[:90]}")
        return out

    def returned(self) -> frozenset[int] | None | bool:
        """What this function hands out unchecked: False (nothing), None (its whole result), or the
        items of the tuple it returns that hold a path."""
        items: set[int] = set()
        whole = False
        for n in self._nodes():
            if not isinstance(n, ast.Return) or n.value is None:
                continue
            if isinstance(n.value, ast.Tuple):
                items |= {i for i, e in enumerate(n.value.elts) if self.dirty(e)}
            elif self.dirty(n.value):
                whole = True
        return None if whole else frozenset(items) if items else False


def bypasses(code: str, where: str) -> list[str]:
    """Every call in ``code`` that gets a typed or addressed path without the gate."""
    tree = ast.parse(code)
    fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    top = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    local = {f.name: [a.arg for a in [*f.args.posonlyargs, *f.args.args]] for f in fns}
    returns: dict[str, frozenset[int] | None] = {}
    given: dict[str, set[str]] = {}
    while True:  # what this file's functions hand out and are handed, until nothing changes
        units = [_Unit(where, f.name, f.body, returns, local, given) for f in fns]
        units.append(_Unit(where, "<module>", top, returns, local, given))
        for u in units:
            u.spread()
        now = {u.fn: r for u in units if (r := u.returned()) is not False}
        handed: dict[str, set[str]] = {}
        for u in units:
            for fn, names in u.hand_on().items():
                handed.setdefault(fn, set()).update(names)
        if now == returns and handed == given:
            break
        returns, given = now, handed
    return sorted(leak for u in units for leak in u.leaks())


def _files() -> list[Path]:
    return sorted([*ROOT.glob("pages/*.py"), *ROOT.glob("ui/*.py"), ROOT / "app.py"])


def test_every_typed_or_addressed_path_passes_the_gate():
    found = [leak for f in _files()
             for leak in bypasses(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert not found, "paths that reach a call without confined():\n" + "\n".join(found)


def test_the_walk_sees_the_fields_it_must_check():
    """The check is not vacuous: the path fields of the pages are found as sources."""
    seen = set()
    for f in _files():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _name(node) in SOURCES and _key(node) not in NOT_PATHS:
                seen.add(_key(node))
    assert {"cap_run_path", "train_path", "cmp_b", "mi_ckpt_path", "mi_file", "mi_hf"} <= seen, seen


@pytest.mark.parametrize("code, bad", [
    ("p = st.text_input('Run', key='x')\nread_captures(p.strip())\n", True),
    ("p = st.text_input('Run', key='x')\nread_captures(checked_path(p))\n", False),
    ("def f():\n    return st.text_input('B', key='x').strip()\nb = f()\ncompare(m, b)\n", True),
    ("def f():\n    return server_source(st.text_input('B', key='x'))\nb = f()\ncompare(m, b)\n", False),
    ("qp = st.query_params\nopen(qp.get('checkpoint'))\n", True),
    ("qp = st.query_params\nst.write(qp.get('checkpoint'))\nuse(qp.get('device'))\n", False),
    ("p = st.text_input('Run', key='x')\nq = p or 'a'\nwith open(q) as fh: pass\n", True),
    ("p = st.text_input('Filter', key='cap_patterns')\nopen(p)\n", False),
    ("def show(x):\n    read_run(x)\np = st.text_input('R', key='x')\nshow(p)\n", True),
    ("def show(x):\n    st.write(x.startswith('a'))\np = st.text_input('R', key='x')\nshow(p)\n", False),
    ("def live(u, x):\n    read_run(x)\nu, p, f = src()\n"
     "def src():\n    return 1, st.text_input('R', key='x'), 2\n"
     "st.fragment(live, run_every=1)(u, p)\n", True),
    ("u, p = None, st.text_input('R', key='x')\nread_run(u)\n", False),
])
def test_the_walk_flags_a_path_that_skips_the_gate(code, bad):
    assert bool(bypasses(code, "snippet.py")) is bad


def test_each_gate_calls_confined():
    """A function listed as a gate really puts the path through ``confined`` (or another gate)."""
    import importlib

    for name, module in GATES.items():
        if name == "confined":
            continue
        src = inspect.getsource(getattr(importlib.import_module(module), name))
        calls = {_name(n) for n in ast.walk(ast.parse(src.strip() if src.startswith(" ") else src))
                 if isinstance(n, ast.Call)}
        assert calls & (set(GATES) - {name}), f"{module}.{name} lists no gate call: {sorted(calls)}"
