"""The bug zoo's own runner on a few of its cases: rows come out, a broken case is a crash (never
hidden), and a planted gradient-not-cleared is caught at its step, naming a parameter."""

from __future__ import annotations

import torch

from benchmarks.bugzoo.cases_plain import BROKEN
from benchmarks.bugzoo.core import where_matches
from benchmarks.bugzoo.runner import run_case, run_zoo, select
from benchmarks.bugzoo.table import figures, summary, zoo_tables


def test_zoo_rows_crash_and_a_caught_bug() -> None:
    torch.set_num_threads(1)
    cases = select("mlp-not-cleared,mlp-before-zero")
    assert [c.name for c in cases] == ["mlp-before-zero", "mlp-not-cleared"]
    rows = run_zoo(cases, steps=40)
    healthy, bug = rows
    assert healthy.case.healthy and healthy.status in ("ok", "alarm")
    assert bug.status == "caught" and bug.code == "gradient-not-cleared"
    assert bug.planted == 30 and bug.step is not None and abs(bug.step - 30) <= 1 and bug.within_one
    assert bug.module_right  # no module planted: any where is right
    crash, _ = run_case(BROKEN, steps=5)
    assert crash.status == "crash" and crash.error == "ValueError: this case is broken on purpose"
    text = zoo_tables(rows + [crash]) + "\n" + summary(rows + [crash])
    assert ("| mlp-not-cleared | mlp | torch | zero_grad before | default | `gradient-not-cleared` | yes |"
            in text)
    assert "| broken-case |" in text and "crash: ValueError: this case is broken on purpose" in text
    assert "| mlp-before-zero | mlp | torch | zero_grad before (set_to_none=False) |" in text
    f = figures(rows + [crash])
    assert (f["bugs"], f["caught"], f["crashed"], f["healthy"]) == (2, 1, 1, 1)


def test_where_matching_rule() -> None:
    assert where_matches("fc1.weight", ("fc1",))  # a parameter inside the planted module
    assert where_matches("fc1", ("fc1.weight",))  # the module that owns the planted parameter
    assert where_matches("_orig_mod.bn1", ("bn1",))  # a torch.compile wrapper's prefix
    assert where_matches("model.bn1", ("bn1",))  # named from an outer LightningModule
    assert where_matches("gan.disc.0.weight", ("disc",))
    assert not where_matches("fc2", ("fc1",))
    assert not where_matches("transformer", ("transformer.h.1.mlp.c_fc",))
    assert not where_matches("fc1", ("fc10",))
    assert where_matches("(model)", None)
