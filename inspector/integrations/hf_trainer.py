"""Hugging Face ``Trainer``: ``trainer.add_callback(WatchCallback("run.inspect"))``.

The watch opens at ``on_train_begin`` on the Trainer's own model and its optimizer as
accelerate prepared it (the torch optimizer inside, where the step hooks fire, and the
accelerator's GradScaler under fp16); each optimizer step is a step (so gradient accumulation
gives one step per update), checked again at ``on_optimizer_step``; the loss of each step is this
rank's own (the sum of what the Trainer's ``training_step`` returned on this rank since the last step,
as the Trainer sums it before it logs: not the logged loss, which comes a step late, averaged over the
ranks and with NaN/Inf left out); the file closes at ``on_train_end``. :func:`watch_trainer` also closes it
when ``trainer.train()`` raises. Each step's gradients are taken once accelerate has unscaled them
and before the Trainer clips them (``max_grad_norm``), so ``grad_norm`` is the pre-clip norm the
Trainer logs: the accelerator's ``unscale_gradients`` and the Trainer's ``training_step`` are wrapped
(on these instances) from ``on_train_begin`` to ``on_train_end``. A callback is handed no reference to
its Trainer: ``watch_trainer`` gives it one, and a ``WatchCallback`` added by hand
(``Trainer(callbacks=[...])``, ``add_callback``) finds the Trainer calling its ``on_train_begin`` among
the few frames above it.
"""

from __future__ import annotations

import functools
import os
import sys
from types import FrameType
from typing import Any

import torch
from transformers import TrainerCallback

from .session import WatchedTraining


class WatchCallback(TrainerCallback):
    """A ``TrainerCallback`` that watches every optimizer step (see :class:`.session.WatchedTraining`
    for ``stop_on_error``, ``export``, ``report`` and the watch's options)."""

    def __init__(self, path: str | os.PathLike = "run.inspect", **options: Any) -> None:
        self.session = WatchedTraining(path, **options)
        self.trainer: Any = None  # set by watch_trainer; otherwise the Trainer calling on_train_begin
        self._unscale: Any = None
        self._stepping: Any = None  # the Trainer whose training_step is wrapped, and its own attribute

    @property
    def result(self) -> Any:
        return self.session.result

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            return
        scaler = getattr(optimizer, "scaler", None)  # accelerate's GradScaler under fp16
        for e in self.session.exports:
            if hasattr(e, "step_offset"):
                e.step_offset = int(state.global_step) + 1  # the Trainer counts its steps from 1
        self.session.start(model, optimizer, scaler=scaler,
                           name=getattr(getattr(model, "config", None), "model_type", "") or "")
        self._unfollow()  # a wrapper left by a train() that raised (no on_train_end) is replaced
        trainer = self.trainer or _calling_trainer()
        self._follow_unscale(trainer)
        self._follow_loss(trainer)

    def _follow_unscale(self, trainer: Any) -> None:
        """Wrap the accelerator's ``unscale_gradients`` (this instance only, until training ends): the
        Trainer clips right after it, so the step's gradients are read there, before the clip."""
        accelerator: Any = getattr(trainer, "accelerator", None)
        original = getattr(accelerator, "unscale_gradients", None)
        if original is None:
            return
        session = self.session

        def unscale_then_read(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if session.watch is not None:
                session.watch.gradients_ready()
            return out

        accelerator.unscale_gradients = unscale_then_read
        self._unscale = accelerator

    def _follow_loss(self, trainer: Any) -> None:
        """Wrap the Trainer's ``training_step`` (this instance only, until training ends): what it returns,
        this rank's loss of one batch (divided by the accumulation steps), is summed over the step's
        batches and logged as the step's loss before the optimizer steps."""
        original = getattr(trainer, "training_step", None)
        if original is None:
            return
        session = self.session
        summed: list[Any] = [None, -1]  # the step's loss so far, and the step it belongs to

        def step_then_log(*args: Any, **kwargs: Any) -> Any:
            loss = original(*args, **kwargs)
            w = session.watch
            if w is not None and isinstance(loss, torch.Tensor) and loss.numel() == 1:
                mine = loss.detach().reshape(())
                summed[0] = mine if summed[1] != w.steps or summed[0] is None else summed[0] + mine
                summed[1] = w.steps
                session.log(loss=summed[0])
            return loss

        self._stepping = (trainer, vars(trainer).get("training_step"))  # put back at the end
        trainer.training_step = step_then_log

    def _unfollow(self) -> None:
        accelerator, self._unscale = self._unscale, None
        if accelerator is not None:
            accelerator.__dict__.pop("unscale_gradients", None)
        stepping, self._stepping = self._stepping, None
        if stepping is not None:
            trainer, before = stepping
            trainer.__dict__.pop("training_step", None)
            if before is not None:
                trainer.training_step = before

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.after_step()
        if self.session.should_stop and not control.should_training_stop:
            control.should_training_stop = True
            if self.session.rank == 0:
                print(f"[inspector] {self.session.stop_line()}", flush=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unfollow()
        self.session.finish(completed=not self.session.should_stop)


def _calling_trainer(depth: int = 8) -> Any:
    """The ``transformers.Trainer`` whose callback handler is calling (``Trainer._inner_training_loop``,
    3 frames above ``on_train_begin``): the first of the ``depth`` frames above the caller whose
    ``self`` is a Trainer; None when none is (an event called by other code)."""
    trainer_module = sys.modules.get("transformers.trainer")  # not imported: no Trainer is running
    cls = getattr(trainer_module, "Trainer", None)
    if cls is None:
        return None
    frame: FrameType | None = sys._getframe(2)  # 1: on_train_begin, 2: the handler's call_event
    try:
        for _ in range(depth):
            if frame is None:
                return None
            code = frame.f_code
            if code.co_argcount and code.co_varnames[0] == "self":  # a method: read only its self
                owner = frame.f_locals.get("self")
                if isinstance(owner, cls):
                    return owner
            frame = frame.f_back
        return None
    finally:
        del frame  # no reference cycle through the frames


def watch_trainer(trainer: Any, path: str | os.PathLike = "run.inspect", **options: Any) -> WatchCallback:
    """Add a :class:`WatchCallback` to ``trainer``; its ``train()`` also closes the run file when it
    raises."""
    callback = WatchCallback(path, **options)
    callback.trainer = trainer
    trainer.add_callback(callback)
    train = trainer.train

    @functools.wraps(train)
    def train_and_close(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException as exc:
            callback.session.finish(completed=False, error=exc)  # no-op after on_train_end
            raise
        finally:
            callback._unfollow()
            callback.session.finish(completed=False)  # no-op after on_train_end

    trainer.train = train_and_close
    return callback


__all__ = ["WatchCallback", "watch_trainer"]
