"""Alias groups, tie snapshots, re-tying and the conversion check, on tiny hand-built models."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from inspector import InspectorError, move_model
from inspector.aliases import (
    CONVERSIONS,
    alias_analysis,
    alias_groups,
    compare_ties,
    conversion_check,
    conversion_table,
    graph_data,
    retie,
    snapshot_ties,
)
from inspector.figures import alias_graph_figure
from inspector.inventory import tensor_inventory
from sample_models import get_sample

# --------------------------------------------------------------------------------------------
# Hand-built models, one per kind


def two_linears() -> nn.Sequential:
    # 0.weight (3x4 = 12), 0.bias (3), 1.weight (3x4 = 12), 1.bias (3): 30 elements
    return nn.Sequential(nn.Linear(4, 3), nn.Linear(4, 3))


def same_object_model() -> nn.Sequential:
    m = two_linears()
    m[1].weight = m[0].weight  # one Parameter, two names: unique 12 + 3 + 3 = 18, with aliases 30
    return m


def shared_storage_model() -> nn.Sequential:
    m = two_linears()
    t = torch.randn(3, 4)
    m[0].weight = nn.Parameter(t)  # two Parameter objects over one tensor's memory
    m[1].weight = nn.Parameter(t)
    return m


class SliceBuffers(nn.Module):
    """``full`` is a (4, 4) float32 buffer (64 bytes); ``rows`` is full[1:3] (bytes 16..48)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("full", torch.arange(16.0).reshape(4, 4))
        self.register_buffer("rows", self.full[1:3])


