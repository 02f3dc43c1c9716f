"""Hugging Face ``Trainer``: ``trainer.add_callback(WatchCallback("run.inspect"))``.

The watch opens at ``on_train_begin`` on the Trainer's own model and its optimizer as
accelerate prepared it (the torch optimizer inside, where the step hooks fire, and the
accelerator's GradScaler under fp16); each optimizer step is a step (so gradient accumulation
gives one step per update), checked again at ``on_optimizer_step``; the loss the Trainer logs
goes into the run; the file closes at ``on_train_end``. :func:`watch_trainer` also closes it
when ``trainer.train()`` raises, and takes each step's gradients once accelerate has unscaled
them and before it clips them (``max_grad_norm``), so ``grad_norm`` is the pre-clip norm the
Trainer logs; a ``WatchCallback`` added by hand, which cannot reach the Trainer's accelerator,
reads the gradients at the optimizer's step, after the clip.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from transformers import TrainerCallback

from .session import WatchedTraining, stop_message


class WatchCallback(TrainerCallback):
    """A ``TrainerCallback`` that watches every optimizer step (see :class:`.session.WatchedTraining`
    for ``stop_on_error``, ``export``, ``report`` and the watch's options)."""

    def __init__(self, path: str | os.PathLike = "run.inspect", **options: Any) -> None:
        self.session = WatchedTraining(path, **options)
        self.trainer: Any = None  # set by watch_trainer: its accelerator's unscale is followed
        self._unscale: Any = None

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
        self._follow_unscale()

    def _follow_unscale(self) -> None:
        """Wrap the accelerator's ``unscale_gradients`` (this instance only, until training ends): the
        Trainer clips right after it, so the step's gradients are read there, before the clip."""
        accelerator: Any = getattr(self.trainer, "accelerator", None)
        original = getattr(accelerator, "unscale_gradients", None)
        if original is None or self._unscale is not None:
            return
        session = self.session

        def unscale_then_read(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if session.watch is not None:
                session.watch.gradients_ready()
            return out

        accelerator.unscale_gradients = unscale_then_read
        self._unscale = accelerator

    def _unfollow(self) -> None:
        accelerator, self._unscale = self._unscale, None
        if accelerator is not None:
            accelerator.__dict__.pop("unscale_gradients", None)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.after_step()
        if self.session.should_stop and not control.should_training_stop:
            control.should_training_stop = True
            if self.session.rank == 0:
                print(f"[inspector] {stop_message(self.session.stop_finding())}", flush=True)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and isinstance(logs.get("loss"), (int, float)):
            self.session.log(loss=float(logs["loss"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unfollow()
        self.session.finish(completed=not self.session.should_stop)


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
