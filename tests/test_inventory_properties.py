"""Property tests: the inventory's walk is torch's own walk, on random module graphs.

``tensor_inventory`` walks modules with a stack where it can and asks torch's methods otherwise;
either way its entries must be exactly ``named_parameters(remove_duplicate=False)`` then
``named_buffers(remove_duplicate=False)``: the same names, in the same order, holding the same
objects, and its modules exactly ``named_modules(remove_duplicate=False)``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from inspector import tensor_table
from inspector.inventory import tensor_inventory


class OwnModules(nn.Module):
    """Overrides ``named_modules`` (as some wrappers do): the walk must ask torch's methods."""

    def named_modules(self, memo=None, prefix="", remove_duplicate=True) -> Iterator[tuple[str, nn.Module]]:
        yield from super().named_modules(memo, prefix, remove_duplicate)


class OwnParameters(nn.Module):
    """Overrides ``named_parameters`` on the root."""

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True) -> Iterator:
        yield from super().named_parameters(prefix, recurse, remove_duplicate)


# What one module holds: ("param" | "buffer" | "transient", source), source "new", "none" or
# ("same", k): the k-th earlier tensor of that kind (a tie); "transient" is a non-persistent buffer.
TENSOR = st.tuples(st.sampled_from(["param", "buffer", "transient"]),
                   st.one_of(st.just("new"), st.just("none"), st.tuples(st.just("same"), st.integers(0, 20))))
MODULE = st.fixed_dictionaries({
    "tensors": st.lists(TENSOR, max_size=4),
    "parents": st.lists(st.integers(0, 20), min_size=1, max_size=2),  # two parents: a shared submodule
    "kind": st.sampled_from(["plain", "plain", "plain", "own-modules"]),
})
GRAPH = st.fixed_dictionaries({
    "modules": st.lists(MODULE, max_size=8),
    "depth": st.integers(0, 40),                  # a chain this deep under the root
    "root": st.sampled_from(["plain", "own-parameters"]),
    "none_child": st.booleans(),                  # a child slot holding None
})


def build(graph: dict) -> nn.Module:
    root: nn.Module = OwnParameters() if graph["root"] == "own-parameters" else nn.Module()
    modules = [root]
    made: dict[str, list[torch.Tensor]] = {"param": [], "buffer": []}
    tail = root
    for d in range(graph["depth"]):
        tail.add_module(f"d{d}", nn.Module())
        tail = getattr(tail, f"d{d}")
        modules.append(tail)
    for i, spec in enumerate(graph["modules"]):
        m = OwnModules() if spec["kind"] == "own-modules" else nn.Module()
        for j, (kind, source) in enumerate(spec["tensors"]):
            pool = made["param" if kind == "param" else "buffer"]
            t: torch.Tensor | None
            if source == "none":
                t = None
            elif source != "new" and pool:
                t = pool[source[1] % len(pool)]
            else:
                t = nn.Parameter(torch.randn(j + 1)) if kind == "param" else torch.randn(j + 1)
                pool.append(t)
            if kind == "param":
                m.register_parameter(f"p{j}", t)  # type: ignore[arg-type]
            else:
                m.register_buffer(f"b{j}", t, persistent=kind == "buffer")
        for k, parent in enumerate(dict.fromkeys(spec["parents"])):
            modules[parent % len(modules)].add_module(f"m{i}_{k}", m)
        modules.append(m)
    if graph["none_child"]:
        root.add_module("empty", None)
    return root


@settings(max_examples=300, deadline=None)
@given(GRAPH)
def test_the_walk_is_torchs_walk(graph):
    model = build(graph)
    inv = tensor_inventory(model)
    expected = [(n, "parameter", t) for n, t in model.named_parameters(remove_duplicate=False)]
    expected += [(n, "buffer", t) for n, t in model.named_buffers(remove_duplicate=False)]
    assert [(e.name, e.kind) for e in inv.entries] == [(n, k) for n, k, _ in expected]
    assert all(e.tensor is t for e, (_, _, t) in zip(inv.entries, expected, strict=True))
    named = list(model.named_modules(remove_duplicate=False))
    assert list(inv.modules) == [n for n, _ in named]
    assert all(a is b for a, (_, b) in zip(inv.module_objects, named, strict=True))
    first: dict[int, str] = {}
    for e in inv.entries:
        assert e.first_name == first.setdefault(id(e.tensor), e.name)
        owner = model.get_submodule(e.module)
        assert (owner._parameters if e.kind == "parameter" else owner._buffers)[e.attr] is e.tensor
    assert [inv.entries[i].name for i in inv.unique] == list(dict.fromkeys(first.values()))
    by_module: dict[str, list[str]] = {}
    for e in inv.entries:
        by_module.setdefault(e.module, []).append(e.name)
    assert {m: [e.name for e in own] for m, own in inv.own_entries.items()} == by_module


@settings(max_examples=100, deadline=None)
@given(GRAPH)
def test_module_tables_count_each_object_once(graph):
    model = build(graph)
    inv = tensor_inventory(model)
    tables = inv.module_tables()
    assert (
        tables.sizes[""]
        == inv.unique_bytes()
        == sum(t.numel() * t.element_size() for t in dict.fromkeys([*model.parameters(), *model.buffers()]))
    )
    assert list(tables.classes) == list(inv.modules)
    assert {n for names in tables.direct.values() for n in names} == set(inv.by_name)


def test_tensor_table_lists_every_name_as_torch_walks_them():
    m = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 2, bias=False))
    m[2].weight = nn.Parameter(m[0].weight.detach().T.contiguous())
    m.add_module("again", m[1])  # a shared submodule: its names twice
    m[0].bias.requires_grad_(False)
    table = tensor_table(m)
    names = [n for n, _ in m.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in m.named_buffers(remove_duplicate=False)]
    assert table["name"].tolist() == names
    row = table.set_index("name")
    assert row.at["again.weight", "same_as"] == "1.weight" and row.at["1.weight", "same_as"] == ""
    assert row.at["0.bias", "requires_grad"] is False and row.at["1.running_mean", "requires_grad"] is None
    assert (row.at["0.weight", "shape"], row.at["1.num_batches_tracked", "dtype"]) == ("(3, 2)", "int64")
