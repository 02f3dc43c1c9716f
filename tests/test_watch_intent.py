"""Checks that tell a bug from a recipe done on purpose: a step on zeroed gradients, a param group at lr
0, a norm layer frozen in eval mode. Each has a planted bug that must fire and healthy recipes that must
stay silent, through the public ``watch``."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from inspector import InspectorError, watch
from inspector.watching import WATCH_CHECKS, read_run

LearningRateRose = next(r.check for r in WATCH_CHECKS if r.check.__name__ == "LearningRateRose")


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


def _batch(i: int) -> torch.Tensor:
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(i))


def _alarms(result) -> list[tuple[int, str, str]]:
    return [(f.step, f.code, f.where) for f in result.findings if f.severity in ("warning", "error")]


# -- zero-gradient-step ---------------------------------------------------------------------------
@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_between_backward_and_step_is_named_at_once_and_nothing_else(tmp_path, set_to_none):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(10):
            w.log(loss=model(_batch(i)).pow(2).mean())
            model(_batch(i)).pow(2).mean().backward()
            opt.zero_grad(set_to_none=set_to_none)  # the bug: the step below uses no gradient
            opt.step()
    found = _alarms(w.result)
    # step 0, at the first trainable parameter; no dead-gradient 4 steps later, no gradient-not-cleared
    assert found == [(0, "zero-gradient-step", "0.weight")]
    had = "no gradient" if set_to_none else "no gradient or an all-zero one"
    assert w.result.findings[0].message == ZEROED.replace("all 2", "all 4").replace("no gradient", had)


def _zeroed_before_step(tmp_path, head_only: bool, freeze_at: int | None = None) -> list:
    """zero_grad() between backward() and step() from step 2 on; the optimizer holds the head only, or
    everything with the first layer frozen at ``freeze_at``: the zero-gradient-step findings."""
    model = _mlp()
    opt = torch.optim.SGD(model[2].parameters() if head_only else model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(4):
            if i == freeze_at:
                model[0].requires_grad_(False)
            model(_batch(i)).pow(2).mean().backward()
            if i >= 2:
                opt.zero_grad()
            opt.step()
            opt.zero_grad()
            model.zero_grad()
    return [(f.step, f.where, f.message) for f in w.result.findings if f.code == "zero-gradient-step"]


ZEROED = ("the optimizer stepped while all 2 trainable parameters it holds had no gradient: this step moved "
          "nothing. optimizer.zero_grad() between loss.backward() and optimizer.step() does this (call it "
          "before backward() or after step()); so does a backward that never ran or a loss that does not "
          "depend on the parameters")


def test_a_step_on_zeroed_gradients_counts_only_what_the_optimizer_holds(tmp_path):
    # the first layer keeps its gradient (the optimizer does not hold it): the step still moved nothing
    assert _zeroed_before_step(tmp_path, head_only=True) == [(2, "2.weight", ZEROED)]


def test_a_step_on_zeroed_gradients_counts_only_parameters_that_require_grad(tmp_path):
    # the first layer frozen at step 1, still in the optimizer: two trainable parameters are left
    assert _zeroed_before_step(tmp_path, head_only=False, freeze_at=1) == [(2, "2.weight", ZEROED)]

def test_zero_gradient_step_stays_silent_on_healthy_loops(tmp_path):
    # zero_grad before the forward, after the step, accumulation over two backward passes, a frozen part
    model = _mlp()
    model[0].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(12):
            if i % 2 == 0:
                opt.zero_grad()
            model(_batch(i)).pow(2).mean().backward()
            model(_batch(i + 100)).pow(2).mean().backward()
            opt.step()
            if i % 2 == 0:
                opt.zero_grad(set_to_none=False)  # the odd step starts from zeroed gradients
    assert _alarms(w.result) == []


# -- a param group at lr 0 ------------------------------------------------------------------------
def test_a_param_group_at_lr_zero_while_the_others_train_is_named(tmp_path):
    model = _mlp()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                           {"params": model[2].parameters(), "lr": 0.0}])  # the head never learns
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(6):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == [(1, "no-update", "2.weight")]
    assert w.result.findings[0].message == IDLE.format("2")


IDLE = ("param group 1 (holding 2 parameters with a gradient, of {}) has had lr 0 for 2 steps while other "
        "groups train: its parameters never change. Check that group's lr and the scheduler's lambda for it "
        "(freeze a part with requires_grad_(False) instead)")


def test_a_param_group_at_lr_zero_names_its_modules_by_their_full_names(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 1)))
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                           {"params": model[2].parameters(), "lr": 0.0}])
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(3):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == [(1, "no-update", "2.0.weight")]
    assert w.result.findings[0].message == IDLE.format("2.0")


def test_a_param_group_at_lr_zero_whose_gradients_are_all_zero_is_not_called_idle(tmp_path):
    # the group at lr 0 gets gradients of zeros (its branch is multiplied by 0): nothing of it would move
    # at any lr, so it is not a group left out by its lr (the zeros are dead-gradient's to name)
    model, side = _mlp(), nn.Linear(4, 1)
    opt = torch.optim.SGD([{"params": model.parameters(), "lr": 0.1},
                           {"params": side.parameters(), "lr": 0.0}])
    root = nn.ModuleDict({"model": model, "side": side})
    with watch(root, opt, tmp_path / "run.inspect") as w:
        for i in range(4):
            x = _batch(i)
            (model(x).pow(2).mean() + 0 * side(x).sum()).backward()
            assert side.weight.grad is not None and not side.weight.grad.any()
            opt.step()
            opt.zero_grad()
    assert [f for f in w.result.findings if f.code == "no-update"] == []


def test_groups_warming_up_from_zero_and_decaying_to_zero_are_silent(tmp_path):
    model = _mlp()
    opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters()}], lr=0.1)
    steps = 20
    # group 0 warms up from 0 over 5 steps; group 1 decays linearly to 0 at the last step
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: min(1.0, s / 5), lambda s: 1 - s / (steps - 1)])
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(steps):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
    assert _alarms(w.result) == []


# -- a module whose weights never move ------------------------------------------------------------
def _two_rates(tmp_path, dtype: torch.dtype, steps: int = 8, nested: bool = False):
    """The head at lr 1e-6 while the rest trains at 0.1: in bfloat16 the head's updates are below its
    weights' precision (its weights near 0.3, bfloat16's step there about 0.002), in float32 they are not.
    ``nested``: the head is a Linear inside a Sequential (``2.0``)."""
    model = _mlp()
    if nested:
        model[2] = nn.Sequential(model[2])
    model = model.to(dtype)
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                           {"params": model[2].parameters(), "lr": 1e-6}])
    head = model[2].get_parameter("0.weight" if nested else "weight").detach().clone()
    norms = []  # the head's gradient norm (weight and bias together) at each step
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(steps):
            model(_batch(i).to(dtype)).pow(2).mean().backward()
            norms.append(torch.cat([p.grad.double().flatten() for p in model[2].parameters()]).norm().item())
            opt.step()
            opt.zero_grad()
    return w.result, torch.equal(head, model[2].get_parameter("0.weight" if nested else "weight")), norms


def test_a_module_whose_weights_never_move_is_named(tmp_path):
    result, unmoved, norms = _two_rates(tmp_path, torch.bfloat16)
    assert unmoved  # the plant: not one of the head's weights moved
    assert _alarms(result) == [(3, "no-update", "2.weight")]
    assert result.findings[0].message == (
        f"2's weights (bfloat16) have not changed in 3 steps although their gradient is non-zero (norm "
        f"{norms[3]:.3g}) and their lr is 1e-06, while the rest of the model trains: each update is below "
        "the weights' precision (bfloat16 weights: keep float32 master weights, or raise this part's lr), or "
        "something puts the weights back after each step")


def test_a_nested_module_whose_weights_never_move_is_named_by_its_full_name(tmp_path):
    result, unmoved, norms = _two_rates(tmp_path, torch.bfloat16, nested=True)
    assert unmoved and _alarms(result) == [(3, "no-update", "2.0.weight")]
    assert result.findings[0].message.startswith("2.0's weights (bfloat16) have not changed in 3 steps")


def test_two_modules_whose_weights_never_move_are_both_named(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    model = model.to(torch.bfloat16)
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                           {"params": [*model[2].parameters(), *model[4].parameters()], "lr": 1e-6}])
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(8):
            model(_batch(i).to(torch.bfloat16)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    still = [(f.step, f.where) for f in w.result.findings if "have not changed" in f.message]
    assert still == [(3, "2.weight"), (3, "4.weight")]


def test_a_module_with_a_small_lr_that_moves_is_silent(tmp_path):
    result, unmoved, _ = _two_rates(tmp_path, torch.float32)
    assert not unmoved and _alarms(result) == []


def test_a_second_optimizer_that_steps_every_fifth_step_is_not_a_module_standing_still(tmp_path):
    # a GAN's pattern: the critic steps every step (the watch's steps), the generator every fifth
    torch.manual_seed(0)
    critic, generator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), nn.Linear(4, 4)
    model = nn.ModuleDict({"critic": critic, "generator": generator})
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    with watch(model, [opt_c, opt_g], tmp_path / "run.inspect") as w:
        for i in range(12):
            critic(generator(_batch(i))).mean().backward()
            opt_c.step()
            if i % 5 == 0:  # as WGAN loops do: the generator after every fifth critic step
                opt_g.step()
            opt_c.zero_grad()
            opt_g.zero_grad()
    assert _alarms(w.result) == []


def test_a_frozen_group_at_lr_zero_is_not_named(tmp_path):
    model = _mlp()
    model[2].requires_grad_(False)
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                           {"params": model[2].parameters(), "lr": 0.0}])
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(6):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == []


# -- norm layers kept in eval mode on purpose -----------------------------------------------------
class _Net(nn.Module):
    def __init__(self, norm_eval: bool, freeze_affine: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)
        self.norm_eval = norm_eval
        if freeze_affine:
            self.bn.requires_grad_(False)

    def train(self, mode: bool = True) -> _Net:  # the detection recipe: norm_eval=True
        super().train(mode)
        if mode and self.norm_eval:
            self.bn.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.conv(x)).mean((2, 3)))


def _conv_run(tmp_path, net: nn.Module):
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.01)
    net.train()
    with watch(net, opt, tmp_path / "run.inspect") as w:
        for i in range(4):
            x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(i))
            net(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return w.result


def test_batchnorm_in_eval_with_its_affine_frozen_is_intent(tmp_path):
    assert _alarms(_conv_run(tmp_path, _Net(norm_eval=True, freeze_affine=True))) == []


def test_batchnorm_in_eval_with_its_affine_training_is_named(tmp_path):
    assert _alarms(_conv_run(tmp_path, _Net(norm_eval=True, freeze_affine=False))) == [
        (0, "eval-mode-module", "bn")]


def test_batchnorm_without_running_statistics_in_eval_is_intent(tmp_path):
    net = _Net(norm_eval=True, freeze_affine=False)
    net.bn = nn.BatchNorm2d(4, track_running_stats=False)  # eval mode uses the batch's statistics anyway
    assert _alarms(_conv_run(tmp_path, net)) == []


# -- an AMP GradScaler that skips every step ------------------------------------------------------
def _amp_run(tmp_path, overflow_from: int, init_scale: float, iterations: int = 40, every: int = 1):
    """A loop under ``GradScaler`` (on the CPU): from ``overflow_from`` on, every ``every``-th step's loss is
    Inf, so the scaler skips it. Returns the result, whether the optimizer stepped at each iteration,
    and the run file's steps."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    stepped: list[bool] = []
    with watch(model, opt, tmp_path / "run.inspect", scaler=scaler) as w:
        for i in range(iterations):
            bad = i >= overflow_from and (i - overflow_from) % every == 0
            loss = model(_batch(i)).pow(2).mean() * 50 * (float("inf") if bad else 1.0)
            scaler.scale(loss).backward()
            w.log(loss=loss.detach())
            before = model[0].weight.detach().clone()
            scaler.step(opt)
            scaler.update()
            stepped.append(not torch.equal(before, model[0].weight))
            opt.zero_grad()
    assert "update" not in vars(scaler)  # the class's update() is back
    return w.result, stepped, read_run(tmp_path / "run.inspect").steps


