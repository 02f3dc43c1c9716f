"""The tensor inventory: one walk with every name, owner and storage, on tiny hand-built models."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from inspector import InspectorError
from inspector.inventory import storage_key, tensor_inventory


def tied_model() -> nn.Sequential:
    # 0.weight (3x4 = 12), 0.bias (3), 1.weight = 0.weight, 1.bias (3): 18 unique, 30 with the alias.
    m = nn.Sequential(nn.Linear(4, 3), nn.Linear(4, 3))
    m[1].weight = m[0].weight
    m.register_buffer("w_row", m[0].weight.detach()[1])  # row 1 of 0.weight: 4 elements at offset 4
    m[0].register_buffer("scale", torch.ones(2))
    return m


def test_entries_follow_the_walk_with_owners_and_first_names():
    m = tied_model()
    inv = tensor_inventory(m)
    # parameters first (named_parameters order), then buffers: the root's w_row before 0.scale
    assert [(e.name, e.kind, e.module, e.attr, e.first_name, e.obj) for e in inv] == [
        ("0.weight", "parameter", "0", "weight", "0.weight", 0),
        ("0.bias", "parameter", "0", "bias", "0.bias", 1),
        ("1.weight", "parameter", "1", "weight", "0.weight", 0),
        ("1.bias", "parameter", "1", "bias", "1.bias", 2),
        ("w_row", "buffer", "", "w_row", "w_row", 3),
        ("0.scale", "buffer", "0", "scale", "0.scale", 4),
    ]
    assert [e.is_alias for e in inv] == [False, False, True, False, False, False]
    assert inv.unique == (0, 1, 3, 4, 5)
    assert inv.by_object[id(m[0].weight)] == (0, 2)
    assert inv.aliased == {0: (0, 2)}  # only object 0 (0.weight) has two names
    assert [inv.entries_of(o) for o in range(5)] == [(0, 2), (1,), (3,), (4,), (5,)]
    assert inv.entries[2].tensor is m[0].weight is m[1].weight
    assert inv.names_of(m[0].weight) == ["0.weight", "1.weight"]
    assert inv.names_of(torch.zeros(1)) == []
    # the names named_parameters() keeps are the first names
    assert [e.name for e in inv.unique_entries("parameter")] == [n for n, _ in m.named_parameters()]


def test_sizes_offsets_and_metadata():
    inv = tensor_inventory(tied_model())
    rows = [(e.numel, e.nbytes, e.shape, e.storage_offset, e.dtype_name, str(e.device), e.requires_grad)
            for e in inv]
    assert rows == [
        (12, 48, (3, 4), 0, "float32", "cpu", True),
        (3, 12, (3,), 0, "float32", "cpu", True),
        (12, 48, (3, 4), 0, "float32", "cpu", True),
        (3, 12, (3,), 0, "float32", "cpu", True),
        (4, 16, (4,), 4, "float32", "cpu", False),  # a row of 0.weight starts at element 4
        (2, 8, (2,), 0, "float32", "cpu", False),
    ]
    # plain tensors: local equals global, no placements
    assert [(e.local_shape, e.local_nbytes, e.placements, e.mesh, e.is_dtensor) for e in inv][4] == (
        (4,), 16, "", (), False)
    assert inv.unique_numel() == 18 and inv.numel_with_aliases() == 30
    assert inv.unique_numel("buffer") == 6 and inv.numel_with_aliases("buffer") == 6
    # 18 parameter + 6 buffer elements, 4 bytes each
    assert inv.unique_bytes() == 96


def test_grouped_by_storage():
    m = tied_model()
    inv = tensor_inventory(m)
    weight = storage_key(m[0].weight)
    assert inv.entries[0].storage_key == inv.entries[4].storage_key == weight
    # 0.weight (object 0) and w_row (object 3) share one storage; every other object has its own
    assert inv.by_storage[weight] == (0, 3)
    assert sorted(len(v) for v in inv.by_storage.values()) == [1, 1, 1, 2]
    assert [[e.name for e in g] for g in inv.storage_groups()] == [["0.weight", "w_row"]]


def test_module_bytes_are_prefix_sums_counting_each_object_at_its_first_name():
    inv = tensor_inventory(tied_model())
    # "0": weight 48 + bias 12 + scale 8 = 68; "1": bias 12 (its weight is counted under "0");
    # root: 68 + 12 + w_row 16 = 96
    assert inv.module_bytes() == {"": 96, "0": 68, "1": 12}
    deep = nn.Sequential(nn.Sequential(nn.Linear(2, 2, bias=False)), nn.Linear(1, 1))
    # 0.0.weight 4 floats = 16 bytes; 1.weight 4 + 1.bias 4 = 8 bytes
    assert tensor_inventory(deep).module_bytes() == {"": 24, "0": 16, "0.0": 16, "1": 8}


def test_without_buffers():
    inv = tensor_inventory(tied_model(), include_buffers=False)
    assert [e.name for e in inv] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert not inv.buffers() and len(inv.parameters()) == 4 and not inv.include_buffers


def test_one_walk_lists_what_the_public_methods_list():
    shared = nn.Linear(2, 2)
    m = nn.Sequential(shared, nn.Sequential(shared, nn.BatchNorm1d(2)))
    m[1][1].register_parameter("extra", None)
    walk = [(e.name, id(e.tensor)) for e in tensor_inventory(m)]
    public = [(n, id(t)) for n, t in m.named_parameters(remove_duplicate=False)]
    public += [(n, id(t)) for n, t in m.named_buffers(remove_duplicate=False)]
    assert walk == public
    # the shared Linear's weight and bias under 0 and 1.0 (4 names); BatchNorm1d: weight, bias and
    # 3 buffers (running_mean, running_var, num_batches_tracked); the None "extra" is skipped
    assert len(walk) == 4 + 2 + 3


class Renamed(nn.Module):
    """Overrides named_parameters: the walk must ask the method, not the modules' dictionaries."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 1)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from super().named_parameters(prefix, recurse, remove_duplicate)
        yield "inner.weight_again", self.inner.weight


