"""The loop checks of watch(): each planted bug is named at its step and module; each healthy loop is
silent. Tiny real models, real optimizers, the public API only."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from inspector import InspectorError, read_run, watch

STEPS = 12


class Small(nn.Module):
    # fc (4->8) -> bn (8) -> relu -> drop -> head (8->1)
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.fc(x)))))


def _data(steps: int = STEPS):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(steps, 16, 4, generator=g)
    return xs, xs.sum(-1, keepdim=True)


def _loop(model, opt, w, *, order="after", set_to_none=True, before=None, steps=STEPS, sched=None, log=True):
    xs, ys = _data(steps)
    for s in range(steps):
        if before:
            before(s)
        if order == "before":
            opt.zero_grad(set_to_none=set_to_none)
        loss = (model(xs[s]) - ys[s]).pow(2).mean()
        if order == "between":
            opt.zero_grad(set_to_none=set_to_none)
        loss.backward()
        if log:
            w.log(loss=loss)
        opt.step()
        if sched is not None:
            sched.step()
        if order == "after":
            opt.zero_grad(set_to_none=set_to_none)


def _micro_batches(model, x, y, parts: int) -> None:
    """One step's backward passes over ``parts`` equal slices of the batch (gradient accumulation)."""
    n = len(x) // parts
    for k in range(parts):
        ((model(x[k * n:(k + 1) * n]) - y[k * n:(k + 1) * n]).pow(2).mean() / parts).backward()


def _found(w, severity=("error", "warning")):
    return [(f.step, f.code, f.where) for f in w.findings if f.severity in severity]


@pytest.mark.parametrize("order", ["before", "between", "after"])
@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_healthy_loops_are_silent(tmp_path, order, set_to_none, opt_name):
    torch.manual_seed(0)
    model = Small()
    opt = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if opt_name == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-3))
    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, order=order, set_to_none=set_to_none)
    assert [f for f in _found(w) if f[1] != "loss-spike"] == []


def test_gradient_accumulation_cleared_each_step_is_silent(tmp_path):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs, ys = _data()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            _micro_batches(model, xs[s], ys[s], 4)  # four micro-batches, one step
            opt.step()
            opt.zero_grad()
    assert _found(w) == []


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradient_not_cleared_from_step_5(tmp_path, set_to_none):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = _data()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            if s < 5:  # cleared before steps 0..4; from step 5 on the old gradient stays
                opt.zero_grad(set_to_none=set_to_none)
            (model(xs[s]) - ys[s]).pow(2).mean().backward()
            opt.step()
    found = [f for f in _found(w) if f[1] == "gradient-not-cleared"]
    assert found == [(5, "gradient-not-cleared", "fc.weight")]


def test_gradients_cleared_through_data_are_cleared_and_not_clearing_them_is_found(tmp_path):
    """``p.grad.data.zero_()`` (an old idiom) zeroes the gradient without moving its version counter: it is
    clearing, with two micro-batches a step too; from step 5 on nothing clears the gradients."""
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = _data()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            for p in model.parameters():
                if p.grad is not None and s < 5:
                    p.grad.data.zero_()
            _micro_batches(model, xs[s], ys[s], 2)
            opt.step()
    assert _found(w) == [(5, "gradient-not-cleared", "fc.weight")]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradient_not_cleared_after_cleared_steps_and_an_evaluation_pass(tmp_path, set_to_none):
    """Steps 0..4 clear their gradients (the hooks may stand down for those steps); from step 5 an
    evaluation pass under no_grad and then the training forward run on the old gradients."""
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = _data()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            if s < 5:
                opt.zero_grad(set_to_none=set_to_none)
            model.eval()
            with torch.no_grad():
                model(xs[s])
            model.train()
            for k in range(2):  # two micro-batches, one step
                (model(xs[s][k * 8:(k + 1) * 8]) - ys[s][k * 8:(k + 1) * 8]).pow(2).mean().backward()
            opt.step()
    found = [f for f in _found(w) if f[1] == "gradient-not-cleared"]
    assert found == [(5, "gradient-not-cleared", "fc.weight")]