class DisjointBuffers(nn.Module):
    """Two halves of one (4, 4) storage, and two interleaved column views of another."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.arange(16.0).reshape(4, 4)
        self.register_buffer("top", base[:2])       # bytes 0..32
        self.register_buffer("bottom", base[2:])    # bytes 32..64
        cols = torch.arange(16.0).reshape(4, 4)
        self.register_buffer("even", cols[:, 0::2])  # extents overlap, elements do not
        self.register_buffer("odd", cols[:, 1::2])


# --------------------------------------------------------------------------------------------
# alias_groups


def test_same_object_two_names():
    m = same_object_model()
    a = alias_analysis(m)
    assert [(g.names, g.kind, g.objects, g.numel, g.nbytes) for g in a.groups] == [
        (("0.weight", "1.weight"), "same-object", 1, 12, 48)]
    # named_parameters() keeps 0.weight, the first name
    assert a.groups[0].names[0] == next(n for n, p in m.named_parameters() if p is m[1].weight)
    assert (a.unique_numel, a.numel_with_aliases, a.names) == (18, 30, 4)
    assert a.groups[0].memory_checked and not a.identity_only and a.findings == ()


def test_shared_storage_two_parameters():
    m = shared_storage_model()
    g = alias_groups(m)
    assert [(g.names, g.kind, g.objects, g.numel) for g in g] == [
        (("0.weight", "1.weight"), "shared-storage", 2, 12)]
    # parameters() counts the memory twice: 12 + 3 + 12 + 3
    assert sum(p.numel() for p in m.parameters()) == 30


def test_buffer_slice_is_overlapping_view():
    g = alias_groups(SliceBuffers())
    assert len(g) == 1
    assert (g[0].names, g[0].kind, g[0].objects, g[0].tensor_kinds) == (
        ("full", "rows"), "overlapping-view", 2, ("buffer", "buffer"))
    # union of bytes 0..64 and 16..48 is 64 bytes = 16 float32 elements
    assert (g[0].numel, g[0].nbytes) == (16, 64)


def test_parameter_buffer_alias_and_transposed_view():
    m = nn.Linear(3, 2)
    m.register_buffer("w_copy", m.weight.detach())   # same bytes, a different object
    m.register_buffer("w_t", m.weight.detach().t())  # same bytes, transposed: still exactly them
    g = alias_groups(m)
    assert [(x.names, x.kind, x.objects, x.tensor_kinds) for x in g] == [
        (("weight", "w_copy", "w_t"), "shared-storage", 3, ("parameter", "buffer", "buffer"))]
    assert alias_groups(m, include_buffers=False) == []


def test_names_keep_walk_order_across_objects():
    m = nn.Module()
    m.a = nn.Linear(2, 2, bias=False)   # walk: a.weight (object A)
    m.z = nn.Linear(2, 2, bias=False)   #       z.weight (object B, A's memory)
    m.c = nn.Linear(2, 2, bias=False)   #       c.weight (object A again)
    m.z.weight = nn.Parameter(m.a.weight.detach())
    m.c.weight = m.a.weight
    assert [(g.names, g.kind, g.objects) for g in alias_groups(m)] == [
        (("a.weight", "z.weight", "c.weight"), "shared-storage", 2)]


def test_disjoint_views_are_not_aliases():
    a = alias_analysis(DisjointBuffers())
    assert a.groups == ()
    assert sorted(d.regions for d in a.disjoint) == sorted([(("top",), ("bottom",)),
                                                            (("even",), ("odd",))])
    assert {d.storage_nbytes for d in a.disjoint} == {64}


def test_many_interleaved_views_of_one_storage():
    # 16 column views of one (4, 16) storage: all byte extents overlap, no element is shared,
    # except "cols_pair" (columns 0..1), which overlaps col0 and col1
    m = nn.Module()
    base = torch.zeros(4, 16)
    for i in range(16):
        m.register_buffer(f"col{i}", base[:, i])
    m.register_buffer("cols_pair", base[:, 0:2])
    a = alias_analysis(m)
    assert [(g.names, g.kind) for g in a.groups] == [(("col0", "col1", "cols_pair"), "overlapping-view")]
    assert len(a.disjoint) == 1 and len(a.disjoint[0].regions) == 15


def test_group_of_object_and_view_takes_loosest_kind():
    m = same_object_model()
    m.register_buffer("w_row", m[0].weight.detach()[1])  # a row of the tied weight
    g = alias_groups(m)
    assert [(x.names, x.kind, x.objects) for x in g] == [
        (("0.weight", "1.weight", "w_row"), "overlapping-view", 2)]


def test_one_walk_lists_what_the_public_methods_list():
    shared = nn.Linear(2, 2)
    m = nn.Sequential(shared, nn.Sequential(shared, nn.BatchNorm1d(2)))
    m[1][1].register_parameter("extra", None)
    walk = [(e.name, id(e.tensor)) for e in tensor_inventory(m)]
    public = [(n, id(t)) for n, t in m.named_parameters(remove_duplicate=False)]
    public += [(n, id(t)) for n, t in m.named_buffers(remove_duplicate=False)]
    assert walk == public
    assert [x.names for x in alias_groups(m)] == [("0.weight", "1.0.weight"), ("0.bias", "1.0.bias")]


def test_meta_device_is_identity_only():
    with torch.device("meta"):
        m = same_object_model()
        m.register_buffer("w_view", m[0].weight.detach()[0])
    a = alias_analysis(m)
    assert [(g.names, g.kind, g.memory_checked) for g in a.groups] == [
        (("0.weight", "1.weight"), "same-object", False)]
    assert a.identity_only
    assert [f.code for f in a.findings] == ["alias-identity-only"]
    assert "meta device" in a.findings[0].message


def test_llama_70b_meta_has_no_groups():
    m = get_sample("llama-70b-meta").build()
    a = alias_analysis(m)
    assert a.groups == () and a.identity_only and a.names == 724


def test_none_and_zero_size_parameters():
    m = two_linears()
    m[0].register_parameter("gone", None)
    m[0].empty_a = nn.Parameter(torch.empty(0))
    m[1].empty_b = nn.Parameter(torch.empty(0, 4))  # null data pointer too: not an alias of empty_a
    m[1].empty_tied = m[0].empty_a
    g = alias_groups(m)
    assert [(x.names, x.kind, x.numel) for x in g] == [(("0.empty_a", "1.empty_tied"), "same-object", 0)]


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_sparse_and_quantized_are_reported_not_analysable():
    m = nn.Module()
    m.sp = nn.Parameter(torch.eye(3).to_sparse())
    m.register_buffer("q", torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8))
    m.register_buffer("q_again", m.q)
    a = alias_analysis(m)
    assert sorted((f.code, f.where) for f in a.findings) == [
        ("alias-not-analysable", "q"), ("alias-not-analysable", "sp")]
    assert [(g.names, g.kind, g.memory_checked) for g in a.groups] == [
        (("q", "q_again"), "same-object", False)]


def test_thousands_of_tensors_group_by_key():
    # 1500 Linear(1, 1): 3000 tensors; every odd layer reuses the weight of the layer before
    layers = nn.ModuleList(nn.Linear(1, 1) for _ in range(1500))
    for i in range(1, 1500, 2):
        layers[i].weight = layers[i - 1].weight
    g = alias_groups(layers)
    assert len(g) == 750
    assert g[0].names == ("0.weight", "1.weight") and g[-1].names == ("1498.weight", "1499.weight")


def test_bad_model_gets_clear_error():
    with pytest.raises(InspectorError, match="nn.Module"):
        alias_groups(None)


def test_results_are_json_friendly():
    # each result read back from JSON says what the object said: full (4, 4) float32 = 64 bytes,
    # rows a view of it; lin's 2x2 weight and 2 biases are the 6 unique elements
    a = json.loads(json.dumps(alias_analysis(SliceBuffers()).to_dict()))
    [g] = a["groups"]
    assert (g["names"], g["kind"], g["numel"], g["nbytes"], g["objects"], g["shape"], g["dtype"]) == \
        (["full", "rows"], "overlapping-view", 16, 64, 2, [4, 4], "float32")
    assert (a["names"], a["unique_numel"], a["findings"]) == (4, 6, [])
    s = json.loads(json.dumps(snapshot_ties(same_object_model()).to_dict()))
    assert (s["unique_numel"], s["identity_only"], s["groups"][0]["names"]) == \
        (18, False, ["0.weight", "1.weight"])
    assert s["layouts"][0] == [{"name": n, "tensor_kind": "parameter", "obj": 0, "shape": [3, 4],
                                "stride": [4, 1], "storage_offset": 0, "dtype": "float32"}
                               for n in ("0.weight", "1.weight")]
    c = json.loads(json.dumps(conversion_check(same_object_model(), "to-float64-overwrite").to_dict()))
    assert (c["unique_before"], c["unique_after"]) == (18, 30)
    assert c["outcomes"] == [{"names": ["0.weight", "1.weight"], "kind": "same-object", "outcome": "broken",
                              "same_object": False, "same_storage": False, "objects": 2, "storages": 2,
                              "missing": []}]
    assert [(f["code"], f["where"]) for f in c["findings"]] == [("tie-broken", "0.weight")]


# --------------------------------------------------------------------------------------------
# snapshot_ties / compare_ties / retie


def test_compare_ties_broken_and_weakened(tiny_gpt2, overwrite_flag):
    snap = snapshot_ties(tiny_gpt2)
    assert compare_ties(snap, tiny_gpt2) == []
    m = tiny_gpt2.to(torch.float64)  # overwrite flag on: two objects, two storages
    f = compare_ties(snap, m)
    assert [(x.code, x.severity, x.where) for x in f] == [("tie-broken", "error", "transformer.wte.weight")]
    assert "transformer.wte.weight, lm_head.weight" in f[0].message
    assert "from 4,080 to 4,592" in f[0].message


def test_ties_kept_by_move_model_are_silent(tiny_gpt2, overwrite_flag):
    # the conversion that breaks the tie above, done by move_model: nothing to report, nothing to re-tie
    snap = snapshot_ties(tiny_gpt2)
    move_model(tiny_gpt2, dtype=torch.float64)
    assert tiny_gpt2.lm_head.weight is tiny_gpt2.transformer.wte.weight
    assert compare_ties(snap, tiny_gpt2) == [] and retie(tiny_gpt2, snap) == []


def test_compare_ties_weakened(tiny_gpt2, overwrite_flag):
    snap = snapshot_ties(tiny_gpt2)
    m = tiny_gpt2.to(torch.float32)  # same dtype: new objects over the same storage
    f = compare_ties(snap, m)
    assert [(x.code, x.severity, x.where) for x in f] == \
        [("tie-weakened", "warning", "transformer.wte.weight")]
    assert "were one object and are now 2 objects over one memory" in f[0].message
    assert f[0].message.endswith("parameters() and an optimizer count the weight twice, and the next "
                                 "conversion can split the memory. Re-tie them (retie).")
    assert "lm_head.weight" in f[0].message and "from 4,080 to 4,592" in f[0].message


def test_compare_ties_missing_name(tiny_gpt2):
    snap = snapshot_ties(tiny_gpt2)
    del tiny_gpt2.lm_head.weight
    f = compare_ties(snap, tiny_gpt2)
    assert [x.code for x in f] == ["tie-broken"] and "lm_head.weight no longer exist" in f[0].message


def test_retie_restores_identity(tiny_gpt2, overwrite_flag):
    snap = snapshot_ties(tiny_gpt2)
    m = tiny_gpt2.to(torch.float64)
    assert sum(p.numel() for p in m.parameters()) == 4592
    f = retie(m, snap)
    assert [(x.code, x.where) for x in f] == [("tie-restored", "transformer.wte.weight")]
    assert m.lm_head.weight is m.transformer.wte.weight
    assert sum(p.numel() for p in m.parameters()) == 4080
    assert compare_ties(snap, m) == [] and retie(m, snap) == []


def test_retie_restores_overlapping_view():
    m = SliceBuffers()
    snap = snapshot_ties(m)
    m.rows = m.rows.clone()  # the slice now has its own memory
    assert [x.code for x in compare_ties(snap, m)] == ["tie-broken"]
    retie(m, snap)
    assert m.rows.untyped_storage().data_ptr() == m.full.untyped_storage().data_ptr()
    assert m.rows.storage_offset() == 4 and torch.equal(m.rows, m.full[1:3])
    assert compare_ties(snap, m) == []


def test_a_view_moved_within_its_storage_is_broken_and_retied():
    # rows was full[1:3] (storage offset 4); full[0:2] has the same storage, shape and stride
    # but starts at offset 0: the tie now points at other rows, so it is broken, not kept
    m = SliceBuffers()
    snap = snapshot_ties(m)
    m.rows = m.full[0:2]
    assert m.rows.untyped_storage().data_ptr() == m.full.untyped_storage().data_ptr()
    [f] = compare_ties(snap, m)
    assert (f.code, f.severity, f.where) == ("tie-broken", "error", "full")
    assert "full, rows (overlapping-view) no longer share memory: 2 objects over different places in one " \
        "storage" in f.message
    assert [x.code for x in retie(m, snap)] == ["tie-restored"]
    assert m.rows.storage_offset() == 4 and torch.equal(m.rows, m.full[1:3])
    assert compare_ties(snap, m) == []


def test_a_tie_split_into_two_places_of_one_storage_is_broken():
    # 0.weight and 1.weight were one Parameter; now two Parameters over one 24-element storage,
    # at offsets 0 and 12: one memory, two places, so the weights train apart
    m = same_object_model()
    snap = snapshot_ties(m)
    store = torch.randn(24)
    m[0].weight = nn.Parameter(store[:12].view(3, 4))
    m[1].weight = nn.Parameter(store[12:].view(3, 4))
    [f] = compare_ties(snap, m)
    assert (f.code, f.where) == ("tie-broken", "0.weight")
    assert "2 objects over different places in one storage" in f.message
    assert "from 18 to 30" in f.message  # 12 + 3 + 3 unique, then 12 + 3 + 12 + 3


class RowsFirst(nn.Module):
    """``rows`` (full[1:3], storage offset 4) registered before ``full`` (offset 0): the group's first
    name sits 4 elements into the storage, so every other name is placed relative to it."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.arange(16.0).reshape(4, 4)
        self.register_buffer("rows", base[1:3])
        self.register_buffer("full", base)


