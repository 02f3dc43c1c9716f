"""Device maps: planning, audit, accelerate side by side, dispatch, bad input.

Byte counts are float32 (4 bytes an element) unless said otherwise.
split-block (sample_models/small.py SplitBlockNet):
    embed  Linear(64, 64)  4160 elements = 16640 bytes
    block  fc1, fc2, fc3   16640 bytes each = 49920
           scale (buffer)  64 elements   =   256
           pos_table (buf) 16*64 = 1024  =  4096   -> block 54272
    head   Linear(64, 8)   520 elements  =  2080   -> model 72992
"""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch
from accelerate import infer_auto_device_map
from accelerate.utils import check_device_map
from torch import nn

from inspector import InspectorError, tensor_inventory
from inspector.placement import (
    PlacementPlan,
    PlanResult,
    accelerate_budget,
    audit,
    audit_device_map,
    compare_with_accelerate,
    dispatch_plan,
    load_device_map,
    parse_max_memory,
    placement_findings,
    placement_table,
    plan_device_map,
    plan_device_map_explained,
    validate_device_map,
)
from sample_models import get_sample

GiB = 2**30
SPLIT_BUDGET = "0=40000,1=40000,cpu=100000"


@pytest.fixture(autouse=True)
def _quiet_accelerate():
    # accelerate logs "Device 0 is not available" for GPUs this machine lacks; planning is arithmetic.
    logger = logging.getLogger("accelerate")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture
def split_block():
    return get_sample("split-block").build()


@pytest.fixture(scope="module")
def llama():
    return get_sample("llama-70b-meta").build()


def passes_check(model, device_map) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # tensor-name keys are not module names
        check_device_map(model, device_map)
    return True


# ----------------------------------------------------------------------------- budgets

def test_parse_max_memory():
    assert parse_max_memory("0=20GiB,1=20GiB,cpu=200GiB") == {0: 20 * GiB, 1: 20 * GiB, "cpu": 200 * GiB}
    # order: GPUs by index, then mps, cpu, disk; cuda:N is GPU N; GB is 10**9
    assert list(parse_max_memory("disk=1GB,cpu=2GB,cuda:1=3,mps=4,0=5")) == [0, 1, "mps", "cpu", "disk"]
    assert parse_max_memory({0: "1KB", "cpu": 7}) == {0: 1000, "cpu": 7}


@pytest.mark.parametrize("text, words", [
    ("gpu0=20GiB", "unknown device 'gpu0'"),
    ("tpu=1GiB", "unknown device 'tpu'"),
    ("cpu=lots", "cannot read 'lots'"),
    ("cpu=1GiB,cpu=2GiB", "appears twice"),
    ("", "budget is empty"),
    ("cpu", "has no '='"),
])
def test_parse_max_memory_rejects(text, words):
    with pytest.raises(InspectorError, match=words):
        parse_max_memory(text)


# ----------------------------------------------------------------------------- small exact plans

def test_the_explained_plan_is_a_placement_plan(split_block):
    plan = plan_device_map_explained(split_block, SPLIT_BUDGET)
    assert isinstance(plan, PlacementPlan) and PlanResult is PlacementPlan  # the earlier name still works
    assert plan.device_map == plan_device_map(split_block, SPLIT_BUDGET)
    assert plan.budget == parse_max_memory(SPLIT_BUDGET)


def test_inventory_sizes_by_prefix_and_dtype(split_block):
    inv = tensor_inventory(split_block).module_tables()
    assert (inv.sizes[""], inv.sizes["block"], inv.sizes["block.fc1"], inv.sizes["head"]) == \
        (72992, 54272, 16640, 2080)
    half = tensor_inventory(split_block).module_tables(
        torch.float16
    )  # every tensor is floating: exactly half
    assert half.sizes[""] == 36496


