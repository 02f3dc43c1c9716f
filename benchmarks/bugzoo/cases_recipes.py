"""The zoo's recipes from real libraries (transformers' MoE and ResNet classes, peft, torch's
AveragedModel and schedulers, transformers' schedulers and Adafactor) and the training recipes
people run with them, healthy and with the bugs that stop training silently or get explained
wrongly: a GradScaler that skips every step, a param group at lr 0, ``zero_grad()`` between
``backward()`` and ``step()``, a layer whose output died, an optimizer replaced behind the
watch's back, a learning rate raised a hundredfold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import models_lib  # noqa: F401 - registers the library models in MODELS
from .cases_plain import (
    BY_LR,
    HUGE_LR,
    IN_FORWARD,
    IN_WEIGHT,
    NONFINITE,
    divide_by_zero,
    fill_inf,
    scale_grad,
)
from .core import Case, Ctx, cause_for
from .loops import LOOP, NO_PLANT, Loop, Plant, make_optimizer, plain_loop
from .models import MODELS

SKIPS = 9  # scaler-skipping names the tenth skipped step in a row: the plant's step + 9
FP16 = Loop("after", amp=torch.float16, scaler=True)
FP16_EARLY = Loop("after", amp=torch.float16, scaler=True, init_scale=2.0**24)  # a few skips first
LR_RAISED = (
    "learning rate rose",
    "learning rate was raised",
    "learning rate changed",
    "lr rose",
    "lr changed",
    "learning rate jumped",
    "lr jumped",
    "raised the learning rate",
    "higher learning rate",
    "learning rate grew",
    "lr grew",
)
DEAD_OUTPUT = (
    "relu",
    "inactive",
    "dead unit",
    "dead activation",
    "output is zero",
    "outputs are zero",
    "output was zero",
    "never positive",
    "its output",
)
GROUP_LR = ("param group", "group")


def _run(
    model: str, loop: Loop = LOOP, plant: Plant = NO_PLANT, seed: int = 0, **kw: Any
) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        plain_loop(ctx, MODELS[model](seed), loop, plant, **kw)

    return run


def ok(
    name: str,
    model: str,
    loop: Loop = LOOP,
    *,
    seed: int = 0,
    stack: str = "torch",
    note: str = "",
    label: str = "",
    **kw: Any,
) -> Case:
    return Case(
        name,
        model,
        stack,
        label or loop.label,
        _run(model, loop, seed=seed, **kw),
        note=note,
        baselines="every" not in kw,
    )


def bad(
    name: str,
    model: str,
    expect: tuple[str, ...],
    where: tuple[str, ...] | None,
    loop: Loop = LOOP,
    plant: Plant = NO_PLANT,
    *,
    nonfinite: tuple[str, ...] = (),
    grace: int = 0,
    at: int | None = None,
    note: str = "",
    cause: tuple[str, ...] = (),
    label: str = "",
    stack: str = "torch",
    **kw: Any,
) -> Case:
    extra = {"plant_at": at} if at is not None else {}
    return Case(
        name,
        model,
        stack,
        label or loop.label,
        _run(model, loop, plant, **kw),
        expect,
        where,
        nonfinite,
        grace,
        note=note,
        cause=cause_for(expect, cause),
        baselines="every" not in kw,
        **extra,
    )


# -- recipe parts ------------------------------------------------------------------------------
def _hf_linear(warmup: int, total: int) -> Callable[[torch.optim.Optimizer], Any]:
    def make(opt: torch.optim.Optimizer) -> Any:
        from transformers import get_linear_schedule_with_warmup

        return get_linear_schedule_with_warmup(opt, warmup, total)

    return make


def _hf_cosine(warmup: int, total: int) -> Callable[[torch.optim.Optimizer], Any]:
    def make(opt: torch.optim.Optimizer) -> Any:
        from transformers import get_cosine_schedule_with_warmup

        return get_cosine_schedule_with_warmup(opt, warmup, total)

    return make


def _hf_polynomial(warmup: int, total: int) -> Callable[[torch.optim.Optimizer], Any]:
    def make(opt: torch.optim.Optimizer) -> Any:
        from transformers import get_polynomial_decay_schedule_with_warmup

        return get_polynomial_decay_schedule_with_warmup(opt, warmup, total, lr_end=0.0, power=2.0)

    return make


def _cosine_annealing(total: int) -> Callable[[torch.optim.Optimizer], Any]:
    return lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - 1, eta_min=0.0)


def _one_cycle(total: int) -> Callable[[torch.optim.Optimizer], Any]:
    return lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=opt.param_groups[0]["lr"], total_steps=total
    )


def _replace_optimizer(at: int, name: str = "sgd", handed: bool = True) -> Callable[..., Any]:
    """A second phase: at iteration ``at`` a new optimizer is built over the same parameters (and,
    when ``handed``, given to the watch; otherwise it is the bug: the watch keeps the old one)."""

    def every(ctx: Ctx, model: nn.Module, opt: Any, mon: Any) -> Any:
        if ctx.i != at:
            return None
        if not handed:
            ctx.mark()
        lr = opt.param_groups[0]["lr"]
        new = make_optimizer(
            name, [p for p in model.parameters() if p.requires_grad], lr / 10 if name == "sgd" else lr
        )
        if handed:
            mon.hand_over(new)
        return new

    return every


def _unfreeze(module: str, at: int, add: bool = True, lr_scale: float = 0.1) -> dict[str, Any]:
    """The fine-tuning recipe that trains the head first: ``module`` frozen until iteration ``at``,
    then trainable and added to the optimizer as a new param group at a lower lr (or, the bug,
    made trainable and never added)."""

    def before(model: nn.Module) -> None:
        model.get_submodule(module).requires_grad_(False)

    def every(ctx: Ctx, model: nn.Module, opt: Any, mon: Any) -> None:
        if ctx.i != at:
            return
        part = model.get_submodule(module)
        part.requires_grad_(True)
        if add:
            opt.add_param_group(
                {"params": list(part.parameters()), "lr": opt.param_groups[0]["lr"] * lr_scale}
            )
        else:
            ctx.mark()

    def params(model: nn.Module) -> Any:  # the optimizer holds what trains at the start
        return [p for p in model.parameters() if p.requires_grad]

    return {"before": before, "every": every, "params": params}


def _groups(module: str, lr: float | None = None) -> Callable[[nn.Module], Any]:
    """Two param groups: the rest of the model at the base lr, then ``module`` (at ``lr`` if given)."""

    def params(model: nn.Module) -> Any:
        part = {id(p) for p in model.get_submodule(module).parameters()}
        rest = [p for p in model.parameters() if id(p) not in part and p.requires_grad]
        mine = [p for p in model.get_submodule(module).parameters() if p.requires_grad]
        return [{"params": rest}, {"params": mine, **({"lr": lr} if lr is not None else {})}]

    return params


def _discriminative(module: str) -> Callable[[nn.Module], Any]:
    """The backbone at a tenth of the head's lr (layer-wise lr, as fine-tuning recipes do)."""

    def params(model: nn.Module) -> Any:
        head = {id(p) for p in model.get_submodule(module).parameters()}
        return [
            {"params": [p for p in model.parameters() if id(p) not in head and p.requires_grad], "lr": 1e-4},
            {"params": [p for p in model.parameters() if id(p) in head]},
        ]

    return params