def test_retie_places_views_relative_to_the_first_name():
    m = RowsFirst()
    snap = snapshot_ties(m)
    assert snap.groups[0].names == ("rows", "full")
    assert compare_ties(snap, m) == []  # full sits 4 before rows, as it did
    m.full = m.full.clone()  # full gets its own memory; rows keeps the old one at offset 4
    [f] = retie(m, snap)
    assert (f.code, f.where) == ("tie-restored", "rows")
    assert f.message == "re-tied rows, full (overlapping-view, was broken) to the memory of rows"
    # full starts 4 elements before rows: at offset 0 of rows' storage, rows being its rows 1 and 2
    assert m.full.storage_offset() == 0 and m.full.untyped_storage().data_ptr() == \
        m.rows.untyped_storage().data_ptr()
    assert (m.full.stride(), m.full.dtype) == ((4, 1), torch.float32) and torch.equal(m.full[1:3], m.rows)


def test_retie_refuses_a_view_that_would_reach_outside_the_storage():
    m = RowsFirst()
    snap = snapshot_ties(m)
    m.rows = m.rows.clone()  # rows now owns 8 elements: full would have to start 4 before them
    before = m.full
    with pytest.raises(InspectorError) as err:
        retie(m, snap)
    assert str(err.value) == ("cannot re-tie full as a view of rows: it would reach outside that tensor's "
                              "storage; nothing was changed")
    assert m.full is before


