"""A lab's own experiment leaves its scenario's model unchanged."""

from __future__ import annotations

import torch

from inspector.labs import get_lab

_SCENARIOS: dict[str, object] = {}


def scenario(lab_id: str):
    """One scenario per lab for the whole file (checkers never change it)."""
    if lab_id not in _SCENARIOS:
        _SCENARIOS[lab_id] = get_lab(lab_id, labs_dir="").build()
    return _SCENARIOS[lab_id]


def test_myths_experiment_leaves_the_model_alone():
    lab = get_lab("flattening-myths", labs_dir="")
    [experiment] = [v for v in lab.views if v.title.startswith("Experiment 1")]  # as the lab page runs it
    sc = scenario("flattening-myths")
    before = [p.detach().clone() for p in sc.model.parameters()]
    table = experiment.build(sc)
    assert len(table) == 12 and not table["storage overlaps the vector"].any()
    assert all(torch.equal(a, b) for a, b in zip(before, sc.model.parameters(), strict=True))
