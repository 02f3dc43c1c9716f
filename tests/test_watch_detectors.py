"""``loss-spike``, ``exploding-gradient`` and ``nonfinite-loss`` on real loops: silent on healthy MLP and
CNN+BatchNorm runs, one finding for one planted cause at the step it was planted, and the rule itself
(log scale, median and median absolute deviation, a warm-up) on numbers worked out by hand."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from inspector import watch
from inspector.utils import LOSS_LABEL, ROOT_LABEL
from inspector.watching import NOISE, WARM_UP, Detectors, Layout

SPIKY = {"loss-spike", "exploding-gradient"}


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 2 * 2, 2))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))


def _batch(kind: str, g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and a simple rule to learn: is the left half larger than the right half?"""
    if kind == "cnn":
        x = torch.randn(n, 1, 8, 8, generator=g)
        return x, (x[..., :4].mean((1, 2, 3)) > x[..., 4:].mean((1, 2, 3))).long()
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :8].sum(1) > x[:, 8:].sum(1)).long()


def _train(path, kind: str, seed: int, optimizer: str, *, steps: int = 200, batch: int = 32,
           plant=None, loss_fn=None, **options):
    """A real loop, ``w.log(loss=loss)`` each step; ``plant(step, model, loss)`` may change the loss
    before the backward (returns the loss) and ``plant`` is called again after it with ``loss=None``."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1000)
    model = _cnn() if kind == "cnn" else _mlp()
    opt = (torch.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-3))
    loss_fn = loss_fn or nn.functional.cross_entropy
    with watch(model, opt, path, **options) as w:
        for step in range(steps):
            x, y = _batch(kind, g, batch)
            loss = loss_fn(model(x), y)
            if plant is not None:
                loss = plant(step, model, loss)
            opt.zero_grad()
            loss.backward()
            if plant is not None:
                plant(step, model, None)
            w.log(loss=loss)
            opt.step()
    return w.result


def _found(result, codes):
    return [(f.step, f.code, f.where) for f in result.findings if f.code in codes]


@pytest.mark.parametrize(("kind", "optimizer", "seed", "batch"), [
    ("mlp", "sgd", 0, 16), ("mlp", "sgd", 2, 16), ("mlp", "adam", 0, 32), ("mlp", "adam", 1, 16),
    ("cnn", "sgd", 0, 16), ("cnn", "sgd", 2, 32), ("cnn", "adam", 0, 32), ("cnn", "adam", 1, 16),
])
def test_a_healthy_run_has_no_spike(tmp_path, kind, optimizer, seed, batch):
    """200 steps of SGD lr 0.1 or Adam 1e-3 learning a simple rule: the loss and the gradients are noisy,
    and nothing is a spike (the old rule, 3x the median from step 5, saw 1 or 2 loss spikes in each of
    the four SGD runs)."""
    result = _train(tmp_path / "r.inspect", kind, seed, optimizer, batch=batch)
    assert _found(result, SPIKY | {"nonfinite-loss"}) == []


def _loss_times_40(step, model, loss):
    return loss * 40.0 if loss is not None and step == 60 else loss


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_loss_40x_at_one_step_is_one_finding(tmp_path, kind, optimizer):
    """Every module's gradient grows 40x with the loss: one loss-spike at step 60 says so, and no
    exploding-gradient is listed (not one per module, not one for the model)."""
    result = _train(tmp_path / "r.inspect", kind, 0, optimizer, steps=80, plant=_loss_times_40)
    assert _found(result, SPIKY) == [(60, "loss-spike", ROOT_LABEL)]
    spike = next(f for f in result.findings if f.code == "loss-spike")
    assert "gradient grew about" in spike.message or "gradients grew about" in spike.message
    assert "x with it" in spike.message


def test_a_gradient_40x_at_one_step_without_a_logged_loss_is_one_model_finding(tmp_path):
    """The same cause with no loss logged: one exploding-gradient for the whole model, not three."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1000)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for step in range(80):
            x, y = _batch("mlp", g, 32)
            opt.zero_grad()
            (nn.functional.cross_entropy(model(x), y) * (40.0 if step == 60 else 1.0)).backward()
            opt.step()
    assert _found(w.result, SPIKY) == [(60, "exploding-gradient", ROOT_LABEL)]
    assert "every module's gradient grew about" in w.result.findings[0].message