def _ema(every_eval: int = 20) -> dict[str, Any]:
    """An EMA copy (torch's ``AveragedModel`` with ``get_ema_multi_avg_fn``, BN buffers averaged too)
    updated after each step and, every ``every_eval`` steps, put in eval mode and checked finite
    (where a validation pass would use it)."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    kept: dict[str, Any] = {}

    def before(model: nn.Module) -> None:
        kept["ema"] = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99), use_buffers=True)

    def after_step(ctx: Ctx, model: nn.Module) -> None:
        ema = kept["ema"]
        ema.update_parameters(model)
        if ctx.i % every_eval == every_eval - 1:
            ema.eval()
            with torch.no_grad():
                for p in ema.parameters():
                    assert torch.isfinite(p).all()

    return {"before": before, "after_step": after_step}


def _set_group_lr(index: int, lr: float) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        opt.param_groups[index]["lr"] = lr

    return start


def _lr_times(factor: float) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        for g in opt.param_groups:
            g["lr"] *= factor

    return start


def _overflow(module: str) -> Callable[[Ctx, nn.Module, Any], None]:
    """From now on the backward through ``module`` overflows (its gradient is Inf, as an fp16
    activation past 65504 makes it): the GradScaler skips every step and lowers its scale forever."""

    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        def hook(m: nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda g: g + float("inf"))

        model.get_submodule(module).register_forward_hook(hook)

    return start


def _bias(module: str, value: float) -> Callable[[Ctx, nn.Module, Any], None]:
    """A write into a layer's bias (a bad init or load): ``-100`` kills every unit after its
    ReLU/GELU."""

    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        with torch.no_grad():
            model.get_submodule(module).bias.fill_(value)

    return start


def _detach_input(module: str) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        model.get_submodule(module).register_forward_pre_hook(
            lambda m, args: tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        )

    return start


def _frozen(name: str) -> Callable[[nn.Module], None]:
    return lambda model: model.get_submodule(name).requires_grad_(False)


def _without_lora(model: nn.Module) -> Any:
    """The optimizer built before ``get_peft_model``: it holds the base weights, none of the adapters'."""
    return [p for n, p in model.named_parameters() if "lora_" not in n]


