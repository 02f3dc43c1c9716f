"""Send a watch's numbers and findings to the trackers a team already runs.

Each export takes the rows :class:`.follow.RunFollower` reads from the run file after a step:
the global gradient norm, the loss, nonfinite counts and, per module (every module that holds
parameters, or those with fewer than ``depth`` dots), the gradient norm, the update ratio and
the nonfinite count; each finding goes as text at the step where it first appeared.
:class:`TensorBoardExport` writes through a ``torch.utils.tensorboard.SummaryWriter``;
:class:`WandbExport` and :class:`MlflowExport` log to the active W&B / MLflow run where those
packages are installed (imported only when used).
"""

from __future__ import annotations

import html
import math
import os
from typing import Any, Protocol

from ..utils.escaping import tensorboard_text, terminal_line
from ..utils.findings import InspectorError
from ..utils.program import install_hint
from ..watching import RunMeta, finding_line
from .follow import StepRow


class Export(Protocol):
    """Where the numbers of each new step go (``write``) until the run ends (``close``)."""

    def write(self, meta: RunMeta, rows: list[StepRow]) -> None: ...

    def close(self) -> None: ...


def finding_text(step: int, f: dict[str, str]) -> str:
    """One line for a finding: ``step 12 · error · nonfinite-gradient at h.0.mlp: ...``; a line break
    or a bidirectional override in a name shows as an escape (it cannot forge a second line)."""
    return terminal_line(finding_line(step, f["severity"], f["code"], f["where"], f["message"]))


def step_numbers(meta: RunMeta, row: StepRow, depth: int | None = None,
                 prefix: str = "inspector") -> dict[str, float]:
    """The scalars of one step, by tag: ``inspector/grad_norm``, ``inspector/grad_norm/<module>``, ...

    Per-module values cover the modules with fewer than ``depth`` dots in their names (None: every
    module that holds parameters); the
    per-module nonfinite counts only on steps that had any.
    """
    out: dict[str, float] = {}
    if row.grad_norm is not None:
        out[f"{prefix}/grad_norm"] = float(row.grad_norm)
    if row.loss is not None:
        out[f"{prefix}/loss"] = float(row.loss)
    out[f"{prefix}/nonfinite"] = float(row.nonfinite)
    if row.scale is not None:
        out[f"{prefix}/loss_scale"] = float(row.scale)
    keep = [i for i, name in enumerate(meta.modules)
            if name and (depth is None or name.count(".") < depth)]
    columns = [("grad_norm", row.module_grad_norm), ("update_ratio", row.module_update_ratio)]
    if row.nonfinite:
        columns.append(("nonfinite", row.module_nonfinite))
    for label, values in columns:
        if values is None:
            continue
        for i in keep:
            v = float(values[i])
            if not math.isnan(v):
                out[f"{prefix}/{label}/{tag_text(meta.modules[i])}"] = v
    return out


def tag_text(name: str) -> str:
    r"""A module name inside a tracker's tag: control characters, ANSI escapes, line breaks and
    bidirectional marks as visible escapes (:func:`terminal_line`), and ``<``, ``>``, ``&`` as entities,
    so a name shows as written and is never markup.

    >>> tag_text("h.0\x1b[31m<script>")
    'h.0\\x1b[31m&lt;script&gt;'
    """
    return html.escape(terminal_line(name), quote=False)