@pytest.mark.parametrize(("kind", "module"), [("mlp", "2"), ("cnn", "4")])
def test_one_module_gradient_10x_is_that_module(tmp_path, kind, module):
    """One module's gradient is multiplied by 10 before the optimizer step at step 60 (the others are
    as they were): exploding-gradient names that module, and only it."""
    def plant(step, model, loss):
        if loss is None and step == 60:
            for p in model.get_submodule(module).parameters():
                p.grad.mul_(10.0)
        return loss

    result = _train(tmp_path / "r.inspect", kind, 0, "sgd", steps=80, plant=plant)
    assert _found(result, SPIKY) == [(60, "exploding-gradient", module)]


@pytest.mark.parametrize(("entropy", "shown"), [(False, "inf"), (True, "nan")])
def test_a_loss_with_log_0_is_nonfinite_loss_at_its_step(tmp_path, entropy, shown):
    """A custom loss takes log(p) of the right class; at step 30 one probability is set to 0: -log 0 is
    inf, and p log p (an entropy term) is 0 * -inf = nan. Either is nonfinite-loss at step 30, where
    (loss), and the message shows the value."""
    def loss_fn(logits, y, state={"step": 0}):  # noqa: B006 (counts the calls)
        p = logits.softmax(1).gather(1, y[:, None]).squeeze(1)
        if state["step"] == 30:
            p = torch.cat([p[:1] * 0, p[1:]])
        state["step"] += 1
        return -(p * p.log()).mean() if entropy else -p.log().mean()

    result = _train(tmp_path / "r.inspect", "mlp", 0, "sgd", steps=32, loss_fn=loss_fn)
    found = [(f.step, f.where) for f in result.findings if f.code == "nonfinite-loss"]
    assert found == [(30, LOSS_LABEL)]
    message = next(f.message for f in result.findings if f.code == "nonfinite-loss")
    assert f"the loss logged at this step is {shown}:" in message and "log(0)" in message


# -- the rule on numbers worked out by hand ------------------------------------------------------

def _detectors(modules: int = 1) -> Detectors:
    names = tuple(f"m{i}" for i in range(modules))
    return Detectors(Layout(tuple(f"{n}.weight" for n in names), names, np.arange(modules), ()))


def _losses(d: Detectors, values) -> list:
    return [f for v in values for f in d.loss(v)]


def test_the_constants_the_rule_is_written_for():
    assert (NOISE, WARM_UP) == (7.0, 10)


def test_nothing_is_judged_before_the_warm_up():
    # nine losses of 1, then 100: only nine seen, not judged; after ten, 100 is a spike
    assert _losses(_detectors(), [1.0] * 9 + [100.0]) == []
    d = _detectors()
    _losses(d, [1.0] * 10)
    [spike] = d.loss(100.0)
    # median of the logs 0 (the loss 1), deviation 0: the threshold is log 3, and log 100 = 4.61 is over it
    assert (spike.code, spike.where) == ("loss-spike", ROOT_LABEL)
    assert spike.message.startswith("the loss is 100, 100x its median over the last 10 steps (1)")


def test_a_noisy_loss_must_pass_its_own_noise():
    """Log-losses -0.5 and +0.5 five times each: median 0, median absolute deviation 0.5, so the threshold
    is max(log 3 = 1.10, 7 * 0.5 = 3.5) = 3.5 above the median 1. A loss of e^3 = 20.1 (20x, over the old
    3x) is the run's noise; e^4 = 54.6 is a spike."""
    past = [math.exp(-0.5), math.exp(0.5)] * 5
    d = _detectors()
    _losses(d, past)
    assert d.loss(math.exp(3.0)) == []
    d = _detectors()
    _losses(d, past)
    [spike] = d.loss(math.exp(4.0))
    assert "54.6x its median over the last 10 steps (1)" in spike.message


def test_a_nonfinite_loss_is_an_error_and_a_negative_loss_is_not_judged():
    d = _detectors()
    for value in (math.nan, math.inf, -math.inf):
        [f] = d.loss(value)
        assert (f.code, f.severity, f.where) == ("nonfinite-loss", "error", LOSS_LABEL)
        assert f.message == (
            f"the loss logged at this step is {value}: look for a log(0), a division by zero or a sqrt of a "
            "negative in the loss, a NaN or Inf in the batch, or an fp16 overflow (a larger loss scale, "
            "bf16); watch with nonfinite=True names the module that made it, if one did")
    assert _losses(d, [-1.0, 0.0] * 10) == [] and len(d.losses) == 0  # neither judged nor kept


def _grads(d: Detectors, norms) -> list:
    g = np.asarray(norms, dtype=np.float64)
    return d.gradients(g, np.ones(len(g), dtype=bool), g)


def _where(found) -> list[tuple[str, str]]:
    return [(f.code, f.where) for f in found]


