"""Flat offset map, locate, gradient norms, the backward helper and the round trip."""

from __future__ import annotations

import math

import numpy as np
import psutil
import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from inspector import InspectorError, gradient_norms, load_model, locate, offset_map
from inspector.offsets import (
    OFFSET_COLUMNS,
    display_table,
    flatten_roundtrip,
    gradient_report,
    offset_findings,
    run_backward,
    state_counts,
    vector_lengths,
)
from sample_models import get_sample


def assert_matches_vector(model: nn.Module, table, tensors: list[torch.Tensor]) -> None:
    """Every row's [start:end] slice of the concatenation is that tensor, flattened."""
    vec = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    by_name = dict(model.named_parameters())
    by_name.update(dict(model.named_buffers()))
    assert len(table) == len(tensors)
    assert int(table["end"].iloc[-1]) == vec.numel()
    for row, t in zip(table.itertuples(), tensors, strict=True):
        assert by_name[row.name] is t
        assert row.end - row.start == row.numel == t.numel()
        assert row.shape == tuple(t.shape)
        assert torch.equal(vec[row.start:row.end], t.detach().reshape(-1).double())


# --------------------------------------------------------------------------- offset map


def test_columns_are_the_contract():
    assert list(offset_map(nn.Linear(2, 2)).columns) == OFFSET_COLUMNS == [
        "name", "aliases", "module", "start", "end", "numel", "shape", "dtype", "device",
        "requires_grad", "kind"]


def test_tied_tiny_gpt2_agrees_with_parameters_to_vector(tiny_gpt2):
    table = offset_map(tiny_gpt2)
    vec = parameters_to_vector(tiny_gpt2.parameters())
    assert vec.numel() == 4080 == int(table["end"].iloc[-1])  # tie counted once (4592 twice)
    assert table["name"].tolist() == [n for n, _ in tiny_gpt2.named_parameters()]
    for row, p in zip(table.itertuples(), tiny_gpt2.parameters(), strict=True):
        assert torch.equal(vec[row.start:row.end], p.detach().view(-1))
    first = table.iloc[0]
    # wte is 32 x 16 = 512 elements and is lm_head.weight too
    assert (first["name"], first["aliases"], first["start"], first["end"]) == \
        ("transformer.wte.weight", ("lm_head.weight",), 0, 512)
    assert first["module"] == "transformer.wte"
    assert "lm_head.weight" not in set(table["name"])
    assert [f.code for f in offset_findings(tiny_gpt2)] == ["tied"]


def test_frozen_adapter_full_and_trainable_maps():
    model = get_sample("frozen-adapter").build()
    full = offset_map(model)
    assert_matches_vector(model, full, list(model.parameters()))
    trainable = offset_map(model, trainable_only=True)
    assert_matches_vector(model, trainable, [p for p in model.parameters() if p.requires_grad])
    # layers.0: base.weight 16x8=128, base.bias 16 (frozen), lora_A 2x8=16, lora_B 16x2=32
    row = full.set_index("name").loc["layers.0.lora_A.weight"]
    assert (row["start"], row["end"]) == (144, 160)
    row = trainable.set_index("name").loc["layers.0.lora_A.weight"]
    assert (row["start"], row["end"]) == (0, 16)
    # layers.1.lora_B.weight: full start = 144+16+32 (layer 0: 192) + 256+16+32 = 496;
    # trainable start = 16+32 + 32 = 80; the 416 frozen elements in front are the shift
    f = full.set_index("name").loc["layers.1.lora_B.weight", "start"]
    t = trainable.set_index("name").loc["layers.1.lora_B.weight", "start"]
    assert (f, t, f - t) == (496, 80, 416)
    assert not full["requires_grad"].iloc[0] and trainable["requires_grad"].all()
    codes = [f.code for f in offset_findings(model)]
    assert codes == ["frozen-shift"]


def test_vector_lengths_match_parameters_to_vector_and_the_trainable_vector(tiny_gpt2):
    model = get_sample("frozen-adapter").build()
    n = vector_lengths(offset_map(model, include_buffers=True), offset_map(model, trainable_only=True))
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    assert n["total"] == parameters_to_vector(params).numel()
    assert n["trainable"] == parameters_to_vector(trainable).numel()
    assert n["frozen"] == n["total"] - n["trainable"] > 0
    assert (n["tensors"], n["aliases"]) == (len(params), 0)
    tied = vector_lengths(offset_map(tiny_gpt2), offset_map(tiny_gpt2, trainable_only=True))
    assert tied["aliases"] >= 1 and tied["tensors"] == len(list(tiny_gpt2.parameters()))


