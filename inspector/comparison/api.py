"""``compare(a, b)``: two models or checkpoints, or two run files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..watching import Run, is_watch_file
from .opening import Spec
from .result import RunComparison, WeightComparison
from .runs import DEFAULT_TOLERANCE, compare_runs
from .weights import Progress, compare_weights


def is_run_source(spec: Any) -> bool:
    """Whether ``spec`` is a run file: the watch's Arrow stream, or ``check_step``'s JSON lines (read
    from the first bytes, whatever the name)."""
    from ..runfiles import is_run_file

    if isinstance(spec, Run):
        return True
    if not isinstance(spec, (str, os.PathLike)):
        return False
    path = Path(os.fspath(spec))
    if not path.is_file() or path.suffix in (".safetensors", ".pt", ".pth", ".bin"):
        return False
    return is_watch_file(path) or is_run_file(path)


def compare(a: Spec, b: Spec, *, device: str = "cpu", tolerance: float = DEFAULT_TOLERANCE,
            progress: Progress | None = None, expect_unchanged: Sequence[str] = ()
            ) -> WeightComparison | RunComparison:
    """What changed from ``a`` to ``b``.

    Args:
        a, b: two model sources or checkpoints (``"sample:NAME"``, ``"FILE.py:factory"``, ``"hf:DIR"``,
            a ``.safetensors``/``.pt``/``.bin`` file, a ``torch.distributed.checkpoint`` folder, a
            ``LoadedModel``, an ``nn.Module`` or a state dict), or two run files.
        device: where a model built from a source string is placed.
        tolerance: for run files, the relative difference beyond which two runs diverge (0: any
            difference at all).
        progress: called with a line of text now and then.
        expect_unchanged: glob patterns of tensor names or module prefixes (``"*.wte"``,
            ``"model.layers.*.mlp"``) that are meant to stay: reported as info, not as a warning.

    Returns:
        a :class:`WeightComparison` (tensors, modules, findings), or a :class:`RunComparison`.

    Raises:
        InspectorError: a source is unknown, missing, corrupt or refused, or one is a run file
            and the other is not.

    >>> import torch
    >>> from torch import nn
    >>> a = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    >>> b = {k: v + (k.startswith("1.")) for k, v in a.state_dict().items()}  # layer 1 moved by 1
    >>> result = compare(a, b)
    >>> result.codes(), result.facts["summary"]
    (['unchanged-tensor'], '2 of 4 tensors changed; 2 unchanged: 0')
    >>> result.findings[0].where, result.modules["changed"].tolist()
    ('0', [0, 2])
    """
    runs = is_run_source(a), is_run_source(b)
    if all(runs):
        return compare_runs(a, b, tolerance=tolerance)
    if any(runs):
        from ..utils.findings import InspectorError
        from ..utils.paths import file_kind

        other = b if runs[0] else a
        kind = file_kind(other) if isinstance(other, (str, os.PathLike)) else None
        if kind is not None and kind != "a folder":
            raise InspectorError(f"{other} is {kind}, not a regular file: neither a run file nor a "
                                 "checkpoint; reading it could block or never end")
        if isinstance(other, (str, os.PathLike)) and str(other).endswith((".inspect", ".jsonl")) and \
                not os.path.lexists(other):
            raise InspectorError(f"run file {other} does not exist; compare two run files that exist")
        raise InspectorError(
            f"{a if runs[0] else b} is a run file but the other side is not: compare two run "
            "files, or two models/checkpoints"
        )
    return compare_weights(a, b, device=device, progress=progress, expect_unchanged=expect_unchanged)
