"""The zoo's cases in the three stacks: Hugging Face Trainer (``watch_trainer``), Lightning
automatic and manual optimisation (``LightningWatch``) and accelerate (``watch_accelerator``)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .cases_plain import IN_BATCH, IN_WEIGHT, NONFINITE, _frozen
from .core import Case, Ctx, PlantedError, cause_for
from .models import GAN, MODELS, Task, gan_data

Action = Callable[[Ctx, nn.Module, Any], None]


def _stepper(ctx: Ctx, session: Any) -> None:
    ctx.step_of = lambda: session.watch.steps if session.watch is not None else ctx.i


# -- Hugging Face Trainer --------------------------------------------------------------------
def trainer_run(model: str, *, plant: Action | None = None, accum: int = 1, bf16: bool = False,
                optimizer: Callable[[nn.Module, float], Any] | None = None,
                before: Callable[[nn.Module], None] | None = None) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

        from inspector.integrations import watch_trainer

        task = MODELS[model](0)
        if before is not None:
            before(task.model)
        rows = [{k: v[j] for k, v in task.batch(i).items()} for i in range(16) for j in range(4)]

        class Planter(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                              **kw: Any) -> None:
                ctx.i = state.global_step
                if plant is not None and ctx.i == ctx.plant_at:
                    ctx.mark()
                    plant(ctx, model, None)

        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(out, per_device_train_batch_size=4, gradient_accumulation_steps=accum,
                                     max_steps=ctx.steps, learning_rate=task.lr, use_cpu=True, report_to=[],
                                     save_strategy="no", logging_steps=1, bf16=bf16, seed=0,
                                     disable_tqdm=True, dataloader_num_workers=0)
            opts = (optimizer(task.model, task.lr), None) if optimizer is not None else (None, None)
            trainer = Trainer(model=task.model, args=args, train_dataset=rows, optimizers=opts)
            trainer.remove_callback(PrinterCallback)  # the logs every step on stdout
            callback = watch_trainer(trainer, ctx.path, report=None, **ctx.options)
            _stepper(ctx, callback.session)
            trainer.add_callback(Planter())
            try:
                trainer.train()
            finally:
                ctx.results.append(callback.session)
    return run


def _fill_inf(name: str) -> Action:
    def act(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        with torch.no_grad():
            model.get_parameter(name).fill_(float("inf"))
    return act


def _nan_input(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    def hook(m: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        if ctx.i == ctx.plant_at and "pixel_values" in kwargs:
            kwargs["pixel_values"] = kwargs["pixel_values"].clone()
            kwargs["pixel_values"][0, 0, 0, 0] = float("nan")
        return args, kwargs
    model.register_forward_pre_hook(hook, with_kwargs=True)


def _raise(ctx: Ctx, model: Any, opt: Any) -> None:
    raise PlantedError("planted failure at step 12")


def _no_classifier(model: nn.Module, lr: float) -> Any:
    skip = {id(p) for p in model.classifier.parameters()}
    return torch.optim.AdamW([p for p in model.parameters() if id(p) not in skip], lr=lr)


def _trainer_zero_warmup(model: str) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        from transformers import Trainer

        original = Trainer.create_scheduler

        def create_scheduler(self: Any, num_training_steps: int, optimizer: Any = None) -> Any:
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer or self.optimizer, lambda s: min(1, s // 1000))
            return self.lr_scheduler
        Trainer.create_scheduler = create_scheduler  # type: ignore[method-assign]
        try:
            trainer_run(model)(ctx)
        finally:
            Trainer.create_scheduler = original  # type: ignore[method-assign]
    return run


def T(name: str, model: str, run: Callable[[Ctx], None], expect: tuple[str, ...] = (),
      where: tuple[str, ...] | None = None, loop: str = "Trainer", **kw: Any) -> Case:
    kw["cause"] = cause_for(expect, kw.get("cause", ()))
    return Case(name, model, "Trainer", loop, run, expect, where, baselines=False, **kw)


TRAINER_HEALTHY = [
    T("trainer-gpt2", "gpt2", trainer_run("gpt2")),
    T("trainer-bert-accumulate", "bert", trainer_run("bert", accum=4), loop="Trainer, accumulate 4"),
    T("trainer-vit-bf16", "vit", trainer_run("vit", bf16=True), loop="Trainer, bf16"),
]
TRAINER_BUGS = [
    T("trainer-gpt2-lr-zero", "gpt2", _trainer_zero_warmup("gpt2"), ("no-update",), None, plant_at=0, grace=5,
      note="the Trainer's scheduler replaced by a LambdaLR warm-up that stays 0"),
    T("trainer-vit-nan-batch", "vit", trainer_run("vit", plant=_nan_input), NONFINITE,
      ("(batch)", "vit.embeddings.patch_embeddings"), expect_nonfinite=("nonfinite-forward",),
      cause=IN_BATCH),
    T("trainer-llama-inf-weight", "llama",
      trainer_run("llama", plant=_fill_inf("model.layers.0.mlp.up_proj.weight")), NONFINITE,
      ("model.layers.0.mlp.up_proj",),
      expect_nonfinite=("nonfinite-forward", "nonfinite-parameter"), cause=IN_WEIGHT),
    T("trainer-gpt2-raises", "gpt2", trainer_run("gpt2", plant=_raise), ("run-failed",), None, plant_at=12),
    T("trainer-gpt2-frozen-wpe", "gpt2", trainer_run("gpt2", before=_frozen("transformer.wpe")),
      ("frozen-parameters",), ("transformer.wpe",), plant_at=0),
    T("trainer-vit-not-in-optimizer", "vit", trainer_run("vit", optimizer=_no_classifier),
      ("not-in-optimizer",), ("classifier",), plant_at=0),
]


# -- Lightning -------------------------------------------------------------------------------
def lightning_run(model: str, *, manual: bool = False, accum: int = 1, plant: Action | None = None,
                  loss_plant: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  no_clear: bool = False) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        import pytorch_lightning as pl

        task: Task = MODELS[model](0)

        class Lit(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.model = task.model
                self.automatic_optimization = not manual

            def training_step(self, batch: Any, idx: int) -> Any:
                ctx.i = idx // accum
                if plant is not None and idx == ctx.plant_at * accum:
                    ctx.mark()
                    plant(ctx, self.model, None)
                loss = task.loss(self.model, batch)
                if loss_plant is not None and idx == ctx.plant_at * accum:
                    ctx.mark()
                    loss = loss_plant(loss)
                if not manual:
                    return loss
                opt = self.optimizers()
                if not (no_clear and ctx.i >= ctx.plant_at):
                    opt.zero_grad()
                else:
                    ctx.mark()
                self.manual_backward(loss)
                opt.step()
                return None

            def configure_optimizers(self) -> Any:
                return torch.optim.AdamW(self.parameters(), lr=task.lr)

        _fit(ctx, Lit(), [task.batch(i) for i in range(ctx.steps * accum)], accum)
    return run


def _fit(ctx: Ctx, module: Any, batches: list[Any], accum: int = 1, max_steps: int | None = None) -> None:
    import logging

    import pytorch_lightning as pl

    for name in ("pytorch_lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from inspector.integrations import LightningWatch

    callback = LightningWatch(ctx.path, report=None, **ctx.options)
    _stepper(ctx, callback.session)
    trainer = pl.Trainer(max_steps=ctx.steps if max_steps is None else max_steps, max_epochs=1,
                         accelerator="cpu", devices=1,
                         enable_checkpointing=False, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accumulate_grad_batches=accum, callbacks=[callback])
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    try:
        trainer.fit(module, loader)
    finally:
        ctx.results.append(callback.session)


def lightning_gan(skip_d: bool = False) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        import pytorch_lightning as pl

        torch.manual_seed(0)
        data = gan_data(0)
        bce = nn.functional.binary_cross_entropy_with_logits

        class LitGAN(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.gan = GAN()
                self.automatic_optimization = False

            def training_step(self, batch: Any, idx: int) -> None:
                ctx.i = idx
                opt_g, opt_d = self.optimizers()
                fake = self.gan.gen(batch["z"])
                real_logit, fake_logit = self.gan.disc(batch["real"]), self.gan.disc(fake.detach())
                loss_d = bce(real_logit, torch.ones_like(real_logit)) + \
                    bce(fake_logit, torch.zeros_like(fake_logit))
                opt_d.zero_grad()
                self.manual_backward(loss_d)
                if skip_d and idx >= ctx.plant_at:
                    ctx.mark()
                else:
                    opt_d.step()
                gen_logit = self.gan.disc(fake)
                loss_g = bce(gen_logit, torch.ones_like(gen_logit))
                opt_g.zero_grad()
                self.manual_backward(loss_g)
                opt_g.step()

            def configure_optimizers(self) -> Any:
                return (torch.optim.Adam(self.gan.gen.parameters(), lr=1e-3, betas=(0.5, 0.999)),
                        torch.optim.Adam(self.gan.disc.parameters(), lr=1e-3, betas=(0.5, 0.999)))

        # Lightning counts each optimizer's step in global_step: one epoch of ctx.steps batches bounds it
        _fit(ctx, LitGAN(), [data(i) for i in range(ctx.steps)], max_steps=-1)
    return run


def L(name: str, model: str, run: Callable[[Ctx], None], expect: tuple[str, ...] = (),
      where: tuple[str, ...] | None = None, loop: str = "automatic", **kw: Any) -> Case:
    kw["cause"] = cause_for(expect, kw.get("cause", ()))
    return Case(name, model, "Lightning", loop, run, expect, where, baselines=False, **kw)


def _bn_eval(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    model.bn1.eval()


LIGHTNING_HEALTHY = [
    L("pl-auto-cnn", "cnn", lightning_run("cnn")),
    L("pl-auto-gpt2", "gpt2", lightning_run("gpt2")),
    L("pl-auto-llama-accumulate", "llama", lightning_run("llama", accum=4), loop="automatic, accumulate 4"),
    L("pl-manual-mlp", "mlp", lightning_run("mlp", manual=True), loop="manual"),
    L("pl-manual-gan", "gan", lightning_gan(), loop="manual, two optimizers"),
]
LIGHTNING_BUGS = [
    L("pl-auto-bn-eval", "cnn", lightning_run("cnn", plant=_bn_eval), ("eval-mode-module",), ("bn1",)),
    L("pl-auto-nan-loss", "mlp", lightning_run("mlp", loss_plant=lambda x: x * float("nan")),
      ("nonfinite-loss",), ("(loss)", "loss")),
    L("pl-auto-raises", "bert", lightning_run("bert", plant=_raise), ("run-failed",), None, plant_at=12),
    L("pl-manual-gan-d-never-steps", "gan", lightning_gan(skip_d=True), ("optimizer-not-stepped",), ("disc",),
      loop="manual, two optimizers", grace=5),
    L("pl-manual-not-cleared", "lstm", lightning_run("lstm", manual=True, no_clear=True),
      ("gradient-not-cleared",), None, loop="manual"),
]


# -- accelerate ------------------------------------------------------------------------------
def accelerate_run(model: str, *, accum: int = 1, mixed: str = "no", plant: Action | None = None,
                   no_clear: bool = False, zero_lr: bool = False) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState

        from inspector.integrations import watch_accelerator

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        task = MODELS[model](0)
        acc = Accelerator(cpu=True, mixed_precision=mixed, gradient_accumulation_steps=accum)
        opt = torch.optim.AdamW(task.model.parameters(), lr=task.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, s // 1000)) if zero_lr else None
        loader = torch.utils.data.DataLoader([task.batch(i) for i in range(ctx.steps * accum)],
                                             batch_size=None, shuffle=False)
        m, o, dl = acc.prepare(task.model, opt, loader)
        with watch_accelerator(acc, m, o, ctx.path, report=None, **ctx.options) as w:
            _stepper(ctx, w)
            try:
                for idx, batch in enumerate(dl):
                    ctx.i = idx // accum
                    if plant is not None and idx == ctx.plant_at * accum:
                        ctx.mark()
                        plant(ctx, task.model, o)
                    with acc.accumulate(m):
                        loss = task.loss(m, batch)
                        acc.backward(loss)
                        w.log(loss=loss.detach())
                        o.step()
                        if sched is not None and acc.sync_gradients:
                            sched.step()
                        if no_clear and ctx.i >= ctx.plant_at:
                            ctx.mark()
                        else:
                            o.zero_grad()
            finally:
                ctx.results.append(w)
    return run


def A(name: str, model: str, run: Callable[[Ctx], None], expect: tuple[str, ...] = (),
      where: tuple[str, ...] | None = None, loop: str = "accelerate", **kw: Any) -> Case:
    kw["cause"] = cause_for(expect, kw.get("cause", ()))
    return Case(name, model, "accelerate", loop, run, expect, where, baselines=False, **kw)


def _grad_x1000(name: str) -> Action:
    def act(ctx: Ctx, model: nn.Module, opt: Any) -> None:
        model.get_parameter(name).register_hook(lambda g: g * 1000.0)
    return act


def _reload_assign(ctx: Ctx, model: nn.Module, opt: Any) -> None:
    import copy

    model.load_state_dict(copy.deepcopy(model.state_dict()), assign=True)


ACCELERATE_HEALTHY = [
    A("acc-llama", "llama", accelerate_run("llama")),
    A("acc-gpt2-accumulate", "gpt2", accelerate_run("gpt2", accum=4), loop="accelerate, accumulate 4"),
    A("acc-bert-bf16", "bert", accelerate_run("bert", mixed="bf16"), loop="accelerate, bf16"),
]
ACCELERATE_BUGS = [
    A("acc-accumulate-not-cleared", "gpt2", accelerate_run("gpt2", accum=4, no_clear=True),
      ("gradient-not-cleared",), None, loop="accelerate, accumulate 4"),
    A("acc-lr-zero", "mlp", accelerate_run("mlp", zero_lr=True), ("no-update",), None, plant_at=0, grace=5),
    A("acc-exploding-lstm", "lstm", accelerate_run("lstm", plant=_grad_x1000("lstm.weight_hh_l0")),
      ("exploding-gradient",), ("lstm",)),
    A("acc-load-assign", "cnn", accelerate_run("cnn", plant=_reload_assign), ("parameters-replaced",
                                                                                 "not-in-optimizer"), None),
    A("acc-raises", "llama", accelerate_run("llama", plant=_raise), ("run-failed",), None, plant_at=12),
]

HEALTHY = TRAINER_HEALTHY + LIGHTNING_HEALTHY + ACCELERATE_HEALTHY
BUGS = TRAINER_BUGS + LIGHTNING_BUGS + ACCELERATE_BUGS
