"""The zoo's cases in plain PyTorch loops: healthy configurations and planted bugs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from .core import Case, Ctx, PlantedError, cause_for
from .loops import LOOP, NO_PLANT, Loop, Plant, gan_loop, plain_loop, wgan_loop
from .models import MODELS

NONFINITE = ("nonfinite-parameter", "nonfinite-gradient", "nonfinite-forward", "nonfinite-backward",
             "nonfinite-loss")  # with default options no producer is traced: the parameter that went NaN
HUGE_LR = ("nonfinite-parameter", "exploding-gradient", "loss-spike") + NONFINITE
# stated causes: the planted NaN/Inf came from the batch, a module's forward, a backward, a weight, the lr
IN_BATCH = ("batch",)
IN_FORWARD = ("forward", "produced", "output")
IN_BACKWARD = ("backward",)
IN_WEIGHT = ("holds nan/inf values", "weight", "parameter")
BY_LR = ("learning rate", "optimizer step", "lr ")


def _train(model: str, loop: Loop = LOOP, plant: Plant = NO_PLANT, **kw: Any) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        plain_loop(ctx, MODELS[model](0), loop, plant, **kw)
    return run


def healthy(name: str, model: str, loop: Loop = LOOP, note: str = "", **kw: Any) -> Case:
    return Case(name, model, "torch", loop.label, _train(model, loop, **kw), note=note)


HEALTHY = [
    healthy("mlp-before", "mlp", Loop("before")),
    healthy("mlp-before-zero", "mlp", Loop("before", False)),
    healthy("mlp-between", "mlp", Loop("between")),
    healthy("mlp-between-zero", "mlp", Loop("between", False)),
    healthy("mlp-after", "mlp", Loop("after")),
    healthy("mlp-after-zero-sgd", "mlp", Loop("after", False, optimizer="sgd")),
    healthy("cnn-bn-after", "cnn", Loop("after")),
    healthy("cnn-bn-between-zero", "cnn", Loop("between", False)),
    healthy("cnn-bn-fp16-scaler", "cnn", Loop("after", amp=torch.float16, scaler=True)),
    healthy("gpt2-between", "gpt2", Loop("between")),
    healthy("gpt2-accumulate", "gpt2", Loop("before", accum=4)),
    healthy("gpt2-checkpointing", "gpt2", Loop("after", checkpointing=True)),
    healthy("llama-bf16", "llama", Loop("before", amp=torch.bfloat16)),
    healthy("llama-checkpointing-zero", "llama", Loop("between", False, checkpointing=True)),
    healthy("bert-mlm-after", "bert", Loop("after")),
    healthy("vit-before-zero", "vit", Loop("before", False)),
    healthy("lstm-between", "lstm", Loop("between")),
    healthy("mlp-compile", "mlp", Loop("after", compile=True)),
    Case("gan-two-optimizers", "gan", "torch", "two optimizers (G, D), zero_grad before backward", gan_loop),
    Case("wgan-critic-5", "gan", "torch", "WGAN, the critic's optimizer first, G stepped every 5th step",
         wgan_loop),
    Case("wgan-critic-through", "gan", "torch",
         "WGAN, G every 5th step, the critic's backward reaching G (no detach; G clears before its own)",
         partial(wgan_loop, detach=False)),
]


# -- plants ---------------------------------------------------------------------------------
def _param(model: nn.Module, name: str) -> nn.Parameter:
    return model.get_parameter(name)


def fill_inf(name: str) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        with torch.no_grad():
            _param(model, name).fill_(float("inf"))
    return start


def divide_by_zero(module: str) -> Callable[[Ctx, nn.Module, Any], None]:
    """The module's own forward now ends in ``x / 0`` (inside the call, as a bug in its code)."""
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        m = model.get_submodule(module)
        forward = m.forward
        m.forward = lambda *a, **k: forward(*a, **k) / 0.0
    return start


