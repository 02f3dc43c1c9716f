"""Property tests: move_model keeps every alias group of random small models with random ties."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from inspector import move_model
from inspector.aliases import alias_analysis, alias_groups, overwrite_on_conversion
from inspector.inventory import tensor_inventory

OWNERS = ["", "a", "b", "a.c"]
SOURCE = st.one_of(
    st.tuples(st.just("new"), st.integers(1, 6)),  # its own memory, n elements
    st.tuples(st.just("same"), st.integers(0, 7)),  # an earlier object of its kind
    st.tuples(st.just("shared"), st.integers(0, 7)),  # a new object over an earlier one's memory
    st.tuples(
        st.just("view"),
        st.integers(0, 1),
        st.integers(0, 8),  # base, start, length, step
        st.integers(1, 8),
        st.integers(1, 2),
    ),
    st.tuples(st.just("int"), st.integers(1, 4)),  # an integer buffer (keeps its dtype)
)
SLOTS = st.lists(st.tuples(st.sampled_from(OWNERS), st.sampled_from(["parameter", "buffer"]), SOURCE),
                 min_size=2, max_size=8)
TARGETS = st.sampled_from([(None, torch.float64), (None, torch.bfloat16), ("cpu", torch.float64),
                           ("cpu", None), ("meta", None), ("meta", torch.float16)])


def build(slots: list[tuple]) -> nn.Module:
    """A root with submodules a, b, a.c holding tensors t0, t1, ... made as ``slots`` say."""
    m = nn.Module()
    m.a, m.b = nn.Module(), nn.Module()
    m.a.c = nn.Module()
    bases = [torch.arange(16.0), torch.arange(16.0) + 100]
    made: list[tuple[str, torch.Tensor]] = []
    for i, (owner, kind, source) in enumerate(slots):
        same_kind = [t for k, t in made if k == kind]
        if source[0] == "same" and same_kind:
            t = same_kind[source[1] % len(same_kind)]
        else:
            if source[0] == "shared" and made:
                data = made[source[1] % len(made)][1].detach()
                data = data if data.is_floating_point() else torch.randn(3)
            elif source[0] == "view":
                _, b, start, length, step = source
                data = bases[b][start:start + length * step:step]
            elif source[0] == "int" and kind == "buffer":
                data = torch.arange(source[1])
            else:
                data = torch.randn(source[1] if source[0] in ("new", "int") else 3)
            t = nn.Parameter(data) if kind == "parameter" else data
        module = m.get_submodule(owner)
        if kind == "parameter":
            module.register_parameter(f"t{i}", t)
        else:
            module.register_buffer(f"t{i}", t)
        made.append((kind, t))
    return m


def same_object_sets(model: nn.Module) -> set[tuple[str, ...]]:
    inv = tensor_inventory(model)
    return {tuple(inv.entries[i].name for i in idx) for idx in inv.by_object.values() if len(idx) > 1}


@settings(max_examples=50, deadline=None)
@given(slots=SLOTS, target=TARGETS, overwrite=st.booleans())
def test_move_model_keeps_every_alias_group(slots, target, overwrite):
    m = build(slots)
    device, dtype = target
    before = alias_analysis(m)
    objects = same_object_sets(m)
    values = {n: t.detach().clone() for n, t in tensor_inventory(m).tensors().items()}
    with overwrite_on_conversion(overwrite):
        move_model(m, device, dtype)
    after = alias_analysis(m)
    if device == "meta":
        # no memory on meta: only object identity can be seen, and every one-object tie is kept
        assert {g.names for g in after.groups} == objects
        assert {g.kind for g in after.groups} <= {"same-object"}
        return
    assert [(g.names, g.kind, g.objects) for g in after.groups] == \
        [(g.names, g.kind, g.objects) for g in before.groups]
    assert [d.regions for d in after.disjoint] == [d.regions for d in before.disjoint]
    assert same_object_sets(m) == objects
    for name, t in tensor_inventory(m).tensors().items():
        old = values[name]
        want = old.to(dtype) if dtype is not None and old.is_floating_point() else old
        assert t.dtype == want.dtype and torch.equal(t.detach(), want), name


@settings(max_examples=30, deadline=None)
@given(slots=SLOTS)
def test_plain_float64_conversion_under_the_overwrite_flag_breaks_what_move_model_keeps(slots):
    # the contrast move_model exists for: with the flag, Module.to gives each name its own memory
    m = build(slots)
    before = alias_groups(m)
    with overwrite_on_conversion(True):
        m.to(torch.float64)
    after = {(g.names, g.kind) for g in alias_groups(m)}
    broken = [g for g in before if (g.names, g.kind) not in after]
    # every group whose names are all floating-point parameters is split by the plain conversion
    assert all(g in broken for g in before if set(g.tensor_kinds) == {"parameter"})