def test_overridden_named_parameters_are_followed():
    m = Renamed()
    inv = tensor_inventory(m)
    assert [(e.name, e.module, e.attr, e.first_name) for e in inv] == [
        ("inner.weight", "inner", "weight", "inner.weight"),
        ("inner.bias", "inner", "bias", "inner.bias"),
        ("inner.weight_again", "inner", "weight_again", "inner.weight"),
    ]


def test_lookups_by_name():
    m = tied_model()
    inv = tensor_inventory(m)
    assert inv.by_name["1.weight"].first_name == "0.weight"
    tensors = inv.tensors()
    assert list(tensors) == ["0.weight", "0.bias", "1.weight", "1.bias", "w_row", "0.scale"]
    assert tensors["w_row"] is m.w_row
    assert not inv.has_meta()


def test_meta_model_has_no_storage_keys():
    with torch.device("meta"):
        m = tied_model()
    inv = tensor_inventory(m)
    assert inv.has_meta()
    assert [e.storage_key for e in inv] == [None] * 6 and inv.by_storage == {}
    assert inv.unique_numel() == 18 and inv.entries[4].storage_offset == 4


def test_storage_key():
    w = torch.zeros(2, 3)
    key = storage_key(w)
    assert key is not None and key[:2] == ("cpu", None)
    assert storage_key(w[1]) == storage_key(w.view(3, 2)) == storage_key(w.t()) == key
    assert storage_key(w.clone()) != key
    assert storage_key(torch.zeros(2, device="meta")) is None
    assert storage_key(torch.zeros(0)) is None  # no elements, no memory
    assert storage_key(w[2:]) is None  # no elements, even as a view of w's storage
    assert storage_key(w.to_sparse()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.quint8)
    assert storage_key(q) is None