def test_one_module_out_of_line_and_every_module_at_once():
    """Four modules with gradient norm 1 for ten steps (median log 0, deviation 0, threshold log 8)."""
    d = _detectors(4)
    for _ in range(10):
        assert _grads(d, [1, 1, 1, 1]) == []
    # m0 at 10: 1 of 4 modules over, itself
    [f] = _grads(d, [10, 1, 1, 1])
    assert (f.where, f.message[:45]) == ("m0", "gradient norm of m0 is 10x its median over th")
    # 3 of 4 at 40: the model, about 40x (median of the excesses log 40, log 40, log 40, 0)
    [f] = _grads(d, [40, 40, 40, 1])
    assert f.where == ROOT_LABEL
    assert f.message.startswith("the modules' gradients grew about 40x at once (3 of 4 modules over")
    # the 5 steps after it are not judged (the large update settles); the 6th is
    for _ in range(5):
        assert _grads(d, [100, 1, 1, 1]) == []
    for _ in range(3):  # back to 1 for SUDDEN steps: 100 is then a jump again
        assert _grads(d, [1, 1, 1, 1]) == []
    assert _where(_grads(d, [100, 1, 1, 1])) == [("exploding-gradient", "m0")]


def test_a_gradient_that_grows_step_by_step_is_not_a_jump():
    """m0 grows 1.5x a step from 1 (an attention's key, near 0 at first): at step 16 it is 1.5^6 = 11x its
    median of 1, over log 8, but never more than sqrt(8) = 2.8x the largest of its last 3 steps: silent."""
    d = _detectors(2)
    for _ in range(10):
        assert _grads(d, [1, 1]) == []
    for k in range(1, 9):
        assert _grads(d, [1.5 ** k, 1]) == []
    assert _where(_grads(d, [1.5 ** 8 * 10, 1])) == [("exploding-gradient", "m0")]  # then a jump


def test_every_module_at_once_with_one_far_out_of_line():
    """40x, 40x, 40x and 4000x: the model at 40x (the median excess) and m3, 100x beyond the rest (log 100
    = 4.6 over log 8 = 2.08), on its own."""
    d = _detectors(4)
    for _ in range(10):
        _grads(d, [1, 1, 1, 1])
    found = _grads(d, [40, 40, 40, 4000])
    assert _where(found) == [("exploding-gradient", ROOT_LABEL), ("exploding-gradient", "m3")]
    assert found[0].message.startswith("every module's gradient grew about 40x at once (4 of 4 modules over")


def test_a_loss_spike_takes_in_the_whole_model_finding():
    d = _detectors(2)
    for _ in range(10):
        d.loss(2.0, _grads(d, [1, 1]))
    found = d.loss(80.0, _grads(d, [40, 40]))
    assert _where(found) == [("loss-spike", ROOT_LABEL)]
    assert "40x its median" in found[0].message
    assert "every module's gradient grew about 40x with it" in found[0].message
    for _ in range(5):  # settling: neither judged
        assert d.loss(80.0, _grads(d, [40, 40])) == []
    # without a spike of the loss the gradient finding stays
    d = _detectors(2)
    for _ in range(10):
        d.loss(2.0, _grads(d, [1, 1]))
    assert _where(d.loss(2.0, _grads(d, [40, 40]))) == [("exploding-gradient", ROOT_LABEL)]


def test_the_median_module_grown_is_the_whole_model_even_when_few_pass_their_noise():
    """Four modules: m0 and m1 steady at 1 (threshold log 8), m2 and m3 alternating e^-1 and e^+1 (median
    0, deviation 1, threshold 7). All four grow 20x (log 20 = 3.0): m0 and m1 pass, m2 and m3 stay under
    their noise, 2 of 4 is not most; but every module grew 20x, over explode_factor 8: one finding."""
    d = _detectors(4)
    for i in range(10):
        e = math.e if i % 2 else 1 / math.e
        _grads(d, [1, 1, e, e])
    found = _grads(d, [20, 20, 20, 20])
    assert _where(found) == [("exploding-gradient", ROOT_LABEL)]
    assert found[0].message.startswith("the modules' gradients grew about 20x at once (2 of 4 modules over")


def test_a_jump_in_a_module_that_holds_almost_none_of_the_gradient_is_left_alone():
    """m0 jumps 20x in one step. From 1e-4 to 2e-3 beside m1 at 1 it holds 0.2% of the step's gradient
    norm, under SHARE (1%): silent. From 1e-3 to 2e-2 it holds 2%: named."""
    for base, named in ((1e-4, False), (1e-3, True)):
        d = _detectors(2)
        for _ in range(10):
            assert _grads(d, [base, 1]) == []
        assert _where(_grads(d, [20 * base, 1])) == ([("exploding-gradient", "m0")] if named else [])


