"""Every finding code the inspector reports: its usual severity, what it means and what to do.

The one list of codes (``CODES``). Modules take their codes from it; ``tests/test_finding_codes.py``
fails when a module uses a code that is not here or that no page of ``docs/`` names, and
``docs/findings.md`` lists them all. ``recurs`` says how often a watched run reports a code at one
place: ``"once"`` (the first time), ``"episode"`` (again each time it comes back after it cleared
for some steps) or ``"every"`` (each step it is seen).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Literal, TypeVar

from .findings import Finding, Severity

Recurs = Literal["once", "episode", "every"]


@dataclass(frozen=True)
class FindingCode:
    """One code: ``severity`` is the usual one (a few codes are raised or lowered by context)."""

    code: str
    severity: Severity
    meaning: str
    action: str
    recurs: Recurs = "once"


def _c(code: str, severity: Severity, meaning: str, action: str, recurs: Recurs = "once") -> FindingCode:
    return FindingCode(code, severity, meaning, action, recurs)


_E: Severity = "error"
_W: Severity = "warning"
_I: Severity = "info"


CODES: dict[str, FindingCode] = {c.code: c for c in (
    # a training run, step by step (watch) and across ranks (check_step)
    _c("nonfinite-forward", _E, "a module (or the batch) made NaN/Inf from finite inputs in the forward pass",
       "look at that module's weights, its input range and the captures of its inputs", "episode"),
    _c("nonfinite-backward", _E, "a module's backward turned a finite output gradient into a NaN/Inf one",
       "look for a sqrt/log/division at 0, an overflow or a custom autograd function in its backward",
       "episode"),
    _c("nonfinite-gradient", _E, "a parameter's gradient holds NaN/Inf values",
       "find the producer (watch with nonfinite=True); skip the step or lower the loss scale", "episode"),
    _c("nonfinite-parameter", _E, "a parameter's or buffer's values (not its gradient) hold NaN/Inf",
       "restore a checkpoint from before the step that wrote them; find what wrote them", "episode"),
    _c("nonfinite-loss", _E, "the loss logged with w.log(loss=...) is NaN/Inf at that step",
       "look for a log(0) or a division in the loss, a NaN batch, an fp16 overflow; nonfinite=True names a "
       "module that made it", "episode"),
    _c("exploding-gradient", _W, "a module's gradient norm is many times its running median and its noise "
       "(where (model): every module's at once)",
       "lower the learning rate, clip gradients, or check that step's batch", "episode"),
    _c("loss-spike", _W, "the logged loss is many times its running median and its noise",
       "look at that step's batch and the gradient norms around it; lower the learning rate", "episode"),
    _c("replay-differs", _W, "a replayed step's loss is not the one the run recorded at that step",
       "pass the model, code and loss function the run used; data written in place since is not kept"),
    _c("dead-gradient", _W, "a parameter had no gradient, or an all-zero one, for several steps",
       "check that it takes part in the loss (no detach(), unused branch or dead ReLUs)"),
    _c("not-in-optimizer", _E, "a parameter requires grad but no param group of the optimizer holds it",
       "build the optimizer from model.parameters() after every change to the model"),
    _c("gradient-not-cleared", _E, "gradients of the last step were still there when this step began",
       "call optimizer.zero_grad() each step (or accumulate on purpose and say so)"),
    _c("no-update", _E,
       "nothing trains, or part of it does not: every lr is 0, a param group's lr is 0 while the others "
       "train, or no parameter with a gradient changed, for two steps; or one module's weights stayed "
       "exactly the same for three steps while the rest trained",
       "check the scheduler and the lr; bfloat16 weights need a larger update or float32 master weights"),
    _c("zero-gradient-step", _E,
       "the optimizer stepped while every gradient it holds was absent or all zero: nothing could move",
       "call optimizer.zero_grad() before backward() or after step(), never between them; check that the "
       "loss depends on the parameters"),
    _c("scaler-skipping", _E,
       "the AMP GradScaler skipped many optimizer steps in a row (the gradients overflow at every step), "
       "or its scale fell under 1 as skips came on and off",
       "find the overflow (watch with nonfinite=True), lower the lr, or train in bfloat16", "episode"),
    _c("optimizer-lost", _W,
       "an optimizer the watch was not given steps the parameters the watched optimizer holds: the watch "
       "no longer sees the steps", "hand the new optimizer to the watch with w.use_optimizer(new)"),
    _c("optimizer-not-stepped", _E,
       "one of several optimizers given to watch does not step while the first does",
       "call that optimizer's step() in the loop"),
    _c("eval-mode-module", _W,
       "a BatchNorm/InstanceNorm/Dropout ran in eval mode in a forward pass that trains",
       "call model.train() after each validation pass; set .train() on the module unless frozen on purpose"),
    _c("frozen-parameters", _I, "some parameters do not require grad when the watch starts (frozen modules)",
       "nothing, when frozen on purpose"),
    _c("parameters-replaced", _E, "parameters were replaced mid-run by tensors no optimizer holds",
       "rebuild the optimizer from model.parameters() after load_state_dict(assign=True), .to() or a swap"),
    _c("run-failed", _E, "the watched run ended by an exception (its type and message, at its step)",
       "read the message; every step before it is in the run file"),
    _c("slow-rank", _W, "one rank took far longer than the others to load its batch and run its forward pass",
       "look at that rank's data loader, its batch sizes and its machine; every rank waited for it",
       "episode"),
    _c("replica-drift", _E, "a tensor that should be identical on every rank differs on some ranks",
       "find what updated it on one rank only (a rank-dependent branch, an unsynchronised buffer)"),
    _c("replica-resynchronised", _I, "a buffer differed between ranks and was made equal again",
       "nothing, when the model updates it in its forward pass (BatchNorm) and syncs it"),
    _c("gradient-not-synchronized", _W, "a replicated parameter's gradient norm differs across ranks",
       "wrap the model in DDP/FSDP or all-reduce its gradient before the optimizer step"),
    _c("gradient-far-off", _W, "one rank's gradients are far larger per element than another's",
       "check that rank's data shard and its loss scaling"),
    _c("shard-imbalance", _W, "one rank holds far more sharded parameter elements than the mean",
       "shard along a dimension that divides evenly, or shard the large tensors differently"),
    _c("run-file-truncated", _W, "a run file's last record is cut short: the run stopped while writing it",
       "nothing to do to read it: every complete step is read"),
    _c("run-file-newer", _W, "a run file was written by a newer version of the record",
       "update the inspector to read the fields it does not know"),
    # two runs, two models, two checkpoints
    _c("run-diverged", _W, "two runs' loss or gradient norms part beyond the tolerance",
       "look at the first step they part at and what differs between the runs there"),
    _c("runs-agree", _I, "two runs agree within the tolerance at every common step", "nothing"),
    _c("steps-missing", _I, "some steps are in one run only", "nothing: they are shown but not compared"),
    _c("modules-differ", _W, "some modules are in one run only", "compare runs of the same model"),
    _c("missing", _W, "a tensor is in the first model or checkpoint but not the second",
       "check the names (a prefix, a rename) or the architecture"),
    _c("extra", _W, "a tensor is in the second model or checkpoint but not the first",
       "check the names (a prefix, a rename) or the architecture"),
    _c("renamed", _I, "the second side names tensors with another prefix", "nothing: matched by name"),
    _c("shape-changed", _E, "a tensor's shape differs between the two sides (or from the saved folder)",
       "load a checkpoint of the same architecture"),
    _c("dtype-changed", _W, "a tensor's dtype differs between the two sides (or from the saved folder)",
       "cast on purpose, or load with the dtype it was saved in"),
    _c("device-changed", _I, "tensors sit on another device on the second side", "nothing, unless unplanned"),
    _c("nonfinite", _E, "a compared tensor holds NaN/Inf values", "find where they came from"),
    _c("unchanged-tensor", _W, "a tensor is bitwise identical although the others changed",
       "check that it is trainable, in the optimizer and loaded"),
    _c("unchanged-expected", _I, "tensors stayed bitwise identical as expected (--expect-unchanged, or a "
       "whole frozen kind)", "nothing"),
    _c("expect-unmatched", _W, "an --expect-unchanged pattern matches no tensor name or module prefix",
       "check the pattern's spelling (a glob such as '*.wte')"),
    _c("changed-unexpectedly", _W, "tensors expected unchanged (--expect-unchanged) changed",
       "check what trained them: requires_grad, the optimizer's param groups"),
    _c("changed-from-zero", _I, "tensors all zeros on the first side changed (zero-initialised biases)",
       "nothing: read their diff_norm, their rel_change is empty"),
    _c("low-rank-update", _I, "changed matrices moved by a low-rank update (a merged adapter such as LoRA)",
       "nothing, if an adapter was merged on purpose"),
    _c("tie-added", _W, "the second side ties tensors the first kept apart", "check that it is meant"),
    _c("tie-stored-once", _I, "a checkpoint stores a tie once; loading fills the other names through it",
       "nothing"),
    # ties and aliases
    _c("tie-broken", _E, "tensors that were one are now separate storages: they train apart",
       "re-tie them (model.tie_weights(), or assign one Parameter to both names)"),
    _c("tie-weakened", _W, "tensors that were one object are now separate objects over one memory",
       "re-tie them so that parameters() and the optimizer count the weight once"),
    _c("tie-restored", _I, "a tied name missing from a checkpoint gets its partner's value", "nothing"),
    _c("tie-conflict", _W, "a checkpoint holds different values for names the model ties",
       "check which value is right; the model keeps the last one"),
    _c("tied", _I, "a parameter is reachable under several names", "nothing: it is one tensor in the vector"),
    _c("aliases-present", _I, "some parameters are other names of one tensor", "count elements once"),
    _c("alias-identity-only", _I, "meta tensors were grouped by object identity only", "nothing"),
    _c("alias-not-analysable", _I, "a tensor's storage could not be read, so only identity was checked",
       "nothing"),
    _c("retie-refused", _W, "tensors could not be tied again (shapes or dtypes differ)",
       "tie them by hand, after making them alike"),
    # the flat vector and gradients
    _c("frozen-shift", _I, "frozen parameters sit among trainable ones: offsets shift with trainable_only",
       "flatten with the same filter everywhere"),
    _c("frozen-with-gradient", _I, "frozen parameters still hold a gradient",
       "set their .grad to None, or keep them out of the optimizer"),
    _c("all-frozen", _I, "no parameter requires grad", "nothing to train; unfreeze what should learn"),
    _c("no-gradients", _W, "no trainable parameter has a gradient yet", "run a backward pass first"),
    _c("unreached", _W, "some trainable parameters have no gradient although others do",
       "check that the loss depends on them"),
    _c("sparse-gradient", _I, "a parameter has a sparse gradient", "nothing: its norm comes from its values"),
    _c("meta", _I, "the model is on the meta device: offsets come from shapes alone", "nothing"),
    _c("mixed-dtypes", _W, "parameters have several dtypes; parameters_to_vector promotes them",
       "flatten per dtype"),
    _c("several-devices", _W, "parameters are on several devices; parameters_to_vector refuses them",
       "flatten per device"),
    _c("non-contiguous", _W, "a parameter is not contiguous; parameters_to_vector raises on it",
       "flatten with reshape or make it contiguous"),
    # placement and device maps
    _c("param-unplaced", _E, "a device map leaves a parameter without a device", "add its module to the map"),
    _c("buffer-unplaced", _E, "a device map leaves a buffer without a device", "add its module to the map"),
    _c("tie-split", _E, "tied tensors are put on different devices", "put every name of a tie on one device"),
    _c("meta-leftover", _E, "a tensor is still on the meta device after dispatch",
       "give it a device and load its values"),
    _c("buffer-stranded", _W, "a buffer sits away from the device holding most of its module",
       "put it with its module's parameters"),
    _c("unknown-key", _E, "a device map key names nothing in the model", "fix its spelling or remove it"),
    _c("overlapping-key", _W, "two device map keys overlap", "keep one of them"),
    _c("split-owner", _I, "a module split across devices uses its own tensors in forward",
       "add its class to no_split_module_classes if the forward mixes devices"),
    _c("meta-model", _I, "every tensor is on the meta device: structure only", "load weights to run it"),
    _c("accelerate-failed", _W, "accelerate could not plan this model", "nothing: only our plan is shown"),
    _c("accelerate-offloaded", _I, "accelerate dispatched the model with offloaded weights",
       "nothing: it stays where accelerate put it"),
    # captures
    _c("capture-mutated", _W, "a module's live output was overwritten in place after the hook saw it",
       "use the captured clone; a hook keeping a bare reference sees the overwritten values"),
    _c("capture-written-same-values", _I, "an output was written in place without changing its values",
       "nothing"),
    _c("capture-budget-zero", _W, "the byte budget is 0: nothing was captured", "give a positive budget"),
    _c("capture-over-budget", _I, "the byte budget was reached; later captures were skipped",
       "raise the budget or select fewer modules"),
    _c("capture-not-tensor", _I, "a module's output holds something that is not a tensor", "nothing"),
    _c("capture-no-grads", _W, "no gradients were captured: nothing requires grad",
       "make the parameters you study trainable"),
    _c("capture-shard", _I, "a captured output is this rank's piece of a DTensor", "nothing"),
    _c("mutation-watch-off", _I, "in-place writes were not watched (inference mode)", "nothing"),
    _c("forward-state-restored", _I, "the forward changed module attributes or buffers; they were put back",
       "nothing"),
    # attribution
    _c("attribution-nan", _E, "some attribution values are NaN", "check the model's outputs and weights"),
    _c("attribution-inf", _E, "some attribution values are infinite", "check the outputs and weights"),
    _c("attribution-target", _I, "no target given: the predicted one was attributed", "give a target"),
    _c("completeness-poor", _W, "Integrated Gradients' convergence delta is large", "raise n_steps"),
    _c("method-switched", _I, "token ids: attribution ran on the input embedding", "nothing"),
    _c("eval-mode", _I, "attribution ran in eval mode; training mode was restored", "nothing"),
    _c("hook-removed", _W, "hooks added during the call were removed", "nothing"),
    # loading
    _c("missing-key", _W, "a model tensor is not in the checkpoint; it keeps its initial value",
       "check that the checkpoint belongs to this model"),
    _c("unexpected-key", _W, "the checkpoint holds a tensor the model lacks; it was ignored",
       "check that the checkpoint belongs to this model"),
    _c("dtype-mismatch", _W, "a checkpoint tensor's dtype kind differs from the model's; it was cast",
       "check that the checkpoint belongs to this model"),
    _c("dtype-cast", _I, "a checkpoint tensor was cast to the model's dtype", "nothing"),
    _c("checkpoint-nested", _I, "the state dict was read under a key of the checkpoint", "nothing"),
    _c("checkpoint-folder", _I, "a checkpoint folder was read through its index or its one weights file",
       "nothing"),
    _c("checkpoint-part", _I, "one part of a checkpoint was used, the others skipped", "nothing"),
    _c("checkpoint-wrapped", _I, "the checkpoint was saved from a wrapped model (prefixed names)", "nothing"),
    _c("checkpoint-key-not-text", _W, "a checkpoint key is not valid text", "re-save the checkpoint"),
    _c("checkpoint-non-tensor", _I, "some checkpoint entries are not tensors; they were not loaded",
       "nothing"),
    _c("distributed-checkpoint", _I, "a torch.distributed.checkpoint folder was put together", "nothing"),
    _c("complex-kept", _I, "a complex tensor kept a complex dtype through a cast", "nothing"),
    _c("torch-state-restored", _W, "loading changed a process-wide torch setting; it was put back",
       "set it inside the model instead"),
    _c("model-wrapped", _I, "the model is wrapped (DDP, torch.compile); the inner one is inspected",
       "nothing"),
    _c("fsdp-flat-parameters", _W, "FSDP holds flat parameters: names, shapes and ties are hidden",
       "use use_orig_params=True or FSDP2"),
    _c("hf-class", _I, "loaded as the class the folder was saved from", "nothing"),
    _c("hf-class-guessed", _I, "the folder names no class; one was chosen", "check the class"),
    _c("hf-class-differs", _W, "the class loaded is not the one the folder was saved from",
       "install the model's transformers version"),
    _c("hf-tie-skipped", _W, "config says tie_word_embeddings but the folder saved two different values",
       "check which is right"),
    _c("hf-not-checked", _I, "the folder holds no weights file to compare with", "nothing"),
    _c("hf-not-saved-model", _E, "the loaded model is not the one saved in the folder",
       "fix what the message lists before trusting any output"),
    _c("left-at-init", _W, "a model tensor was left at its initial value by loading",
       "check that the folder holds it"),
    _c("unexpected-tensor", _W, "the folder holds a tensor the model does not use", "check the class"),
    _c("weight-differs", _W, "a loaded tensor differs from the saved one", "check the loading code"),
    # the report and the labs
    _c("report-section-failed", _E, "a report section could not be built", "read the message; fix the input"),
    _c("lab-task-open", _I, "a lab task is not passed yet", "do the task"),
)}


def finding_code(code: str) -> FindingCode:
    """The registry entry of ``code``.

    Raises:
        KeyError: ``code`` is not a known finding code.

    >>> finding_code("loss-spike").recurs
    'episode'
    """
    return CODES[code]


def coded(code: str, where: str, message: str) -> Finding:
    """A finding of ``code`` at its registered severity (the one place a check's severity comes from).

    >>> coded("loss-spike", "(model)", "the loss is 9.1").severity
    'warning'
    """
    return Finding(code, CODES[code].severity, where, message)


# where NaN/Inf began on a rank: its batch or a module in its forward, a module's backward, its own loss
ORIGINS = ("nonfinite-forward", "nonfinite-backward", "nonfinite-loss")
_F = TypeVar("_F")


def lead_ranks(codes_by_rank: Sequence[Iterable[str]]) -> list[int]:
    """The order in which the ranks' findings of one step are told: the ranks where NaN/Inf began (a code
    of ``ORIGINS``) first, then the others (what followed, through the gradient reduction), each in rank
    order.

    >>> lead_ranks([["nonfinite-gradient"], ["nonfinite-loss", "nonfinite-parameter"]])
    [1, 0]
    """
    lead = [r for r, codes in enumerate(codes_by_rank) if any(c in ORIGINS for c in codes)]
    return lead + [r for r in range(len(codes_by_rank)) if r not in lead]


def origin_first(findings: Iterable[_F]) -> list[_F]:
    """Findings (``step``, ``rank``, ``code``) in their order, except that among the findings of one step
    (next to each other), those of the ranks where NaN/Inf began (:func:`lead_ranks`) come first: the
    cause before its consequences on the other ranks."""
    out: list[Any] = []
    for _, same in groupby(findings, key=lambda f: f.step):  # type: ignore[attr-defined]
        fs: list[Any] = list(same)
        lead = {f.rank for f in fs if f.code in ORIGINS and f.rank is not None}
        out += [f for f in fs if f.rank in lead] + [f for f in fs if f.rank not in lead] if lead else fs
    return out


def recurs(code: str) -> Recurs:
    """How often a watched run reports ``code`` at one place (``"once"`` for codes not listed)."""
    entry = CODES.get(code)
    return entry.recurs if entry is not None else "once"
