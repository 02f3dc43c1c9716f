"""Property: every row of the offset map is its tensor's slice of ``parameters_to_vector``.

Random small models: random shapes (empty and 0-d tensors included), two dtypes, frozen
parameters, parameters registered under several names, a module registered twice, buffers.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import parameters_to_vector

from inspector import offset_map

SHAPES = st.lists(st.integers(0, 3), max_size=3).map(tuple)


@st.composite
def models(draw) -> nn.Module:
    """A model of 1-4 children, each holding 0-3 parameters (some tied to earlier ones),
    maybe a buffer and a grandchild; maybe an earlier child registered again."""
    root = nn.Module()
    made: list[nn.Parameter] = []
    counter = [0]

    def fresh_tensor() -> torch.Tensor:
        shape = draw(SHAPES)
        dtype = draw(st.sampled_from([torch.float32, torch.float64]))
        n = int(torch.Size(shape).numel())
        counter[0] += 1
        return (torch.arange(n, dtype=dtype) + 1000 * counter[0]).reshape(shape)  # distinct values

    def fill(module: nn.Module) -> None:
        for j in range(draw(st.integers(0, 3))):
            if made and draw(st.integers(0, 3)) == 0:
                p = draw(st.sampled_from(made))  # the same Parameter object under a second name
            else:
                p = nn.Parameter(fresh_tensor(), requires_grad=draw(st.booleans()))
                made.append(p)
            module.register_parameter(f"p{j}", p)
        if draw(st.booleans()):
            module.register_buffer("b", fresh_tensor())

    fill(root)
    children: list[nn.Module] = []
    for i in range(draw(st.integers(1, 4))):
        if children and draw(st.integers(0, 4)) == 0:
            root.add_module(f"again{i}", draw(st.sampled_from(children)))  # a shared module
            continue
        child = nn.Module()
        root.add_module(f"c{i}", child)
        children.append(child)
        fill(child)
        if draw(st.booleans()):
            grandchild = nn.Module()
            child.add_module("inner", grandchild)
            fill(grandchild)
    return root


@settings(max_examples=50, deadline=None)
@given(model=models(), trainable_only=st.booleans(), include_buffers=st.booleans())
def test_rows_are_contiguous_slices_of_parameters_to_vector(model: nn.Module, trainable_only: bool,
                                                            include_buffers: bool) -> None:
    table = offset_map(model, trainable_only=trainable_only, include_buffers=include_buffers)
    expected = [p for p in model.parameters() if p.requires_grad or not trainable_only]
    if include_buffers:
        expected += list(model.buffers())
    tensors = [model.get_parameter(n) if kind == "parameter" else model.get_buffer(n)
               for n, kind in zip(table["name"], table["kind"], strict=True)]
    # the rows are parameters() (then buffers()), each object once, in that order
    assert [id(t) for t in tensors] == [id(t) for t in expected]
    starts, ends = table["start"].tolist(), table["end"].tolist()
    assert starts == ([0] + ends[:-1] if ends else [])
    every_name: dict[int, set[str]] = {}
    for name, t in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        every_name.setdefault(id(t), set()).add(name)
    if not tensors:
        return
    with torch.no_grad():
        vec = parameters_to_vector(tensors)
    assert vec.numel() == ends[-1]
    for row, t in zip(table.itertuples(), tensors, strict=True):
        assert row.end - row.start == row.numel == t.numel()
        assert row.shape == tuple(t.shape)
        assert torch.equal(vec[row.start:row.end], t.detach().reshape(-1).to(vec.dtype))
        assert {row.name, *row.aliases} == every_name[id(t)] and row.name not in row.aliases