def test_retie_refuses_a_view_past_the_end_of_the_storage():
    # rows moved to offset 4 of a 12-element storage: full, 16 elements from 4 before rows, would end at 16
    m = RowsFirst()
    snap = snapshot_ties(m)
    m.rows = torch.arange(12.0)[4:].view(2, 4)
    with pytest.raises(InspectorError, match="cannot re-tie full as a view of rows: it would reach outside"):
        retie(m, snap)


class Columns(nn.Module):
    """``cols`` is full[:, 1:3]: shape (4, 2) with full's strides (4, 1), not contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("full", torch.arange(16.0).reshape(4, 4))
        self.register_buffer("cols", self.full[:, 1:3])


def test_retie_restores_a_non_contiguous_view_with_its_strides():
    m = Columns()
    snap = snapshot_ties(m)
    m.cols = m.cols.clone()  # contiguous: strides (2, 1)
    assert [x.code for x in retie(m, snap)] == ["tie-restored"]
    assert (m.cols.stride(), m.cols.storage_offset()) == ((4, 1), 1) and torch.equal(m.cols, m.full[:, 1:3])


class SharedThrice(nn.Module):
    """``a`` and ``b`` two Parameters over one (3, 4) tensor's memory; ``c`` is ``b`` itself."""

    def __init__(self) -> None:
        super().__init__()
        t = torch.randn(3, 4)
        self.a, self.b = nn.Parameter(t), nn.Parameter(t)
        self.register_parameter("c", self.b)


