"""The watch's rules table (``inspector.watching.table.WATCH_CHECKS``): every row's codes registered at
their severity, the ordering rules it states, each tested by a real run that comes out wrong when the
two rows are swapped, and docs/findings.md kept equal to the table; the gathered phase's rules on
findings built by hand."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch
from torch import nn

from inspector.sharding.findings import about
from inspector.utils.codes import CODES, coded
from inspector.utils.findings import Finding, InspectorError
from inspector.watching import rules, watch
from inspector.watching import table as watch_table
from inspector.watching.events import PHASES, At, ByRank, Kit
from inspector.watching.numbers import Numbers
from inspector.watching.ranks import Meeting, RanksApart
from inspector.watching.roles import Ranks, Target, WatchOptions
from inspector.watching.rules.after import LearningRateRose
from inspector.watching.rules.around import (
    OriginFirst,
    RankFailures,
    ReplicaFindingsPlaced,
    SlowRanks,
    SpreadFolded,
)
from inspector.watching.table import WATCH_CHECKS, Checks, Row, table_markdown

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "findings.md"


def swapped(a: type, b: type) -> tuple[Row, ...]:
    """WATCH_CHECKS with the rows of checks ``a`` and ``b`` exchanged."""
    rows = list(WATCH_CHECKS)
    i = next(k for k, r in enumerate(rows) if r.check is a)
    j = next(k for k, r in enumerate(rows) if r.check is b)
    rows[i], rows[j] = rows[j], rows[i]
    return tuple(rows)


def order_broken(rows: tuple[Row, ...]) -> list[str]:
    """The ordering rules ``rows`` breaks: a row placed before a row of its phase it must follow."""
    place = {r.check: k for k, r in enumerate(rows)}
    return [f"{r.name} before {a.__name__}" for r in rows for a in r.after if place[a] > place[r.check]]


# -- the table itself -----------------------------------------------------------------------------
def test_every_row_lists_registered_codes_and_a_known_phase():
    for row in WATCH_CHECKS:
        assert row.phase in PHASES
        assert set(row.codes) <= set(CODES), row.name
        assert row.check.__doc__, f"{row.name} says nowhere when it fires"
        for a in row.after:
            assert a in {r.check for r in WATCH_CHECKS if r.phase == row.phase}, (row.name, a)
        assert bool(row.after) == bool(row.why), row.name


def test_the_table_keeps_its_own_ordering_rules_and_a_swap_breaks_them():
    assert order_broken(WATCH_CHECKS) == []
    rules_stated = [(a, r.check) for r in WATCH_CHECKS for a in r.after]
    assert len(rules_stated) >= 7
    for a, b in rules_stated:
        assert order_broken(swapped(a, b)), (a, b)


def test_each_check_class_appears_once():
    checks = [r.check for r in WATCH_CHECKS]
    assert len(checks) == len(set(checks))


def test_no_watch_module_writes_a_severity_of_its_own():
    """Severity comes from CODES (``coded``): no ``Finding("code", "severity", ...)`` in the watch."""
    folder = pathlib.Path(watch_table.__file__).parent
    literal = re.compile(r'(?<![A-Za-z_])Finding\(\s*"[a-z-]+",\s*"(error|warning|info)"')
    found = [p.name for p in folder.glob("*.py") if literal.search(p.read_text())]
    assert found == []


def test_docs_list_the_table_as_it_is():
    text = DOCS.read_text()
    assert table_markdown() in text, "docs/findings.md is behind the table: paste table_markdown() into it"


def test_docs_check_fails_on_a_sabotaged_table():
    rows = swapped(rules.Loss, rules.NonfiniteGradients)
    assert table_markdown(rows) not in DOCS.read_text()


# -- a row that reports what it does not list raises ---------------------------------------------
def _nan_loss_run(tmp_path, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect", **options) as w:
        for i in range(3):
            out = model(torch.ones(2, 3)).mean()
            loss = out * float("nan") if i == 1 else out.pow(2)  # a NaN loss at step 1
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return w.result.findings


def test_a_row_that_reports_a_code_it_does_not_list_raises(tmp_path, monkeypatch):
    rows = tuple(Row(r.phase, r.check, ("loss-spike",)) if r.check is rules.Loss else r for r in WATCH_CHECKS)
    monkeypatch.setattr(watch_table, "WATCH_CHECKS", rows)
    with pytest.raises(InspectorError, match="'Loss' reported nonfinite-loss"):
        _nan_loss_run(tmp_path)


def test_a_row_that_writes_its_own_severity_raises(tmp_path, monkeypatch):
    # nonfinite-loss is an error in the registry: a check that says "warning" is caught too
    class QuietLoss(rules.Loss):
        def __call__(self, at, found):
            return [Finding(f.code, "warning", f.where, f.message) if f.code == "nonfinite-loss" else f
                    for f in super().__call__(at, found)]

    rows = tuple(Row(r.phase, QuietLoss, r.codes, r.after, r.why) if r.check is rules.Loss else r
                 for r in WATCH_CHECKS)
    monkeypatch.setattr(watch_table, "WATCH_CHECKS", rows)
    with pytest.raises(InspectorError, match="nonfinite-loss \\(warning\\)"):
        _nan_loss_run(tmp_path)


def test_the_registry_severity_reaches_the_run(tmp_path):
    found = _nan_loss_run(tmp_path)
    assert [f.code for f in found] == ["nonfinite-loss", "nonfinite-parameter"]
    assert [f.severity for f in found] == [CODES[f.code].severity for f in found] == ["error", "error"]


# -- the ordering rules, each on a real run ------------------------------------------------------
def _codes(findings) -> list[tuple[int, str]]:
    return [(f.step, f.code) for f in findings]


def scenario_nan_loss(tmp_path) -> list[tuple[int, str]]:
    """A NaN loss at step 1 (default options): the loss is named, not the gradients it made NaN."""
    return _codes(_nan_loss_run(tmp_path))


class _Nan(nn.Module):
    def forward(self, x):
        return x * float("nan") if self.bad else x


def scenario_producer(tmp_path) -> list[tuple[int, str]]:
    """A module that makes NaN at step 2, with ``nonfinite=True`` and the loss logged: the producer is the
    one finding (no nonfinite-loss, no nonfinite-gradient)."""
    torch.manual_seed(0)
    bad = _Nan()
    model = nn.Sequential(nn.Linear(3, 4), bad, nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect", nonfinite=True) as w:
        for i in range(3):
            bad.bad = i == 2
            loss = model(torch.ones(2, 3)).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return _codes(w.result.findings)


def scenario_written_weight(tmp_path) -> list[tuple[int, str]]:
    """A weight filled with NaN by hand between steps 1 and 2: the written weight is the one finding."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(3):
            if i == 2:
                with torch.no_grad():
                    model[0].weight.fill_(float("nan"))
            loss = model(torch.ones(2, 3)).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return _codes(w.result.findings)