# -- where a group of dead gradients stops -------------------------------------------------------
def _dead_run(params: list[str], dead: set[str], steps: int = 5, last: set[str] = frozenset()) -> list:
    """``dead-gradient`` findings after ``steps`` steps in which the parameters ``dead`` have no gradient
    (and ``last`` none at the last step only), the others a gradient of norm 1."""
    modules = tuple(dict.fromkeys(p.rpartition(".")[0] for p in params))
    owner = np.array([modules.index(p.rpartition(".")[0]) for p in params])
    d = Detectors(Layout(tuple(params), modules, owner, ()))
    out = []
    for step in range(steps):
        has = np.array([p not in dead and not (step == steps - 1 and p in last) for p in params])
        g = np.where(has, 1.0, 0.0)
        out += d.gradients(g, has, np.ones(len(modules)))
    return [(f.where, f.message) for f in out if f.code == "dead-gradient"]


GONE = ("each had no gradient, or an all-zero one, for 5 steps: they do not take part in the loss (an unused "
        "branch, a detach(), a frozen path) or their gradients are killed (dead ReLUs, a zero mask)")
TWO = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias", "d.weight", "d.bias"]


def test_a_group_of_dead_gradients_stops_at_the_last_layer_with_a_bias_whose_next_lost_its_own():
    # c (a weight alone) also loses its gradient when only its input is zero: the edge is b, before it
    params = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight"]
    assert _dead_run(params, set(params)) == [("b.weight", (
        f"5 parameters of 3 module(s) (a, b, c) {GONE}. The gradient stops at b: its output is zero (c, "
        "which takes it, lost its gradient too), so its units are dead (a ReLU or GELU that is never "
        "positive, a bias pushed far negative) or masked"))]