def test_storage_key_of_a_fake_tensor_is_none_without_a_warning():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        f = torch.zeros(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading a fake tensor's data pointer warns
        assert storage_key(f) is None


def test_not_a_module_is_refused():
    with pytest.raises(InspectorError, match="tensor_inventory"):
        tensor_inventory(torch.zeros(2))


def test_dtensor_entries_have_global_and_local_sizes(world1):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (1,))
    # this rank holds 2 rows of a global 4x3 tensor (as if the mesh had 2 ranks)
    local = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    d = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size((4, 3)),
                           stride=(3, 1))
    m = nn.Module()
    m.w = nn.Parameter(d)
    m.b = nn.Parameter(torch.zeros(3))
    inv = tensor_inventory(m)
    w = inv.by_name["w"]
    # global 4x3 = 12 floats = 48 bytes; local 2x3 = 6 floats = 24 bytes
    assert (w.shape, w.numel, w.nbytes, w.local_shape, w.local_nbytes) == ((4, 3), 12, 48, (2, 3), 24)
    assert (w.is_dtensor, w.placements, w.mesh, w.storage_key, w.storage_offset) == (
        True, "Shard(0)", (1,), None, 0)
    assert inv.module_bytes() == {"": 60} and inv.module_bytes(local=True) == {"": 36}


def test_storage_keys_are_read_on_first_ask_then_kept():
    m = tied_model()
    inv = tensor_inventory(m)
    before = storage_key(m[0].weight)
    with torch.no_grad():
        m[0].weight.data = torch.zeros(3, 4)  # same Parameter object, a new storage
    # first ask after the change: the keys describe the storage as it is now, for every reader
    now = storage_key(m[0].weight)
    assert now != before
    assert inv.entries[0].storage_key == inv.entries[2].storage_key == now
    assert inv.by_storage[now] == (0,)  # w_row still views the old storage: no longer grouped
    assert inv.storage_groups() == []
    m[0].weight.data = torch.zeros(3, 4)
    # asked once: kept for the inventory's life, and the same for entries and groups
    assert inv.entries[0].storage_key == now and inv.by_storage[now] == (0,)
    assert tensor_inventory(m).entries[0].storage_key == storage_key(m[0].weight) != now


def test_named_unique_is_what_named_parameters_and_named_buffers_yield():
    m = tied_model()
    m.register_buffer("again", m[0].scale)  # one buffer under two names
    inv = tensor_inventory(m)
    params, shared = inv.named_unique()
    assert [(n, id(t)) for n, t in params] == [(n, id(t)) for n, t in m.named_parameters()]
    assert shared == {id(m[0].weight): ["0.weight", "1.weight"]}
    buffers, shared_buffers = inv.named_unique("buffer")
    assert [(n, id(t)) for n, t in buffers] == [(n, id(t)) for n, t in m.named_buffers()]
    # root's buffers come first (named_buffers order): "again" is the first name of 0.scale's object
    assert shared_buffers == {id(m[0].scale): ["again", "0.scale"]}
    assert tensor_inventory(nn.Linear(2, 2)).named_unique()[1] == {}


def test_own_entries_and_module_objects():
    m = tied_model()
    inv = tensor_inventory(m)
    assert [(n, id(o)) for n, o in zip(inv.modules, inv.module_objects, strict=True)] == [
        (n, id(o)) for n, o in m.named_modules(remove_duplicate=False)]
    # each module's own tensors: its parameters, then its buffers
    assert {k: [e.name for e in v] for k, v in inv.own_entries.items()} == {
        "": ["w_row"], "0": ["0.weight", "0.bias", "0.scale"], "1": ["1.weight", "1.bias"]}


def test_own_entries_without_the_stack_walk():
    class Renamed(nn.Sequential):  # overrides named_modules: the inventory asks the methods
        def named_modules(self, *args, **kwargs):
            return super().named_modules(*args, **kwargs)

    m = Renamed(nn.Linear(2, 2), nn.BatchNorm1d(2))
    inv = tensor_inventory(m)
    assert {k: [e.attr for e in v] for k, v in inv.own_entries.items()} == {
        "0": ["weight", "bias"],
        "1": ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"],
    }
    assert inv.modules == ("", "0", "1") and inv.module_objects[2] is m[1]