def scenario_spike(tmp_path) -> list[tuple[int, str, bool]]:
    """A loss 1000x larger at step 30 on a steady run: one loss-spike, which says that every module's
    gradient grew with it (no separate whole-model exploding-gradient)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(32):
            x = torch.randn(16, 4, generator=g)
            loss = (model(x) - 1).pow(2).mean() * (1000.0 if i == 30 else 1.0)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return [(f.step, f.code, "grew about" in f.message) for f in w.result.findings]


def scenario_two_optimizers(tmp_path) -> list[tuple[int, str]]:
    """Two optimizers; the second steps every step but its gradients are never cleared: named at step 1."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.1)
    with watch(model, [first, second], tmp_path / "run.inspect") as w:
        for _ in range(3):
            model(torch.ones(2, 3)).pow(2).mean().backward()
            second.step()
            first.step()
            first.zero_grad()  # the second's gradients are left to add up
    return _codes(w.result.findings)


def scenario_zero_grad_before_step(tmp_path) -> list[tuple[int, str]]:
    """zero_grad() between backward() and step() for 8 steps: the step on zeroed gradients is the one
    finding (no dead-gradient once the window passes)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for _ in range(8):
            model(torch.ones(2, 3)).pow(2).mean().backward()
            opt.zero_grad()
            opt.step()
    return _codes(w.result.findings)


def scenario_nan_weights_used(tmp_path) -> list[tuple[int, str]]:
    """A NaN loss at step 2 makes every weight NaN; step 3's forward through the NaN embedding is not a
    new producer (``nonfinite=True``): the findings of step 2 are the only ones."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect", nonfinite=True) as w:
        for i in range(5):
            loss = model(torch.arange(8)).pow(2).mean() * (float("nan") if i == 2 else 1.0)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return _codes(w.result.findings)