def test_the_next_layer_that_lost_its_gradient_only_now_still_says_the_output_is_zero():
    params = ["z.weight", "a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]
    found = _dead_run(params, {"z.weight", "a.weight", "a.bias", "b.weight", "b.bias"}, last={"c.weight"})
    assert found == [("b.weight", (
        f"5 parameters of 3 module(s) (z, a, b) {GONE}. The gradient stops at b: its output is zero (c, "
        "which takes it, lost its gradient too), so its units are dead (a ReLU or GELU that is never "
        "positive, a bias pushed far negative) or masked"))]


def test_a_module_that_lost_only_part_of_its_gradient_is_not_where_it_stops():
    found = _dead_run(TWO, {"a.weight", "a.bias", "b.weight", "b.bias", "d.weight"})
    assert found == [("b.weight", f"5 parameters of 3 module(s) (a, b, d) {GONE}. The gradient stops at b's "
                                  "output: everything before it lost its own")]


def test_a_group_that_ends_at_the_last_module_stops_at_its_output():
    found = _dead_run(TWO, {"b.weight", "c.weight", "c.bias", "d.weight", "d.bias"})
    assert found == [("d.weight", f"5 parameters of 3 module(s) (b, c, d) {GONE}. The gradient stops at d's "
                                  "output: everything before it lost its own")]


def test_a_group_with_no_module_wholly_dead_names_no_edge():
    params = [f"{m}.{k}" for m in "abcde" for k in ("weight", "bias")]
    found = _dead_run(params, {f"{m}.weight" for m in "abcde"})
    assert found == [("a.weight", f"5 parameters of 5 module(s) (a, b, c and 2 more) {GONE}")]


def test_a_value_exactly_at_its_threshold_is_not_a_spike():
    # ten values of 1 (median log 0, deviation 0): the loss's threshold is log 3, a gradient's log 8;
    # a value of exactly 3x (8x) is at its threshold, not over it
    d = _detectors()
    _losses(d, [1.0] * 10)
    assert d.loss(3.0) == []
    d = _detectors(2)
    for _ in range(10):
        _grads(d, [1, 1])
    assert _grads(d, [8, 8]) == [] and _grads(d, [1, 8]) == []


def test_a_loss_spike_alone_is_said_in_full():
    d = _detectors(2)
    for _ in range(10):
        d.loss(2.0, _grads(d, [1, 1]))
    [spike] = d.loss(80.0, _grads(d, [1, 1]))
    assert spike.message == ("the loss is 80, 40x its median over the last 10 steps (2): look at this step's "
                             "batch and the gradient norms around it, or lower the learning rate")


def _after_ten_ones(modules: int, now: list[float]) -> list:
    d = _detectors(modules)
    for _ in range(10):
        _grads(d, [1] * modules)
    return [(f.where, f.message) for f in _grads(d, now)]


WHOLE = ("grew about {}x at once ({} of {} modules over their own threshold): the loss or the batch of this "
         "step, not one layer; look at this step's batch and loss, clip gradients or lower the learning rate")


def test_the_whole_model_grew_by_its_middle_module():
    # three modules, two 20x: the middle of the growths (log 0, log 20, log 20) is 20x, said in full
    said = "the modules' gradients " + WHOLE.format(20, 2, 3)
    assert _after_ten_ones(3, [1, 20, 20]) == [("(model)", said)]


def test_a_middle_growth_exactly_at_the_factor_is_not_the_whole_model():
    # 8x, 8x and 100x: one module over its threshold; the middle growth is 8x, at explode_factor, not over
    assert _after_ten_ones(3, [8, 8, 100]) == [("m2", "gradient norm of m2 is 100x its median over the last "
                                                      "10 steps (100 vs 1): lower its learning rate, clip "
                                                      "gradients, or check its input")]


def test_a_module_exactly_8x_beyond_the_whole_models_growth_is_not_out_of_line():
    # every module 32x, one 256x: log 256 - log 32 is log 8 exactly, at the threshold, not over it
    assert _after_ten_ones(4, [32, 32, 32, 256]) == [("(model)", "every module's gradient "
                                                                 + WHOLE.format(32, 4, 4))]


def test_the_root_modules_own_gradient_is_named_as_the_root_module():
    d = Detectors(Layout(("weight", "m1.weight"), ("", "m1"), np.array([0, 1]), ()))
    for _ in range(10):
        _grads(d, [1, 1])
    said = ("gradient norm of the root module is 100x its median over the last 10 steps (100 vs 1): lower "
            "its learning rate, clip gradients, or check its input")
    assert _where_said(_grads(d, [100, 1])) == [(ROOT_LABEL, said)]


def _where_said(found) -> list[tuple[str, str]]:
    return [(f.where, f.message) for f in found]


def test_a_gradient_that_grows_2_5x_a_step_is_not_a_jump():
    # 2.5x a step is under sqrt(8) = 2.83x over the largest of the last 3 steps: silent even at 39x
    d = _detectors(2)
    for _ in range(10):
        _grads(d, [1, 1])
    assert [f for k in range(1, 5) for f in _grads(d, [2.5 ** k, 1])] == []


def test_a_module_without_a_gradient_holds_no_part_of_the_step():
    # m0 jumps 20x to 0.012 beside m1 at 1: 1.2% of the step's norm; m2 has no gradient (NaN), counted 0
    d = _detectors(3)
    for _ in range(10):
        _grads(d, [6e-4, 1, np.nan])
    assert _where(_grads(d, [0.012, 1, np.nan])) == [("exploding-gradient", "m0")]


def test_a_jump_under_1_percent_of_a_large_step_is_left_alone():
    # 0.025 to 0.5 (20x) beside a module at 100: 0.5% of the step's norm
    d = _detectors(2)
    for _ in range(10):
        _grads(d, [0.025, 100])
    assert _grads(d, [0.5, 100]) == []


def test_the_median_of_an_odd_count_is_its_middle_value():
    d = _detectors()
    _losses(d, [float(v) for v in range(1, 12)])
    [spike] = d.loss(600.0)
    assert spike.message.startswith("the loss is 600, 100x its median over the last 11 steps (6):")


def test_a_parameter_no_param_group_holds_is_said_in_full(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1, bias=False))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)  # 1.weight is left out
    with watch(model, opt, tmp_path / "run.inspect") as w:
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    [f] = [f for f in w.result.findings if f.code == "not-in-optimizer"]
    assert (f.where, f.message) == ("1.weight", (
        "1.weight requires grad but no param group of the optimizer holds it: it never changes. Build the "
        "optimizer from model.parameters() after every change to the model (after "
        "load_state_dict(assign=True), .to(), or adding a layer)"))


# -- nonfinite-parameter: one finding per kind, the first named and the others counted ----------
NONFINITE_TAIL = ("holds NaN/Inf values (not only its gradient): the last optimizer step or a write into it "
                  "made it so; every later output that uses it is non-finite")


def _nonfinite_parameters(bad_params: list[int], bad_buffers: list[int]) -> list[tuple[str, str, str]]:
    d = _detectors(6)
    p = np.ones(6)
    p[bad_params] = [np.nan, np.inf, -np.inf, np.nan, np.inf][:len(bad_params)]
    b = np.ones(2)
    b[bad_buffers] = np.nan
    return [(f.code, f.where, f.message) for f in d.parameters(p, b, ("bn.running_mean", "bn.running_var"))]