def test_cnn_bn_buffers_come_after_and_never_shift_parameters():
    model = get_sample("cnn-bn").build()
    params_only = offset_map(model)
    with_buffers = offset_map(model, include_buffers=True)
    # conv1 224 + conv2 1168 + bn2 32 + fc 170 = 1594 parameter elements
    assert int(params_only["end"].iloc[-1]) == 1594
    assert with_buffers[with_buffers["kind"] == "parameter"].reset_index(drop=True).equals(params_only)
    buffers = with_buffers[with_buffers["kind"] == "buffer"]
    # running_mean 16, running_var 16, num_batches_tracked 1 = 33 buffer elements after 1594
    assert buffers["name"].tolist() == ["bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked"]
    assert buffers["start"].tolist() == [1594, 1610, 1626] and int(buffers["end"].iloc[-1]) == 1627
    assert buffers["dtype"].tolist() == ["float32", "float32", "int64"]
    assert not buffers["requires_grad"].any()
    assert_matches_vector(model, with_buffers, [*model.parameters(), *model.buffers()])


def test_non_contiguous_parameter_is_flagged_and_offsets_hold_for_reshape():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[1].weight = nn.Parameter(torch.arange(8.0).reshape(4, 2).t())  # (2, 4), stride (1, 2)
    with pytest.raises(RuntimeError, match="view size"):
        parameters_to_vector(model.parameters())
    table = offset_map(model)
    assert_matches_vector(model, table, list(model.parameters()))
    # 0.weight 12 + 0.bias 4 = 16, so 1.weight is [16, 24): row 0 of the transpose is 0, 2, 4, 6
    row = table.set_index("name").loc["1.weight"]
    assert (row["start"], row["end"], row["shape"]) == (16, 24, (2, 4))
    found = offset_findings(model)
    assert [(f.code, f.where) for f in found] == [("non-contiguous", "1.weight")]
    assert "reshape" in found[0].message


def test_mixed_dtypes_are_flagged():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].half()
    codes = {f.code: f for f in offset_findings(model)}
    assert "mixed-dtypes" in codes and "float32" in codes["mixed-dtypes"].message
    assert offset_map(model)["dtype"].tolist() == ["float32", "float32", "float16", "float16"]


def test_hugging_face_gpt2_from_a_tiny_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    table = offset_map(model)
    vec = parameters_to_vector(model.parameters())
    assert int(table["end"].iloc[-1]) == vec.numel()
    for row, p in zip(table.itertuples(), model.parameters(), strict=True):
        assert torch.equal(vec[row.start:row.end], p.detach().view(-1))
    wte = table.set_index("name").loc["transformer.wte.weight"]
    assert wte["aliases"] == ("lm_head.weight",) and wte["numel"] == 32 * 16


def test_llama_70b_on_meta_without_allocating():
    model = get_sample("llama-70b-meta").build()
    rss = psutil.Process().memory_info().rss
    table = offset_map(model, include_buffers=True)
    assert psutil.Process().memory_info().rss - rss < 50 * 2**20  # a vector would be 276 GB
    params = table[table["kind"] == "parameter"]
    # embed 32000*8192 = 262,144,000; per layer q,o 67,108,864 each, k,v 8,388,608 each,
    # gate/up/down 234,881,024 each, two norms 8192 each = 855,654,400; x80 = 68,452,352,000;
    # + norm 8192 + lm_head 262,144,000 = 68,976,648,192
    assert int(params["end"].iloc[-1]) == 68_976_648_192
    assert len(params) == 1 + 80 * 9 + 2 and set(table["device"]) == {"meta"}
    buffers = table[table["kind"] == "buffer"]
    assert buffers["name"].tolist() == ["rotary_emb.inv_freq"]
    assert int(buffers["start"].iloc[0]) == 68_976_648_192 and int(buffers["numel"].iloc[0]) == 64
    loc = locate(model, 262_144_000)  # first element after the embedding
    assert (loc.name, loc.element) == ("layers.0.input_layernorm.weight", (0,))


def test_offset_map_does_not_change_the_model(tiny_gpt2):
    before = [(n, id(p), p.requires_grad) for n, p in tiny_gpt2.named_parameters()]
    offset_map(tiny_gpt2, include_buffers=True)
    offset_findings(tiny_gpt2)
    assert [(n, id(p), p.requires_grad) for n, p in tiny_gpt2.named_parameters()] == before


# --------------------------------------------------------------------------- locate