def scenario_lr_raised(tmp_path) -> list[tuple[int, str, bool]]:
    """The learning rate raised 100x at step 30: the spikes it makes say that it rose."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    target = torch.randn(8, 1, generator=g)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(36):
            if i == 30:
                opt.param_groups[0]["lr"] *= 100
            loss = (model(torch.randn(8, 4, generator=g)) - target).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return [(f.step, f.code, "learning rate rose" in f.message) for f in w.result.findings]


# a NaN/Inf gradient the optimizer applies makes the weights NaN too: the post-step check names them
_NAN_WEIGHTS = "nonfinite-parameter"
ORDER_CASES = [
    # (the rule: the row that must come first, the row after it), the run, what it must report
    ((rules.Loss, rules.NonfiniteGradients), scenario_nan_loss, [(1, "nonfinite-loss"), (1, _NAN_WEIGHTS)]),
    ((rules.Producers, rules.Loss), scenario_producer, [(2, "nonfinite-forward"), (2, _NAN_WEIGHTS)]),
    ((rules.Producers, rules.NonfiniteGradients), scenario_producer,
     [(2, "nonfinite-forward"), (2, _NAN_WEIGHTS)]),
    ((rules.WrittenWeights, rules.Loss), scenario_written_weight, [(2, _NAN_WEIGHTS)]),
    ((rules.WrittenWeights, rules.NonfiniteGradients), scenario_written_weight, [(2, _NAN_WEIGHTS)]),
    ((rules.GradientNorms, rules.Loss), scenario_spike, [(30, "loss-spike", True)]),
    ((rules.Producers, rules.UsedNonfiniteWeights), scenario_nan_weights_used,
     [(2, "nonfinite-loss"), (2, _NAN_WEIGHTS)]),
    ((rules.NonfiniteGradients, rules.UsedNonfiniteWeights), scenario_nan_weights_used,
     [(2, "nonfinite-loss"), (2, _NAN_WEIGHTS)]),
    ((rules.Loss, rules.LearningRateRose), scenario_lr_raised, [(33, "loss-spike", True)]),
    ((rules.ZeroGradientStep, rules.GradientNorms), scenario_zero_grad_before_step,
     [(0, "zero-gradient-step")]),
]


def test_a_second_optimizer_whose_gradients_add_up_is_named_at_its_own_step(tmp_path):
    """Judged before its own step (its pre-step hook), named at the first optimizer's step after it."""
    assert scenario_two_optimizers(tmp_path) == [(1, "gradient-not-cleared")]


@pytest.mark.parametrize("rule, run, expected", ORDER_CASES, ids=lambda v: getattr(v, "__name__", None))
def test_ordering_rule_holds(tmp_path, rule, run, expected):
    assert run(tmp_path) == expected


@pytest.mark.parametrize("rule, run, expected", ORDER_CASES, ids=lambda v: getattr(v, "__name__", None))
def test_ordering_rule_swapped_reports_wrong(tmp_path, monkeypatch, rule, run, expected):
    """The same run with the two rows swapped reports something else: the rule's test can fail."""
    first, then = rule
    assert first in next(r for r in WATCH_CHECKS if r.check is then).after  # the rule is on its row
    monkeypatch.setattr(watch_table, "WATCH_CHECKS", swapped(first, then))
    assert run(tmp_path) != expected


def test_every_stated_rule_has_a_run(tmp_path):
    stated = {(a, r.check) for r in WATCH_CHECKS for a in r.after}
    covered = {rule for rule, _, _ in ORDER_CASES}
    # tested just below; GradientNorms before LearningRateRose: its spikes are extended the same way as
    # the loss's, which the run above checks
    assert stated - covered == {(rules.ReplicaFindingsPlaced, rules.SpreadFolded),
                                (rules.GradientNorms, rules.LearningRateRose)}


class _Ranks:
    """Two ranks, as the gathered phase reads them (no process group needed for these two rows)."""

    world, rank, distributed, meeting = 2, 0, True, None


