"""What would give each lab task's answer away, and the text of a lab view, for the tests that keep
answers off the screen until their task is answered."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

# (lab, task) -> patterns that must not show in any view open before the task is answered. A name
# pattern matches a whole name only, not a longer name it begins (blocks.0 but not blocks.0.fc1.weight).
GIVEAWAYS: dict[tuple[str, str], tuple[str, ...]] = {
    # the count after the conversion (the 512-element matrix twice) and the tie check's verdict
    ("broken-tie", "name-group"): (r"\b4,?592\b", r"tie-broken", r"tie-weakened"),
    ("broken-tie", "retie"): (r"lm_head\.weight\s*=\s*model\.transformer",),
    # layers.1.lora_B.weight[10, 0]: the NaN's place, which the gradient norms would point at
    ("shifted-offsets", "locate"): (r"\(10, 0\)", r"\[10, 0\]", r"nonfinite"),
    ("shifted-offsets", "shift"): (r"\b416\b",),
    ("stranded-buffer", "missing"): (r"buffer-unplaced", r"unplaced"),
    # the device the block's buffers belong on is the audit's primary device of their module
    ("stranded-buffer", "fix-map"): (r"module_primary_device", r"buffer-stranded"),
    ("corrupted-capture", "corrupted"): (r"\bmutated\b", r"naive - clone"),
    ("corrupted-capture", "culprits"): (r"conv1 -> relu1", r"mutated by", r"wrote into"),
    ("flattening-myths", "shares-memory"): (r"is a copy", r"shares no memory"),
    # 636 = 484 frozen + 152 trainable elements
    ("flattening-myths", "skips-frozen"): (r"\b636\b",),
    # the division 0 / sqrt(0) in norm's forward: the replay's op table names it and its line
    ("find-the-op", "op"): (r"aten\.div", r"centred / spread"),
    ("late-overflow", "producer"): (r"nonfinite-forward",),
    ("late-overflow", "fix"): (r"torch\.softmax", r"stable softmax"),
    # blocks.0: 8416 elements never changed (compare's unchanged-tensor)
    ("silent-block", "which"): (r"\b8,?416\b", r"unchanged-tensor", r"(?<![\w.])blocks\.0(?![\w.])"),
    ("silent-block", "why"): (r"does not hold", r"never held"),
    # step 8: the learning rate column and the watch's no-update finding name it
    ("stalled-schedule", "stopped"): (r"no-update", r"\blr_0\b", r"learning rate"),
    ("stalled-schedule", "why"): (r"total = 24", r"epochs \* len"),
}


def view_text(value: Any) -> str:
    """Everything a view shows, as text: a table's columns and cells, a figure's data and labels."""
    if isinstance(value, (list, tuple)):
        return "\n".join(view_text(v) for v in value)
    if isinstance(value, pd.DataFrame):
        return " ".join(map(str, value.columns)) + "\n" + value.to_csv(index=False)
    if hasattr(value, "to_plotly_json"):
        return value.to_json()
    return str(value)


def given_away(text: str, lab_id: str, task_id: str) -> list[str]:
    """The giveaway patterns of the task found in ``text``."""
    return [p for p in GIVEAWAYS[(lab_id, task_id)] if re.search(p, text)]