def test_sequential_plan_exact():
    # Linear(4, 4): 20 elements = 80 bytes; BatchNorm1d(4): weight+bias 32, running_mean 16,
    # running_var 16, num_batches_tracked (int64) 8 -> 72 bytes; model 80 + 72 + 80 = 232.
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4))
    # No offload device after the GPUs: nothing reserved. 0 takes 80 + 72 = 152 <= 160; "2" moves on.
    assert plan_device_map(m, {0: 160, 1: 100}) == {"0": 0, "1": 0, "2": 1}
    # With cpu after GPU 0 and the whole model fitting on it (232 <= 240), nothing is offloaded,
    # so nothing is reserved.
    assert plan_device_map(m, {0: 240, "cpu": 1000}) == {"": 0}
    # With 200, "2" would not fit (232 > 200), so GPU 0 keeps the largest layer still to place
    # free: placing "0" the largest left is "2" (80): 80 <= 200 - 80; placing "1", still 80:
    # 80 + 72 = 152 > 120, so "1" and "2" go to cpu, as accelerate decides.
    plan = plan_device_map_explained(m, {0: 200, "cpu": 1000})
    assert plan.device_map == {"0": 0, "1": "cpu", "2": "cpu"}
    assert plan.device_map == dict(infer_auto_device_map(m, max_memory={0: 200, "cpu": 1000}))
    assert [(r.step, r.subject, r.device, r.nbytes) for r in plan.records if r.step == "reserve"] == \
        [("reserve", "2", 0, 80)]
    usage = plan.usage.set_index("device")
    assert usage.loc[0, "parameter_bytes"] == 80 and usage.loc[0, "reserved_bytes"] == 80
    assert usage.loc["cpu", "total_bytes"] == 72 + 80


def test_everything_fits_one_device_gives_root_key():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    assert plan_device_map(m, "0=1000,cpu=1000") == {"": 0}