def test_locate_at_segment_edges():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2, bias=False))
    # 0.weight (2, 3) -> [0, 6); 0.bias (2,) -> [6, 8); 1.weight (2, 2) -> [8, 12)
    cases = {0: ("0.weight", (0, 0)), 5: ("0.weight", (1, 2)), 6: ("0.bias", (0,)),
             7: ("0.bias", (1,)), 8: ("1.weight", (0, 0)), 11: ("1.weight", (1, 1))}
    for index, (name, element) in cases.items():
        loc = locate(model, index)
        assert (loc.name, loc.element, loc.total) == (name, element, 12)
        assert loc.start <= index < loc.end
    assert locate(model, 7).offset == 1
    assert "0.bias[1]" in locate(model, 7).describe()


def test_locate_out_of_range_and_bad_index():
    model = nn.Linear(3, 2)  # 6 + 2 = 8 elements
    with pytest.raises(InspectorError, match=r"index 8 is out of range.*8 elements.*0\.\.7"):
        locate(model, 8)
    with pytest.raises(InspectorError, match="out of range"):
        locate(model, -1)
    with pytest.raises(InspectorError, match="integer"):
        locate(model, 1.5)


def test_locate_trainable_only_and_from_a_table():
    model = get_sample("frozen-adapter").build()
    # index 100 of the trainable vector: layer 0 adapters 48, layer 1 lora_A 32 -> [80, 112) is
    # layers.1.lora_B.weight (16, 2); 100 - 80 = 20 -> row 10, column 0
    loc = locate(model, 100, trainable_only=True)
    assert (loc.name, loc.element, loc.requires_grad) == ("layers.1.lora_B.weight", (10, 0), True)
    assert locate(offset_map(model, trainable_only=True), 100) == loc
    assert locate(model, 100).name == "layers.0.base.weight"  # the full map's answer


# --------------------------------------------------------------------------- every word of the map


def _thrice_tied() -> nn.Module:
    """``a.weight`` (2, 2) reachable under two more names; ``a.bias`` (2,)."""
    model = nn.Module()
    model.a = nn.Linear(2, 2)
    model.b, model.c = nn.Module(), nn.Module()
    model.b.w = model.a.weight
    model.c.w = model.a.weight
    return model


def test_display_table_writes_tuples_as_text_and_leaves_the_table_alone():
    table = offset_map(_thrice_tied())
    shown = display_table(table)
    assert shown["aliases"].tolist() == ["b.w, c.w", ""]
    assert shown["shape"].tolist() == ["(2, 2)", "(2,)"]
    assert shown.drop(columns=["aliases", "shape"]).equals(table.drop(columns=["aliases", "shape"]))
    assert table["aliases"].tolist() == [("b.w", "c.w"), ()] and table["shape"].tolist() == [(2, 2), (2,)]
    # a table without those columns is shown as it is
    part = table[["name", "start"]]
    assert display_table(part).equals(part)


def test_vector_lengths_count_each_alias_and_leave_buffers_out():
    model = _thrice_tied()
    model.a.bias.requires_grad_(False)
    model.register_buffer("steps", torch.zeros(5))
    n = vector_lengths(offset_map(model, include_buffers=True), offset_map(model, trainable_only=True))
    assert n == {"total": 6, "frozen": 2, "trainable": 4, "tensors": 2, "aliases": 2}


def test_offset_map_rows_name_their_module_aliases_and_kind():
    model = _thrice_tied()
    model.a.bias.requires_grad_(False)
    model.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    model.b.register_buffer("seen", torch.ones(1))
    table = offset_map(model, trainable_only=True, include_buffers=True)
    assert table[["name", "aliases", "module", "start", "end", "requires_grad", "kind", "dtype", "device"]
                 ].values.tolist() == [
        ["a.weight", ("b.w", "c.w"), "a", 0, 4, True, "parameter", "float32", "cpu"],
        ["steps", (), "", 4, 7, False, "buffer", "int64", "cpu"],
        ["b.seen", (), "b", 7, 8, False, "buffer", "float32", "cpu"],
    ]


def test_locate_describes_an_element_with_its_aliases_and_thousands():
    loc = locate(_thrice_tied(), 1)
    assert (loc.name, loc.aliases, loc.start, loc.end, loc.offset, loc.element, loc.shape) == \
        ("a.weight", ("b.w", "c.w"), 0, 4, 1, (0, 1), (2, 2))
    assert (loc.dtype, loc.device, loc.requires_grad, loc.kind, loc.total) == \
        ("float32", "cpu", True, "parameter", 6)
    assert loc.describe() == ("element 1 of the 6-element vector is a.weight[0, 1] (also b.w, c.w): "
                              "element 1 of its 4 (range 0..3, shape (2, 2))")
    # 0.weight 40 x 30 = 1,200, 0.bias 30 -> 1.weight (2, 30) is [1,230, 1,290); 1,234 is its [0, 4]
    big = nn.Sequential(nn.Linear(40, 30), nn.Linear(30, 2))
    assert locate(big, 1234).describe() == (
        "element 1,234 of the 1,292-element vector is 1.weight[0, 4]: element 4 of its 60 "
        "(range 1,230..1,289, shape (2, 30))")