def _spread_after_placing(rows: tuple[Row, ...]) -> list[list[str]]:
    """The gathered phase of a step where rank 0 names a producer and the distributed check placed a
    nonfinite-gradient about rank 1: what each rank reports."""
    model = nn.Linear(2, 1)
    target = Target.of(model, None)
    checks = Checks(Kit(target, WatchOptions()), rows)
    placed = about(Finding("nonfinite-gradient", "error", "weight", "rank 1's gradient is NaN"), [1])
    at = At(3, True, target, _Ranks(), numbers_all=[], measured=[placed])
    checks.by_phase["gathered"] = [(r, c) for r, c in checks.by_phase["gathered"]
                                   if r.check is not rules.SlowRanks]  # no compute times here
    producer = Finding("nonfinite-forward", "error", "0", "made NaN")
    out = checks.run("gathered", at, ByRank([[producer], []], [[], []]))
    return [[f.code for f in fs] for fs in out.found]


def test_spread_is_folded_after_the_distributed_findings_are_placed():
    assert _spread_after_placing(WATCH_CHECKS) == [["nonfinite-forward"], []]
    swapped_rows = swapped(rules.ReplicaFindingsPlaced, rules.SpreadFolded)
    assert _spread_after_placing(swapped_rows) != [["nonfinite-forward"], []]


def test_the_rank_where_nan_began_is_recorded_first():
    # rank 1's loss went NaN; rank 0 only holds the NaN gradients the reduction brought it: rank 1 leads
    model = nn.Linear(2, 1)
    target = Target.of(model, None)
    checks = Checks(Kit(target, WatchOptions()))
    checks.by_phase["gathered"] = [(r, c) for r, c in checks.by_phase["gathered"]
                                   if r.check is not rules.SlowRanks]  # no compute times here
    at = At(3, True, target, _Ranks(), numbers_all=[], measured=[])
    found = [[Finding("nonfinite-gradient", "error", "(model)", "NaN gradients")],
             [Finding("nonfinite-loss", "error", "(loss)", "the loss is nan")]]
    assert checks.run("gathered", at, ByRank(found, [[], []])).order == [1, 0]
    calm = [[Finding("dead-gradient", "warning", "weight", "none")], []]
    assert checks.run("gathered", at, ByRank(calm, [[], []])).order == [0, 1]

# -- the gathered phase's rules, on findings built by hand --------------------------------------
# Every rank's numbers and findings of a step side by side: which rank a slow step, a replica finding
# and a NaN producer are placed on, what the gradient reduction's spread folds away, and which rank is
# told first. The same rules run under real process groups in test_distributed_watch*.py; here each
# rule's own decision is checked on numbers worked out by hand.
def at_step(world: int, **kw) -> At:
    """An ``At`` of step 3 on ``world`` ranks, as the gathered phase sees it."""
    ranks = Ranks(None, None, False, 60.0)
    ranks.world = world
    return At(step=3, check=True, target=None, ranks=ranks, **kw)  # type: ignore[arg-type]


def empty(world: int) -> ByRank:
    return ByRank(found=[[] for _ in range(world)], quiet=[[] for _ in range(world)])


def codes(found: ByRank) -> list[list[str]]:
    return [[f"{f.code}@{f.where}" for f in fs] for fs in found.found]


# -- SlowRanks ------------------------------------------------------------------------------------
def numbers(*compute: float) -> list[Numbers]:
    return [Numbers(modules=1, parameters=1, compute=c) for c in compute]


def test_a_rank_4_s_behind_others_at_1_s_is_slow_and_said_in_full():
    found = SlowRanks()(at_step(3, numbers_all=numbers(1.0, 4.0, 1.0)), empty(3))
    assert codes(found) == [[], ["slow-rank@(model)"], []]
    f = found.found[1][0]
    assert f.severity == "warning"
    assert f.message == (
        "rank 1 took 4 s to load its batch and run its forward pass at this step, the other ranks 1 s: "
        "every rank waited for it in the step's first collective, so the step time is the same everywhere. "
        "Look at that rank's data loader, its batch sizes and its machine")


@pytest.mark.parametrize("compute", [(1.0, 2.9, 1.0),     # 1.9 s behind but under 3x
                                     (0.1, 0.9, 0.1),     # 9x but under 1 s behind
                                     (1.0, float("nan"), 1.0)])
def test_a_rank_under_both_bounds_or_unmeasured_is_not_slow(compute):
    found = SlowRanks()(at_step(3, numbers_all=numbers(*compute)), empty(3))
    assert codes(found) == [[], [], []]