class TensorBoardExport:
    """Write each step to TensorBoard: ``TensorBoardExport(writer)`` or ``TensorBoardExport(logdir=...)``.

    ``step_offset`` is added to the watch's step (0 for the first optimizer step) so the lines
    sit on the x axis of the training stack's own logs.
    """

    def __init__(self, writer: Any = None, *, logdir: str | os.PathLike | None = None,
                 depth: int | None = None, prefix: str = "inspector", step_offset: int = 0) -> None:
        if writer is None and logdir is None:
            raise InspectorError("TensorBoardExport needs a SummaryWriter or logdir=<folder>")
        self._given, self.logdir = writer, logdir
        self._own: Any = None
        self.depth, self.prefix, self.step_offset = depth, prefix, step_offset
        if writer is None:
            self._open()  # now: a missing tensorboard package is said at once

    def _open(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise InspectorError(f"TensorBoard export needs the tensorboard package ({exc}); "
                                 + install_hint("integrations")) from None
        self._own = SummaryWriter(log_dir=str(self.logdir))
        return self._own

    @property
    def writer(self) -> Any:
        """The given writer, or this export's own (opened again after :meth:`close`, for a second run)."""
        if self._given is not None:
            return self._given
        return self._own if self._own is not None else self._open()

    def write(self, meta: RunMeta, rows: list[StepRow]) -> None:
        writer = self.writer
        for row in rows:
            if row.rank > 0:
                continue
            step = row.step + self.step_offset
            for tag, value in step_numbers(meta, row, self.depth, self.prefix).items():
                writer.add_scalar(tag, value, step)
            for f in row.findings:
                # TensorBoard renders the text as Markdown: a code block shows the names as written
                writer.add_text(f"{self.prefix}/findings", tensorboard_text(finding_text(row.step, f)), step)

    def close(self) -> None:
        """Flush a given writer (it stays the caller's); close this export's own."""
        if self._given is not None:
            self._given.flush()
        elif self._own is not None:
            self._own.close()
            self._own = None


class WandbExport:
    """Log each step to the active W&B run (``wandb.init`` first), on its own ``inspector/step`` axis."""

    def __init__(self, run: Any = None, *, depth: int | None = None, prefix: str = "inspector") -> None:
        try:
            import wandb  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise InspectorError(f"W&B export needs the wandb package ({exc})") from None
        self.run: Any = run if run is not None else wandb.run
        if self.run is None:
            raise InspectorError("W&B export needs an active run: call wandb.init(...) first")
        self.depth, self.prefix = depth, prefix
        self.run.define_metric(f"{prefix}/step")
        self.run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")

    def write(self, meta: RunMeta, rows: list[StepRow]) -> None:
        for row in rows:
            if row.rank > 0:
                continue
            data: dict[str, Any] = {f"{self.prefix}/step": row.step}
            data.update(step_numbers(meta, row, self.depth, self.prefix))
            if row.findings:
                data[f"{self.prefix}/findings"] = "\n".join(finding_text(row.step, f) for f in row.findings)
            self.run.log(data)

    def close(self) -> None:
        pass


class MlflowExport:
    """Log each step's numbers as metrics of the active MLflow run, the findings as one text artifact."""

    def __init__(self, *, depth: int | None = None, prefix: str = "inspector") -> None:
        try:
            import mlflow  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise InspectorError(f"MLflow export needs the mlflow package ({exc})") from None
        self.mlflow, self.depth, self.prefix = mlflow, depth, prefix
        self.lines: list[str] = []

    def write(self, meta: RunMeta, rows: list[StepRow]) -> None:
        for row in rows:
            if row.rank > 0:
                continue
            self.mlflow.log_metrics(step_numbers(meta, row, self.depth, self.prefix), step=row.step)
            if row.findings:
                self.lines += [finding_text(row.step, f) for f in row.findings]
                self.mlflow.log_text("\n".join(self.lines) + "\n", f"{self.prefix}/findings.txt")

    def close(self) -> None:
        pass


def make_export(spec: Any) -> Export:
    """An export from ``"tensorboard:<logdir>"``, ``"wandb"``, ``"mlflow"``, or an object with write/close."""
    if hasattr(spec, "write") and hasattr(spec, "close"):
        return spec  # type: ignore[no-any-return,unused-ignore]
    if isinstance(spec, str):
        kind, _, arg = spec.partition(":")
        if kind == "tensorboard" and arg:
            return TensorBoardExport(logdir=arg)
        if kind == "wandb" and not arg:
            return WandbExport()
        if kind == "mlflow" and not arg:
            return MlflowExport()
    raise InspectorError(f"unknown export {spec!r}: give 'tensorboard:<logdir>', 'wandb', 'mlflow', or a "
                         "TensorBoardExport / WandbExport / MlflowExport")


__all__ = ["Export", "MlflowExport", "TensorBoardExport", "WandbExport", "finding_text", "make_export",
           "step_numbers"]
