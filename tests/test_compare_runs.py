"""compare on two run files: the first step where they part and the modules that part first."""

from __future__ import annotations

import numpy as np
import pytest

from inspector import InspectorError, RunComparison, compare
from inspector.__main__ import main
from inspector.watching import RunMeta, RunWriter, StepRecord

MODULES = ("embed", "block.0", "block.1", "head")


def write_run(path, *, part_at: int | None = None, steps: int = 10) -> str:
    """Gradient norms (1, 2, 3, 4) / (1 + step), loss 2 / (1 + step). From ``part_at`` on, block.1's
    norm grows (x1.5 at part_at, x2.5 one step later...), and from the step after, the loss is 20% higher."""
    meta = RunMeta(model="m", world_size=1, every=1, modules=MODULES,
                   parameters=tuple(m + ".weight" for m in MODULES), parameter_modules=(0, 1, 2, 3))
    with RunWriter(path, meta) as w:
        for s in range(steps):
            g = np.array([1.0, 2.0, 3.0, 4.0], np.float32) / (1 + s)
            loss = 2.0 / (1 + s)
            if part_at is not None and s >= part_at:
                g[2] *= 1.5 + s - part_at
                loss *= 1.2 if s > part_at else 1.0
            w.write(
                [
                    StepRecord(
                        step=s,
                        rank=0,
                        time=float(s),
                        loss=loss,
                        grad_norm=float(np.linalg.norm(g)),
                        module_grad_norm=g,
                        module_nonfinite=np.zeros(4, np.int32),
                        param_grad_norm=g,
                    )
                ]
            )
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    return (write_run(folder / "a.inspect"), write_run(folder / "b.inspect", part_at=6),
            write_run(folder / "same.inspect"), write_run(folder / "short.inspect", steps=4))


def test_runs_that_part_at_a_known_step(runs):
    a, b, _, _ = runs
    result = compare(a, b)
    assert isinstance(result, RunComparison)
    assert result.first_divergence == 6 and result.first_modules == ("block.1",)
    # at step 6 block.1 is 3/7 in A and 1.5 * 3/7 in B: |B - A| / max = 0.5 / 1.5 = 1/3
    table = result.modules.set_index("module")
    assert table.loc["block.1", "diff_at_divergence"] == pytest.approx(1 / 3, rel=1e-6)
    assert table["first_divergence"].isna().tolist() == [True, True, False, True]
    steps = result.steps.set_index("step")
    assert steps.loc[6, "loss_diff"] == 0 and steps.loc[7, "loss_diff"] == pytest.approx(0.2 / 1.2)
    f = result.findings[0]
    assert f.code == "run-diverged" and f.where == "block.1" and "step 6" in f.message
    # with a tolerance above 1/3 the module's step-6 jump is within it; the 20% loss gap is not, from step 7
    assert compare(a, b, tolerance=0.4).first_divergence == 7


def test_runs_that_agree_and_runs_of_different_length(runs):
    a, _, same, short = runs
    assert compare(a, same).codes() == ["runs-agree"]
    result = compare(a, short)
    assert result.first_divergence is None and set(result.codes()) == {"runs-agree", "steps-missing"}
    assert len(result.steps) == 10 and result.facts["common_steps"] == 4


def test_a_run_against_a_checkpoint_is_refused(runs, tmp_path):
    with pytest.raises(InspectorError, match="a.inspect is a run file but the other side is not"):
        compare(runs[0], "sample:tiny-gpt2")


def test_cli_compares_two_runs(runs, capsys):
    a, b, _, _ = runs
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "first divergence at step 6: grad_norm; modules first: block.1" in out and "run-diverged" in out


def test_two_check_step_run_files(world1, tmp_path):
    """check_step's run.jsonl (read through read_run): B's second layer gets 3x the gradient from step 2
    on."""
    import torch
    from torch import nn

    from inspector.distributed import check_step

    for name, part_at in (("a", None), ("b", 2)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        for step in range(4):
            model.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            if part_at is not None and step >= part_at:
                for p in model[1].parameters():
                    p.grad.mul_(3)
            check_step(model, step, tmp_path / f"{name}.jsonl")
    result = compare(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert result.first_divergence == 2 and result.first_modules == ("1",)
    assert result.steps["loss_a"].isna().all()  # check_step records no loss


def test_a_loss_that_turned_nan_is_a_divergence_not_a_gap(tmp_path):
    import math

    import torch

    from inspector import watch

    def run(path, nan_at):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 1))
        opt = torch.optim.SGD(
            model.parameters(), lr=0.0
        )  # the weights stay put: only the logged loss differs
        x = torch.ones(2, 3)
        with watch(model, opt, path) as w:
            for step in range(4):
                loss = model(x).pow(2).mean()
                loss.backward()
                w.log(loss=math.nan if step == nan_at else loss.item())
                opt.step()
                opt.zero_grad()
        return path

    a, b = run(tmp_path / "a.inspect", None), run(tmp_path / "b.inspect", 2)
    result = compare(str(a), str(b))
    assert result.first_divergence == 2 and result.first_modules == ()
    assert "nan in B" in result.findings[0].message
    assert compare(str(b), str(b)).codes() == ["runs-agree"]  # NaN in both at the same step agrees