def test_the_other_ranks_median_is_the_middle_of_an_even_count():
    # rank 3 at 6 s; the others 1, 2 and 2.5: median 2 (odd count), 6 >= 3 x 2 and 4 s behind: slow.
    # with rank 4 at 10 s too, rank 3's others are 1, 2, 2.5, 10: median 2.25; 6 < 3 x 2.25: not slow
    assert codes(SlowRanks()(at_step(4, numbers_all=numbers(1.0, 2.0, 2.5, 6.0)), empty(4)))[3] \
        == ["slow-rank@(model)"]
    found = SlowRanks()(at_step(5, numbers_all=numbers(1.0, 2.0, 2.5, 6.0, 10.0)), empty(5))
    assert codes(found) == [[], [], [], [], ["slow-rank@(model)"]]
    assert "the other ranks 2.25 s" in found.found[4][0].message


# -- ReplicaFindingsPlaced ------------------------------------------------------------------------
def test_a_replica_finding_is_placed_on_the_first_rank_it_is_about():
    drift = about(coded("replica-drift", "fc.weight", "rank 2 holds different values"), [2, 0])
    whole = coded("shard-imbalance", "fc.weight", "uneven")
    found = ReplicaFindingsPlaced()(at_step(3, measured=[drift, whole]), empty(3))
    assert codes(found) == [["shard-imbalance@fc.weight"], [], ["replica-drift@fc.weight"]]
    assert found.found[2][0] is drift


@pytest.mark.parametrize("rank", [2, 5])
def test_a_replica_finding_about_a_rank_beyond_the_world_goes_to_rank_0(rank):
    stray = about(coded("replica-drift", "fc.weight", f"rank {rank} differs"), [rank])
    found = ReplicaFindingsPlaced()(at_step(2, measured=[stray]), empty(2))
    assert codes(found) == [["replica-drift@fc.weight"], []]


# -- SpreadFolded ---------------------------------------------------------------------------------
def spread_case() -> ByRank:
    found = empty(2)
    found.found[0] = [coded("nonfinite-gradient", "fc", "NaN gradient"),
                      coded("nonfinite-parameter", "fc", "NaN weights"),
                      coded("loss-spike", "(model)", "the loss rose")]
    found.found[1] = [coded("nonfinite-forward", "fc", "fc made NaN"),
                      coded("nonfinite-gradient", "fc", "NaN gradient")]
    return found


def test_with_a_producer_named_the_spread_is_noted_as_seen_and_the_rest_kept():
    found = SpreadFolded()(at_step(2), spread_case())
    assert codes(found) == [["loss-spike@(model)"], ["nonfinite-forward@fc"]]
    assert [[f.code for f in fs] for fs in found.quiet] == [["nonfinite-gradient", "nonfinite-parameter"],
                                                            ["nonfinite-gradient"]]


def test_a_backward_producer_folds_the_spread_too():
    found = spread_case()
    found.found[1][0] = coded("nonfinite-backward", "fc", "fc's backward made NaN")
    found = SpreadFolded()(at_step(2), found)
    assert codes(found) == [["loss-spike@(model)"], ["nonfinite-backward@fc"]]


def test_without_a_producer_or_on_one_rank_nothing_is_folded():
    no_producer = spread_case()
    no_producer.found[1] = [coded("nonfinite-loss", "(model)", "the loss is NaN")]
    assert codes(SpreadFolded()(at_step(2), no_producer)) == [
        ["nonfinite-gradient@fc", "nonfinite-parameter@fc", "loss-spike@(model)"], ["nonfinite-loss@(model)"]]
    one = empty(1)
    one.found[0] = [coded("nonfinite-forward", "fc", "x"), coded("nonfinite-gradient", "fc", "y")]
    folded = SpreadFolded()(at_step(1), one)
    assert codes(folded) == [["nonfinite-forward@fc", "nonfinite-gradient@fc"]]
    assert folded.quiet == [[]]


# -- OriginFirst ----------------------------------------------------------------------------------
def test_the_rank_whose_loss_went_nan_is_told_first():
    found = empty(3)
    found.found[0] = [coded("nonfinite-gradient", "fc", "spread")]
    found.found[2] = [coded("nonfinite-loss", "(model)", "the loss is NaN")]
    assert OriginFirst()(at_step(3), found).order == [2, 0, 1]


