"""Inputs reach the model's device and dtype: every tensor of a pytree, casting only floating ones."""

from __future__ import annotations

import torch


def test_to_device_moves_every_tensor_of_a_pytree_and_casts_only_floating_ones():
    from collections import namedtuple

    from inspector.loading import to_device

    Batch = namedtuple("Batch", "x ids")
    inputs = {
        "batch": Batch(torch.ones(2), torch.arange(2)),
        "extra": [torch.zeros(1, dtype=torch.float64), "tag"],
    }
    out = to_device(inputs, torch.device("meta"), torch.float16)
    assert isinstance(out["batch"], Batch)
    assert (out["batch"].x.device.type, out["batch"].x.dtype) == ("meta", torch.float16)
    assert (out["batch"].ids.device.type, out["batch"].ids.dtype) == ("meta", torch.int64)
    assert out["extra"][0].dtype == torch.float16 and out["extra"][1] == "tag"
    assert inputs["batch"].x.device.type == "cpu"  # the input is not changed


def test_to_device_moves_tensors_inside_containers_pytree_does_not_know():
    from inspector.loading import to_device

    class Inputs(dict):
        pass

    class Pair(tuple):
        pass

    class Needs(list):  # a constructor that cannot be called with the items alone
        def __init__(self, items, tag):
            super().__init__(items)

    inputs = Inputs(
        x=torch.ones(2), ids=torch.arange(2), more=[Pair((torch.ones(1),)), Needs([torch.ones(1)], "t")]
    )
    out = to_device(inputs, torch.device("meta"), torch.float16)
    assert type(out) is Inputs
    assert (out["x"].device.type, out["x"].dtype) == ("meta", torch.float16)
    assert (out["ids"].device.type, out["ids"].dtype) == ("meta", torch.int64)
    assert type(out["more"][0]) is Pair and out["more"][0][0].device.type == "meta"
    assert type(out["more"][1]) is list and out["more"][1][0].device.type == "meta"
    assert inputs["x"].device.type == "cpu"