def poison_gate(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    model.gate.poison = True


def scale_grad(name: str, factor: float) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        _param(model, name).register_hook(lambda g: g * factor)
    return start


def detach_input(module: str) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        model.get_submodule(module).register_forward_pre_hook(
            lambda m, args: tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    return start


def set_eval(module: str) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        (model.get_submodule(module) if module else model).eval()
    return start


def replace(module: str, make: Callable[[nn.Module], nn.Module]) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        parent, _, leaf = module.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, leaf, make(getattr(owner, leaf)))
    return start


def reload_assign(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    model.load_state_dict(copy.deepcopy(model.state_dict()), assign=True)


def huge_lr(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    for g in opt.param_groups:
        g["lr"] = 1e30


def untie(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())


def raise_now(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    raise PlantedError("planted failure: the data loader lost its worker")


def nan_batch(key: str) -> Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    def batch(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        b[key][0, 0] = float("nan")
        return b
    return batch


def scale_batch(key: str, factor: float) -> Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    def batch(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        b[key] = b[key] * factor
        return b
    return batch


def log_zero(loss: torch.Tensor) -> torch.Tensor:
    p = torch.zeros(())  # an entropy term p * log(p) with p = 0: 0 * -inf = NaN
    return loss + p * torch.log(p)


def bug(name: str, model: str, expect: tuple[str, ...], where: tuple[str, ...] | None,
        loop: Loop = LOOP, plant: Plant = NO_PLANT, *, nonfinite: tuple[str, ...] = (), grace: int = 0,
        at: int | None = None, note: str = "", cause: tuple[str, ...] = (), **kw: Any) -> Case:
    extra = {"plant_at": at} if at is not None else {}
    return Case(name, model, "torch", loop.label, _train(model, loop, plant, **kw), expect, where,
                nonfinite, grace, note=note, cause=cause_for(expect, cause), **extra)


def _frozen(module: str) -> Callable[[nn.Module], None]:
    def before(model: nn.Module) -> None:
        for p in model.get_submodule(module).parameters():
            p.requires_grad_(False)
    return before


def _without(module: str) -> Callable[[nn.Module], Any]:
    def params(model: nn.Module) -> Any:
        skip = {id(p) for p in model.get_submodule(module).parameters()}
        return [p for p in model.parameters() if id(p) not in skip]
    return params


def _zero_warmup(opt: torch.optim.Optimizer) -> Any:
    warmup = 1000
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, s // warmup))  # int division: 0


BUGS = [
    bug("mlp-not-cleared", "mlp", ("gradient-not-cleared",), None, Loop("before"),
        Plant(no_clear=True, persist=True)),
    bug("gpt2-not-cleared-zero", "gpt2", ("gradient-not-cleared",), None, Loop("between", False),
        Plant(no_clear=True, persist=True)),
    bug("llama-accumulate-not-cleared", "llama", ("gradient-not-cleared",), None, Loop("before", accum=4),
        Plant(no_clear=True, persist=True)),
    bug("cnn-not-cleared-after-zero", "cnn", ("gradient-not-cleared",), None, Loop("after", False),
        Plant(no_clear=True, persist=True)),
    bug("mlp-lr-zero-warmup", "mlp", ("no-update",), None, at=0, grace=5, scheduler=_zero_warmup,
        note="LambdaLR(lambda s: min(1, s // 1000)): lr 0 from the first step"),
    Case("gan-d-never-steps", "gan", "torch", "two optimizers, D's step() removed",
         partial(gan_loop, skip_d_step=True), ("optimizer-not-stepped",), ("disc",), grace=5,
         cause=cause_for(("optimizer-not-stepped",))),
    Case("wgan-g-never-steps", "gan", "torch", "WGAN, G's step() removed (its backward every 5th step)",
         partial(wgan_loop, skip_g_step=True), ("optimizer-not-stepped",), ("gen",), grace=10,
         cause=cause_for(("optimizer-not-stepped",))),
    Case("wgan-through-g-not-cleared", "gan", "torch",
         "WGAN, the critic's backward reaching G, G's zero_grad() removed (its step every 5th)",
         partial(wgan_loop, detach=False, skip_g_zero=True), ("gradient-not-cleared",), ("gen",),
         cause=cause_for(("gradient-not-cleared",))),
    bug("cnn-bn-eval", "cnn", ("eval-mode-module",), ("bn1",), plant=Plant(set_eval("bn1"))),
    bug("bert-dropout-eval", "bert", ("eval-mode-module",), ("bert.embeddings.dropout",),
        plant=Plant(set_eval("bert.embeddings.dropout"))),
    bug("cnn-model-eval", "cnn", ("eval-mode-module",), ("bn1", "bn2", "drop", "(model)"),
        plant=Plant(set_eval(""))),
    bug("mlp-frozen-fc1", "mlp", ("frozen-parameters",), ("fc1",), at=0, before=_frozen("fc1")),
    bug("vit-frozen-embeddings", "vit", ("frozen-parameters",), ("vit.embeddings",), at=0,
        before=_frozen("vit.embeddings")),
    bug("mlp-loss-log0", "mlp", ("nonfinite-loss",), ("(loss)", "loss"), plant=Plant(loss=log_zero)),
    bug("llama-inf-weight", "llama", NONFINITE,
        ("model.layers.1.mlp.down_proj",), plant=Plant(fill_inf("model.layers.1.mlp.down_proj.weight")),
        nonfinite=("nonfinite-forward", "nonfinite-parameter"), cause=IN_WEIGHT),
    bug("cnn-div-zero-conv2", "cnn", NONFINITE, ("conv2",),
        plant=Plant(divide_by_zero("conv2")), nonfinite=("nonfinite-forward",), cause=IN_FORWARD),
    bug("gpt2-div-zero-mlp", "gpt2", NONFINITE,
        ("transformer.h.1.mlp.c_fc",), plant=Plant(divide_by_zero("transformer.h.1.mlp.c_fc")),
        nonfinite=("nonfinite-forward",), cause=IN_FORWARD),
    bug("mlp-nan-batch", "mlp", NONFINITE, ("(batch)", "fc1"), plant=Plant(batch=nan_batch("x")),
        nonfinite=("nonfinite-forward",), cause=IN_BATCH),
    bug("vit-nan-batch", "vit", NONFINITE, ("(batch)", "vit.embeddings.patch_embeddings"),
        plant=Plant(batch=nan_batch("pixel_values")), nonfinite=("nonfinite-forward",), cause=IN_BATCH),
    bug("mlp-backward-nan", "mlp", NONFINITE, ("gate",),
        plant=Plant(poison_gate), nonfinite=("nonfinite-backward",), cause=IN_BACKWARD,
        note="a custom autograd.Function whose backward returns NaN, inside module gate"),
    bug("cnn-head-replaced", "cnn", ("not-in-optimizer", "parameters-replaced"), ("head",),
        plant=Plant(replace("head", lambda old: nn.Linear(8, 4)))),
    bug("lstm-load-assign", "lstm", ("parameters-replaced", "not-in-optimizer"), None,
        plant=Plant(reload_assign)),
    bug("mlp-missing-from-optimizer", "mlp", ("not-in-optimizer",), ("fc2",), at=0, params=_without("fc2")),
    bug("mlp-raises-step12", "mlp", ("run-failed",), None, plant=Plant(raise_now), at=12),
    bug("cnn-loss-spike", "cnn", ("loss-spike",), None, plant=Plant(loss=lambda x: x * 40)),
    bug("mlp-batch-spike", "mlp", ("loss-spike",), None, plant=Plant(batch=scale_batch("x", 40.0)),
        cause=IN_BATCH,
        note="one batch's inputs x40"),
    bug("lstm-exploding-head", "lstm", ("exploding-gradient",), ("head",),
        plant=Plant(scale_grad("head.weight", 1000.0))),
    bug("gpt2-exploding-block", "gpt2", ("exploding-gradient",), ("transformer.h.1.mlp.c_fc",),
        plant=Plant(scale_grad("transformer.h.1.mlp.c_fc.weight", 1000.0))),
    bug("mlp-huge-lr", "mlp", HUGE_LR, None, Loop(optimizer="sgd"), Plant(huge_lr), cause=BY_LR,
        note="lr=1e30 from the plant on"),
    bug("cnn-huge-lr", "cnn", HUGE_LR, None, plant=Plant(huge_lr), cause=BY_LR,
        note="lr=1e30 from the plant on"),
    bug("mlp-detach-fc2", "mlp", ("dead-gradient",), ("fc1",), plant=Plant(detach_input("fc2")), grace=5,
        note="fc2's input detached: fc1 gets no gradient"),
    bug("gpt2-load-assign-tie", "gpt2", ("tie-broken", "parameters-replaced"),
        ("lm_head.weight", "transformer.wte.weight"), plant=Plant(reload_assign),
        cause=("assign=true", "tie", "tied")),
    bug("gpt2-untie-head", "gpt2", ("tie-broken",), ("lm_head.weight", "transformer.wte.weight"),
        plant=Plant(untie)),
    bug("bert-head-replaced", "bert", ("not-in-optimizer", "parameters-replaced"),
        ("cls.predictions.transform.dense",),
        plant=Plant(replace("cls.predictions.transform.dense", lambda old: nn.Linear(32, 32)))),
]


def _exception_case(ctx: Ctx) -> None:  # used by the tests: a case that breaks is a crash, not a miss
    raise ValueError("this case is broken on purpose")


BROKEN = Case("broken-case", "mlp", "torch", "-", _exception_case, ("gradient-not-cleared",), None,
              baselines=False)
