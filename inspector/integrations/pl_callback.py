"""PyTorch Lightning: ``Trainer(callbacks=[LightningWatch("run.inspect")])``.

The watch opens at ``on_train_start`` on the LightningModule and the optimizer Lightning built
(its precision plugin's GradScaler under ``16-mixed``). With one optimizer each of its steps is a
step, in automatic and manual optimisation alike; with several (manual optimisation: a GAN) the
watch is given all of them: the first one's steps are the steps and one that does not step is
named (``optimizer-not-stepped``); give ``optimizer=i`` to follow only the i-th. The loss of each
step is the one handed to backward; the file closes at ``on_train_end`` or ``on_exception`` (which
records the exception).
"""

from __future__ import annotations

import os
from typing import Any

from ..utils.findings import InspectorError
from .session import WatchedTraining

try:  # the package the Trainer comes from decides which Callback class it accepts
    from pytorch_lightning import Callback
except ImportError:  # pragma: no cover - only the unified `lightning` package installed
    from lightning.pytorch import Callback  # type: ignore[no-redef,import-not-found,unused-ignore]


class LightningWatch(Callback):
    """A Lightning ``Callback`` that watches every optimizer step (``stop_on_error``, ``export``,
    ``report`` and the watch's options as :class:`.session.WatchedTraining` takes them)."""

    def __init__(self, path: str | os.PathLike = "run.inspect", *, optimizer: int | None = None,
                 **options: Any) -> None:
        super().__init__()
        self.session = WatchedTraining(path, **options)
        self.which = optimizer

    @property
    def result(self) -> Any:
        return self.session.result

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(trainer.optimizers)
        chosen: Any = optimizers or None
        if optimizers and self.which is not None:
            if not 0 <= self.which < len(optimizers):
                raise InspectorError(f"LightningWatch(optimizer={self.which}): the trainer has "
                                     f"{len(optimizers)} optimizer(s); give 0 to {len(optimizers) - 1}")
            chosen = optimizers[self.which]
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        self.session.start(pl_module, chosen, scaler=scaler, name=type(pl_module).__name__)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.session.log(loss=loss.detach())

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._after(trainer)

    def _after(self, trainer: Any) -> None:
        self.session.after_step()
        if self.session.should_stop and not trainer.should_stop:
            trainer.should_stop = True
            if self.session.rank == 0:
                print(f"[inspector] {self.session.stop_line()}", flush=True)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish(completed=not self.session.should_stop)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish(completed=False, error=exception)


__all__ = ["LightningWatch"]