def test_locate_skips_empty_tensors_and_reads_scalars():
    model = nn.Module()
    model.empty = nn.Parameter(torch.zeros(0))
    model.scale = nn.Parameter(torch.tensor(2.0))
    model.none = nn.Parameter(torch.zeros(2, 0))
    model.w = nn.Parameter(torch.zeros(2, 3))
    # empty [0, 0), scale [0, 1), none [1, 1), w [1, 7)
    first = locate(model, 0)
    assert (first.name, first.element, first.shape, first.offset) == ("scale", (), (), 0)
    assert first.describe().startswith("element 0 of the 7-element vector is scale[]:")
    for index, element in [(1, (0, 0)), (3, (0, 2)), (4, (1, 0)), (6, (1, 2))]:
        loc = locate(model, index)
        assert (loc.name, loc.element, loc.offset) == ("w", element, index - 1)


def test_locate_takes_numpy_integers_and_refuses_booleans():
    model = nn.Linear(3, 2)
    assert locate(model, np.int64(7)).name == "bias"
    assert locate(model, np.int32(0)).element == (0, 0)
    for bad in (True, False, "3", 2.0, None):
        with pytest.raises(InspectorError, match="a flat index must be an integer, got"):
            locate(model, bad)


def test_locate_in_a_table_with_buffers_counts_parameters_only():
    model = get_sample("cnn-bn").build()  # 1594 parameter elements, then 33 of buffers
    table = offset_map(model, include_buffers=True)
    assert locate(table, 1593).name == "fc.bias"
    with pytest.raises(InspectorError, match=r"index 1594 is out of range: the flat vector has 1594 "
                                              r"elements, so valid indices are 0\.\.1593"):
        locate(table, 1594)


def test_locate_in_an_empty_vector_says_why():
    with pytest.raises(InspectorError, match=r"^the flat vector is empty: the model has no parameters$"):
        locate(nn.ReLU(), 0)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(InspectorError, match=r"^the trainable-only vector is empty: the model has no "
                                              r"parameters that require gradients$"):
        locate(frozen, 0, trainable_only=True)
    with pytest.raises(InspectorError, match=r"index 4 is out of range: the trainable-only vector has 4 "):
        locate(nn.Linear(1, 2).requires_grad_(True), 4, trainable_only=True)


def test_tied_finding_counts_each_name():
    found = offset_findings(_thrice_tied())
    assert [(f.code, f.severity, f.where) for f in found] == [("tied", "info", "a.weight")]
    assert found[0].message == ("a.weight is also reachable as b.w, c.w: it is one Parameter object, so it "
                                "appears once in the flat vector (4 elements, not 12).")


def test_findings_of_a_trainable_only_vector_leave_frozen_parameters_out():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].half().requires_grad_(False)
    model[1].weight = nn.Parameter(torch.zeros(2, 2).t())
    model[2].weight = model[1].weight
    full = offset_findings(model)
    assert [(f.code, f.where) for f in full] == [
        ("non-contiguous", "1.weight"), ("mixed-dtypes", ""), ("frozen-shift", "0.weight"),
        ("tied", "1.weight")]
    trainable = offset_findings(model, trainable_only=True)
    assert [(f.code, f.where) for f in trainable] == [
        ("non-contiguous", "1.weight"), ("frozen-shift", "0.weight"), ("tied", "1.weight")]
    model[1].weight.requires_grad_(False)
    assert [f.code for f in offset_findings(model, trainable_only=True)] == ["frozen-shift"]


def test_finding_messages_name_shapes_dtypes_and_counts():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2))
    model[1].weight = nn.Parameter(torch.zeros(4, 2).t())
    model[1].half()
    model[0].requires_grad_(False)
    found = {f.code: f for f in offset_findings(model)}
    assert list(found) == ["non-contiguous", "mixed-dtypes", "frozen-shift"]
    assert found["non-contiguous"].severity == "warning"
    assert found["non-contiguous"].message == (
        "1.weight (shape (2, 4), stride (1, 2)) is not contiguous: parameters_to_vector calls view(-1) "
        "on it and raises. Flatten with torch.cat([p.reshape(-1) for p in params]) instead; the offsets "
        "shown hold for that row-major flattening.")
    assert (found["mixed-dtypes"].severity, found["mixed-dtypes"].where) == ("warning", "")
    assert found["mixed-dtypes"].message == (
        "parameters have several dtypes: float32 (4, first 0.weight), float16 (2, first 1.weight). "
        "parameters_to_vector promotes them all to float32, and vector_to_parameters then gives every "
        "parameter float32 data, silently changing the dtype of the others. Flatten each dtype group "
        "separately.")
    assert (found["frozen-shift"].severity, found["frozen-shift"].where) == ("info", "0.weight")
    assert found["frozen-shift"].message == (
        "2 frozen parameters sit among trainable ones (first: 0.weight). parameters() still yields them, "
        "so parameters_to_vector(model.parameters()) includes them; a vector of trainable parameters only "
        "has different offsets for 4 trainable parameters after it (first: 1.weight).")