def test_retie_gives_names_of_one_object_one_view():
    m = SharedThrice()
    snap = snapshot_ties(m)
    assert snap.groups[0].names == ("a", "b", "c")
    copy = nn.Parameter(m.b.detach().clone())  # b and c: still one object, now with memory of its own
    m.b = copy
    m.c = copy
    assert [x.code for x in retie(m, snap)] == ["tie-restored"]
    assert m.b is copy and m.c is copy and m.b.data_ptr() == m.a.data_ptr()


def test_retie_of_a_same_object_tie_on_the_meta_device_needs_no_memory():
    with torch.device("meta"):
        m = same_object_model()
        snap = snapshot_ties(m)
        m[1].weight = nn.Parameter(torch.empty(3, 4))
    assert [x.code for x in retie(m, snap)] == ["tie-restored"] and m[1].weight is m[0].weight


def test_retie_keeps_each_parameter_object_and_its_dtype():
    # 0.weight and 1.weight: two float64 Parameters over one tensor's memory; 1.weight gets a copy, then
    # retie gives the same Parameter object a view of 0.weight's memory again
    m = two_linears().double()
    t = torch.randn(3, 4, dtype=torch.float64)
    m[0].weight, m[1].weight = nn.Parameter(t), nn.Parameter(t)
    snap = snapshot_ties(m)
    m[1].weight = nn.Parameter(t.clone())
    kept = m[1].weight
    assert [x.code for x in retie(m, snap)] == ["tie-restored"]
    assert m[1].weight is kept and m[1].weight.dtype == torch.float64
    assert m[1].weight.data_ptr() == m[0].weight.data_ptr() and compare_ties(snap, m) == []


def test_bad_input_to_the_tie_functions_is_named():
    m = same_object_model()
    snap = snapshot_ties(m)
    with pytest.raises(InspectorError) as err:
        compare_ties(snap.to_dict(), m)
    assert str(err.value) == "compare_ties needs a TieSnapshot from snapshot_ties(model), got dict"
    with pytest.raises(InspectorError) as err:
        retie(m, "snapshot")
    assert str(err.value) == "retie needs a TieSnapshot from snapshot_ties(model), got str"
    calls = {"snapshot_ties": lambda: snapshot_ties(None), "compare_ties": lambda: compare_ties(snap, None),
             "retie": lambda: retie(None, snap)}
    for name, call in calls.items():
        with pytest.raises(InspectorError, match=rf"^{name} needs a torch nn.Module \(a model\), got None"):
            call()


def test_retie_refuses_a_snapshot_of_another_model():
    # the snapshot names 0.weight, 0.bias, 1.weight, 1.bias; a model with only a.weight and a.bias
    # lacks all four: more than half, refused, naming the first two missing in sorted order
    snap = snapshot_ties(same_object_model())
    other = nn.Sequential()
    other.add_module("a", nn.Linear(4, 3))
    with pytest.raises(InspectorError) as err:
        retie(other, snap)
    assert str(err.value) == (
        "retie: the snapshot was taken of another model: 4 of the 4 tensors it names are not in this model "
        "(first: 0.bias, 0.weight); nothing was changed. Take the snapshot of this model with "
        "snapshot_ties(model) before converting it")