class BufferNeighbour(nn.Module):
    """a: Linear(4, 4) 80 bytes; pos: a module holding only a 16-float buffer (64 bytes); b: 80."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.pos = nn.Module()
        self.pos.register_buffer("table", torch.arange(16.0))
        self.b = nn.Linear(4, 4)


def test_buffer_only_module_goes_with_nearest_neighbour():
    # a -> 0 (80); b: 160 > 150 -> 1; pos waits, then joins its earlier neighbour a on 0 (144 <= 150).
    plan = plan_device_map_explained(BufferNeighbour(), {0: 150, 1: 1000})
    assert plan.device_map == {"a": 0, "pos": 0, "b": 1}
    rec = [r for r in plan.records if r.step == "buffer"]
    assert [(r.subject, r.device, r.nbytes) for r in rec] == [("pos", 0, 64)]
    assert "nearest placed neighbour a" in rec[0].reason


# ----------------------------------------------------------------------------- split block vs accelerate

OUR_SPLIT_MAP = {
    # The whole model fits on the two GPUs, so nothing is offloaded and nothing is reserved
    # (accelerate keeps one Linear, 16640, free on GPU 0 anyway and offloads fc3 and head).
    "embed": 0,             # 16640 of 40000; block (54272) does not fit -> split
    "block.scale": 1,       # block's primary device: 1 holds fc2 + fc3 = 33280 of its 49920
    "block.pos_table": 1,   # parameter bytes; 33280 + 2080 + 4352 buffer bytes = 39712 <= 40000
    "block.fc1": 0,         # 16640 + 16640 = 33280 <= 40000
    "block.fc2": 1,         # 49920 > 40000 on 0 -> 1
    "block.fc3": 1,         # 33280 <= 40000
    "head": 1,              # 33280 + 2080 = 35360 <= 40000
}
ACCELERATE_SPLIT_MAP = {"embed": 0, "block.fc1": 1, "block.fc2": 1, "block.fc3": "cpu", "head": "cpu"}


def test_split_block_plan_exact_and_accepted_by_accelerate(split_block):
    plan = plan_device_map_explained(split_block, SPLIT_BUDGET)
    assert plan.device_map == OUR_SPLIT_MAP
    assert passes_check(split_block, plan.device_map)
    assert plan.audit["finding"].isna().all()
    assert [f.code for f in plan.findings] == ["split-owner"]  # info: block uses its own tensors
    buffers = [(r.subject, r.device) for r in plan.records if r.step == "buffer"]
    assert buffers == [("block.scale", 1), ("block.pos_table", 1)]


def test_split_block_accelerate_map_misses_buffers_and_audit_names_them(split_block):
    theirs = infer_auto_device_map(split_block, max_memory=accelerate_budget(parse_max_memory(SPLIT_BUDGET)))
    assert dict(theirs) == ACCELERATE_SPLIT_MAP
    with pytest.raises(ValueError, match="block.scale, block.pos_table"):
        check_device_map(split_block, theirs)
    table = audit_device_map(split_block, theirs).set_index("name")
    for name in ("block.scale", "block.pos_table"):
        assert table.at[name, "device"] is None
        assert table.at[name, "finding"] == "buffer-unplaced"
        assert table.at[name, "module_primary_device"] == 1
        assert bool(table.at[name, "split"]) is True
    assert table["finding"].notna().sum() == 2
    codes = [(f.code, f.where) for f in audit(split_block, theirs).findings]
    assert codes == [("buffer-unplaced", "block.scale"), ("buffer-unplaced", "block.pos_table")]


def test_compare_with_accelerate_side_by_side(split_block):
    c = compare_with_accelerate(split_block, SPLIT_BUDGET)
    assert c.ours.device_map == OUR_SPLIT_MAP
    assert c.our_check is None
    assert "block.scale, block.pos_table" in c.accelerate_check
    rows = c.difference[["name", "ours", "accelerate", "accelerate_finding"]].values.tolist()
    assert rows[:2] == [
        ["block.scale", 1, None, "buffer-unplaced"],
        ["block.pos_table", 1, None, "buffer-unplaced"],
    ]
    # the rest: what accelerate offloads to the cpu (or moves to GPU 1) while room is left on the GPUs
    assert [(r[0], r[1], r[2]) for r in rows[2:]] == [
        ("block.fc1.weight", 0, 1), ("block.fc1.bias", 0, 1), ("block.fc3.weight", 1, "cpu"),
        ("block.fc3.bias", 1, "cpu"), ("head.weight", 1, "cpu"), ("head.bias", 1, "cpu")]


def test_buffers_placed_late_reserve_room_and_replan(split_block):
    # On 1 (35000): fc1 + fc2 = 33280, then block's buffers (4352) would make 37632: 2632 over.
    # Planning again with 2632 kept free on 1 leaves 32368 there: only fc1 fits; fc2, fc3 go to
    # cpu, which now holds most of block's parameter bytes, so the buffers follow to cpu.
    plan = plan_device_map_explained(split_block, "0=40000,1=35000,cpu=100000")
    assert plan.device_map == {"embed": 0, "block.scale": "cpu", "block.pos_table": "cpu", "block.fc1": 1,
                               "block.fc2": "cpu", "block.fc3": "cpu", "head": "cpu"}
    assert [(r.device, r.nbytes) for r in plan.records if r.step == "reserve" and not r.subject] == [
        (1, 2632)
    ]
    assert passes_check(split_block, plan.device_map)


# ----------------------------------------------------------------------------- ties

class TiedNet(nn.Module):
    """embed Embedding(16, 8): 128 elements = 512 bytes; body Linear(8, 8): 72 = 288;
    head.0 Linear(8, 8): 288; head.1 Linear(8, 16) whose weight IS embed.weight (counted once,
    under embed) plus a 16-float bias = 64 -> head 352; model 1152."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 16))
        self.head[1].weight = self.embed.weight


