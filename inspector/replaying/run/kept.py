"""What a replay starts from: the replay file that kept the step (next to the run file, its weights
checked against the model), the model (a live one, a loaded one, or a spec built here) and what the run
recorded at that step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from ...loading import LoadedModel, load_model
from ...runfiles import read_run
from ...utils.findings import InspectorError
from ...utils.paths import confined
from ...utils.wrappers import underlying
from ..files import KeptStep, ReplayFile, replay_files


def _kept_file(run_path: Path, step: int, rank: int) -> tuple[ReplayFile, KeptStep]:
    def inside(t: str) -> str:
        return (f"replay file {t} is a link that leads outside {run_path.parent}; a run's replay files lie "
                "next to it")

    files = [ReplayFile(confined(f, [run_path.parent], what="replay file", refusal=inside))
             for f in replay_files(run_path)]
    mine = [f for f in files if f.meta.rank == rank]
    for f in sorted(mine, key=lambda f: f.meta.step):
        kept = f.meta.kept(step)
        if kept is not None and kept.weights:
            return f, kept
    held = sorted({(s.step, s.weights) for f in mine for s in f.meta.steps})
    where = f"rank {rank} of " if rank else ""
    if not held:
        raise InspectorError(
            f"step {step} of {where}{run_path.name} was not kept: no replay file lies next to it. "
            "Watch with keep=True: a step whose error finding (NaN/Inf gradients or loss, "
            "an exploding gradient) is seen before the update is kept"
        )
    listed = ", ".join(f"{s}{'' if w else ' (no weights)'}" for s, w in held)
    raise InspectorError(
        f"step {step} of {where}{run_path.name} was not kept with its weights; its replay files "
        f"hold steps {listed}. A finding after the update needs keep_weights=True"
    )


def _the_model(model: nn.Module | str | LoadedModel, run: str) -> tuple[nn.Module, Callable | None]:
    if isinstance(model, LoadedModel):
        return model.model, (model.loss if model.has_loss else None)
    if isinstance(model, nn.Module):
        return underlying(model), None
    if isinstance(model, str):
        try:
            loaded = load_model(model)
        except InspectorError as exc:
            raise InspectorError(f"replay of {run}: the model {model!r} did not build: {exc}") from None
        return loaded.model, (loaded.loss if loaded.has_loss else None)
    raise InspectorError(
        f"replay needs model= an nn.Module, a LoadedModel or a spec such as 'file.py:factory', "
        f"got {type(model).__name__}"
    )


def _check_weights(f: ReplayFile, model: nn.Module) -> None:
    """The file's weights against the model: the same names and shapes, else an error naming both."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for kind, names, own in (("parameter", f.meta.parameters, params), ("buffer", f.meta.buffers, buffers)):
        missing, extra = [n for n in own if n not in set(names)], [n for n in names if n not in own]
        if missing or extra:
            raise InspectorError(
                f"replay file {f.path.name} holds the weights of another model ({f.meta.model!r}): "
                + "; ".join(
                    x
                    for x in (
                        f"{len(extra)} {kind} name(s) not in this model, first {extra[0]!r}" if extra else "",
                        f"{len(missing)} of this model's not in the file, first {missing[0]!r}"
                        if missing
                        else "",
                    )
                    if x
                )
                + ". Pass the model the run trained"
            )
    step = next(s for s in f.meta.steps if s.weights).step
    for prefix, own in ((f"s{step}/w/", params), (f"s{step}/b/", buffers)):
        for n, t in own.items():
            shape = f.shapes[prefix + n]
            if shape != tuple(t.shape):
                raise InspectorError(
                    f"replay file {f.path.name}: {n} has shape {list(shape)} there and {list(t.shape)} in "
                    "this model; pass the model the run trained (the same sizes)"
                )


def _recorded(run_path: Path, step: int, rank: int, kept: KeptStep) -> tuple[float | None, float | None]:
    """The loss (else the one the keeper read) and the total gradient norm the run recorded at ``step``."""
    run = read_run(run_path)
    rows = run.steps[(run.steps["step"] == step) & (run.steps["rank"] == rank)]
    loss = float(rows["loss"].iloc[-1]) if len(rows) and bool(rows["loss_logged"].iloc[-1]) else kept.loss
    norm = float(rows["grad_norm"].iloc[-1]) if len(rows) else None
    return loss, norm