def test_closure_step_reads_this_steps_gradients(tmp_path):
    """A step given a closure (Lightning's automatic optimisation: forward, zero_grad, backward inside
    optimizer.step) records the gradient that step computed, not the last step's."""
    torch.manual_seed(0)
    lin = nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)
    x = torch.tensor([[3.0, 4.0]])
    with watch(lin, opt, tmp_path / "r.inspect") as w:
        for scale in (1.0, 2.0, 3.0):
            def closure(scale=scale):
                opt.zero_grad()
                loss = lin(x).sum() * scale  # d loss / d w = scale * (3, 4): norm 5 * scale
                loss.backward()
                return loss
            opt.step(closure)
    steps = read_run(tmp_path / "r.inspect").steps
    assert steps["grad_norm"].tolist() == pytest.approx([5.0, 10.0, 15.0])
    assert _found(w) == [(1, "no-update", "(model)")]  # lr 0 keeps the weights (and the numbers) fixed


def test_lr_zero_is_no_update(tmp_path):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0)  # a warm-up written wrong
    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, sched=sched)
    assert _found(w) == [(1, "no-update", "(model)")]


def test_warmup_from_zero_is_not_no_update(tmp_path):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step / 5))  # lr 0 at step 0 only
    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, sched=sched)
    assert [f for f in _found(w) if f[1] == "no-update"] == []


def test_updates_below_bf16_precision_are_no_update(tmp_path):
    torch.manual_seed(0)
    # no zero-initialised tensor (a 0 would move): weights near 0.1-0.5, where 1e-6 rounds away in bfloat16
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    xs, ys = _data()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            (model(xs[s].bfloat16()) - ys[s].bfloat16()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _found(w) == [(1, "no-update", "(model)")]
    assert "none of the 4 parameters with a gradient changed in 2 steps" in w.findings[0].message


class Gan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4))
        self.disc = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))


