"""The watch's checks, one small class each, all with one interface: ``check(at, found) -> found``.

``at`` (:class:`~inspector.watching.events.At`) is what a check may read at one event of one step;
``found`` is this event's findings so far, threaded from check to check in the order of
:data:`~inspector.watching.table.WATCH_CHECKS` (a check may add to it, and a few fold what they
explain). A check that holds hooks or a starting state sets them up in ``attach(at, stack)``, pushing
what undoes them on the exit stack the watch closes. Each class's docstring says when it fires; the
severity of every finding comes from :data:`~inspector.utils.codes.CODES`.

By event: ``before`` (the watch opening, before the optimizer's step, the gradients measured),
``after`` (after the step, on this rank's numbers), ``updates`` (after the step: whether training
moves anything, per run, param group and module), ``around`` (a step the GradScaler skipped, an
optimizer the watch was not given, the ranks' numbers gathered, the watch closing).
"""

from __future__ import annotations

from .after import (
    PRODUCED,
    SPREAD,
    GradientNorms,
    GradientsUsed,
    LearningRateRose,
    Loss,
    NonfiniteGradients,
    NonfiniteWeights,
    Producers,
    UsedNonfiniteWeights,
    WrittenWeights,
    ZeroGradientStep,
)
from .around import (
    OptimizerLost,
    OriginFirst,
    RankFailures,
    ReplicaFindingsPlaced,
    RunFailed,
    ScalerSkips,
    SlowRanks,
    SpreadFolded,
)
from .before import (
    EvalMode,
    FrozenParameters,
    GradientsCleared,
    Membership,
    OptimizerStepped,
    ReplicasAgree,
    TiesKept,
    Unfrozen,
    UnheldAtOpen,
)
from .updates import IdleGroups, StillModules, Updates

__all__ = [
    "PRODUCED",
    "SPREAD",
    "FrozenParameters",
    "UnheldAtOpen",
    "EvalMode",
    "GradientsCleared",
    "Membership",
    "Unfrozen",
    "OptimizerStepped",
    "TiesKept",
    "ReplicasAgree",
    "WrittenWeights",
    "Producers",
    "ZeroGradientStep",
    "GradientNorms",
    "Loss",
    "LearningRateRose",
    "NonfiniteGradients",
    "UsedNonfiniteWeights",
    "NonfiniteWeights",
    "Updates",
    "IdleGroups",
    "StillModules",
    "GradientsUsed",
    "ScalerSkips",
    "OptimizerLost",
    "SlowRanks",
    "ReplicaFindingsPlaced",
    "SpreadFolded",
    "OriginFirst",
    "RankFailures",
    "RunFailed",
]
