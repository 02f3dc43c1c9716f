"""Hostile torch.distributed.checkpoint folders: a one-process save, then its index or pieces edited."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from inspector import InspectorError
from inspector.__main__ import main
from inspector.distributed import read_dcp, read_metadata


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 4x2 weight (values 0..7) and a length-3 bias saved by ``dcp.save`` in this process."""
    folder = tmp_path_factory.mktemp("dcp") / "ok"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.arange(8.0).reshape(4, 2), "b": torch.ones(3)}, checkpoint_id=str(folder))
    return folder


def _copy(saved, tmp_path, name="bad"):
    folder = tmp_path / name
    shutil.copytree(saved, folder)
    return folder


def _short(s: bytes) -> bytes:
    return b"\x8c" + bytes([len(s)]) + s  # SHORT_BINUNICODE


def _global_call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle calling ``module``'s attribute ``name`` (dotted names allowed) with ``arg``."""
    return (b"\x80\x04" + _short(module.encode()) + _short(name.encode()) + b"\x93"
            + _short(arg.encode()) + b"\x85R.")


@pytest.mark.parametrize("module", ["torch.distributed.checkpoint.filesystem",
                                    "torch.distributed.checkpoint.metadata",
                                    "torch.distributed.checkpoint._extension", "torch", "pathlib"])
def test_dotted_name_reaching_os_system_never_runs(saved, tmp_path, module):
    folder = _copy(saved, tmp_path)
    marker = tmp_path / "MARKER"
    (folder / ".metadata").write_bytes(_global_call(module, "os.system", f"touch {marker}"))
    with pytest.raises(InspectorError, match=r"bad/.metadata was refused: it asks to run .*os\.system"):
        read_metadata(folder)
    assert main(["checkpoint", str(folder)]) == 2
    assert not marker.exists()


@pytest.mark.parametrize("module, name", [("torch.distributed.checkpoint.filesystem", "FileSystemReader"),
                                          ("torch.distributed.checkpoint.filesystem", "os"),
                                          ("torch.distributed.checkpoint._extension", "ZStandard"),
                                          ("torch.distributed.checkpoint.metadata", "dataclass")])
def test_other_names_in_the_checkpoint_modules_are_refused(saved, tmp_path, module, name):
    folder = _copy(saved, tmp_path)
    (folder / ".metadata").write_bytes(_global_call(module, name, "x"))
    with pytest.raises(InspectorError, match=f"refused: it asks to run {module}.{name}"):
        read_metadata(folder)


def test_a_real_index_still_loads(saved):
    state, findings = read_dcp(saved)
    torch.testing.assert_close(state["w"], torch.arange(8.0).reshape(4, 2))
    torch.testing.assert_close(state["b"], torch.ones(3))
    assert "2 tensors put together from 2 pieces in 1 files" in findings[0].message


def _edit(saved, tmp_path, change) -> object:
    """A copy of ``saved`` whose index was rewritten by ``change(metadata)``."""
    folder = _copy(saved, tmp_path)
    metadata = read_metadata(folder)
    change(metadata)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return folder


def _entry(metadata, name="w"):
    return metadata.state_dict_metadata[name]


def _index(metadata, name="w"):
    return next(k for k in metadata.storage_data if k.fqn == name)


def _huge(metadata):
    _entry(metadata).size = torch.Size([1 << 40, 1 << 20])
    _entry(metadata).chunks[0].sizes = torch.Size([1 << 40, 1 << 20])


def _past_the_end(metadata):
    index = _index(metadata)
    metadata.storage_data[dataclasses.replace(index, offset=torch.Size([3, 0]))] = metadata.storage_data.pop(
        index
    )
    _entry(metadata).chunks[0].offsets = torch.Size([3, 0])


def _overlap(metadata):
    # w claims 8 rows; its one stored 4x2 piece is listed at rows 0-3 and again at rows 2-5:
    # 16 elements "filled"
    _entry(metadata).size = torch.Size([8, 2])
    index = _index(metadata)
    metadata.storage_data[dataclasses.replace(index, offset=torch.Size([2, 0]))] = metadata.storage_data[
        index
    ]
    _entry(metadata).chunks.append(type(_entry(metadata).chunks[0])(torch.Size([2, 0]), torch.Size([4, 2])))


def _dtype(metadata):
    _entry(metadata).properties.dtype = torch.float64


def _length(metadata):
    metadata.storage_data[_index(metadata)].length = 1 << 40


def _offset_rank(metadata):
    _entry(metadata).chunks[0].offsets = torch.Size([0])
    index = _index(metadata)
    metadata.storage_data[dataclasses.replace(index, offset=torch.Size([0]))] = metadata.storage_data.pop(
        index
    )


@pytest.mark.parametrize("change, message", [
    (_huge, r"tensor w claims shape \(1099511627776, 1048576\) .* but its pieces hold only \d+ bytes"),
    (_past_the_end, r"piece of w at offset \(3, 0\) in __0_0.distcp with shape \(4, 2\) reaches past the "
                    r"tensor's shape \(4, 2\)"),
    (_overlap, r"piece of w at offset \(2, 0\) in __0_0.distcp overlaps another piece"),
    (_dtype, r"piece of w .* is torch.float32, but the index says torch.float64"),
    (_length, r"needs bytes \d+..\d+ of __0_0.distcp, which is shorter"),
    (_offset_rank, r"a piece of tensor w has offsets \(0,\) for a tensor of shape \(4, 2\)"),
])
def test_pieces_that_do_not_fit_their_tensor_are_named(saved, tmp_path, change, message):
    folder = _edit(saved, tmp_path, change)
    with pytest.raises(InspectorError, match=message):
        read_dcp(folder)
    assert main(["checkpoint", str(folder)]) in (0, 2)  # listing reads no piece; it never raises


def test_an_index_that_is_not_metadata_is_refused(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    (folder / ".metadata").write_bytes(pickle.dumps({1, 2}))
    with pytest.raises(InspectorError, match=r"bad/.metadata is not a checkpoint index \(it holds a set\)"):
        read_dcp(folder)
