"""docs/findings.md's last table: for every finding code, the test that plants its bug and the healthy test
that keeps it silent. Every code has a row, every test named exists, every planted test asserts its code,
and the codes still without such a test are exactly those listed here."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from inspector.utils import CODES

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Which tests plant and silence each code"
ROW = re.compile(r"^\| `([^`]+)` \| (.+?) \| (.+?) \|$")
NONE = "none yet"

# The codes no test plants yet (its assertions naming the code), and those no healthy test silences yet.
NO_PLANTED = {
    "all-frozen", "attribution-inf", "attribution-nan", "attribution-target", "capture-no-grads",
    "capture-written-same-values", "changed-from-zero", "changed-unexpectedly", "device-changed",
    "expect-unmatched", "forward-state-restored", "frozen-with-gradient", "hf-not-checked", "meta-leftover",
    "modules-differ", "param-unplaced", "replica-resynchronised", "retie-refused", "tie-added",
    "tie-conflict", "tie-split", "torch-state-restored",
}


def _rows() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "findings.md").read_text()
    assert SECTION in text, f"docs/findings.md has no section {SECTION!r}"
    rows = {}
    for line in text.split(SECTION, 1)[1].splitlines():
        if m := ROW.match(line.strip()):
            code, planted, healthy = m.groups()
            assert code not in rows, f"{code} has two rows"
            rows[code] = (planted.strip().strip("`"), healthy.strip().strip("`"))
    return rows


@cache
def _function(ref: str) -> tuple[str, list[str]]:
    """``(source, [each assert statement's source])`` of the test ``file::name`` under tests/."""
    file, _, name = ref.partition("::")
    path = ROOT / "tests" / file
    assert path.is_file(), f"{ref}: no file tests/{file}"
    src = path.read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            asserts = [ast.get_source_segment(src, n) or "" for n in ast.walk(node)
                       if isinstance(n, ast.Assert)]
            return ast.get_source_segment(src, node) or "", asserts
    raise AssertionError(f"{ref}: no test {name} in tests/{file}")


def test_every_registered_code_has_a_row():
    assert sorted(_rows()) == sorted(CODES)


def test_each_planted_test_exists_and_asserts_its_code():
    for code, (planted, _) in _rows().items():
        if planted == NONE:
            continue
        literal = re.compile(r"[\"']" + re.escape(code) + r"[\"']")
        _, asserts = _function(planted)
        assert any(literal.search(a) for a in asserts), f"{planted} asserts nothing about {code}"


def test_each_healthy_test_exists_and_asserts_what_it_finds():
    for code, (_, healthy) in _rows().items():
        if healthy == NONE:
            continue
        _, asserts = _function(healthy)
        assert asserts, f"{healthy} (healthy for {code}) asserts nothing"


def test_the_codes_without_a_test_are_those_listed():
    rows = _rows()
    assert {c for c, (p, _) in rows.items() if p == NONE} == NO_PLANTED
    # every code the watch, the distributed step check, the ties and the captures report has both
    trusted = {c for c in CODES if c.startswith("nonfinite-")}
    trusted |= {"tie-broken", "tie-weakened", "capture-mutated"}
    trusted |= {"exploding-gradient", "loss-spike", "dead-gradient", "not-in-optimizer",
                "gradient-not-cleared",
                "no-update", "optimizer-not-stepped", "eval-mode-module", "frozen-parameters",
                "parameters-replaced", "run-failed", "replica-drift", "gradient-not-synchronized",
                "gradient-far-off", "shard-imbalance", "tie-restored"}
    assert {c for c in trusted if NONE in rows[c]} == set()
