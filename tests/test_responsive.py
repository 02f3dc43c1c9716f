"""The quick target count the Attributions page shows before any full forward pass."""

from __future__ import annotations

import torch

from inspector import LoadedModel, load_model
from inspector.attribution import TargetInfo, target_info
from inspector.dashboard import quick_target_info


class _DropLast(torch.nn.Module):
    """Token ids (B, T) -> logits for every position but the last: (B, T - 1, 5)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(7, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids)[:, :-1]


def test_quick_target_info_matches_the_full_forward():
    tiny = load_model("sample:tiny-gpt2")
    ids = tiny.example_inputs(3)  # (3, 16): one token of one sample gives (1, 1, 32)
    assert quick_target_info(tiny, ids) == target_info(tiny, ids) == TargetInfo(32, 16)
    # One token gives (1, 0, 5), no position to read the targets from: the full pass on (1, 6)
    # decides, (1, 5, 5): 5 targets at 5 positions.
    odd = LoadedModel(
        _DropLast(), "drop-last", "test", inputs_fn=lambda b: torch.zeros(b, 6, dtype=torch.long)
    )
    assert quick_target_info(odd) == target_info(odd) == TargetInfo(5, 5)