def test_one_nonfinite_parameter_is_named_alone():
    assert _nonfinite_parameters([2], []) == [
        ("nonfinite-parameter", "m2.weight", f"parameter m2.weight {NONFINITE_TAIL}")]


def test_nonfinite_parameters_name_the_first_and_count_the_others():
    assert _nonfinite_parameters([1, 3], []) == [
        ("nonfinite-parameter", "m1.weight",
         f"parameter m1.weight (and 1 other parameter: m3.weight) {NONFINITE_TAIL}")]
    # four: the three others listed in full; five: three listed, then "..."
    assert _nonfinite_parameters([0, 1, 2, 4], [])[0][2] == (
        f"parameter m0.weight (and 3 other parameters: m1.weight, m2.weight, m4.weight) {NONFINITE_TAIL}")
    assert _nonfinite_parameters([0, 1, 2, 4, 5], [])[0][2] == (
        "parameter m0.weight (and 4 other parameters: m1.weight, m2.weight, m4.weight, ...) "
        f"{NONFINITE_TAIL}")


def test_nonfinite_buffers_are_a_finding_of_their_own():
    assert _nonfinite_parameters([5], [0, 1]) == [
        ("nonfinite-parameter", "m5.weight", f"parameter m5.weight {NONFINITE_TAIL}"),
        ("nonfinite-parameter", "bn.running_mean",
         f"buffer bn.running_mean (and 1 other buffer: bn.running_var) {NONFINITE_TAIL}")]
    assert _nonfinite_parameters([], [1]) == [
        ("nonfinite-parameter", "bn.running_var", f"buffer bn.running_var {NONFINITE_TAIL}")]


# -- dead-gradient said of one parameter, of a few, and after a cut or a gap ---------------------
def _pattern(params: list[str], has) -> list[tuple[int, str, str]]:
    """``(step, where, message)`` of the ``dead-gradient`` findings when ``has(step, name)`` says whether a
    parameter has a gradient (norm 1) at each step, for ``has.steps`` steps."""
    modules = tuple(dict.fromkeys(p.rpartition(".")[0] for p in params))
    owner = np.array([modules.index(p.rpartition(".")[0]) for p in params])
    d = Detectors(Layout(tuple(params), modules, owner, ()))
    out = []
    for step in range(has.steps):
        h = np.array([has(step, p) for p in params])
        found = d.gradients(np.where(h, 1.0, 0.0), h, np.ones(len(modules)))
        out += [(step, f.where, f.message) for f in found if f.code == "dead-gradient"]
    return out


def _has(steps: int, rule):
    rule.steps = steps
    return rule


ONE_GONE = ("had no gradient, or an all-zero one, for 5 steps: it does not take part in the loss (an unused "
            "branch, a detach(), a frozen path) or its gradient is killed (dead ReLUs, a zero mask)")


def test_one_parameter_without_a_gradient_is_said_in_the_singular():
    params = ["a.weight", "a.bias", "b.weight"]
    # named once, at the window's fifth step (not again at twice the window, the rule of a gradient that
    # came and went)
    found = _pattern(params, _has(12, lambda s, p: p != "b.weight"))
    assert found == [(4, "b.weight", f"b.weight {ONE_GONE}")]


def test_four_parameters_at_once_are_four_findings_and_five_are_one():
    params = [f"{m}.{k}" for m in "abc" for k in ("weight", "bias")]
    four = {"a.weight", "a.bias", "b.weight", "b.bias"}
    assert _pattern(params, _has(5, lambda s, p: p not in four)) == [
        (4, p, f"{p} {ONE_GONE}") for p in ["a.weight", "a.bias", "b.weight", "b.bias"]]
    five = four | {"c.weight"}
    [(step, _, text)] = _pattern(params, _has(5, lambda s, p: p not in five))
    assert step == 4 and text.startswith("5 parameters of 3 module(s) (a, b, c) each had no gradient, or an "
                                         "all-zero one, for 5 steps: they do not take part in the loss")
    assert "or their gradients are killed (dead ReLUs, a zero mask)" in text


def test_a_gradient_cut_off_after_a_settled_run_is_said_as_cut():
    params = ["a.weight", "a.bias", "b.weight"]
    # b.weight has its gradient for 20 steps (SETTLED), then none: named at the second step without it
    # (at step 24 the window's rule names it again, and the watch records it once while it lasts)
    assert _pattern(params, _has(23, lambda s, p: p != "b.weight" or s < 20)) == [
        (21, "b.weight", "b.weight had a gradient at each of the 20 steps before and none, or an all-zero "
                         "one, for the last 2: something cut it off (a detach(), a frozen path, a branch no "
                         "longer taken)")]