def test_each_run_keeps_one_colour_in_both_panels_as_its_legend_shows(runs):
    from inspector.comparison import compare_runs
    from inspector.figures import run_divergence_figure
    from inspector.watching import read_run

    a, b, _, _ = runs
    result = compare_runs(read_run(a), read_run(b))
    fig = run_divergence_figure(result.steps, result.first_divergence, "a.inspect", "b.inspect")
    colours = {(t.name, t.yaxis): t.line.color for t in fig.data}
    assert colours[("a.inspect", "y")] == colours[("a.inspect", "y2")] != colours[("b.inspect", "y")]
    assert colours[("b.inspect", "y")] == colours[("b.inspect", "y2")]


def _watched(path, *, lr_at: int | None = None, nudge_at: int | None = None, steps: int = 6) -> str:
    """Linear(3, 1) on ones, SGD lr 0.1, watched. ``lr_at``: from that step the learning rate is 0.1001
    (only the recorded lr differs at that step; the weights part one step later). ``nudge_at``: the
    logged loss is 1e-5 higher (relative) at that step only."""
    import torch

    from inspector import watch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(2, 3)
    with watch(model, opt, path) as w:
        for step in range(steps):
            if step == lr_at:
                opt.param_groups[0]["lr"] = 0.1001
            loss = model(x).pow(2).mean()
            loss.backward()
            w.log(loss=loss.item() * (1 + 1e-5 if step == nudge_at else 1))
            opt.step()
            opt.zero_grad()
    return str(path)


def test_a_learning_rate_change_is_the_divergence_at_its_own_step(tmp_path, capsys):
    a, b = _watched(tmp_path / "a.inspect"), _watched(tmp_path / "b.inspect", lr_at=3)
    result = compare(a, b)
    assert result.first_divergence == 3 and result.first_quantities == ("lr_0",)
    assert "lr_0 is 0.1 in A and 0.1001 in B; the loss still agrees" in result.findings[0].message
    steps = result.steps.set_index("step")
    assert steps.loc[3, "lr_0_diff"] == pytest.approx(0.0001 / 0.1001)
    assert main(["compare", a, b, "--tolerance", "0"]) == 0
    assert "first divergence at step 3: lr_0" in capsys.readouterr().out


def test_the_default_tolerance_finds_a_small_difference_at_its_step_and_zero_finds_any(tmp_path):
    a, b = _watched(tmp_path / "a.inspect"), _watched(tmp_path / "b.inspect", nudge_at=2)
    result = compare(a, b)  # 1e-5 relative is beyond the default 1e-6
    assert result.first_divergence == 2 and result.first_quantities == ("loss",)
    assert compare(a, b, tolerance=1e-4).first_divergence is None
    assert compare(a, b, tolerance=0).first_divergence == 2
    assert compare(a, a, tolerance=0).codes() == ["runs-agree"]
    with pytest.raises(InspectorError, match="tolerance must be a finite number of 0 or more"):
        compare(a, b, tolerance=-1)


def test_run_json_is_strict_and_fits_the_schema(tmp_path):
    import json

    import jsonschema

    from inspector.comparison import JSON_SCHEMA

    a, b = _watched(tmp_path / "a.inspect"), _watched(tmp_path / "b.inspect", lr_at=2)
    out = tmp_path / "runs.json"
    assert main(["compare", a, b, "--json", str(out), "--fail-on", "warning"]) == 1  # run-diverged
    data = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    jsonschema.validate(data, JSON_SCHEMA)
    assert data["first_divergence"] == 2 and data["first_quantities"] == ["lr_0"]


def test_two_runs_of_100000_modules_compare_in_seconds(tmp_path):
    """Each module is looked up once (a set of B's modules built once, the module table column-wise):
    100,000 modules x 5 steps compare in well under a second here (over 120 s when a set was rebuilt
    per module); 30 s leaves room for a loaded machine."""
    import time

    from inspector.watching import synthetic_run

    for name, seed in (("a", 0), ("b", 1)):
        synthetic_run(tmp_path / f"{name}.inspect", steps=5, modules=100_000, seed=seed)
    start = time.perf_counter()
    result = compare(tmp_path / "a.inspect", tmp_path / "b.inspect")
    assert time.perf_counter() - start < 30
    assert len(result.modules) == 100_000 and result.first_divergence is not None