def test_retie_of_a_model_missing_half_its_names_is_not_another_model():
    # exactly half the names gone (0.bias and 1.bias deleted): the same model, whose tie is intact
    m = same_object_model()
    snap = snapshot_ties(m)
    del m[0].bias, m[1].bias
    assert retie(m, snap) == []


def test_retie_names_what_is_missing():
    m = same_object_model()
    snap = snapshot_ties(m)
    del m[1].weight
    with pytest.raises(InspectorError) as err:
        retie(m, snap)
    assert str(err.value) == ("cannot re-tie 0.weight, 1.weight: 1.weight no longer exist in the model; "
                              "nothing was changed")
    [f] = compare_ties(snap, m)
    assert (f.code, f.where) == ("tie-broken", "0.weight")


def test_a_tie_copied_into_two_storages_says_so():
    m = same_object_model()
    snap = snapshot_ties(m)
    m[1].weight = nn.Parameter(m[0].weight.detach().clone())
    [f] = compare_ties(snap, m)
    assert f.message == ("0.weight, 1.weight (same-object) no longer share memory: 2 objects over 2 "
                         "separate storages; the unique parameter count went from 18 to 30. Training updates "
                         "each copy on its own. Re-tie them (retie) or convert with move_model, which keeps "
                         "ties.")


def test_a_tie_untied_on_the_meta_device_is_broken_over_separate_memory():
    with torch.device("meta"):
        m = same_object_model()
    snap = snapshot_ties(m)
    with torch.device("meta"):
        m[1].weight = nn.Parameter(torch.empty(3, 4))
    [f] = compare_ties(snap, m)
    assert (f.code, f.where) == ("tie-broken", "0.weight")
    assert "2 objects over separate memory" in f.message


def test_retie_of_a_view_on_the_meta_device_is_refused():
    m = SliceBuffers()
    snap = snapshot_ties(m)  # on the CPU: rows is a view of full
    m.to("meta")
    with pytest.raises(InspectorError) as err:
        retie(m, snap)
    assert str(err.value) == ("cannot re-tie full, rows (overlapping-view) on the meta device: there is no "
                              "memory to share; materialise the model first")


def test_a_snapshot_without_buffers_has_no_buffer_groups():
    assert snapshot_ties(SliceBuffers(), include_buffers=False).groups == ()
    assert [g.names for g in snapshot_ties(SliceBuffers()).groups] == [("full", "rows")]