def test_tie_across_a_split_lands_on_one_device():
    # embed 512 + body 288 = 800 fill 0; head (352) is split: head.0 and head.1 go to 1, but
    # head.1.weight is embed.weight, so head.1 (a layer: its bias goes with its weight) moves to 0:
    # 864 > 800, so 0 keeps 64 bytes free and the plan runs again: embed (512) on 0, body (288)
    # no longer fits the 736 left, so body and head.0 go to 1 and head.1 follows its weight to 0.
    m = TiedNet()
    plan = plan_device_map_explained(m, {0: 800, 1: 1000})
    assert plan.device_map == {"embed": 0, "body": 1, "head.0": 1, "head.1": 0}
    assert [(r.step, r.subject, r.device) for r in plan.records if r.step in ("tie", "together")] == \
        [("tie", "head.1.weight", 0), ("together", "head.1.bias", 0)]
    assert plan.audit["finding"].isna().all()
    assert passes_check(m, plan.device_map)
    # A hand-made map that splits the tie is flagged.
    table = audit_device_map(m, {"embed": 0, "body": 0, "head": 1}).set_index("name")
    assert table.at["head.1.weight", "finding"] == "tie-split"
    assert table.at["head.1.weight", "alias_of"] == "embed.weight"


# ----------------------------------------------------------------------------- dispatch

def test_dispatch_cpu_and_disk_matches_undispatched(split_block):
    # Without a reserve the model (72992) does not fit 67000, so something goes to disk and the
    # cpu keeps the largest layer still to place free: placing fc2 that is fc3 (16640):
    # 49920 <= 67000 - 16640; placing fc3 it is head (2080): 66560 > 64920 -> disk, head -> disk.
    # block's primary is cpu (33280 of 49920), so its buffers stay on cpu: 49920 + 4352 <= 67000.
    dm = plan_device_map(split_block, "cpu=67000,disk=1GiB")
    assert dm == {"embed": "cpu", "block.scale": "cpu", "block.pos_table": "cpu", "block.fc1": "cpu",
                  "block.fc2": "cpu", "block.fc3": "disk", "head": "disk"}
    x = get_sample("split-block").example_inputs(2)
    with torch.no_grad():
        expected = split_block(x)
    before = {n: p for n, p in split_block.named_parameters()}
    with dispatch_plan(split_block, dm) as d:
        folder = d.offload_folder
        assert os.path.isfile(os.path.join(folder, "index.json"))
        with torch.no_grad():
            got = d.model(x)
        assert torch.equal(got, expected)
        actual = d.table.set_index("name")["device"]
        assert actual["block.fc3.weight"] == "disk" and actual["head.bias"] == "disk"
        assert actual["block.scale"] == "cpu" and actual["embed.weight"] == "cpu"
        assert d.findings == [] and d.in_place is False
    assert not os.path.exists(folder)
    # the model passed in is untouched: same objects, on cpu, no hooks
    assert all(before[n] is p and p.device.type == "cpu" for n, p in split_block.named_parameters())
    assert not hasattr(split_block.block.fc3, "_hf_hook")


# ----------------------------------------------------------------------------- placement of real tensors

def test_placement_table_meta_leftover(split_block):
    split_block.block.register_buffer("scale", torch.empty(64, device="meta"))
    table = placement_table(split_block).set_index("name")
    assert table.at["block.scale", "device"] == "meta"
    assert table.at["block.scale", "finding"] == "meta-leftover"
    assert table["finding"].notna().sum() == 1


def test_audit_stranded_buffer(split_block):
    # All of block's parameters (49920 bytes) are on 1, so 1 is its primary device; scale on cpu
    # is stranded there, pos_table on 1 is not.
    dm = {"embed": 0, "block.scale": "cpu", "block.pos_table": 1, "block.fc1": 1, "block.fc2": 1,
          "block.fc3": 1, "head": 1}
    table = audit_device_map(split_block, dm).set_index("name")
    assert table.at["block.scale", "finding"] == "buffer-stranded"
    assert table.at["block.pos_table", "finding"] is None