def test_five_gradients_cut_off_at_once_are_one_finding_that_says_them():
    params = [f"{m}.{k}" for m in "abc" for k in ("weight", "bias")]
    gone = {"a.weight", "a.bias", "b.weight", "b.bias", "c.weight"}
    [(step, where, text)] = _pattern(params, _has(23, lambda s, p: p not in gone or s < 20))
    assert step == 21
    assert text.startswith("5 parameters of 3 module(s) (a, b, c) each had a gradient at each of the 20 "
                           "steps before and none, or an all-zero one, for the last 2: something cut them "
                           "off (a detach(), a frozen path, a branch no longer taken)")


def test_a_gradient_that_came_and_went_is_named_well_past_its_own_gaps():
    params = ["a.weight", "b.weight"]
    # b.weight: missing at steps 3 and 4 (a gap of 2), back at 5, then missing from step 8 on. Its own
    # gaps allow max(2 x 5, 3 x 2 + 2) = 10 steps without a gradient: named at the tenth, step 17
    has = _has(25, lambda s, p: p == "a.weight" or s in (0, 1, 2, 5, 6, 7))
    assert _pattern(params, has) == [(17, "b.weight", (
        "b.weight had no gradient, or an all-zero one, for 10 steps (its gradients came and went before, as "
        "a routed expert's or an optional branch's do, but were never missing for more than 2 steps in a "
        "row): it does not take part in the loss (an unused branch, a detach(), a frozen path) or its "
        "gradient is killed (dead ReLUs, a zero mask)"))]


def test_a_window_of_2_names_a_lost_gradient_by_the_window_not_as_cut():
    # the cut rule needs a window longer than its 2 steps: with window=2 the window's rule says it
    d = Detectors(Layout(("a.weight", "b.weight"), ("a", "b"), np.arange(2), ()), window=2)
    found = []
    for step in range(23):
        h = np.array([True, step < 20])
        found += [(step, f.message) for f in d.gradients(np.where(h, 1.0, 0.0), h, np.ones(2))]
    assert found == [(21, "b.weight had no gradient, or an all-zero one, for 2 steps: it does not take part "
                          "in the loss (an unused branch, a detach(), a frozen path) or its gradient is "
                          "killed (dead ReLUs, a zero mask)")]


CUT_B = ("b.weight had a gradient at each of the 20 steps before and none, or an all-zero one, for the last "
         "2: something cut it off (a detach(), a frozen path, a branch no longer taken)")


def test_a_gradient_missing_at_the_start_does_not_come_and_go():
    # b.weight (a LoRA A while its B is 0) has none at steps 0 to 2, then one for 20 steps, then none: the
    # start is no gap of its own, so the loss at step 23 is a cut, named at step 24
    has = _has(26, lambda s, p: p == "a.weight" or 3 <= s < 23)
    assert _pattern(["a.weight", "b.weight"], has) == [(24, "b.weight", CUT_B)]


def test_a_gradient_back_after_one_step_came_and_went():
    # b.weight: one at step 0, none at 1 and 2, back from step 3: a gap of 2 after a streak of one step.
    # Missing again from step 30, it is judged by its own gaps: named at max(10, 3 x 2 + 2) = 10 steps
    has = _has(42, lambda s, p: p == "a.weight" or s == 0 or 3 <= s < 30)
    assert [(s, w) for s, w, _ in _pattern(["a.weight", "b.weight"], has)] == [(39, "b.weight")]


def test_the_streak_before_a_loss_starts_after_the_last_gap():
    # b.weight: none at step 0, then one for 19 steps (1 to 19), then none: 19 steps are not SETTLED (20),
    # so it is named by the window (5 steps) at step 24, not as cut
    has = _has(26, lambda s, p: p == "a.weight" or 1 <= s < 20)
    assert _pattern(["a.weight", "b.weight"], has) == [(24, "b.weight", f"b.weight {ONE_GONE}")]


def test_a_loss_at_its_threshold_over_a_lower_minimum_is_not_a_spike():
    # nine losses of 1 and one of 0.5: median log 0, deviation 0, so the threshold is log 3; 3.0 is over the
    # lowest (0.5) by more than 3x, so the median is worked out, and it is exactly at the threshold
    d = _detectors()
    _losses(d, [0.5] + [1.0] * 9)
    assert d.loss(3.0) == []
    assert [f.code for f in d.loss(3.01)] == ["loss-spike"]