def test_retie_refuses_when_shapes_or_dtypes_differ():
    m = same_object_model()
    snap = snapshot_ties(m)
    m[1].weight = nn.Parameter(torch.zeros(5, 4))
    before = m[1].weight
    with pytest.raises(InspectorError, match=r"1\.weight.*\(5, 4\).*\(3, 4\)"):
        retie(m, snap)
    assert m[1].weight is before  # nothing changed
    m[1].weight = nn.Parameter(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(InspectorError) as err:
        retie(m, snap)
    assert str(err.value) == ("cannot re-tie 1.weight (float64) to 0.weight (float32): dtypes differ; "
                              "convert both to one dtype first; nothing was changed")


# --------------------------------------------------------------------------------------------
# Conversion check


def _row(result):
    o = result.outcomes[0]
    return o.outcome, o.same_object, o.same_storage, result.unique_after


def test_conversion_table_on_tiny_gpt2(tiny_gpt2):
    flag = torch.__future__.get_overwrite_module_params_on_conversion()
    wte = tiny_gpt2.transformer.wte.weight
    value = wte.detach().clone()
    names = ["to-float64-overwrite", "to-float32-overwrite", "move-model-float64", "move-model-float32"]
    table, results = conversion_table(tiny_gpt2, names)
    got = {r.conversion: _row(r) for r in results}
    assert got == {
        "to-float64-overwrite": ("broken", False, False, 4592),   # different objects, different storage
        "to-float32-overwrite": ("weakened", False, True, 4592),  # different objects, same storage
        "move-model-float64": ("kept", True, True, 4080),         # same, same
        "move-model-float32": ("kept", True, True, 4080),
    }
    assert table.iloc[0][["conversion", "same_object", "same_storage", "unique"]].tolist() == [
        "before", True, True, 4080]
    assert table["outcome"].tolist() == ["-", "broken", "weakened", "kept", "kept"]
    # the model itself is untouched and the process-wide flag is back
    assert tiny_gpt2.lm_head.weight is wte and torch.equal(wte, value) and wte.dtype == torch.float32
    assert torch.__future__.get_overwrite_module_params_on_conversion() == flag


def test_every_conversion_on_tiny_gpt2(tiny_gpt2):
    names = [n for n in CONVERSIONS if n != "cuda" or torch.cuda.is_available()]
    got = {name: _row(conversion_check(tiny_gpt2, name)) for name in names}
    assert got["to-float64"] == ("kept", True, True, 4080)
    assert got["to-device"] == ("kept", True, True, 4080)  # cpu -> cpu: .to() hands back the same tensors
    assert got["to-device-overwrite"] == ("weakened", False, True, 4592)  # cpu -> cpu, new objects
    assert got["move-model-device"] == ("kept", True, True, 4080)
    assert got["load-state-dict-assign"] == ("weakened", False, True, 4592)
    assert got["safetensors-file"] == ("broken", False, False, 4592)
    assert got["safetensors-model"] == ("kept", True, True, 4080)
    assert got["deepcopy"] == ("kept", True, True, 4080)
    assert got["to-empty"] == ("kept", True, True, 4080)


def test_module_cuda_needs_a_cuda_target(tiny_gpt2):
    r = conversion_check(tiny_gpt2, "cuda", device="cpu")
    assert r.outcomes == () and "Module.cuda() moves to a CUDA device" in r.error and "cuda:N" in r.error


def test_a_view_breaks_when_buffers_are_converted_one_by_one_and_move_model_keeps_it():
    # full is (4, 4); rows = full[1:3]. .to(float64) converts each buffer on its own: two storages.
    broken = conversion_check(SliceBuffers(), "to-float64").outcomes[0]
    assert (broken.names, broken.outcome, broken.same_storage) == (("full", "rows"), "broken", False)
    kept = conversion_check(SliceBuffers(), "move-model-float64").outcomes[0]
    assert (kept.outcome, kept.same_storage) == ("kept", True)
    m = move_model(SliceBuffers(), dtype=torch.float64)
    assert m.rows.dtype == torch.float64 and m.rows.data_ptr() == m.full[1:3].data_ptr()
    assert [(g.names, g.kind) for g in alias_groups(m)] == [(("full", "rows"), "overlapping-view")]


def test_conversion_with_retie(tiny_gpt2):
    r = conversion_check(tiny_gpt2, "to-float64-overwrite", retie_after=True)
    assert [f.code for f in r.findings] == ["tie-broken"]
    assert [f.code for f in r.retied] == ["tie-restored"]
    assert r.unique_after_retie == 4080 and r.after_retie[0].outcome == "kept"


def test_conversion_on_meta_model():
    with torch.device("meta"):
        m = get_sample("tiny-gpt2").build_fn()
    assert _row(conversion_check(m, "to-float64-overwrite")) == ("broken", False, None, 4592)
    assert _row(conversion_check(m, "to-float64")) == ("kept", True, None, 4080)
    assert _row(conversion_check(m, "to-empty")) == ("broken", False, False, 4592)  # meta -> cpu
    r = conversion_check(m, "safetensors-file")
    assert r.error is not None and "meta device" in r.error and r.outcomes == ()
    big = conversion_check(get_sample("llama-70b-meta").build(), "to-empty")
    assert big.error is not None and "GiB" in big.error


def test_overwrite_flag_restored_when_conversion_fails():
    class Refuses(nn.Linear):
        def _apply(self, fn, recurse=True):
            raise RuntimeError("no conversion for you")

    m = nn.Sequential(Refuses(2, 2))
    r = conversion_check(m, "to-float64-overwrite")
    assert r.error == "RuntimeError: no conversion for you"
    assert torch.__future__.get_overwrite_module_params_on_conversion() is False


def test_unknown_conversion():
    with pytest.raises(InspectorError, match="unknown conversion 'nope'"):
        conversion_check(two_linears(), "nope")


def test_hugging_face_gpt2_from_tiny_config():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(config)
    a = alias_analysis(m)
    assert [(g.names, g.kind) for g in a.groups] == [(("transformer.wte.weight", "lm_head.weight"),
                                                       "same-object")]
    # the same sizes as tiny-gpt2: 4080 unique, 4592 with the tie counted twice
    assert (a.unique_numel, a.numel_with_aliases) == (4080, 4592)
    assert _row(conversion_check(m, "to-float64-overwrite")) == ("broken", False, False, 4592)
    assert _row(conversion_check(m, "move-model-float64")) == ("kept", True, True, 4080)


# --------------------------------------------------------------------------------------------
# Figure


def test_graph_of_tied_model():
    m = same_object_model()
    d = graph_data(m)
    # modules: root, 0, 1; tensors: 0.weight (held by 0 and 1), 0.bias, 1.bias
    assert sorted(d.nodes) == ["m:", "m:0", "m:1", "t:0.bias", "t:0.weight", "t:1.bias"]
    assert d.extra == [("m:1", "t:0.weight", 0)]
    assert (d.left_out_modules, d.left_out_tensors) == (0, 0)
    fig = alias_graph_figure(d)
    assert fig.layout.title.text == "1 alias group"
    assert any(tr.name and tr.name.startswith("same-object: 0.weight, 1.weight") for tr in fig.data)


def test_graph_of_big_models_is_aggregated():
    m = get_sample("llama-70b-meta").build()
    d = graph_data(m, max_nodes=300)
    # no aliases: root + embed_tokens, rotary_emb, layers, norm, lm_head; no tensors
    assert len(d.nodes) == 6 and d.left_out_tensors == 724
    assert d.left_out_modules == sum(1 for _ in m.named_modules(remove_duplicate=False)) - 6
    assert "724 tensors left out" in alias_graph_figure(d).layout.title.text
    layers = nn.ModuleList(nn.Sequential(nn.Linear(1, 1)) for _ in range(200))
    layers[199][0].weight = layers[0][0].weight
    d = graph_data(layers, max_nodes=100)
    # kept: root, 0, 0.0, 199, 199.0 and the one tied tensor
    assert sorted(d.nodes) == ["m:", "m:0", "m:0.0", "m:199", "m:199.0", "t:0.0.weight"]
    assert d.left_out_tensors == 399 - 1


def test_graph_escapes_names():
    m = nn.Module()
    m.add_module("<b>x</b>", nn.Linear(1, 1, bias=False))
    m.add_module("y", nn.Linear(1, 1, bias=False))
    m.y.weight = m.get_submodule("<b>x</b>").weight
    fig = alias_graph_figure(graph_data(m))
    texts = [h for tr in fig.data for h in [*(tr.hovertext or ()), *(tr.text or ()), tr.name or ""]]
    assert any("&lt;b&gt;x&lt;/b&gt;" in h for h in texts) and not any("<b>" in h for h in texts)


# --------------------------------------------------------------------------------------------
# CUDA


@pytest.mark.cuda
def test_conversions_onto_cuda(tiny_gpt2):
    assert _row(conversion_check(tiny_gpt2, "to-device-overwrite", device="cuda")) == (
        "broken", False, False, 4592)  # cpu -> cuda: each name gets its own copy
    assert _row(conversion_check(tiny_gpt2, "move-model-device", device="cuda")) == ("kept", True, True, 4080)
    assert _row(conversion_check(tiny_gpt2, "safetensors-file", device="cuda")) == (
        "broken", False, False, 4592)
    r = conversion_check(tiny_gpt2, "to-device-overwrite", device="cuda", retie_after=True)
    assert r.unique_after_retie == 4080 and r.after_retie[0].outcome == "kept"
    assert tiny_gpt2.lm_head.weight.device.type == "cpu"  # the model itself stayed


@pytest.mark.cuda
def test_groups_on_cuda():
    # Module.cuda() moves full and rows one by one: the view does not survive, as the table says
    plain = SliceBuffers().cuda()
    assert [g.kind for g in alias_groups(plain)] == []
    for name in ("cuda", "to-device"):
        o = conversion_check(SliceBuffers(), name, device="cuda").outcomes[0]
        assert (o.names, o.outcome, o.same_storage) == (("full", "rows"), "broken", False), name
    o = conversion_check(SliceBuffers(), "move-model-device", device="cuda").outcomes[0]
    assert (o.outcome, o.same_storage) == ("kept", True)
    m = move_model(SliceBuffers(), "cuda")  # keeps the view
    m.lin.register_buffer("w_copy", m.lin.weight.detach())
    g = alias_groups(m)
    assert [(x.names, x.kind, x.device) for x in g] == [
        (("lin.weight", "lin.w_copy"), "shared-storage", "cuda:0"),
        (("full", "rows"), "overlapping-view", "cuda:0")]
    m.full = m.full.cpu()  # same numbers, other device: no longer an alias
    assert [x.names for x in alias_groups(m)] == [("lin.weight", "lin.w_copy")]