def test_mixed_dtypes_name_the_dtype_they_are_promoted_to():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double()).half()
    model[1].double()
    (found,) = offset_findings(model)
    assert found.message.startswith("parameters have several dtypes: float16 (2, first 0.weight), float64 "
                                    "(2, first 1.weight). parameters_to_vector promotes them all to "
                                    "float64, and vector_to_parameters then gives every parameter float64 "
                                    "data")


def test_what_is_no_model_is_refused_by_name():
    for call, what in [(offset_map, "offset_map"), (offset_findings, "offset_findings")]:
        with pytest.raises(InspectorError, match=rf"^{what} needs a torch nn.Module \(a model\), got str"):
            call("model.pt")


def test_frozen_parameters_shift_nothing_when_all_or_only_the_last_are_frozen():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].requires_grad_(False)
    assert offset_findings(model) == []
    model[0].requires_grad_(False)
    assert offset_findings(model) == []
    model[1].bias.requires_grad_(True)
    assert [(f.code, f.where) for f in offset_findings(model)] == [("frozen-shift", "0.weight")]
    assert "after it (first: 1.bias)" in offset_findings(model)[0].message


def test_parameters_on_two_devices_and_on_meta_are_named():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 3))
    model[1].to("meta")
    found = {f.code: f for f in offset_findings(model)}
    assert list(found) == ["several-devices", "meta"]
    assert found["several-devices"].severity == "warning" and found["several-devices"].where == ""
    assert found["several-devices"].message == (
        "parameters are on several devices: cpu (2, first 0.weight), meta (2, first 1.weight). "
        "parameters_to_vector refuses them ('Found two parameters on different devices'); flatten per "
        "device.")
    assert (found["meta"].severity, found["meta"].where) == ("info", "")
    assert found["meta"].message == ("the model is on the meta device: offsets come from shapes alone; "
                                     "there are no values, so no gradients and no flat vector.")
    # a non-contiguous meta parameter has no data to flatten: not flagged
    model[1].weight = nn.Parameter(torch.empty(2, 3, device="meta").t())
    assert [f.code for f in offset_findings(model)] == ["several-devices", "meta"]


# --------------------------------------------------------------------------- gradient norms


