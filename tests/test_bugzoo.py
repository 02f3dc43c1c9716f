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


def test_every_bug_has_a_code_a_cause_rule_and_the_zoo_its_size() -> None:
    from benchmarks.bugzoo.runner import BUGS, HEALTHY
    from inspector.utils import CODES

    assert len(BUGS) >= 80 and len(HEALTHY) >= 50
    names = [c.name for c in BUGS + HEALTHY]
    assert len(names) == len(set(names))
    pending = {"scaler-skipping", "zero-gradient-step", "optimizer-lost"}  # codes the zoo asks of the watch
    for c in BUGS:
        assert c.cause and all(isinstance(w, str) and w for w in c.cause), c.name
        assert all(code in CODES or code in pending for code in c.expect), c.name


def test_stated_cause_is_judged_by_the_case_rule() -> None:
    from benchmarks.bugzoo.core import judge, states_cause
    from benchmarks.bugzoo.runner import select
    from inspector.runfiles import StepFinding

    case = select("mlp-zero-grad-before-step")[0]
    assert case.expect == ("zero-gradient-step",) and case.cause == ("zero_grad",)
    right = StepFinding(30, None, "zero-gradient-step", "error", "fc1.weight",
                        "the optimizer stepped on all-zero gradients: zero_grad() ran between backward() "
                        "and step()")
    wrong = StepFinding(31, None, "zero-gradient-step", "error", "fc1.weight", "a detach() cut it off")
    assert states_cause(right.message, case.cause) and not states_cause(wrong.message, case.cause)
    j = judge(case, "default", [wrong, right], 30)
    assert j.status == "caught" and j.step == 30 and j.cause_right is True
    j = judge(case, "default", [wrong], 30)
    assert j.status == "caught" and j.cause_right is False
    assert judge(case, "default", [], 30).cause_right is None


def test_library_recipes_run_and_the_goals_line() -> None:
    """One healthy recipe from a real library (peft LoRA on Llama) and one of the new bugs (the
    optimizer built before get_peft_model: no adapter in it), judged and tabled."""
    torch.set_num_threads(1)
    from benchmarks.bugzoo.table import goals_line

    wanted = ("lora-llama", "lora-gpt2-not-in-optimizer")
    cases = [c for c in select(",".join(wanted)) if c.name in wanted]
    assert [c.name for c in cases] == list(wanted)
    healthy, bug = run_zoo(cases, steps=12)
    assert healthy.status in ("ok", "alarm") and healthy.case.model == "lora-llama"
    assert not any(f.code == "not-in-optimizer" for f in healthy.findings)  # the adapters are all held
    assert bug.status == "caught" and bug.code == "not-in-optimizer" and bug.step == 0
    assert ".lora_" in bug.where and bug.module_right and bug.cause_right
    text = zoo_tables([healthy, bug]) + "\n" + summary([healthy, bug])
    assert "| stated cause |" in text and "| lora-gpt2-not-in-optimizer |" in text
    line = goals_line([healthy, bug])
    assert line.startswith("goals (not met): bugs 1 (goal >= 80), healthy 1 (goal >= 50)")
    assert "right module within one step (windowed checks within their grace) 1/1 = 100%" in line
    assert "stated cause right 1/1 = 100%" in line