def _gan(tmp_path, step_disc: bool | int):
    torch.manual_seed(0)
    gan = Gan()
    opt_g = torch.optim.Adam(gan.gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(gan.disc.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    with watch(gan, [opt_g, opt_d], tmp_path / "gan.inspect") as w:
        for s in range(STEPS):
            real, z = torch.randn(16, 4) + 2, torch.randn(16, 2)
            opt_d.zero_grad()
            fake = gan.gen(z).detach()
            d_loss = bce(gan.disc(real), torch.ones(16, 1)) + bce(gan.disc(fake), torch.zeros(16, 1))
            d_loss.backward()
            if step_disc is True or s < step_disc:
                opt_d.step()
            opt_g.zero_grad()
            g_loss = bce(gan.disc(gan.gen(z)), torch.ones(16, 1))
            g_loss.backward()
            w.log(loss=g_loss)
            opt_g.step()
    return w


def test_two_optimizers_healthy_and_one_never_stepped(tmp_path):
    assert _found(_gan(tmp_path, step_disc=True)) == []
    assert _found(_gan(tmp_path, step_disc=False)) == [(1, "optimizer-not-stepped", "disc.0.weight")]
    # it stepped with each of the generator's first 10 steps, then stopped: missing at 10, 11 -> named at 11
    assert _found(_gan(tmp_path, step_disc=10)) == [(11, "optimizer-not-stepped", "disc.0.weight")]


def _gan_steps(tmp_path, steps: int, disc_steps, frozen_until: int = 0):
    """A GAN whose discriminator trains (a backward on detached samples, then its step) at the steps
    ``disc_steps(s)`` says, frozen before ``frozen_until``; the generator steps every step."""
    torch.manual_seed(0)
    gan = Gan()
    gan.disc.requires_grad_(frozen_until == 0)
    opt_g = torch.optim.Adam(gan.gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(gan.disc.parameters(), lr=1e-3)
    with watch(gan, [opt_g, opt_d], tmp_path / "r.inspect") as w:
        for s in range(steps):
            if s == frozen_until:
                gan.disc.requires_grad_(True)
            if s >= frozen_until:
                opt_d.zero_grad()
                gan.disc(gan.gen(torch.randn(8, 2)).detach()).mean().backward()
                if disc_steps(s):
                    opt_d.step()
            opt_g.zero_grad()
            gan.disc(gan.gen(torch.randn(8, 2))).mean().backward()
            opt_g.step()
    return w


def test_a_critic_stepped_every_third_step_is_not_stalled(tmp_path):
    assert _found(_gan_steps(tmp_path, 24, lambda s: s % 3 == 0)) == []


def test_a_wgan_critic_stepped_five_times_per_generator_step_is_healthy(tmp_path):
    """The critic's optimizer given first (its steps are the steps), the generator stepped every fifth: the
    generator has no gradient before its first step, and the critic's output bias none ever (a mean
    difference does not change with a shift of the critic's output)."""
    torch.manual_seed(0)
    gan = Gan()
    opt_d = torch.optim.Adam(gan.disc.parameters(), lr=1e-4)
    opt_g = torch.optim.Adam(gan.gen.parameters(), lr=1e-4)
    with watch(gan, [opt_d, opt_g], tmp_path / "r.inspect") as w:
        for s in range(30):
            real, z = torch.randn(16, 4) + 2, torch.randn(16, 2)
            opt_d.zero_grad()
            (gan.disc(gan.gen(z).detach()).mean() - gan.disc(real).mean()).backward()
            opt_d.step()
            if s % 5 == 4:
                opt_g.zero_grad()
                (-gan.disc(gan.gen(z)).mean()).backward()
                opt_g.step()
    assert _found(w) == []


def _gan_adams(lr: float) -> tuple[Gan, torch.optim.Adam, torch.optim.Adam]:
    """A seeded GAN and an Adam for its generator and one for its discriminator."""
    torch.manual_seed(0)
    gan = Gan()
    return gan, torch.optim.Adam(gan.gen.parameters(), lr=lr), torch.optim.Adam(gan.disc.parameters(), lr=lr)


def _wgan_through(tmp_path, steps: int = 30, g_step: bool = True, g_zero: bool = True):
    """A WGAN whose critic's backward also reaches the generator (no ``detach()``: the generator's
    gradients pile up between its steps), the critic's optimizer first, the generator stepped every fifth
    step after clearing its gradients; ``g_step`` / ``g_zero``: that step / that clearing kept."""
    gan, opt_g, opt_d = _gan_adams(1e-4)
    with watch(gan, [opt_d, opt_g], tmp_path / "r.inspect") as w:
        for s in range(steps):
            real, z = torch.randn(16, 4) + 2, torch.randn(16, 2)
            opt_d.zero_grad()
            (gan.disc(gan.gen(z)).mean() - gan.disc(real).mean()).backward()
            opt_d.step()
            if s % 5 == 4:
                if g_zero:
                    opt_g.zero_grad()
                (-gan.disc(gan.gen(z)).mean()).backward()
                if g_step:
                    opt_g.step()
    return w


def test_a_wgan_whose_critic_backward_reaches_the_generator_is_healthy(tmp_path):
    """The critic's backward adds onto the generator's gradients at every step, and the generator's own
    step clears them first: no optimizer is stalled and no gradient the generator's step uses was added
    onto (judged at the generator's own steps, not at the critic's)."""
    assert _found(_wgan_through(tmp_path)) == []


def test_that_wgan_without_the_generator_step_or_its_clearing_is_named(tmp_path):
    """Its generator's step() gone: named once it got new gradients at two steps (the critic's first
    backward made them at step 0, its own backward anew after its zero_grad() at step 4, seen at 5). Its
    clearing gone: its step at 9 uses the very gradient its step at 4 used, added onto since, found at
    its own step and named at the critic's next (10)."""
    assert _found(_wgan_through(tmp_path, g_step=False)) == [(5, "optimizer-not-stepped", "gen.0.weight")]
    assert _found(_wgan_through(tmp_path, g_zero=False)) == [(10, "gradient-not-cleared", "gen.0.weight")]


def _second_forgotten(tmp_path, act: nn.Module, lr: float):
    """Two optimizers over a 3-4-1 network (``act`` between): the first, at ``lr``, cleared and stepped
    each step; the second never cleared nor stepped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), act, nn.Linear(4, 1))
    first = torch.optim.SGD(model[0].parameters(), lr=lr)
    second = torch.optim.SGD(model[2].parameters(), lr=0.1)
    with watch(model, [first, second], tmp_path / "r.inspect") as w:
        for _ in range(STEPS):
            first.zero_grad()
            model(torch.randn(8, 3)).pow(2).mean().backward()
            first.step()
    return w


def test_an_optimizer_forgotten_with_its_clearing_is_named_once_its_gradients_piled_up_for_10_steps(tmp_path):
    """The second optimizer is never cleared nor stepped: its gradients are there from step 0 and only
    added onto, as a generator's are between its steps; named at the 10th step with them (9)."""
    assert _found(_second_forgotten(tmp_path, nn.ReLU(), 0.1)) == [(9, "optimizer-not-stepped", "2.weight")]


def test_no_update_counts_only_the_parameters_of_optimizers_that_step(tmp_path):
    """The first optimizer's updates are below float32's precision (nothing moves); the second never
    steps (named by optimizer-not-stepped, not counted by no-update): no-update counts the first's 2."""
    found = [f for f in _second_forgotten(tmp_path, nn.Tanh(), 1e-30).findings if f.code == "no-update"]
    assert [(f.step, f.where) for f in found] == [(1, "(model)")]
    assert "none of the 2 parameters with a gradient changed" in found[0].message


def test_the_first_of_two_optimizers_not_cleared_is_named(tmp_path):
    """A GAN's first optimizer (the generator's) stops clearing its gradients at step 5; the second
    clears its own before its own backward: the first's parameters are named at step 5."""
    gan, opt_g, opt_d = _gan_adams(1e-3)
    with watch(gan, [opt_g, opt_d], tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            z = torch.randn(16, 2)
            opt_d.zero_grad()
            (gan.disc(gan.gen(z).detach()).mean() - gan.disc(torch.randn(16, 4)).mean()).backward()
            opt_d.step()
            if s < 5:
                opt_g.zero_grad()
            (-gan.disc(gan.gen(z)).mean()).backward()
            opt_g.step()
    found = [f for f in _found(w) if f[1] == "gradient-not-cleared"]
    assert found == [(5, "gradient-not-cleared", "gen.0.weight")]


def test_a_part_trained_from_a_later_stage_by_its_own_optimizer_is_waiting(tmp_path):
    """Stage two unfreezes the discriminator at step 6 and steps its optimizer from then on; an optimizer
    that never steps while its parameters get gradients is still named (the test above)."""
    assert _found(_gan_steps(tmp_path, STEPS, lambda s: True, frozen_until=6)) == []


def test_a_feature_extractor_run_under_no_grad_and_left_out_of_the_optimizer_is_frozen(tmp_path):
    """Linear probing: the encoder's parameters still require grad, no optimizer holds them and its
    forward runs under torch.no_grad(): frozen in effect, not a bug. From step 6 the loop also trains
    through it (no_grad dropped) and nothing applies its gradients: that is named."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"enc": nn.Sequential(nn.Linear(4, 8), nn.ReLU()), "head": nn.Linear(8, 1)})
    opt = torch.optim.Adam(model["head"].parameters(), lr=1e-3)
    xs, ys = _data()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            with torch.set_grad_enabled(s >= 6):
                features = model["enc"](xs[s])
            opt.zero_grad()
            (model["head"](features) - ys[s]).pow(2).mean().backward()
            opt.step()
    assert _found(w) == [(6, "not-in-optimizer", "enc.0.weight"), (6, "not-in-optimizer", "enc.0.bias")]


def test_a_frozen_backbone_in_eval_mode_is_on_purpose(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU()), nn.Linear(8, 1))
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[1].parameters(), lr=0.05)
    xs, ys = _data()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(STEPS):
            model[0].eval()  # frozen, with its BatchNorm's running statistics kept
            (model(xs[s]) - ys[s]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _found(w) == []


@pytest.mark.parametrize("plant", ["bn", "drop", "model"])
def test_module_left_in_eval_mode(tmp_path, plant):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def leave_in_eval(step):
        if step == 3:
            with torch.no_grad():  # a validation pass in eval mode, then training resumes without .train()
                (model if plant == "model" else getattr(model, plant)).eval()
                model(torch.randn(16, 4))

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=leave_in_eval)
    where = "(model)" if plant == "model" else plant
    assert _found(w) == [(3, "eval-mode-module", where)]


def test_eval_pass_under_no_grad_and_frozen_layer(tmp_path):
    torch.manual_seed(0)
    model = Small()
    model.fc.requires_grad_(False)  # frozen before the first step: information only
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)

    def validate(step):
        model.eval()
        with torch.no_grad():
            model(torch.randn(16, 4))
        model.train()

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=validate)
    assert _found(w) == []
    assert [(f.step, f.code, f.where) for f in w.findings if f.severity == "info"] == [
        (0, "frozen-parameters", "fc")]
    assert "40 parameter elements" in w.findings[0].message  # fc: 4 * 8 + 8


def test_head_replaced_mid_run_is_named(tmp_path):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def swap(step):
        if step == 4:
            model.head = nn.Linear(8, 1)  # the optimizer still holds the old head

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=swap)
    assert _found(w) == [(4, "parameters-replaced", "head.weight")]
    assert "1 module(s) (head)" in w.findings[0].message


def test_a_parent_replaced_above_the_owner_is_followed(tmp_path):
    # the parameters' owner (body.0) stays at its path's end; its parent (body) is swapped
    torch.manual_seed(0)
    model = nn.Sequential()
    model.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    model.head = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs, ys = _data(8)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(8):
            if s == 3:
                model.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh())  # not in the optimizer
            nn.functional.mse_loss(model(xs[s]), ys[s]).backward()
            opt.step()
            opt.zero_grad()
    assert _found(w) == [(3, "parameters-replaced", "body.0.weight")]
    run = read_run(tmp_path / "r.inspect")
    _, norms = run.matrix("param_norm")
    body = run.meta.modules.index("body.0")
    expected = float(torch.linalg.vector_norm(torch.cat([model.body[0].weight.detach().reshape(-1),
                                                         model.body[0].bias.detach().reshape(-1)])))
    assert norms[-1, body] == pytest.approx(expected, rel=1e-6)  # the new module's, read after the swap


def test_load_state_dict_assign_is_one_grouped_finding(tmp_path):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def reload(step):
        if step == 6:
            model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=reload)
    found = _found(w)
    assert found == [(6, "parameters-replaced", "fc.weight")]
    assert w.findings[0].message.startswith("6 parameters of 3 module(s) (fc, bn, head)")


def test_an_exception_is_recorded_as_run_failed(tmp_path):
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def crash(step):
        if step == 7:
            raise RuntimeError("CUDA out of memory (planted)")

    with pytest.raises(RuntimeError):
        with watch(model, opt, tmp_path / "r.inspect") as w:
            _loop(model, opt, w, before=crash)
    assert w.result is not None and not w.result.completed
    assert _found(w) == [(7, "run-failed", "(model)")]
    run = read_run(tmp_path / "r.inspect")
    failed = [f for f in run.findings if f.code == "run-failed"]
    assert [(f.step, f.severity) for f in failed] == [(7, "error")]
    assert failed[0].message == ("the run ended at step 7 by RuntimeError: CUDA out of memory (planted); "
                                 "every step before it is in the file")
    assert not run.complete and run.failure is not None and run.failure.step == 7


def test_a_finished_run_has_no_failure(tmp_path):
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, steps=3)
    run = read_run(tmp_path / "r.inspect")
    assert run.complete and run.failure is None


def test_hooks_gone_after_a_run_with_every_check(tmp_path):
    model = Small()
    opt_a = torch.optim.SGD(model.fc.parameters(), lr=0.05)
    opt_b = torch.optim.SGD(list(model.bn.parameters()) + list(model.head.parameters()), lr=0.05)
    with watch(model, [opt_a, opt_b], tmp_path / "r.inspect") as w:
        _loop(model, opt_a, w, steps=2)
    assert all(not p._backward_hooks for p in model.parameters())
    for o in (opt_a, opt_b):
        assert not o._optimizer_step_pre_hooks and not o._optimizer_step_post_hooks
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_bad_optimizer_lists_are_refused(tmp_path):
    with pytest.raises(InspectorError, match="empty list"):
        with watch(Small(), [], tmp_path / "r.inspect"):
            pass
    with pytest.raises(InspectorError, match="got str"):
        with watch(Small(), [torch.optim.SGD(Small().parameters(), lr=1), "adam"], tmp_path / "r.inspect"):
            pass


class NanBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.armed = False

    def forward(self, x):
        y = self.lin(x)
        return NanBackward.apply(y) if self.armed else y


@pytest.mark.parametrize("plant", ["backward", "forward"])
def test_nonfinite_gradient_without_the_producer_option(tmp_path, plant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Gate(), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def arm(step):
        model[1].armed = plant == "backward" and step == 4
        if plant == "forward" and step == 4:
            with torch.no_grad():
                model[0].bias[0] = float("inf")  # the forward turns non-finite: every gradient follows

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=arm, steps=6, log=False)  # no loss logged: gradients tell alone
    if plant == "forward":  # the weight written by hand is named at the step that used it, and nothing else
        assert _found(w)[0] == (4, "nonfinite-parameter", "0.bias")
        assert "written outside the optimizer" in w.findings[0].message
        assert not [f for f in _found(w) if f[0] == 4 and f[1] == "nonfinite-gradient"]
        return
    first = [f for f in _found(w) if f[1] == "nonfinite-gradient"][0]
    # backward: modules 0 and 1.lin get NaN, 3 (after the gate) stays finite -> the boundary is 1.lin
    assert first == (4, "nonfinite-gradient", "1.lin")


def test_a_gradient_cut_off_after_a_settled_run_is_named_at_once(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = _data(30)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(30):
            h = model[1](model[0](xs[s]))
            if s >= 24:
                h = h.detach()  # from step 24 on, nothing reaches layer 0
            (model[2](h) - ys[s]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    # a gradient at each of steps 0-23, none at 24 and 25: named at 25, not after the 5-step window
    assert _found(w) == [(25, "dead-gradient", "0.weight"), (25, "dead-gradient", "0.bias")]
    assert "at each of the 24 steps before" in w.findings[0].message


def test_a_whole_backbone_cut_off_is_one_dead_gradient_finding(tmp_path):
    # 4 Linear layers (8 parameters) behind a detach() from step 24 on: one finding naming them all,
    # not eight, placed where the gradient stops (the last layer before the detach); the head, which
    # keeps its gradient, is not named
    torch.manual_seed(0)
    backbone = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(4)])
    model = nn.Sequential(backbone, nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = _data(30)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(30):
            h = backbone(xs[s])
            if s >= 24:
                h = h.detach()
            (model[1](h) - ys[s]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _found(w) == [(25, "dead-gradient", "0.3.0.weight")]
    message = w.findings[0].message
    assert message.startswith("8 parameters of 4 module(s) (0.0.0, 0.1.0, 0.2.0 and 1 more) each had a "
                              "gradient")
    assert "cut them off" in message
    assert "The gradient stops at 0.3.0's output" in message  # the head still has its input: a cut
    run = read_run(tmp_path / "r.inspect")
    assert [(f.step, f.code, f.where) for f in run.findings] == [(25, "dead-gradient", "0.3.0.weight")]


@pytest.mark.parametrize("how", ["fill", "data"])
def test_a_weight_written_non_finite_between_steps_is_named_at_the_step_that_used_it(tmp_path, how):
    # default options: after the step every weight is NaN, so only a read before the step names the cause
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def corrupt(step):
        if step == 6:
            with torch.no_grad():
                if how == "fill":
                    model.head.weight.fill_(float("inf"))
                else:  # a swap of the storage, which keeps the version counter of the new tensor
                    model.head.weight.data = torch.full_like(model.head.weight, float("nan"))

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=corrupt, steps=8)
    errors = [f for f in _found(w, ("error",)) if f[0] == 6]
    assert errors == [(6, "nonfinite-parameter", "head.weight")]  # the loss and gradients only followed
    assert "held NaN/Inf when this step began" in w.findings[0].message
    run = read_run(tmp_path / "r.inspect")
    assert [(f.step, f.code, f.where) for f in run.findings if f.step == 6] == errors


def test_weights_clamped_between_steps_are_read_and_silent(tmp_path):
    # a WGAN-style clamp after each step writes every weight outside the optimizer: finite, so no finding
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def clamp(step):
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-0.5, 0.5)

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=clamp)
    assert [f for f in _found(w) if f[1] != "loss-spike"] == []


def test_a_nan_in_the_batch_is_named_with_default_options(tmp_path):
    # the batch given as keyword arguments (as the Trainer does); the watch reads each floating input's range
    class ByName(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = Small()

        def forward(self, pixel_values=None, labels=None):
            return (self.net(pixel_values) - labels).pow(2).mean()

    torch.manual_seed(0)
    model = ByName()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs, ys = _data(8)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for s in range(8):
            x = xs[s].clone()
            if s == 5:
                x[3, 1] = float("nan")
            loss = model(pixel_values=x, labels=ys[s])
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    errors = [f for f in _found(w, ("error",)) if f[0] <= 5]
    # the cause first; the loss is not a second one; then what the step's update spread: every parameter
    # (one finding) and BatchNorm's running statistics (one finding)
    assert errors == [(5, "nonfinite-forward", "(batch)"), (5, "nonfinite-parameter", "net.fc.weight"),
                      (5, "nonfinite-parameter", "net.bn.running_mean")]
    assert "already holds NaN/Inf" in [f for f in w.findings if f.step == 5][0].message


def test_evaluation_batches_are_not_judged(tmp_path):
    # a NaN in a batch the model sees in eval mode under no_grad is not the training batch
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    bad = torch.full((4, 4), float("nan"))

    def validate(step):
        model.eval()
        with torch.no_grad():
            model(bad)
        model.train()

    with watch(model, opt, tmp_path / "r.inspect") as w:
        _loop(model, opt, w, before=validate)
    assert [f for f in _found(w) if f[1] != "loss-spike"] == []


@pytest.mark.parametrize("nonfinite", [False, True])
def test_a_minus_inf_mask_in_the_batch_is_not_a_producer(tmp_path, nonfinite):
    # an additive attention mask of -inf (a common way to write one) reaches neither the loss nor a
    # gradient: the batch holds -inf, nothing goes non-finite, and nothing is named
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.score = nn.Linear(4, 6)
            self.head = nn.Linear(6, 1)

        def forward(self, x, mask=None):
            weights = torch.softmax(self.score(x) + mask, dim=-1)
            return self.head(weights)

    torch.manual_seed(0)
    model = Masked()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs, ys = _data(12)
    mask = torch.zeros(16, 6)
    mask[:, 4:] = float("-inf")
    with watch(model, opt, tmp_path / "r.inspect", nonfinite=nonfinite) as w:
        for s in range(12):
            loss = (model(xs[s], mask=mask) - ys[s]).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    assert [f for f in _found(w) if f[1] != "loss-spike"] == []


# -- the distributed step check, asked for on one process ---------------------------------------
def test_the_distributed_step_check_asked_for_on_one_process_names_rank_0(tmp_path):
    # distributed=True without a process group: the step check compares this one process's numbers and
    # names the NaN gradient planted at step 2 with its rank and counts
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    with watch(model, opt, tmp_path / "r.inspect", distributed=True) as w:
        for step in range(3):
            loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()
            loss.backward()
            if step == 2:
                model[2].weight.grad[0, 0] = float("nan")
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    by_rank = [f for f in w.findings if f.code == "nonfinite-gradient" and f.where == "2.weight"]
    assert [(f.step, f.rank) for f in by_rank] == [(2, 0)]
    assert by_rank[0].message.startswith(
        "the gradient of 2.weight is not finite on rank 0 (rank 0: 1 NaN, 0 Inf in the local piece). The "
        "next optimizer step spreads it to the weights")


def test_a_watch_without_an_optimizer_names_no_parameter_as_left_out(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with watch(model, None, tmp_path / "r.inspect") as w:
        for step in range(4):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
            if step != 1:  # step 2 adds onto step 1's gradients: no optimizer holds them, nothing to say
                model.zero_grad()
    assert [f.code for f in w.findings if f.severity in ("warning", "error")] == []


def test_the_distributed_step_check_on_one_process_reads_the_loss_and_writes_no_file_of_its_own(
        tmp_path, monkeypatch):
    # a NaN loss at step 2: the step check is handed this rank's loss, so it says the loss is not finite
    # (not "every rank's values are finite"); it writes no run file of its own in the working folder
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    with watch(model, opt, tmp_path / "r.inspect", distributed=True) as w:
        for step in range(3):
            loss = model(torch.randn(8, 4, generator=g)).pow(2).mean() * (math.nan if step == 2 else 1.0)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    by_rank = [f for f in w.findings if f.code == "nonfinite-gradient" and "on rank 0" in f.message]
    assert [f.step for f in by_rank] == [2]
    assert by_rank[0].message == (
        "the gradients of 4 tensors are not finite on rank 0 (0.weight, 0.bias, 2.weight and 1 more): "
        "non-finite values spread through the forward pass and the gradient reduction. The loss is not "
        "finite on every rank: look at the model's forward pass and the batches.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.inspect"]
