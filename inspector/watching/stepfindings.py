"""Findings read from one step's numbers: NaN/Inf gradients and weights, with the module that made
them where one did, and weights written outside the optimizer that hold NaN/Inf."""

from __future__ import annotations

from ..utils.codes import coded
from ..utils.findings import Finding
from ..utils.labels import listed, module_label
from .numbers import BATCH_PRODUCER, Numbers
from .steps import StepState
from .tracer import BATCH


def nonfinite_findings(n: Numbers, module_names: list[str], rank: int, world: int) -> list[Finding]:
    """``nonfinite-forward`` / ``nonfinite-backward`` for the producers ``n`` names."""
    on = f" on rank {rank}" if world > 1 else ""
    out = []
    if n.forward == BATCH_PRODUCER:
        out.append(
            coded(
                "nonfinite-forward",
                BATCH,
                f"the batch given to the model{on} already holds NaN/Inf: check the data loader and "
                "its preprocessing, not the model",
            )
        )
    elif n.forward >= 0:
        name = module_label(module_names[int(n.forward)])
        out.append(
            coded(
                "nonfinite-forward",
                name,
                f"{name}{on} produced NaN/Inf from finite inputs (the first module to do so; the "
                "ones after it only passed it on). Look at its weights, its input range (exp, log, "
                "division, fp16 overflow) and the captures of its inputs and outputs",
            )
        )
    if n.backward >= 0:
        name = module_label(module_names[int(n.backward)])
        others = [module_label(c) for c in vars(n).get("backward_candidates", ())]
        if len(others) > 1:
            text = (f"in the backward{on}, the gradient of a tensor that {', '.join(others)} all took as "
                    "input turned NaN/Inf while each one's output gradient was finite: one of them (or code "
                    "around them that used the same tensor) made it. A gradient hook sees only the sum "
                    "over a tensor's users, so the watch cannot tell which; look for a custom autograd "
                    "function, a sqrt/log/division at 0 or an overflow in their backward")
        else:
            text = (f"the backward of {name}{on} turned a finite output gradient into a NaN/Inf input "
                    "gradient (its forward was finite): a custom autograd function, a sqrt/log/division "
                    "at 0, or an overflow in its backward")
        out.append(coded("nonfinite-backward", name, text))
    return out


def written_findings(st: StepState, names: tuple[str, ...]) -> list[Finding]:
    """``nonfinite-parameter`` for the parameters that held NaN/Inf before this step's optimizer step
    after a write outside the optimizer since the last one: the cause this step's forward met (the
    step then spreads NaN to every weight, so the post-step check alone would name the first)."""
    if not st.written:
        return []
    bad = [names[i] for i in st.written]
    first = bad[0]
    others = f" (and {len(bad) - 1} more: {listed(bad[1:])})" if len(bad) > 1 else ""
    return [coded("nonfinite-parameter", first,
                    f"parameter {first}{others} held NaN/Inf when this step began: it was written outside "
                    "the optimizer since the last step (a fill_/copy_ or a .data swap by hand, a checkpoint "
                    "loaded into it, a clamp), and this step's forward used it")]

