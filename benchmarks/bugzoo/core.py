"""What a zoo case is, what a run of one gives back, and how a finding is matched to a plant."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector import watch

PLANT = 30  # the optimizer step (0-based, as the watch counts) where most bugs are planted
AFTER = 20  # steps a bugged run goes on after the plant
HEALTHY_STEPS = 200
WRAPPERS = ("_orig_mod.", "module.")  # prefixes torch.compile and DDP add to a name


# The stated-cause rule a bug gets when its case names none: by the code it expects first.
CAUSES: dict[str, tuple[str, ...]] = {
    "gradient-not-cleared": ("not cleared",),
    "no-update": ("learning rate", "lr "),
    "optimizer-not-stepped": ("step()",),
    "eval-mode-module": ("eval mode",),
    "frozen-parameters": ("require grad", "frozen"),
    "nonfinite-loss": ("the loss",),
    "not-in-optimizer": ("no param group",),
    "parameters-replaced": ("replaced",),
    "tie-broken": ("tie", "tied"),
    "run-failed": ("planted failure",),
    "loss-spike": ("the loss is",),
    "exploding-gradient": ("gradient norm", "gradients grew"),
    "dead-gradient": ("detach",),
    "scaler-skipping": ("skip",),
    "zero-gradient-step": ("zero_grad",),
    "optimizer-lost": ("new optimizer", "replaced", "lost track", "another optimizer", "hand it"),
}


def cause_for(expect: tuple[str, ...], cause: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The case's own rule, or the one for the code it expects first."""
    return cause or (CAUSES.get(expect[0], ()) if expect else ())


class PlantedError(RuntimeError):
    """The exception a case raises on purpose (the run must record it; it is not a crash)."""


@dataclass(frozen=True)
class Case:
    """One zoo entry: ``run(ctx)`` trains a small real model under ``ctx.monitor`` (or a stack's
    integration), with a bug planted at ``ctx.plant_at`` unless the case is healthy.

    ``expect``: the finding codes that count as caught with default options (the first is the
    one expected; the others are accepted alternatives). ``expect_nonfinite``: the same with
    ``nonfinite=True`` (given only where the producer check matters; the case then runs twice).
    ``where``: the planted module or parameter names (any of them is right; None: the finding is
    about the whole run, any ``where`` is right). ``grace``: extra steps after the plant a check
    may need by design (``dead-gradient``'s window); the ±1-step figure ignores it. ``cause``: the
    stated-cause rule, words or phrases (any case) at least one of which the caught finding's
    message must contain for the cause it states to be right (say, ``("zero_grad",)`` for a
    ``zero_grad()`` called between ``backward()`` and ``step()``)."""

    name: str
    model: str
    stack: str
    loop: str
    run: Callable[[Ctx], None]
    expect: tuple[str, ...] = ()
    where: tuple[str, ...] | None = None
    expect_nonfinite: tuple[str, ...] = ()
    grace: int = 0
    plant_at: int = PLANT
    note: str = ""
    cause: tuple[str, ...] = ()
    baselines: bool = True  # the case can run under the baseline monitors (a plain loop)

    @property
    def healthy(self) -> bool:
        return not self.expect


@dataclass
class Ctx:
    """What a case's ``run`` gets: the run file, the watch options, its step budget, and where to
    say when the bug was planted. ``monitor`` is the watch (or a baseline in its place)."""

    path: str
    steps: int
    plant_at: int
    options: dict[str, Any] = field(default_factory=dict)
    monitor_factory: Callable[..., Any] | None = None
    planted: int | None = None
    results: list[Any] = field(default_factory=list)
    step_of: Callable[[], int] = lambda: 0  # the current step, as the monitor counts
    i: int = 0  # the loop's own iteration

    def mark(self) -> None:
        """The bug is planted now: record the monitor's current step (first call only)."""
        if self.planted is None:
            self.planted = int(self.step_of())

    @contextmanager
    def monitor(self, model: torch.nn.Module, optimizer: Any, **extra: Any) -> Iterator[Any]:
        factory = self.monitor_factory or WatchMonitor
        mon = factory(self, model, optimizer, **extra)
        with mon.active() as m:
            yield m