def test_a_scaler_that_skips_every_step_is_named(tmp_path):
    result, stepped, steps = _amp_run(tmp_path, overflow_from=20, init_scale=2.0**16)
    assert stepped[:20] == [True] * 20 and not any(stepped[20:])
    # every iteration is a row: a skipped one marked skipped, with the scale it overflowed at
    assert steps["step"].tolist() == list(range(40))
    assert steps["skipped"].tolist() == [False] * 20 + [True] * 20
    assert steps["scale"].tolist() == [2.0**16] * 21 + [2.0**(15 - k) for k in range(19)]
    assert steps["loss"].iloc[20:].tolist() == [math.inf] * 20  # the loss logged for the skipped steps
    assert _alarms(result) == [(29, "scaler-skipping", "(model)")]  # the tenth skip in a row
    # from the scale the first skipped row records (2^16, the one it overflowed at) to get_scale() after
    # the tenth skip's update() (2^6)
    assert result.findings[0].message == (
        "the GradScaler skipped the last 10 optimizer steps in a row (its scale fell from 6.55e+04 to 64): "
        "the gradients hold Inf/NaN at every step, so optimizer.step() is never called and the model no "
        "longer trains. Find the overflow (watch with nonfinite=True names the module), lower the learning "
        "rate, or train in bfloat16")


