"""Names under torch.compile are the model's, however a function is imported."""

from __future__ import annotations

import torch
from torch import nn

import inspector
from inspector import aliases, offsets, placement
from inspector.aliases import alias_groups, snapshot_ties
from inspector.capture import capture_activations, capturing
from inspector.offsets import locate, offset_map


def _tied():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    m[1].weight = m[0].weight
    return m


def test_module_imports_see_through_torch_compile():
    m = _tied()
    c = torch.compile(m)
    assert locate(c, 0).name == "0.weight"
    assert inspector.locate(c, 0).name == "0.weight"
    assert offset_map(c)["name"].tolist()[0] == "0.weight"
    assert [g.names for g in alias_groups(c)] == [("0.weight", "1.weight")]
    assert [g.names for g in snapshot_ties(c).groups] == [("0.weight", "1.weight")]
    table = placement.placement_table(c)
    assert not any(n.startswith("_orig_mod") for n in table["name"]), table["name"].tolist()
    assert inspector.model_summary(c).parameter_elements == 8
    caps = capture_activations(c, torch.ones(1, 2))
    assert sorted(caps.outputs) == ["0", "1"]
    with capturing(c) as caps:
        m(torch.ones(1, 2))
    assert sorted(caps.outputs) == ["0", "1"]


def test_the_package_hands_out_the_module_functions_themselves():
    assert inspector.alias_groups is aliases.alias_groups
    assert inspector.offset_map is offsets.offset_map