def test_all_meta_model_is_structure_only():
    m = get_sample("split-block").build().to("meta")
    assert placement_table(m)["finding"].isna().all()
    assert [f.code for f in placement_findings(m)] == ["meta-model"]


# ----------------------------------------------------------------------------- bad input

def test_budget_too_small_with_nowhere_to_offload(split_block):
    # cpu only: embed 16640, fc1 33280, fc2 49920, fc3 would need 66560 > 50000 and there is no disk.
    with pytest.raises(ValueError, match=r"needs 71.3 KiB and the budget gives 48.8 KiB"):
        plan_device_map(split_block, "cpu=50000")


def test_unknown_device_names(split_block):
    with pytest.raises(InspectorError, match="unknown device 'npu'"):
        plan_device_map(split_block, "npu=1GiB")
    with pytest.raises(InspectorError, match="device map key 'head'"):
        audit_device_map(split_block, {"": "cpu", "head": "tpu:0"})


def test_unknown_and_overlapping_keys(split_block):
    dm = {"embed": 0, "block": 0, "head": 0, "blok.fc9": 1, "block.fc1": 0}
    found = {(f.code, f.where) for f in audit(split_block, dm).findings}
    assert found == {("unknown-key", "blok.fc9"), ("overlapping-key", "block.fc1")}
    with pytest.raises(InspectorError, match="'blok.fc9' names no module"):
        validate_device_map(split_block, dm)
    with pytest.raises(InspectorError, match="'block' and 'block.fc1' overlap"):
        dispatch_plan(split_block, {"embed": "cpu", "block": "cpu", "block.fc1": "cpu", "head": "cpu"})
    with pytest.raises(InspectorError, match="gives no device to 2 tensors"):
        validate_device_map(split_block, {"embed": 0, "block.fc1": 0, "block.fc2": 0, "block.fc3": 0,
                                          "head": 0})


@pytest.mark.parametrize("text, words", [
    ('{"embed": 0, ', "not valid JSON"),
    ("{'embed': 0}", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"embed": "gpu"}', "unknown device 'gpu'"),
])
def test_json_map_that_does_not_parse(text, words):
    with pytest.raises(InspectorError, match=words):
        load_device_map(text)


def test_json_map_round_trip(split_block):
    assert load_device_map('{"embed": "cuda:0", "block": 1, "head": "cpu"}') == \
        {"embed": 0, "block": 1, "head": "cpu"}


# ----------------------------------------------------------------------------- llama-70b-meta

def test_llama_70b_four_gpus_and_cpu(llama):
    # One DecoderLayer: attention 2*8192*8192 + 2*8192*1024 = 150994944 elements, MLP 3*8192*28672
    # = 704643072, two RMSNorms 16384 -> 855654400 elements = 3422617600 bytes (no-split class).
    # embed_tokens and lm_head: 32000*8192*4 = 1048576000 bytes each; rotary inv_freq 64*4 = 256.
    # GPU 0: 20 GiB = 21474836480 - 3422617600 kept free = 18052218880; embed leaves 17003642880
    #   -> 4 layers (13690470400). GPUs 1-3: 21474836480 / 3422617600 = 6.27 -> 6 layers each.
    # cpu: the other 58 layers + norm + lm_head = 199560429568 <= 200 GiB.
    budget = "0=20GiB,1=20GiB,2=20GiB,3=20GiB,cpu=200GiB"
    plan = plan_device_map_explained(llama, budget)
    expected = {"embed_tokens": 0, "rotary_emb": 0}
    for i in range(80):
        expected[f"layers.{i}"] = 0 if i < 4 else 1 if i < 10 else 2 if i < 16 else 3 if i < 22 else "cpu"
    expected.update({"norm": "cpu", "lm_head": "cpu"})
    assert plan.device_map == expected
    usage = plan.usage.set_index("device")["total_bytes"].to_dict()
    assert usage == {0: 14739046656, 1: 20535705600, 2: 20535705600, 3: 20535705600, "cpu": 199560429568}
    assert plan.audit["finding"].isna().all()
    assert passes_check(llama, plan.device_map)
    theirs = infer_auto_device_map(llama, max_memory=accelerate_budget(parse_max_memory(budget)),
                                   no_split_module_classes=["DecoderLayer"])
    assert dict(theirs) == expected  # accelerate 1.15 agrees when nothing is split with buffers


