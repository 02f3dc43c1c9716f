"""Hostile torch.distributed.checkpoint folders: a one-process save, then its index or pieces edited."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from inspector.__main__ import main
from inspector.distributed.checkpoint import read_dcp, read_metadata
from inspector.findings import InspectorError


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