class Hand(nn.Module):
    """block.a: grad [3, 4] (norm 5); block.b: grad [12] (norm 12) -> block 13;
    frozen: requires_grad False; unused: no grad; bad: grad [nan, inf, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Module()
        self.block.a = nn.Parameter(torch.zeros(2))
        self.block.b = nn.Parameter(torch.zeros(1))
        self.frozen = nn.Linear(2, 1, bias=False).requires_grad_(False)
        self.unused = nn.Parameter(torch.zeros(3))
        self.bad = nn.Parameter(torch.zeros(3))

    def set_grads(self) -> None:
        self.block.a.grad = torch.tensor([3.0, 4.0])
        self.block.b.grad = torch.tensor([12.0])
        self.bad.grad = torch.tensor([math.nan, math.inf, 1.0])


def test_gradient_states_on_a_hand_built_model():
    model = Hand()
    model.set_grads()
    table = gradient_norms(model).set_index("name")
    assert list(gradient_norms(model).columns[:3]) == ["name", "norm", "state"]
    assert table.loc["block.a", "norm"] == 5.0 and table.loc["block.b", "norm"] == 12.0
    assert table["state"].to_dict() == {"block.a": "ok", "block.b": "ok", "frozen.weight": "frozen",
                                        "unused": "none", "bad": "nonfinite"}
    assert (table.loc["bad", "nan"], table.loc["bad", "inf"]) == (1, 1)
    assert math.isnan(table.loc["unused", "norm"]) and math.isnan(table.loc["frozen.weight", "norm"])
    assert state_counts(gradient_norms(model)) == {"ok": 2, "none": 1, "frozen": 1, "nonfinite": 1}
    report = gradient_report(model)
    assert report.counts == {"ok": 2, "none": 1, "frozen": 1, "nonfinite": 1}
    codes = [f.code for f in report.findings]
    assert codes == ["unreached", "nonfinite-gradient"]
    assert report.findings[1].where == "bad" and "1 NaN and 1 Inf" in report.findings[1].message


def test_module_norms_are_root_sum_of_squares_of_children():
    model = Hand()
    model.set_grads()
    model.bad.grad = torch.tensor([0.0, 0.0, 84.0])  # finite now: 5, 12, 84
    modules = gradient_norms(model, by="module").set_index("name")
    # block: sqrt(5^2 + 12^2) = 13; model: sqrt(13^2 + 84^2) = sqrt(169 + 7056) = 85
    assert modules.loc["block", "norm"] == 13.0
    assert modules.loc["(model)", "norm"] == 85.0
    assert modules.loc["(model)", "parameters"] == 5 and modules.loc["block", "parameters"] == 2
    assert modules.loc["frozen", "state"] == "frozen" and math.isnan(modules.loc["frozen", "norm"])
    assert modules.loc["block", "depth"] == 1 and modules.loc["(model)", "depth"] == 0
    # a nonfinite parameter makes every module above it nonfinite
    model.bad.grad = torch.tensor([math.nan, 0.0, 0.0])
    modules = gradient_norms(model, by="module").set_index("name")
    assert modules.loc["(model)", "state"] == "nonfinite" and modules.loc["(model)", "nan"] == 1
    assert modules.loc["block", "state"] == "ok"


def test_real_backward_gives_nan_and_unreached_states():
    model = nn.ModuleDict({"used": nn.Linear(2, 1), "unused": nn.Linear(2, 1),
                           "frozen": nn.Linear(2, 1).requires_grad_(False)})
    x = torch.tensor([[-1.0, 0.0]])
    y = model["used"](x) + model["frozen"](x)
    torch.sqrt(-y.abs() - 1).sum().backward()  # sqrt of a negative: NaN gradients
    table = gradient_norms(model).set_index("name")
    assert table.loc["used.weight", "state"] == "nonfinite"
    assert table.loc["unused.weight", "state"] == "none"
    assert table.loc["frozen.weight", "state"] == "frozen"


def test_tied_gradient_counted_once_but_under_both_modules(tiny_gpt2):
    grad = torch.zeros(32, 16)
    grad[0, :2] = torch.tensor([3.0, 4.0])  # norm 5
    tiny_gpt2.transformer.wte.weight.grad = grad
    modules = gradient_norms(tiny_gpt2, by="module").set_index("name")
    assert modules.loc["transformer.wte", "norm"] == modules.loc["lm_head", "norm"] == 5.0
    assert modules.loc["(model)", "norm"] == 5.0  # once, not sqrt(50)


def test_no_gradients_yet_says_how_to_get_them(tiny_gpt2):
    report = gradient_report(tiny_gpt2)
    assert report.counts == {"ok": 0, "none": 16, "frozen": 0, "nonfinite": 0}
    assert [f.code for f in report.findings] == ["no-gradients"]
    assert "backward" in report.findings[0].message and "--backward" in report.findings[0].message


def test_sparse_gradients_are_measured():
    model = nn.Embedding(10, 3, sparse=True)
    model(torch.tensor([1, 1, 4])).sum().backward()
    assert model.weight.grad.is_sparse
    # rows 1 (twice: grad 2 each) and 4 (1 each): sqrt(3*4 + 3*1) = sqrt(15)
    report = gradient_report(model)
    norm = report.by_parameter["norm"].iloc[0]
    assert norm == pytest.approx(math.sqrt(15), rel=1e-6)
    assert norm == pytest.approx(float(model.weight.grad.to_dense().norm()), rel=1e-6)
    assert [f.code for f in report.findings] == ["sparse-gradient"]


def test_gradients_on_meta_are_refused():
    with torch.device("meta"):
        model = nn.Linear(2, 2)
    model.weight.grad = torch.empty(2, 2, device="meta")
    with pytest.raises(InspectorError, match="weight.*meta device"):
        gradient_norms(model)


def test_reading_gradients_changes_nothing():
    model = Hand()
    model.set_grads()
    grads = {n: (p.grad, p.grad.clone() if p.grad is not None else None)
             for n, p in model.named_parameters()}
    gradient_report(model)
    for n, p in model.named_parameters():
        same, copy = grads[n]
        assert p.grad is same
        if copy is not None:
            torch.testing.assert_close(p.grad, copy, rtol=0, atol=0, equal_nan=True)


@pytest.mark.cuda
def test_gradients_on_two_devices_are_measured_each_on_its_own():
    model = nn.Sequential(nn.Linear(2, 1, bias=False), nn.Linear(1, 1, bias=False).cuda())
    model[0].weight.grad = torch.tensor([[3.0, 4.0]])
    model[1].weight.grad = torch.tensor([[12.0]], device="cuda")
    report = gradient_report(model)
    assert report.by_parameter["device"].tolist() == ["cpu", "cuda:0"]
    assert report.total_norm == 13.0
    assert "several-devices" in [f.code for f in offset_findings(model)]



def test_gradient_report_and_findings_use_the_names_under_torch_compile():
    model = nn.Sequential(nn.Linear(2, 1, bias=False), nn.Linear(1, 1, bias=False))
    model[1].weight.requires_grad_(False)
    model[0].weight.grad = torch.tensor([[3.0, 4.0]])  # norm 5
    compiled = torch.compile(model)  # a wrapper whose own names start with _orig_mod.
    report = gradient_report(compiled)
    assert report.by_parameter["name"].tolist() == ["0.weight", "1.weight"]
    assert report.by_module["name"].tolist() == ["(model)", "0", "1"]
    assert report.total_norm == 5.0
    assert gradient_report(compiled, grads={"0.weight": torch.tensor([[6.0, 8.0]])}).total_norm == 10.0
    assert [f.code for f in offset_findings(compiled)] == []  # 1.weight is frozen but last: no shift
    model[0].weight.requires_grad_(False)
    model[1].weight.requires_grad_(True)
    assert [(f.code, f.where) for f in offset_findings(compiled)] == [("frozen-shift", "0.weight")]


def test_gradient_report_and_findings_refuse_what_is_not_a_model():
    with pytest.raises(InspectorError, match="gradient_report needs a torch nn.Module"):
        gradient_report({"weight": torch.zeros(1)})
    with pytest.raises(InspectorError, match="offset_findings needs a torch nn.Module"):
        offset_findings(None)
    with pytest.raises(InspectorError, match="flatten_roundtrip needs a torch nn.Module"):
        flatten_roundtrip([torch.zeros(1)])


# --------------------------------------------------------------------------- backward helper


def test_run_backward_sets_grads_and_restores_everything_else():
    loaded = load_model("sample:cnn-bn")
    model = loaded.model
    model.train()
    model.fc.eval()  # a mixed set of flags must come back as it was
    flags = {n: m.training for n, m in model.named_modules()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.conv1.bias.requires_grad_(False)
    stale = torch.ones_like(model.fc.weight)
    model.fc.weight.grad = stale
    result = run_backward(loaded, batch_size=2)
    assert {n: m.training for n, m in model.named_modules()} == flags
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n  # eval mode: BatchNorm statistics untouched
    assert not model.conv1.bias.requires_grad and model.conv1.bias.grad is None
    assert model.fc.weight.grad is not stale
    # 8 parameters, conv1.bias frozen: 7 get a gradient, the stale one was dropped first
    assert (result.with_gradient, result.without_gradient, result.frozen, result.replaced) == (7, 0, 1, 1)
    assert "backward pass" in result.message and "eval mode" in result.message
    assert gradient_report(model).counts == {"ok": 7, "none": 0, "frozen": 1, "nonfinite": 0}


def test_run_backward_refuses_meta_models():
    loaded = load_model("sample:llama-70b-meta", device="meta")
    with pytest.raises(InspectorError, match="meta device"):
        run_backward(loaded)


def test_run_backward_restores_flags_when_the_loss_fails():
    loaded = load_model("sample:tiny-gpt2")
    loaded.model.train()
    loaded.loss_fn = lambda outputs, inputs: outputs  # not a scalar
    with pytest.raises(InspectorError, match="not a scalar"):
        run_backward(loaded)
    assert all(m.training for m in loaded.model.modules())


# --------------------------------------------------------------------------- round trip


def test_round_trip_copies_and_restores_exactly(tiny_gpt2):
    before = [p.detach().clone() for p in tiny_gpt2.parameters()]
    rt = flatten_roundtrip(tiny_gpt2)
    assert (rt.parameters, rt.vector_numel, rt.vector_dtype) == (16, 4080, "float32")
    assert rt.shares_memory is False and rt.write_through is False
    assert rt.restored_exactly is True and rt.views_after is True and rt.original_untouched is True
    assert rt.error is None and rt.dtype_changed == ()
    assert all(torch.equal(p, b) for p, b in zip(tiny_gpt2.parameters(), before, strict=True))


def test_round_trip_shows_what_goes_wrong():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].half()
    rt = flatten_roundtrip(model)
    assert rt.dtype_changed == ("1.weight", "1.bias") and rt.vector_dtype == "float32"
    assert model[1].weight.dtype == torch.float16  # the model itself is untouched
    model[0].weight = nn.Parameter(torch.zeros(2, 2).t())
    rt = flatten_roundtrip(model)
    assert rt.error is not None and "view size" in rt.error and rt.restored_exactly is False
    with pytest.raises(InspectorError, match="meta device"):
        flatten_roundtrip(get_sample("llama-70b-meta").build())
    with pytest.raises(InspectorError, match="limit"):
        flatten_roundtrip(nn.Linear(10, 10), max_elements=50)


# --------------------------------------------------------------------------- figures


def test_strip_is_bounded_on_big_models_and_keeps_buffers_apart():
    from inspector.figures import offset_strip, strip_segments

    model = get_sample("llama-70b-meta").build()
    table = offset_map(model, include_buffers=True)
    segments = strip_segments(table, max_segments=300)
    # 723 parameters in runs of ceil(724 / 300) = 3 -> 241 marks, plus the one buffer on its own
    assert len(segments) == 242
    assert (segments[-1].state, segments[-1].tensors, segments[-1].start) == ("buffer", 1, 68_976_648_192)
    assert segments[-2].end == 68_976_648_192 and segments[0].start == 0
    fig = offset_strip(table, offset_map(model, trainable_only=True))
    assert sum(len(t.x) for t in fig.data) <= 600


def test_strip_colours_states_and_escapes_names():
    from inspector.figures import offset_strip, strip_segments

    model = Hand()
    model.add_module("<b>x", nn.Linear(1, 1, bias=False))
    model.set_grads()
    norms = gradient_norms(model)
    segments = strip_segments(offset_map(model), norms)
    # parameters() order: the model's own (unused, bad), then block.a, block.b, frozen, <b>x
    assert [s.state for s in segments] == ["none", "nonfinite", "ok", "ok", "frozen", "none"]
    assert segments[2].norm == 5.0
    assert "&lt;b&gt;x.weight" in segments[-1].hover and "<b>x.weight" not in segments[-1].hover
    fig = offset_strip(offset_map(model), offset_map(model, trainable_only=True), norms)
    assert {t.name for t in fig.data} == {
        "gradient norm",
        "log10 gradient norm",
        "frozen (requires_grad=False)",
        "trainable, no gradient",
        "NaN / Inf gradient",
    }
    # colours are given as colours (plotly.js warns on bars coloured by numbers); the scale rides on
    # an invisible marker that only draws the colour bar
    bars = next(t for t in fig.data if t.name == "gradient norm")
    assert all(isinstance(c, str) and c.startswith("rgb") for c in bars.marker.color)
    scale = next(t for t in fig.data if t.name == "log10 gradient norm")
    assert scale.marker.showscale and scale.opacity == 0


def test_layer_bars_top_k_and_rest():
    from inspector.figures import layer_norm_bars

    model = Hand()
    model.set_grads()
    model.bad.grad = torch.tensor([0.0, 0.0, 84.0])
    # own parameters: block holds a (5) and b (12) -> 13; the model itself holds unused (no
    # gradient) and bad (84) -> 84; frozen has no gradient and is left out
    modules = gradient_norms(model, by="module").set_index("name")
    assert modules.loc["(model)", "own_norm"] == 84.0 and modules.loc["(model)", "norm"] == 85.0
    bars = layer_norm_bars(modules.reset_index(), top_k=1).data[0]
    assert list(bars.y) == ["(model)", "rest (1 module)"]
    assert list(bars.x) == [84.0, 13.0]


# --------------------------------------------------------------------------- command line


def test_offsets_command(capsys, tmp_path):
    import json

    from inspector.__main__ import main

    out_json = tmp_path / "offsets.json"
    code = main(["offsets", "sample:frozen-adapter", "--trainable-only", "--locate", "100",
                 "--backward", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0
    assert "trainable-only vector: 6 tensors, 152 elements" in out
    assert "element 100 of the 152-element vector is layers.1.lora_B.weight[10, 0]" in out
    assert "Ran a backward pass" in out and "6 ok, 0 none, 6 frozen, 0 nonfinite" in out
    data = json.loads(out_json.read_text())
    assert [r["start"] for r in data["offsets"]] == [0, 16, 48, 80, 112, 144]
    assert {r["state"] for r in data["gradient_norms"]} == {"ok", "frozen"}
    assert main(["offsets", "sample:frozen-adapter", "--locate", "636"]) == 2
    assert "out of range" in capsys.readouterr().err