def test_ten_skips_on_and_off_above_the_floor_are_not_skips_in_a_row(tmp_path):
    # every other step overflows from step 4: 18 skips, never two in a row, the scale from 2^20 to 2^2
    result, stepped, steps = _amp_run(tmp_path, overflow_from=4, init_scale=2.0**20, every=2)
    assert int(steps["skipped"].sum()) == 18 and steps["scale"].min() >= 2.0
    assert _alarms(result) == []


def test_a_scaler_skipping_on_and_off_is_named_when_its_scale_falls_under_the_floor(tmp_path):
    # every other step overflows: never ten in a row, but the scale halves every two steps
    result, stepped, steps = _amp_run(tmp_path, overflow_from=4, init_scale=2.0**8, every=2)
    assert stepped[4:10] == [False, True] * 3
    fell = int(steps.loc[steps["skipped"] & (steps["scale"] < 2.0), "step"].iloc[0])  # scale 1 skipped there
    assert _alarms(result) == [(fell, "scaler-skipping", "(model)")]
    assert result.findings[0].message == (
        f"the GradScaler's scale fell to 0.5, under 1: it skipped 9 of the {fell + 1} steps so far, on and "
        "off, and halves at each skip faster than it grows back, so an overflow comes back whatever the "
        "scale. Find it (watch with nonfinite=True names the module), lower the learning rate, or train in "
        "bfloat16")