# ----------------------------------------------------------------------------- command line

def test_cli_devicemap_compare_and_json(tmp_path, capsys):
    from inspector.__main__ import main

    out = tmp_path / "plan.json"
    assert main(["devicemap", "sample:split-block", "--max-memory", SPLIT_BUDGET, "--compare-accelerate",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "block.scale: 1" in text and "buffer-unplaced [block.pos_table]" in text
    import json

    data = json.loads(out.read_text())
    assert data["device_map"] == OUR_SPLIT_MAP
    assert data["accelerate"]["device_map"] == {"embed": 0, "block.fc1": 1, "block.fc2": 1,
                                                "block.fc3": "cpu", "head": "cpu"}
    bad = tmp_path / "bad.json"
    bad.write_text('{"embed": 0,')
    assert main(["devicemap", "sample:split-block", "--audit", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


@pytest.mark.cuda
def test_dispatch_split_block_gpu_and_cpu(split_block):
    # GPU 0 keeps 16640 free: 80000 - 16640 = 63360. embed 16640, fc1 33280, fc2 49920; fc3 would
    # be 66560 -> cpu, head -> cpu. block's primary is 0 (33280 of 49920), so its buffers go to 0:
    # 49920 + 4352 = 54272 <= 63360.
    dm = plan_device_map(split_block, {0: 80000, "cpu": 10**9})
    assert dm == {"embed": 0, "block.scale": 0, "block.pos_table": 0, "block.fc1": 0, "block.fc2": 0,
                  "block.fc3": "cpu", "head": "cpu"}
    x = get_sample("split-block").example_inputs(2)
    with torch.no_grad():
        expected = split_block(x)
    with dispatch_plan(split_block, dm) as d, torch.no_grad():
        got = d.model(x.to("cuda:0"))
        actual = d.table.set_index("name")["device"]
        assert actual["block.scale"] == 0 and actual["block.pos_table"] == 0
        assert actual["block.fc3.weight"] == "cpu"
        assert d.findings == []
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- figures

def test_treemap_buffers_findings_and_aggregation(split_block, llama):
    from inspector.figures import placement_treemap, usage_bars

    RED = "#D62728"  # the edge of a tensor the map leaves unplaced
    theirs = {"embed": 0, "block.fc1": 1, "block.fc2": 1, "block.fc3": "cpu", "head": "cpu"}
    tree = placement_treemap(audit_device_map(split_block, theirs)).data[0]
    ids = list(tree.ids)
    # 12 tensors + 7 modules (model, embed, block, fc1-3, head): every tensor its own box
    assert len(ids) == 19
    at = {i: k for k, i in enumerate(ids)}
    assert tree.marker.pattern.shape[at["block.scale"]] == "x"          # buffers hatched
    assert tree.marker.pattern.shape[at["block.fc1.weight"]] == ""
    assert tree.marker.line.color[at["block.pos_table"]] == RED         # unplaced: red edge
    assert tree.marker.line.color[at["block.fc1.weight"]] != RED
    # llama-70b-meta: 80 layers aggregated to one parameters box each, never thousands of marks
    big = placement_treemap(
        plan_device_map_explained(llama, "0=20GiB,1=20GiB,2=20GiB,3=20GiB,cpu=200GiB").audit
    )
    assert len(big.data[0].ids) <= 400
    assert "layers.7 [parameters]" in big.data[0].ids and "rotary_emb.inv_freq" in big.data[0].ids
    bars = usage_bars(plan_device_map_explained(split_block, SPLIT_BUDGET).usage)
    # one bar per device and kind, in the device's own colour (the same as in the treemap)
    per_kind = {}
    for t in bars.data:
        if t.type == "bar" and t.showlegend is False:
            per_kind.setdefault(t.name, {})[t.x[0]] = (t.y[0], t.marker.color)
    assert list(per_kind["parameters"]) == ["0", "1", "cpu"]
    assert [v for v, _ in per_kind["buffers"].values()] == [0, 4352, 0]
    assert per_kind["buffers"]["1"][1] == tree.marker.colors[at["block.fc1.weight"]]  # GPU 1 in both


def test_buffers_of_a_block_mostly_on_disk(split_block):
    # cpu keeps 16640 free: 60000 - 16640 = 43360. embed 16640, fc1 33280; fc2 would be 49920 ->
    # disk, fc3 and head -> disk. block's primary is disk (33280 of 49920), so its buffers map to
    # disk. dispatch_model offloads whole modules only: they stay in memory on the cpu, where the
    # disk layers run, and the audit of the dispatched copy accepts that.
    dm = plan_device_map(split_block, "cpu=60000,disk=1GiB")
    assert dm == {"embed": "cpu", "block.scale": "disk", "block.pos_table": "disk", "block.fc1": "cpu",
                  "block.fc2": "disk", "block.fc3": "disk", "head": "disk"}
    assert audit_device_map(split_block, dm)["finding"].isna().all()
    # a map-level audit still calls a buffer on cpu stranded next to a module mostly on disk
    table = audit_device_map(split_block, {**dm, "block.scale": "cpu"}).set_index("name")
    assert table.at["block.scale", "finding"] == "buffer-stranded"
    x = get_sample("split-block").example_inputs(2)
    with dispatch_plan(split_block, dm) as d, torch.no_grad():
        assert torch.equal(d.model(x), split_block(x))
        actual = d.table.set_index("name")
        assert (
            actual.at["block.scale", "device"] == "cpu" and actual.at["block.fc2.weight", "device"] == "disk"
        )
        assert d.findings == []


def test_dispatch_whole_model_to_disk():
    # accelerate finds no tensors under the root key "", so the root is named by its parts
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()
    assert plan_device_map(m, "cpu=100,disk=1GiB") == {"": "disk"}  # 232 bytes; cpu keeps 80 free
    x = torch.randn(3, 4)
    with dispatch_plan(m, {"": "disk"}) as d, torch.no_grad():
        assert torch.equal(d.model(x), m(x))
        assert set(d.table.loc[d.table["kind"] == "parameter", "device"]) == {"disk"}


def test_dispatch_in_place_says_so_and_changes_the_model():
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with dispatch_plan(m, {"0": "cpu", "1": "disk"}, in_place=True) as d:
        assert d.model is m and d.in_place is True
        assert m[1].weight.device.type == "meta" and hasattr(m[1], "_hf_hook")  # offloaded in place
        assert d.table.set_index("name").at["1.weight", "device"] == "disk"


def test_usage_charts_leave_room_for_their_axis_titles():
    import pandas as pd

    from inspector.figures import usage_bars, usage_side_by_side

    u = pd.DataFrame({"device": [0, "cpu"], "parameter_bytes": [10 * 2**30, 5], "buffer_bytes": [2, 0],
                      "total_bytes": [10 * 2**30 + 2, 5], "budget_bytes": [20 * 2**30, 50],
                      "reserved_bytes": [4, 0]})
    for fig in (usage_bars(u, "plan"), usage_side_by_side(u, u)):
        # "bytes" beside "10.0 GiB" ticks, and the device title (or the plan row) below the device row:
        # 5 px of margin put the title's first letters outside the chart at 1400 px
        assert fig.layout.margin.l >= 60 and fig.layout.margin.b >= 60
        assert fig.layout.yaxis.title.text == "bytes" and fig.layout.yaxis.automargin