def test_an_origin_that_goes_on_from_an_earlier_step_does_not_lead():
    found = empty(2)
    found.found[1] = [coded("nonfinite-loss", "(model)", "still NaN")]
    found.found[0] = [coded("nonfinite-forward", "fc", "new")]
    # rank 1's NaN loss began steps ago (not recorded again); rank 0's forward begins now
    starts = (lambda rank, f: rank == 0)
    assert OriginFirst()(at_step(2, starts=starts), found).order == [0, 1]
    assert OriginFirst()(at_step(2, starts=lambda rank, f: rank == 1), found).order == [1, 0]
    assert OriginFirst()(at_step(2, starts=lambda rank, f: False), found).order == [0, 1]


# -- LearningRateRose: a spike's message says when the learning rate rose -------------------------
def rose(history: list[list[float]], found: list[Finding]) -> list[Finding]:
    """``found`` as LearningRateRose leaves it at the last of the steps whose learning rates are ``history``
    (the findings only at that step)."""
    rule = LearningRateRose()
    for lrs in history[:-1]:
        rule(at_step(1, lrs=lrs), [])
    return rule(at_step(1, lrs=history[-1]), found)


def spike() -> Finding:
    return coded("loss-spike", "(model)", "the loss is 9")


def test_a_rise_of_exactly_4x_is_said_on_the_spike_only():
    other = coded("dead-gradient", "fc.weight", "no gradient")
    [said, kept] = rose([[0.1, 1.0], [0.1, 1.0], [0.4, 1.0]], [spike(), other])
    assert (said.code, said.where) == ("loss-spike", "(model)")
    assert said.message == ("the loss is 9; the learning rate rose 4x within the last 2 steps (param group "
                            "0: 0.1 -> 0.4): that change, by a scheduler or by hand, is the likely cause")
    assert kept is other
    assert rose([[0.1], [0.399]], [spike()])[0].message == "the loss is 9"


def test_a_rise_from_0_is_a_warm_up_and_its_lowest_non_zero_value_counts():
    assert rose([[0.0], [0.0], [5.0]], [spike()])[0].message == "the loss is 9"
    assert "(param group 0: 0.1 -> 0.4)" in rose([[0.0], [0.1], [0.4]], [spike()])[0].message


def test_a_param_group_added_at_this_step_has_no_past_to_rise_from():
    assert rose([[0.1], [0.1], [0.1, 50.0]], [spike()])[0].message == "the loss is 9"


# -- RankFailures: what rank 0 records of the other ranks when its watch closes --------------------
def meetings() -> tuple[Meeting, Meeting]:
    """Rank 0's and rank 1's check-ins of one watch, on one real in-memory store (as two processes of a
    2-rank job share the process group's store)."""
    from torch.distributed import HashStore

    store, pair = HashStore(), (Meeting(None, 0, 1, 60.0), Meeting(None, 1, 1, 60.0))
    for m in pair:
        m.store, m.world, m.others, m.tag = store, 2, [1 - m.rank], "inspector/watch/0,1/1"
    return pair


def closing(meeting: Meeting, error: BaseException | None = None) -> At:
    at = at_step(2, error=error)
    at.ranks.meeting = meeting
    return at


def test_a_rank_that_raised_is_recorded_by_rank_0_with_its_error_and_step():
    zero, one = meetings()
    one.ended(3, 4, RuntimeError("CUDA out of memory"))
    [(rank, f)] = RankFailures()(closing(zero), [])
    assert (rank, f.code, f.severity, f.where) == (1, "run-failed", "error", "(model)")
    assert f.message == "rank 1 failed at step 3 by RuntimeError: CUDA out of memory"
    assert RankFailures()(closing(one), []) == []  # only rank 0 records the others


def test_a_rank_that_ended_well_is_not_a_failure_and_one_named_apart_is_not_recorded_twice():
    zero, one = meetings()
    one.ended(3, 4, None)
    assert RankFailures()(closing(zero), []) == []
    zero, one = meetings()
    one.ended(3, 4, RuntimeError("boom"))
    apart = RanksApart("rank 1 is at step 2", [1], {})
    assert RankFailures()(closing(zero, apart), []) == []


def test_a_rank_that_vanished_while_a_collective_failed_is_named():
    zero, _ = meetings()  # rank 1 never tells how it ended
    [(rank, f)] = RankFailures()(closing(zero, RuntimeError("Connection closed by peer")), [])
    assert rank == 1 and f.message.startswith("rank 1 vanished (seen at no check-in) without an exception "
                                              "of its own: killed by a signal, out of memory")