def test_a_scaler_that_skips_from_the_first_step_is_named_at_its_tenth_skip(tmp_path):
    result, stepped, steps = _amp_run(tmp_path, overflow_from=0, init_scale=2.0**16, iterations=12)
    assert not any(stepped) and steps["skipped"].all()
    assert _alarms(result) == [(9, "scaler-skipping", "(model)")]


def test_a_scaler_settling_from_a_huge_scale_is_silent(tmp_path):
    # the usual early skips: the scale halves until the scaled gradients fit in float32
    result, stepped, steps = _amp_run(tmp_path, overflow_from=10**6, init_scale=2.0**127)
    skipped = stepped.index(True)
    assert 2 <= skipped < 10 and all(stepped[skipped:])
    assert steps["skipped"].tolist() == [True] * skipped + [False] * (40 - skipped)
    assert _alarms(result) == []


# -- experts whose gradients come and go ----------------------------------------------------------
class _MoE(nn.Module):
    """Top-1 noisy routing over four experts in a ModuleList: an expert given no token this step gets no
    gradient (it is not called)."""

    def __init__(self, dead_expert: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(4, 8)
        self.gate = nn.Linear(8, 4)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4))
        self.head = nn.Linear(8, 1)
        self.dead_expert = dead_expert  # from step 60, the router never picks it (a bug)
        self.step = 0
        self.idle: list[set[int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        logits = self.gate(h) + torch.randn(h.shape[0], 4, generator=self.noise)
        if self.dead_expert is not None and self.step >= 60:
            logits[:, self.dead_expert] = -1e9
        pick = logits.argmax(-1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows = pick == e
            if rows.any():
                out[rows] = expert(h[rows]) * torch.softmax(logits[rows], -1)[:, e:e + 1]
        self.idle.append(set(range(4)) - set(pick.tolist()))
        self.step += 1
        return self.head(out)


def _moe_run(tmp_path, model: _MoE, steps: int = 150):
    model.noise = torch.Generator().manual_seed(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(steps):
            model(_batch(i)).pow(2).mean().backward()  # 8 tokens for 4 experts: one is idle now and then
            opt.step()
            opt.zero_grad()
    return w.result


def test_experts_idle_for_a_few_steps_are_not_dead(tmp_path):
    model = _MoE()
    result = _moe_run(tmp_path, model)
    idle_late = [i for i, idle in enumerate(model.idle) if i >= 25 and idle]
    assert len(idle_late) > 10  # experts do go idle, after settled runs too
    assert _alarms(result) == []


def test_an_expert_the_router_never_picks_again_is_dead(tmp_path):
    model = _MoE(dead_expert=2)
    found = _alarms(_moe_run(tmp_path, model))
    assert [(code, where) for _, code, where in found] == [("dead-gradient", "experts.2.0.weight"),
                                                          ("dead-gradient", "experts.2.0.bias")]
    longest = max(len(list(g)) for k, g in itertools.groupby(2 in idle for idle in model.idle[:60]) if k)
    assert found[0][0] - 60 <= max(10, 3 * longest + 2)


# -- a new optimizer built mid-run ----------------------------------------------------------------
def _two_phases(tmp_path, hand_over: bool):
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(12):
            if i == 6:  # phase two: a new optimizer over the same parameters
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                if hand_over:
                    w.use_optimizer(opt)
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return w.result


def test_a_new_optimizer_not_handed_over_is_said_at_once(tmp_path):
    result = _two_phases(tmp_path, hand_over=False)
    assert result.steps == 6
    assert _alarms(result) == [(6, "optimizer-lost", "0.weight")]
    assert "w.use_optimizer(new_optimizer)" in result.findings[0].message


def test_a_new_optimizer_over_part_of_the_model_is_said_with_what_it_holds(tmp_path):
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(12):
            if i == 6:  # a new optimizer for the head only
                opt = torch.optim.SGD(model[2].parameters(), lr=0.01)
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == [(6, "optimizer-lost", "2.weight")]
    assert w.result.findings[0].message == (
        "another optimizer (SGD, holding 2 parameters, 2 of them the watched optimizer's) stepped after step "
        "5, the last the watch saw: a new optimizer built mid-run. The watch follows the optimizer it was "
        "given, which no longer steps, so it lost track: the run file records no step from here. Hand it the "
        "new one with w.use_optimizer(new_optimizer)")


def test_a_new_optimizer_handed_over_is_followed(tmp_path):
    result = _two_phases(tmp_path, hand_over=True)
    assert result.steps == 12 and len(result.run().steps) == 12
    assert _alarms(result) == []


class _Lookahead(torch.optim.Optimizer):
    """A wrapper whose step runs its inner optimizer's step (the watch is given the wrapper)."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner
        super().__init__([p for g in inner.param_groups for p in g["params"]], {"lr": 0.0})
        self.param_groups = inner.param_groups

    def step(self, closure=None):
        return self.inner.step(closure)


def test_an_inner_optimizer_and_a_critic_are_not_lost(tmp_path):
    model = _mlp()
    outer = _Lookahead(torch.optim.SGD(model[0].parameters(), lr=0.01))  # steps its inner one inside
    critic = torch.optim.SGD(model[2].parameters(), lr=0.01)  # given too; steps three times as often
    with watch(model, [outer, critic], tmp_path / "run.inspect") as w:
        for i in range(6):
            for _ in range(3):
                model(_batch(i)).pow(2).mean().backward()
                critic.step()
                critic.zero_grad()
            model(_batch(i)).pow(2).mean().backward()
            outer.step()
            outer.zero_grad()
    assert w.result.steps == 6
    assert _alarms(w.result) == []


def test_use_optimizer_needs_a_watched_optimizer(tmp_path):

    model = _mlp()
    with watch(model, None, tmp_path / "run.inspect") as w, pytest.raises(InspectorError, match="w.step"):
        w.use_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


# -- a learning rate raised a hundredfold ---------------------------------------------------------
def _lr_raised(tmp_path, at: int | None):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    target = torch.randn(8, 1, generator=torch.Generator().manual_seed(7))
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(40):
            if i == at:
                for g in opt.param_groups:
                    g["lr"] *= 100  # the bug: a scheduler or a config that multiplies instead of sets
            loss = (model(_batch(i)) - target).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return w.result


def test_a_spike_after_the_learning_rate_rose_says_so(tmp_path):
    found = [f for f in _lr_raised(tmp_path, at=30).findings if f.severity != "info"]
    # the spike comes a few steps later here: within the steps the rise is remembered
    assert found and all(30 <= f.step < 30 + LearningRateRose.steps for f in found)
    assert "the learning rate rose 100x within the last 5 steps (param group 0" in found[0].message


def test_a_steady_learning_rate_adds_nothing_to_a_message(tmp_path):
    assert not [f for f in _lr_raised(tmp_path, at=None).findings if "learning rate" in f.message]


# -- a part unfrozen mid-run ----------------------------------------------------------------------
@pytest.mark.parametrize("added", [False, True])
def test_a_part_unfrozen_and_never_added_to_the_optimizer_is_named(tmp_path, added):
    model = _mlp()
    model[0].requires_grad_(False)  # train the head first
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(8):
            if i == 4:
                model[0].requires_grad_(True)
                if added:  # the recipe: a new param group at a lower lr
                    opt.add_param_group({"params": list(model[0].parameters()), "lr": 0.001})
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == ([] if added else [(4, "not-in-optimizer", "0.weight")])
    if not added:
        assert next(f.message for f in w.result.findings if f.code == "not-in-optimizer") == (
            "2 parameter(s) of 0 were frozen when the watch started and now require grad, but no param group "
            "of the optimizer holds them: they never change. Add them with optimizer.add_param_group("
            "{'params': [...], 'lr': ...}) when you unfreeze them")


# -- a layer whose output died --------------------------------------------------------------------
def test_dead_units_are_placed_at_the_layer_whose_output_died(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                          nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(30):
            if i == 24:
                with torch.no_grad():
                    model[2].bias.fill_(-100.0)  # the second layer's ReLU never fires again
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    found = _alarms(w.result)
    assert found == [(25, "dead-gradient", "2.weight")]
    assert "The gradient stops at 2: its output is zero (4, which takes it" in w.result.findings[0].message


def test_an_optimizer_other_than_the_watched_one_from_the_first_step_is_said_before_it(tmp_path):
    # the optimizer handed to the watch is not the one the loop steps: lost before the first step
    model = _mlp()
    given = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stepped = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, given, tmp_path / "run.inspect") as w:
        for i in range(4):
            model(_batch(i)).pow(2).mean().backward()
            stepped.step()
            stepped.zero_grad()
    assert _alarms(w.result) == [(0, "optimizer-lost", "0.weight")]
    assert w.result.findings[0].message == (
        "another optimizer (SGD, holding 4 parameters, 4 of them the watched optimizer's) stepped before the "
        "first step: the loop steps another optimizer than the one the watch was given. The watch follows "
        "the optimizer it was given, which no longer steps, so it lost track: the run file records no step "
        "from here. Hand it the new one with w.use_optimizer(new_optimizer)")


# -- parameters no param group holds --------------------------------------------------------------
def test_two_parameters_left_out_from_the_start_are_each_named_and_not_called_replaced(tmp_path):
    # the head is left out of the optimizer when it is built: not-in-optimizer for each of its two
    # parameters at step 0, not one parameters-replaced (that is for tensors swapped in after step 0)
    model = _mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(3):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == [(0, "not-in-optimizer", "2.weight"), (0, "not-in-optimizer", "2.bias")]


def test_a_nested_part_unfrozen_and_never_added_is_named_by_its_full_module_name(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8)), nn.Linear(8, 1))
    model[0][2].requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(6):
            if i == 3:
                model[0][2].requires_grad_(True)
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == [(3, "not-in-optimizer", "0.2.weight")]
    assert next(f.message for f in w.result.findings if f.code == "not-in-optimizer").startswith(
        "2 parameter(s) of 0.2 were frozen when the watch started and now require grad")


def test_a_module_swapped_after_its_late_param_group_is_called_replaced(tmp_path):
    # the head is left out at first (named at step 0), added with add_param_group at step 3, then
    # swapped for a new Linear at step 6: its new tensors are replaced ones
    model = _mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(9):
            if i == 3:
                opt.add_param_group({"params": list(model[2].parameters())})
            if i == 6:
                model[2] = nn.Linear(8, 1)
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            model.zero_grad()  # the head's gradients too, while no param group holds it
    assert _alarms(w.result) == [(0, "not-in-optimizer", "2.weight"), (0, "not-in-optimizer", "2.bias"),
                                 (6, "parameters-replaced", "2.weight")]


def test_every_learning_rate_at_0_is_said_as_such(tmp_path):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with watch(model, opt, tmp_path / "run.inspect") as w:
        for i in range(3):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == [(1, "no-update", "(model)")]
    assert w.result.findings[0].message == (
        "every learning rate has been 0 for 2 steps: nothing trains. Check the scheduler (a warm-up that "
        "never leaves 0, a lambda that returns 0) and the lr given to the optimizer")


def test_a_scaler_without_get_scale_is_watched_without_the_skip_check(tmp_path):
    class PassThrough:  # a wrapper's own loss scaler: scale() only
        def scale(self, loss):
            return loss

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "run.inspect", scaler=PassThrough()) as w:
        for i in range(3):
            model(_batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _alarms(w.result) == [] and w.result.steps == 3