def _set_eval(module: str) -> Callable[[Ctx, nn.Module, Any], None]:
    def start(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        model.get_submodule(module).eval()

    return start


def _ignore_labels(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The curriculum's next stage masks every label (-100): the mean over no token is NaN."""
    b["labels"] = torch.full_like(b["labels"], -100)
    return b


def _lora_names(layers: int = 2) -> tuple[str, ...]:
    return tuple(
        f"base_model.model.transformer.h.{i}.{m}.lora_{ab}.default"
        for i in range(layers)
        for m in ("attn.c_attn", "mlp.c_fc")
        for ab in "AB"
    )


RESNET_BN = "resnet.encoder.stages.1.layers.0.layer.0.normalization"
SWITCH_ROUTER = "encoder.block.1.layer.1.mlp.router.classifier"

# -- healthy recipes ---------------------------------------------------------------------------
HEALTHY = [
    # mixture of experts: an expert idle for a step or two is normal
    ok("switch-moe-top1", "switch", note="Switch Transformers, 4 experts, top-1, 16 tokens a step"),
    ok("switch-moe-top1-sgd", "switch", Loop(optimizer="sgd")),
    ok("switch-moe-top1-seed1", "switch", seed=1),
    ok("mixtral-moe-top1", "mixtral", note="MixtralForCausalLM, 4 experts (fused), top-1, jitter 0.1"),
    ok("mixtral-moe-top1-seed1", "mixtral", Loop("before"), seed=1),
    ok("olmoe-moe-top1", "olmoe", note="OlmoeForCausalLM, 4 experts, top-1"),
    # frozen BatchNorm fine-tuning
    ok("resnet-bn-train", "resnet"),
    ok(
        "resnet-norm-eval",
        "resnet-norm-eval",
        note="BatchNorm kept in eval mode by a train() override, affine frozen",
    ),
    ok("resnet-norm-eval-seed1", "resnet-norm-eval", Loop("before"), seed=1),
    ok(
        "resnet-detr-frozen-bn",
        "resnet-frozen-bn",
        note="transformers' DetrFrozenBatchNorm2d in every BN's place",
    ),
    ok(
        "resnet-discriminative-lr",
        "resnet",
        params=_discriminative("classifier"),
        label="zero_grad after, backbone lr 1e-4, head 1e-3",
    ),
    # LoRA through peft
    ok("lora-gpt2", "lora-gpt2", note="peft LoRA r=4 on c_attn and c_fc"),
    ok("lora-llama", "lora-llama", Loop("before")),
    ok("lora-bert-save-head", "lora-bert", note="LoRA on query/value, the MLM head trained in full"),
    # distillation from a frozen teacher (a submodule in eval mode)
    ok("distill-mlp", "distill-mlp"),
    ok("distill-gpt2", "distill-gpt2"),
    # an EMA copy
    ok("ema-mlp", "mlp", label="zero_grad after, AveragedModel EMA", **_ema()),
    ok("ema-resnet", "resnet", label="zero_grad after, AveragedModel EMA (with BN buffers)", **_ema()),
    # AMP fp16 with the GradScaler's normal early skips
    ok("amp-fp16-mlp-early-skips", "mlp", FP16_EARLY),
    ok("amp-fp16-gpt2-early-skips", "gpt2", FP16_EARLY),
    ok("amp-fp16-resnet", "resnet", FP16),
    ok("amp-fp16-lora-llama", "lora-llama", FP16_EARLY),
    # optimizers replaced or param groups added mid-run
    ok(
        "mlp-optimizer-replaced",
        "mlp",
        label="AdamW, then SGD from step 100 (handed to the watch)",
        every=_replace_optimizer(100),
    ),
    ok(
        "gpt2-optimizer-replaced",
        "gpt2",
        label="AdamW, then a new AdamW from step 100 (handed to the watch)",
        every=_replace_optimizer(100, "adamw"),
    ),
    ok(
        "mlp-unfreeze-group-added",
        "mlp",
        label="fc1 frozen, then unfrozen as a new param group at step 100",
        **_unfreeze("fc1", 100),
    ),
    ok(
        "resnet-unfreeze-group-added",
        "resnet",
        label="stem frozen, then a new param group at step 100",
        **_unfreeze("resnet.embedder", 100),
    ),
    # schedulers warming up from 0 or decaying to 0
    ok(
        "gpt2-linear-warmup-from-0",
        "gpt2",
        scheduler=_hf_linear(20, 200),
        label="zero_grad after, get_linear_schedule_with_warmup(20, 200): lr 0 at the first and last step",
    ),
    ok(
        "cnn-cosine-warmup-to-0",
        "cnn",
        scheduler=_hf_cosine(10, 200),
        label="zero_grad after, get_cosine_schedule_with_warmup(10, 200)",
    ),
    ok(
        "llama-polynomial-to-0",
        "llama",
        scheduler=_hf_polynomial(10, 200),
        label="zero_grad after, polynomial decay to 0",
    ),
    ok(
        "mlp-cosine-annealing-to-0",
        "mlp",
        Loop(optimizer="sgd"),
        scheduler=_cosine_annealing(200),
        label="zero_grad after, SGD, CosineAnnealingLR to 0 at the last step",
    ),
    ok("lstm-one-cycle", "lstm", scheduler=_one_cycle(200), label="zero_grad after, OneCycleLR"),
    # a curriculum switch
    ok(
        "gpt2-curriculum",
        "curriculum-gpt2",
        label="zero_grad after, 8-token sequences, then 16 from step 100",
    ),
    ok("cnn-curriculum", "curriculum-cnn", label="zero_grad after, clean images, then noisy from step 100"),
    # more optimizers and seeds
    ok("mlp-nesterov", "mlp", Loop(optimizer="nesterov")),
    ok("cnn-rmsprop", "cnn", Loop(optimizer="rmsprop")),
    ok("lstm-adagrad", "lstm", Loop(optimizer="adagrad")),
    ok("gpt2-adafactor", "gpt2", Loop(optimizer="adafactor")),
    ok("mlp-adam-seed1", "mlp", Loop(optimizer="adam"), seed=1),
    ok("cnn-sgd-seed2", "cnn", Loop(optimizer="sgd"), seed=2),
]

# -- bugs --------------------------------------------------------------------------------------
BUGS = [
    # the GradScaler skips every step from the plant on (an overflow that never goes away): each skipped
    # step is a row, so the tenth in a row, SKIPS steps after the plant, is where it is named
    bad("amp-scaler-skipping-mlp", "mlp", ("scaler-skipping",), None, FP16, Plant(_overflow("fc2")),
        grace=SKIPS),
    bad(
        "amp-scaler-skipping-gpt2",
        "gpt2",
        ("scaler-skipping",),
        None,
        FP16,
        Plant(_overflow("transformer.h.1.mlp.c_fc")),
        grace=SKIPS,
    ),
    bad(
        "amp-scaler-skipping-resnet",
        "resnet",
        ("scaler-skipping",),
        None,
        FP16,
        Plant(_overflow("resnet.encoder.stages.1")),
        grace=SKIPS,
    ),
    bad(
        "amp-scaler-skipping-cnn", "cnn", ("scaler-skipping",), None, FP16, Plant(_overflow("conv2")),
        grace=SKIPS
    ),
    # a param group at lr 0 while the others train
    bad(
        "mlp-group-lr-zero-head",
        "mlp",
        ("no-update",),
        ("fc3",),
        at=0,
        grace=5,
        params=_groups("fc3", lr=0.0),
        cause=GROUP_LR,
        label="zero_grad after, fc3 in its own param group at lr 0",
    ),
    bad(
        "resnet-group-lr-zero-classifier",
        "resnet",
        ("no-update",),
        ("classifier",),
        at=0,
        grace=5,
        params=_groups("classifier", lr=0.0),
        cause=GROUP_LR,
        label="zero_grad after, classifier group at lr 0",
    ),
    bad(
        "bert-group-lr-zero-midrun",
        "bert",
        ("no-update",),
        ("bert.encoder.layer.1",),
        plant=Plant(_set_group_lr(1, 0.0)),
        grace=5,
        params=_groups("bert.encoder.layer.1"),
        cause=GROUP_LR,
        label="zero_grad after, layer 1's group set to lr 0 at the plant",
    ),
    bad(
        "switch-group-lr-zero-router",
        "switch",
        ("no-update",),
        (SWITCH_ROUTER,),
        at=0,
        grace=5,
        params=_groups(SWITCH_ROUTER, lr=0.0),
        cause=GROUP_LR,
        label="zero_grad after, the router's group at lr 0",
    ),
    # zero_grad() between backward() and step()
    bad(
        "mlp-zero-grad-before-step",
        "mlp",
        ("zero-gradient-step",),
        None,
        plant=Plant(clear_late=True, persist=True),
    ),
    bad(
        "mlp-zero-grad-before-step-zero",
        "mlp",
        ("zero-gradient-step",),
        None,
        Loop("after", False),
        Plant(clear_late=True, persist=True),
    ),
    bad(
        "gpt2-zero-grad-before-step",
        "gpt2",
        ("zero-gradient-step",),
        None,
        Loop("before"),
        Plant(clear_late=True, persist=True),
    ),
    bad(
        "resnet-zero-grad-before-step-zero",
        "resnet",
        ("zero-gradient-step",),
        None,
        Loop("before", False),
        Plant(clear_late=True, persist=True),
    ),
    bad(
        "switch-zero-grad-before-step",
        "switch",
        ("zero-gradient-step",),
        None,
        plant=Plant(clear_late=True, persist=True),
    ),
    # a layer whose output died (bias -100 before a ReLU/GELU)
    bad(
        "mlp-dead-relu-fc2",
        "mlp",
        ("dead-gradient",),
        ("fc2",),
        plant=Plant(_bias("fc2", -100.0)),
        grace=5,
        cause=DEAD_OUTPUT,
        note="fc2.bias = -100: relu(fc2(h)) is 0 everywhere",
    ),
    bad(
        "gpt2-dead-gelu-c_fc",
        "gpt2",
        ("dead-gradient",),
        ("transformer.h.0.mlp.c_fc",),
        plant=Plant(_bias("transformer.h.0.mlp.c_fc", -100.0)),
        grace=5,
        cause=DEAD_OUTPUT,
    ),
    bad(
        "resnet-dead-relu-bn",
        "resnet",
        ("dead-gradient",),
        (RESNET_BN, RESNET_BN.rsplit(".", 1)[0]),
        plant=Plant(_bias(RESNET_BN, -100.0)),
        grace=5,
        cause=DEAD_OUTPUT,
        note="a BatchNorm's beta = -100 before its ReLU",
    ),
    # an optimizer replaced and not handed to the watch
    bad(
        "mlp-optimizer-lost",
        "mlp",
        ("optimizer-lost",),
        None,
        every=_replace_optimizer(30, handed=False),
        label="AdamW, then SGD from the plant (the watch keeps the old one)",
    ),
    bad(
        "gpt2-optimizer-lost",
        "gpt2",
        ("optimizer-lost",),
        None,
        every=_replace_optimizer(30, "adamw", handed=False),
        label="a new AdamW from the plant (the watch keeps the old one)",
    ),
    bad(
        "resnet-optimizer-lost",
        "resnet-norm-eval",
        ("optimizer-lost",),
        None,
        every=_replace_optimizer(30, handed=False),
        label="norm_eval; SGD from the plant (not handed)",
    ),
    bad(
        "lora-llama-optimizer-lost",
        "lora-llama",
        ("optimizer-lost",),
        None,
        every=_replace_optimizer(30, "adamw", handed=False),
        label="LoRA; a new AdamW from the plant (not handed)",
    ),
    # the learning rate raised a hundredfold under SGD
    bad(
        "mlp-sgd-lr-x100",
        "mlp",
        ("exploding-gradient", "loss-spike") + NONFINITE,
        None,
        Loop(optimizer="sgd"),
        Plant(_lr_times(100.0)),
        cause=LR_RAISED,
    ),
    bad(
        "cnn-sgd-lr-x100",
        "cnn",
        ("exploding-gradient", "loss-spike") + NONFINITE,
        None,
        Loop(optimizer="sgd"),
        Plant(_lr_times(100.0)),
        cause=LR_RAISED,
    ),
    # the LSTM's: a hundredfold is no bug there (its loss falls from 4.14 to 0.83 by step 49 instead of
    # crawling), so its plant is a thousandfold
    bad(
        "lstm-sgd-lr-x1000",
        "lstm",
        ("exploding-gradient", "loss-spike") + NONFINITE,
        None,
        Loop(optimizer="sgd"),
        Plant(_lr_times(1000.0)),
        cause=LR_RAISED,
    ),
    # the learning rate schedule ends at the plant (num_training_steps too small): lr 0 from then on
    bad(
        "mlp-schedule-ends-early",
        "mlp",
        ("no-update",),
        None,
        scheduler=_hf_linear(0, 30),
        grace=5,
        plant=Plant(start=lambda ctx, m, o: None),
        label="zero_grad after, linear schedule to 0 at step 30 of 50",
    ),
    bad(
        "gpt2-schedule-ends-early",
        "gpt2",
        ("no-update",),
        None,
        scheduler=_hf_polynomial(5, 30),
        grace=5,
        plant=Plant(start=lambda ctx, m, o: None),
        label="zero_grad after, polynomial decay to 0 at step 30 of 50",
    ),
    # a param group that should have been added: the unfrozen part is in no param group
    bad(
        "mlp-unfrozen-not-added",
        "mlp",
        ("not-in-optimizer",),
        ("fc1",),
        label="fc1 unfrozen at the plant, never added",
        **_unfreeze("fc1", 30, add=False),
    ),
    bad(
        "resnet-unfrozen-not-added",
        "resnet",
        ("not-in-optimizer",),
        ("resnet.embedder",),
        label="the stem unfrozen at the plant, never added",
        **_unfreeze("resnet.embedder", 30, add=False),
    ),
    # variants of the known kinds inside the library models
    bad(
        "resnet-div-zero-stage",
        "resnet",
        NONFINITE,
        ("resnet.encoder.stages.1",),
        plant=Plant(divide_by_zero("resnet.encoder.stages.1")),
        nonfinite=("nonfinite-forward",),
        cause=IN_FORWARD,
    ),
    bad(
        "mixtral-inf-router",
        "mixtral",
        NONFINITE,
        ("model.layers.1.mlp.gate",),
        plant=Plant(fill_inf("model.layers.1.mlp.gate.weight")),
        nonfinite=("nonfinite-forward", "nonfinite-parameter"),
        cause=IN_WEIGHT,
    ),
    bad(
        "switch-inf-router",
        "switch",
        NONFINITE,
        (SWITCH_ROUTER, SWITCH_ROUTER.rsplit(".", 1)[0]),
        plant=Plant(fill_inf(SWITCH_ROUTER + ".weight")),
        nonfinite=("nonfinite-forward", "nonfinite-parameter"),
        cause=IN_WEIGHT,
    ),
    bad(
        "olmoe-div-zero-mlp",
        "olmoe",
        NONFINITE,
        ("model.layers.1.mlp",),
        plant=Plant(divide_by_zero("model.layers.1.mlp")),
        nonfinite=("nonfinite-forward",),
        cause=IN_FORWARD,
    ),
    bad(
        "lora-gpt2-detached-branch",
        "lora-gpt2",
        ("dead-gradient",),
        ("base_model.model.transformer.h.0.attn.c_attn.lora_A.default",),
        plant=Plant(_detach_input("base_model.model.transformer.h.0.attn.c_attn.lora_B.default")),
        grace=5,
        note="the input of one LoRA B detached: its A gets no gradient",
    ),
    bad(
        "lora-gpt2-not-in-optimizer",
        "lora-gpt2",
        ("not-in-optimizer",),
        _lora_names(),
        at=0,
        params=_without_lora,
        note="the optimizer built before get_peft_model: no adapter in it",
    ),
    bad("lora-gpt2-huge-lr", "lora-gpt2", HUGE_LR, None, plant=Plant(_lr_times(1e30)), cause=BY_LR),
    bad(
        "switch-frozen-expert",
        "switch",
        ("frozen-parameters",),
        ("encoder.block.1.layer.1.mlp.experts.expert_2",),
        at=0,
        before=_frozen("encoder.block.1.layer.1.mlp.experts.expert_2"),
    ),
    bad(
        "switch-exploding-router",
        "switch",
        ("exploding-gradient",),
        (SWITCH_ROUTER,),
        plant=Plant(scale_grad(SWITCH_ROUTER + ".weight", 1000.0)),
    ),
    bad(
        "mixtral-exploding-experts",
        "mixtral",
        ("exploding-gradient",),
        ("model.layers.0.mlp.experts",),
        plant=Plant(scale_grad("model.layers.0.mlp.experts.gate_up_proj", 1000.0)),
    ),
    bad(
        "resnet-bn-eval-trainable",
        "resnet",
        ("eval-mode-module",),
        (RESNET_BN,),
        plant=Plant(_set_eval(RESNET_BN)),
        note="a BatchNorm left in eval mode while its affine trains (not frozen on purpose)",
    ),
    bad(
        "resnet-not-cleared",
        "resnet",
        ("gradient-not-cleared",),
        None,
        Loop("before"),
        Plant(no_clear=True, persist=True),
    ),
    bad(
        "mixtral-not-cleared",
        "mixtral",
        ("gradient-not-cleared",),
        None,
        Loop("between"),
        Plant(no_clear=True, persist=True),
    ),
    bad(
        "distill-mlp-detach-student",
        "distill-mlp",
        ("dead-gradient",),
        ("student.fc1",),
        plant=Plant(_detach_input("student.fc2")),
        grace=5,
    ),
    bad(
        "gpt2-curriculum-labels-masked",
        "curriculum-gpt2",
        ("nonfinite-loss",),
        ("(loss)", "loss"),
        plant=Plant(batch=_ignore_labels, persist=True),
        cause=("the loss", "labels"),
        note="every label -100 from the plant on: the mean over no token is NaN",
    ),
]
