"""The zoo's plain PyTorch loops, with the places a bug is planted (:class:`Plant`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .core import Ctx
from .models import GAN, Task, gan_data


@dataclass(frozen=True)
class Plant:
    """Where a bug goes in :func:`plain_loop`; each part acts at iteration ``ctx.plant_at`` (and
    from then on where ``persist``), and marks the plant. ``start(ctx, model, opt)``: model
    surgery before the iteration; ``batch``/``loss``: change the batch or the loss;
    ``no_clear``: skip ``zero_grad`` from the plant on; ``clear_late``: call ``zero_grad`` between
    ``backward()`` and ``step()`` (the gradients are gone when the optimizer steps)."""

    start: Callable[[Ctx, nn.Module, Any], None] | None = None
    batch: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None
    no_clear: bool = False
    clear_late: bool = False
    persist: bool = False

    def on(self, ctx: Ctx) -> bool:
        return ctx.i == ctx.plant_at or (self.persist and ctx.i > ctx.plant_at)


NO_PLANT = Plant()


@dataclass(frozen=True)
class Loop:
    """A loop's shape: where ``zero_grad`` goes (``before`` the forward, ``between`` forward and
    backward, ``after`` the step), ``set_to_none``, micro-batches per step, autocast dtype,
    a GradScaler (and its first scale), ``torch.compile``, HF gradient checkpointing, the optimizer."""

    order: str = "after"
    set_to_none: bool = True
    accum: int = 1
    amp: torch.dtype | None = None
    scaler: bool = False
    init_scale: float = 2.0 ** 16
    compile: bool = False
    checkpointing: bool = False
    optimizer: str = "adamw"

    @property
    def label(self) -> str:
        parts = [f"zero_grad {self.order}" + ("" if self.set_to_none else " (set_to_none=False)")]
        if self.accum > 1:
            parts.append(f"accumulate {self.accum}")
        if self.amp is not None:
            parts.append(f"{str(self.amp).removeprefix('torch.')} autocast")
        if self.scaler:
            first = "" if self.init_scale == 2.0 ** 16 else f" from {self.init_scale:g}"
            parts.append("GradScaler" + first)
        if self.compile:
            parts.append("torch.compile")
        if self.checkpointing:
            parts.append("grad checkpointing")
        if self.optimizer != "adamw":
            parts.append(self.optimizer)
        return ", ".join(parts)


LOOP = Loop()


def make_optimizer(name: str, params: Any, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr * 10, momentum=0.9)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=lr * 10, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr / 3)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr * 3)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    return torch.optim.AdamW(params, lr=lr)


Every = Callable[[Ctx, nn.Module, Any, Any], Any]


def plain_loop(ctx: Ctx, task: Task, loop: Loop = LOOP, plant: Plant = NO_PLANT, *,
               params: Any = None, scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
               before: Callable[[nn.Module], None] | None = None, every: Every | None = None,
               after_step: Callable[[Ctx, nn.Module], None] | None = None) -> None:
    """Train ``task`` for ``ctx.steps`` optimizer steps under ``ctx.monitor``. ``every(ctx, model,
    opt, mon)`` runs at the start of each iteration (a recipe's phase change); when it returns an
    optimizer, the loop steps that one from then on. ``after_step(ctx, model)`` runs after each
    step (an EMA copy's update)."""
    model = task.model
    if loop.checkpointing:
        model.gradient_checkpointing_enable()
    if before is not None:
        before(model)
    model.train()
    opt = make_optimizer(loop.optimizer, model.parameters() if params is None else params(model), task.lr)
    sched = scheduler(opt) if scheduler is not None else None
    scaler = torch.amp.GradScaler("cpu", init_scale=loop.init_scale) if loop.scaler else None
    run_model = torch.compile(model) if loop.compile else model
    amp = (lambda: torch.autocast("cpu", dtype=loop.amp)) if loop.amp is not None else nullcontext

    def clear() -> None:
        if not (plant.no_clear and plant.on(ctx)):
            opt.zero_grad(set_to_none=loop.set_to_none)

    with ctx.monitor(run_model, opt, scaler=scaler) as mon:
        for i in range(ctx.steps):
            ctx.i = i
            if every is not None:
                opt = every(ctx, model, opt, mon) or opt
            if plant.start is not None and plant.on(ctx):
                ctx.mark()
                plant.start(ctx, model, opt)
            if loop.order == "before":
                clear()
            for k in range(loop.accum):
                batch = task.batch(i * loop.accum + k)
                if plant.batch is not None and plant.on(ctx) and k == 0:
                    ctx.mark()
                    batch = plant.batch(batch)
                with amp():
                    loss = task.loss(run_model, batch)
                if plant.loss is not None and plant.on(ctx) and k == 0:
                    ctx.mark()
                    loss = plant.loss(loss)
                if loop.order == "between" and k == 0:
                    clear()
                part = loss / loop.accum
                (scaler.scale(part) if scaler is not None else part).backward()
            if plant.no_clear and plant.on(ctx):
                ctx.mark()
            if plant.clear_late and plant.on(ctx):
                ctx.mark()
                opt.zero_grad(set_to_none=loop.set_to_none)
            mon.log(loss.detach().float())
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if sched is not None:
                sched.step()
            if after_step is not None:
                after_step(ctx, model)
            if loop.order == "after":
                clear()


def gan_loop(ctx: Ctx, *, skip_d_step: bool = False, seed: int = 0) -> None:
    """A small GAN, two optimizers (generator, discriminator) watched together as a list; with
    ``skip_d_step`` the discriminator's ``step()`` is gone from the plant on."""
    torch.manual_seed(seed)
    model, data = GAN(), gan_data(seed)
    opt_g = torch.optim.Adam(model.gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(model.disc.parameters(), lr=1e-3, betas=(0.5, 0.999))
    bce = nn.functional.binary_cross_entropy_with_logits
    with ctx.monitor(model, [opt_g, opt_d]) as mon:
        for i in range(ctx.steps):
            ctx.i = i
            b = data(i)
            fake = model.gen(b["z"])
            real_logit, fake_logit = model.disc(b["real"]), model.disc(fake.detach())
            loss_d = bce(real_logit, torch.ones_like(real_logit)) + \
                bce(fake_logit, torch.zeros_like(fake_logit))
            opt_d.zero_grad()
            loss_d.backward()
            if skip_d_step and i >= ctx.plant_at:
                ctx.mark()
            else:
                opt_d.step()
            gen_logit = model.disc(fake)
            loss_g = bce(gen_logit, torch.ones_like(gen_logit))
            opt_g.zero_grad()
            loss_g.backward()
            mon.log(loss_g.detach())
            opt_g.step()


def wgan_loop(ctx: Ctx, *, skip_g_step: bool = False, n_critic: int = 5, seed: int = 0, detach: bool = True,
              skip_g_zero: bool = False) -> None:
    """A WGAN with weight clipping: the critic's optimizer given first (its steps are the watch's steps),
    the generator stepped once every ``n_critic`` critic steps, the critic trained on detached samples
    (``detach=False``: on samples whose graph reaches the generator, so the critic's backward adds onto
    the generator's gradients between its steps); with ``skip_g_step`` the generator's ``step()`` is gone
    (its backward stays), with ``skip_g_zero`` its ``zero_grad()`` (its second step, the first to use a
    gradient its last step used, is the bug's)."""
    torch.manual_seed(seed)
    model, data = GAN(), gan_data(seed)
    opt_d = torch.optim.RMSprop(model.disc.parameters(), lr=5e-4)
    opt_g = torch.optim.RMSprop(model.gen.parameters(), lr=5e-4)
    with ctx.monitor(model, [opt_d, opt_g]) as mon:
        for i in range(ctx.steps):
            ctx.i = i
            b = data(i)
            opt_d.zero_grad()
            fake = model.gen(b["z"])
            loss_d = model.disc(fake.detach() if detach else fake).mean() - model.disc(b["real"]).mean()
            loss_d.backward()
            mon.log(loss_d.detach())
            opt_d.step()
            with torch.no_grad():
                for p in model.disc.parameters():
                    p.clamp_(-0.1, 0.1)
            if i % n_critic == n_critic - 1:
                if not skip_g_zero:
                    opt_g.zero_grad()
                elif i == 2 * n_critic - 1:
                    ctx.mark()
                (-model.disc(model.gen(b["z"])).mean()).backward()
                if skip_g_step:
                    ctx.mark()
                else:
                    opt_g.step()