class WatchMonitor:
    """The default monitor: :func:`inspector.watch` with the case's options."""

    def __init__(self, ctx: Ctx, model: torch.nn.Module, optimizer: Any, **extra: Any) -> None:
        self.ctx, self.model, self.optimizer = ctx, model, optimizer
        self.options = {**ctx.options, **{k: v for k, v in extra.items() if v is not None}}
        self.w: Any = None

    @contextmanager
    def active(self) -> Iterator[WatchMonitor]:
        with watch(self.model, self.optimizer, self.ctx.path, **self.options) as w:
            self.w = w
            self.ctx.step_of = lambda: w.steps
            try:
                yield self
            finally:
                self.ctx.results.append(w)

    def log(self, loss: torch.Tensor) -> None:
        self.w.log(loss=loss)

    def step(self) -> None:  # a step boundary without an optimizer step hook: nothing to do
        pass

    def hand_over(self, optimizer: Any) -> None:
        """Give the watch the optimizer that replaces the one it was given (a run's second phase)."""
        for name in HAND_OVER:
            method = getattr(self.w, name, None)
            if callable(method):
                method(optimizer)
                return
        raise RuntimeError("the watch has no method to be handed a new optimizer (tried "
                           + ", ".join(f"w.{n}()" for n in HAND_OVER) + ")")


HAND_OVER = ("use_optimizer", "replace_optimizer", "set_optimizer")  # the watch's method, the first found


@dataclass
class Judged:
    """One case's row: what the watch (or a baseline) reported against what was planted."""

    case: Case
    variant: str  # "default" or "nonfinite"
    status: str  # caught / missed / crash for bugs, ok / alarm / crash for healthy cases
    code: str = ""
    where: str = ""
    step: int | None = None
    planted: int | None = None
    module_right: bool | None = None
    within_one: bool = False
    cause_right: bool | None = None  # the message states the planted cause (None: not caught)
    message: str = ""
    findings: list[Any] = field(default_factory=list)
    others: list[Any] = field(default_factory=list)  # warnings/errors from the plant on, besides the answer
    error: str = ""
    seconds: float = 0.0

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.findings:
            if f.severity in ("warning", "error"):
                out[f.code] = out.get(f.code, 0) + 1
        return out


def strip_wrappers(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for w in WRAPPERS:
            if name.startswith(w):
                name, changed = name[len(w):], True
            name = name.replace("." + w, ".")
    return name


def where_matches(found: str, planted: tuple[str, ...] | None) -> bool:
    """The matching rule: the finding's ``where`` W is right for a planted name E when, after
    dropping the ``_orig_mod.``/``module.`` parts wrappers add, W == E, or W lies inside E (W
    starts with ``E.``: a parameter or child of the planted module), or W is the module that
    owns the planted parameter E (E == ``W.<name>`` with no further dot); W is also tried with
    its first component dropped (the model named from a LightningModule's attribute, such as
    ``model.`` or ``gan.``). A case planted on the whole run (None) accepts any ``where``."""
    if planted is None:
        return True
    w = strip_wrappers(found)
    tries = [w] + ([w.split(".", 1)[1]] if "." in w else [])
    for e in planted:
        e = strip_wrappers(e)
        for x in tries:
            if x == e or x.startswith(e + ".") or ("." in e and e.rsplit(".", 1)[0] == x):
                return True
    return False


def states_cause(message: str, cause: tuple[str, ...]) -> bool:
    """The stated-cause rule: the message contains one of the case's words or phrases (any case)."""
    text = message.lower()
    return any(c.lower() in text for c in cause)


def judge(case: Case, variant: str, findings: list[Any], planted: int | None) -> Judged:
    """Caught: a finding of an accepted code at a step in [planted - 1, planted + 1 + grace];
    among those, the earliest with the right module wins (else the earliest); its message is then
    held to the case's stated-cause rule (:func:`states_cause`)."""
    if case.healthy:
        bad = [f for f in findings if f.severity in ("warning", "error")]
        return Judged(case, variant, "alarm" if bad else "ok", findings=findings,
                      code=", ".join(sorted({f.code for f in bad})))
    codes = case.expect_nonfinite if variant == "nonfinite" and case.expect_nonfinite else case.expect
    at = case.plant_at if planted is None else planted
    hits = [f for f in findings if f.code in codes and at - 1 <= f.step <= at + 1 + case.grace]
    if not hits:
        first = next((f for f in findings if f.code in codes), None)
        return Judged(case, variant, "missed", code=first.code if first else "",
                      where=first.where if first else "", step=first.step if first else None,
                      planted=at, module_right=where_matches(first.where, case.where) if first else None,
                      findings=findings)
    # what a reader of the run meets first: the right module, the earliest step, then the order the run
    # reported them in
    order = {id(f): i for i, f in enumerate(findings)}
    hits.sort(key=lambda f: (not where_matches(f.where, case.where), f.step, order[id(f)]))
    f = hits[0]
    others = [o for o in findings if o is not f and o.step >= at - 1 and o.severity in ("warning", "error")]
    return Judged(case, variant, "caught", code=f.code, where=f.where, step=f.step, planted=at,
                  module_right=where_matches(f.where, case.where), within_one=abs(f.step - at) <= 1,
                  cause_right=states_cause(f.message, case.cause), message=f.message,
                  findings=findings, others=others)