def test_a_module_without_a_gradient_one_step_ago_can_still_jump():
    # m3 had no gradient at the step before (its log norm NaN, with no floating-point warning): its last
    # steps' largest is the finite 0
    d = _detectors(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(10):
            _grads(d, [1, 1, 1, 1])
        assert _grads(d, [1, 1, 1, 0]) == []
        assert _where(_grads(d, [1, 1, 1, 100])) == [("exploding-gradient", "m3")]


def test_huge_gradient_norms_are_judged_without_a_floating_point_warning():
    # norms of 1e200 (a float64 model): their squares overflow unless scaled. m3 grows 1000x: named, and no
    # overflow is reported
    d = _detectors(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(10):
            _grads(d, [1e200] * 4)
        found = _grads(d, [1e200, 1e200, 1e200, 1e203])
    assert _where(found) == [("exploding-gradient", "m3")]
    assert "(1e+203 vs 1e+200)" in found[0].message


@pytest.mark.parametrize("e0, e1", [("experts.0.w1.weight", "experts.1.w1.weight"),
                                    ("experts.expert_0.wi.weight", "experts.expert_1.wi.weight"),
                                    ("experts.0.weight", "experts.1.weight"),  # a ModuleList of Linear
                                    ("experts.0", "experts.1")])  # a ParameterList
def test_siblings_in_a_module_list_share_their_gradients_history(e0, e1):
    # expert 0's gradient went missing for 2 steps (5, 6) and came back: a routed expert. Expert 1, its
    # sibling, loses its own from step 20: judged by the group's gaps (max(10, 3 x 2 + 2) = 10 steps), not
    # as cut after a settled run
    params = ["gate.weight", e0, e1]
    has = _has(32, lambda s, p: p == "gate.weight" or (p == e0 and s not in (5, 6)) or (p == e1 and s < 20))
    found = _pattern(params, has)
    assert [(s, w) for s, w, _ in found] == [(29, e1)]
    assert "came and went before" in found[0][2]


def test_a_gradient_that_was_missing_4_steps_at_once_waits_3_x_4_plus_2_steps():
    # b.weight: none at steps 3 to 6 (a gap of 4), back from 7, none from 10: named at max(2 x 5, 3 x 4 + 2)
    # = 14 steps without it, step 23
    has = _has(30, lambda s, p: p == "a.weight" or s < 3 or 7 <= s < 10)
    found = _pattern(["a.weight", "b.weight"], has)
    assert [(s, w) for s, w, _ in found] == [(23, "b.weight")]
    assert "for 14 steps (its gradients came and went before" in found[0][2]
    assert "never missing for more than 4 steps in a row" in found[0][2]


def test_the_loss_median_is_over_the_last_50_steps():
    # 60 losses of 10, then 50 of 1: the last 50 are all 1, so 4 is a spike 4x their median
    d = _detectors()
    _losses(d, [10.0] * 60 + [1.0] * 50)
    [f] = d.loss(4.0)
    assert f.message.startswith("the loss is 4, 4x its median over the last 50 steps (1)")


def test_a_module_8_5x_its_median_is_a_spike_by_the_default_factor():
    d = _detectors(4)
    for _ in range(10):
        _grads(d, [1, 1, 1, 1])
    assert _where(_grads(d, [8.5, 1, 1, 1])) == [("exploding-gradient", "m0")]


def test_a_jump_in_a_module_under_1_percent_of_many_others_is_left_alone():
    # 100 modules at 1 and m100 at 0.005, which jumps 10x to 0.05: the step's norm is about 10, so 0.05
    # is under 1% of it (0.1)
    d = _detectors(101)
    for _ in range(10):
        _grads(d, [1.0] * 100 + [0.005])
    assert _grads(d, [1.0] * 100 + [0.05]) == []
    assert _where(_grads(d, [1.0] * 100 + [0.5])) == [("exploding-gradient", "m100")]


def test_the_lowest_values_kept_are_those_of_the_window():
    # a window of 5 steps: each module's lowest log norm, kept as rows come and go, is the window's own
    # at every step (the row written over often held it; a NaN is a module without a gradient that step)
    layout = Layout(("a.weight", "b.weight"), ("a", "b"), np.array([0, 1]), ())
    d = Detectors(layout, history=5)
    rng = np.random.default_rng(0)
    for _ in range(60):
        norms = rng.uniform(0.5, 2.0, 2)
        norms[rng.random(2) < 0.2] = np.nan
        d.gradients(norms, np.isfinite(norms), norms)
        assert np.array_equal(d.low, np.fmin.reduce(d.past[:d.seen], axis=0), equal_nan=True)
