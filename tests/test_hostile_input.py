"""Bad and hostile input, table-driven: every case ends in exit status 2 (CLI) or InspectorError
(library) with a message that names the fix, no traceback, and nothing changed.

The CLI runs in-process through ``inspector.__main__.main(argv)``. Each case also checks
that the files under the case folder (and the working directory) are the same afterwards,
and the library cases that get a model check it is unchanged: every tensor's identity,
values, dtype, device and ``requires_grad``, the training flags and the hooks.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from inspector import InspectorError
from inspector.__main__ import main
from tests.hostile_loading import write_loading_files

MARKER = "code-ran.txt"


class _RunsCode:
    """Pickled as a call to os.system: loading it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


MODEL_FILE = '''
import sys
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, fail=False):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.fail = fail

    def forward(self, x):
        if self.fail:
            raise RuntimeError("boom in forward")
        return self.fc(x)


def good():
    return Net()


def bad_forward():
    return Net(fail=True)


def exits():
    sys.exit(3)


def raises():
    raise ValueError("factory is broken")


def not_a_module():
    return 42


def example_inputs(batch_size):
    return torch.ones(batch_size, 3)


def loss(outputs, inputs):
    return outputs.pow(2).mean()
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Every bad file the cases use, written once per module."""
    root = tmp_path_factory.mktemp("hostile")
    marker = root / MARKER
    models = root / "models"
    models.mkdir()
    (models / "nets.py").write_text(MODEL_FILE)
    (models / "exits_on_import.py").write_text("import sys\nsys.exit(1)\n")
    (models / "broken_import.py").write_text("import not_a_module_anywhere\n")
    outside = root / "outside"
    outside.mkdir()
    (outside / "nets.py").write_text(MODEL_FILE)
    (root / "notes.txt").write_text("these are notes, not tensors\n")
    (root / "garbage.safetensors").write_bytes(b"\x00\x01 not safetensors")
    (root / "garbage.pt").write_bytes(os.urandom(64))
    for name, header in (("huge-shape", '{"w": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}}'),
                         ("huge-offset", '{"w": {"dtype": "F32", "shape": [1], "data_offsets": [1e400, 4]}}'),
                         ("nested-header", '{"w": ' + "[" * 100_000 + "]" * 100_000 + "}")):
        (root / f"{name}.safetensors").write_bytes(
            struct.pack("<Q", len(header)) + header.encode() + bytes(4)
        )
    torch.save({"w": _RunsCode(marker)}, root / "evil_zip.pt")
    torch.save({"w": _RunsCode(marker)}, root / "evil_legacy.pt", _use_new_zipfile_serialization=False)
    for proto in (0, 2, 5):
        with open(root / f"evil_p{proto}.pt", "wb") as fh:
            pickle.dump({"w": _RunsCode(marker)}, fh, protocol=proto)
    save_file({"fc.weight": torch.zeros(5, 5)}, str(root / "wrong_shape.safetensors"))
    hf = root / "remote_code"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "custom-net", "architectures": ["CustomNet"],
        "auto_map": {"AutoConfig": "configuration_custom.CustomConfig",
                     "AutoModel": "modeling_custom.CustomNet"}}))
    code = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    (hf / "configuration_custom.py").write_text(code)
    (hf / "modeling_custom.py").write_text(code)
    (root / "no_config").mkdir()
    bad_json = root / "bad_json"
    bad_json.mkdir()
    (bad_json / "config.json").write_text("{not json")
    (root / "map.json").write_text("this is not JSON")
    (root / "outdir").mkdir()
    write_loading_files(root)
    os.mkfifo(root / "pipe")  # a named pipe: opening it to write would wait for a reader forever
    return {"root": root, "marker": marker, "models": models, "outside": outside, "hf": hf}


@pytest.fixture(autouse=True)
def _model_dirs(files, monkeypatch):
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(files["models"]))


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


# (id, argv with {root}/{models}/{outside}/{hf} placeholders, what the message must say)
CLI_CASES: list[tuple[str, list[str], str]] = [
    (
        "text-file-as-checkpoint",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/notes.txt"],
        "corrupt or not a torch file",
    ),
    (
        "missing-checkpoint",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/nope.pt"],
        "does not exist",
    ),
    (
        "folder-as-checkpoint",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/outdir"],
        "is not a file",
    ),
    (
        "garbage-safetensors",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/garbage.safetensors"],
        "re-save it with safetensors",
    ),
    (
        "garbage-pt",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/garbage.pt"],
        "corrupt or not a torch file",
    ),
    (
        "evil-zip-pickle",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/evil_zip.pt"],
        "run Python code",
    ),
    (
        "evil-legacy-pickle",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/evil_legacy.pt"],
        "run Python code",
    ),
    (
        "evil-pickle-p0",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/evil_p0.pt"],
        "run Python code",
    ),
    (
        "evil-pickle-p2",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/evil_p2.pt"],
        "run Python code",
    ),
    (
        "evil-pickle-p5",
        ["summary", "sample:tiny-gpt2", "--checkpoint", "{root}/evil_p5.pt"],
        "run Python code",
    ),
    (
        "wrong-shape-checkpoint",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/wrong_shape.safetensors"],
        "nothing was loaded",
    ),
    ("capture-batch-size-negative", ["capture", "sample:tiny-gpt2", "--batch-size", "-1"], "at least 1"),
    ("capture-batch-size-zero", ["capture", "sample:tiny-gpt2", "--batch-size", "0"], "at least 1"),
    ("capture-batch-size-text", ["capture", "sample:tiny-gpt2", "--batch-size", "two"], "whole number"),
    ("capture-max-bytes-negative", ["capture", "sample:tiny-gpt2", "--max-bytes", "-5"], "0 or more"),
    ("capture-store-on-cpu1", ["capture", "sample:tiny-gpt2", "--store-on", "cpu:3"], "one cpu device"),
    ("capture-grad-mode", ["capture", "sample:tiny-gpt2", "--grad-mode", "sometimes"], "invalid choice"),
    (
        "capture-json-missing-folder",
        ["capture", "sample:tiny-gpt2", "--json", "{root}/missing/c.json"],
        "create it first",
    ),
    ("attribute-steps-zero", ["attribute", "sample:cnn-bn", "--steps", "0"], "at least 1"),
    ("attribute-batch-size-zero", ["attribute", "sample:cnn-bn", "--batch-size", "0"], "at least 1"),
    ("attribute-rows-zero", ["attribute", "sample:cnn-bn", "--rows", "0"], "at least 1"),
    ("attribute-unknown-method", ["attribute", "sample:cnn-bn", "--method", "magic"], "invalid choice"),
    ("attribute-target-out-of-range", ["attribute", "sample:cnn-bn", "--target", "999"], "must be in 0..9"),
    ("attribute-forward-fails", ["attribute", "{models}/nets.py:bad_forward"], "fix the model's forward"),
    (
        "offsets-backward-forward-fails",
        ["offsets", "{models}/nets.py:bad_forward", "--backward"],
        "fix its forward",
    ),
    ("offsets-locate-negative", ["offsets", "sample:tiny-gpt2", "--locate", "-1"], "0 or more"),
    (
        "offsets-locate-past-end",
        ["offsets", "sample:tiny-gpt2", "--locate", "4080"],
        "valid indices are 0..4079",
    ),
    ("offsets-top-zero", ["offsets", "sample:tiny-gpt2", "--top", "0"], "at least 1"),
    ("offsets-max-rows-negative", ["offsets", "sample:tiny-gpt2", "--max-rows", "-2"], "at least 1"),
    ("factory-calls-sys-exit", ["summary", "{models}/nets.py:exits"], "make the factory return an nn.Module"),
    ("factory-raises", ["summary", "{models}/nets.py:raises"], "make the factory return an nn.Module"),
    ("factory-returns-int", ["summary", "{models}/nets.py:not_a_module"], "not a torch nn.Module"),
    ("file-exits-on-import", ["summary", "{models}/exits_on_import.py:build"], "called sys.exit"),
    ("file-import-fails", ["summary", "{models}/broken_import.py:build"], "fix the file"),
    ("file-missing-factory", ["summary", "{models}/nets.py:nothing_here"], "callables there"),
    ("file-outside-allowed-folders", ["summary", "{outside}/nets.py:good"], "INSPECTOR_MODEL_DIRS"),
    ("missing-file", ["summary", "{models}/absent.py:good"], "does not exist"),
    ("unknown-source-kind", ["summary", "nonsense"], "sample:<name>"),
    ("unknown-sample", ["summary", "sample:nope"], "known samples"),
    ("hf-remote-code", ["summary", "hf:{hf}"], "auto_map"),
    ("hf-no-config", ["summary", "hf:{root}/no_config"], "no config.json"),
    ("hf-bad-config-json", ["summary", "hf:{root}/bad_json"], "fix or replace"),
    ("device-cpu1", ["summary", "sample:tiny-gpt2", "--device", "cpu:1"], "one cpu device"),
    ("device-missing-gpu", ["summary", "sample:tiny-gpt2", "--device", "cuda:7"], "not available"),
    ("device-nonsense", ["summary", "sample:tiny-gpt2", "--device", "banana"], "Available devices"),
    ("dtype-int64", ["summary", "sample:tiny-gpt2", "--dtype", "int64"], "choose one of float32"),
    ("dtype-int8", ["summary", "sample:tiny-gpt2", "--dtype", "torch.int8"], "choose one of float32"),
    (
        "report-unwritable",
        ["report", "sample:tiny-gpt2", "-o", "/proc/inspector-report.html"],
        "cannot be written",
    ),
    (
        "report-folder-missing",
        ["report", "sample:tiny-gpt2", "-o", "{root}/missing/r.html"],
        "create it first",
    ),
    ("report-output-is-folder", ["report", "sample:tiny-gpt2", "-o", "{root}/outdir"], "give a file name"),
    ("report-output-empty", ["report", "sample:tiny-gpt2", "-o", ""], "give a file name"),
    (
        "report-batch-size-zero",
        ["report", "sample:tiny-gpt2", "-o", "{root}/outdir/r.html", "--batch-size", "0"],
        "at least 1",
    ),
    (
        "report-attribution-steps-zero",
        ["report", "sample:tiny-gpt2", "-o", "{root}/outdir/r.html", "--attribution-steps", "0"],
        "at least 1",
    ),
    (
        "report-unknown-section",
        ["report", "sample:tiny-gpt2", "-o", "{root}/outdir/r.html", "--sections", "bogus"],
        "choose from",
    ),
    (
        "report-unknown-format",
        ["report", "sample:tiny-gpt2", "-o", "{root}/outdir/r.x", "--format", "docx"],
        "invalid choice",
    ),
    ("aliases-unknown-conversion", ["aliases", "sample:tiny-gpt2", "--convert", "bogus"], "choose one of"),
    (
        "aliases-json-is-folder",
        ["aliases", "sample:tiny-gpt2", "--json", "{root}/outdir"],
        "give a file name",
    ),
    ("devicemap-nan-budget", ["devicemap", "sample:tiny-gpt2", "--max-memory", "cpu=nan"], "20GiB"),
    ("devicemap-negative-budget", ["devicemap", "sample:tiny-gpt2", "--max-memory", "cpu=-1GB"], "20GiB"),
    ("devicemap-no-budget", ["devicemap", "sample:tiny-gpt2"], "--max-memory"),
    (
        "devicemap-audit-missing",
        ["devicemap", "sample:tiny-gpt2", "--audit", "{root}/absent.json"],
        "does not exist",
    ),
    (
        "devicemap-audit-not-json",
        ["devicemap", "sample:tiny-gpt2", "--audit", "{root}/map.json"],
        "write it like",
    ),
    (
        "distributed-gpu-index",
        ["distributed", "sample:tiny-gpt2", "--device", "cuda:1", "-o", "{root}/run.jsonl"],
        "invalid choice: 'cuda:1'",
    ),
    (
        "distributed-unknown-device",
        ["distributed", "sample:tiny-gpt2", "--device", "foo", "-o", "{root}/run.jsonl"],
        "invalid choice: 'foo'",
    ),
    (
        "distributed-nan-lr",
        ["distributed", "sample:tiny-gpt2", "--lr", "nan", "-o", "{root}/run.jsonl"],
        "must be a finite number above 0, got nan",
    ),
    (
        "distributed-negative-lr",
        ["distributed", "sample:tiny-gpt2", "--lr=-0.1", "-o", "{root}/run.jsonl"],
        "must be a finite number above 0, got -0.1",
    ),
    (
        "distributed-word-lr",
        ["distributed", "sample:tiny-gpt2", "--lr", "fast", "-o", "{root}/run.jsonl"],
        "must be a number, got 'fast'",
    ),
    (
        "zip-bomb-checkpoint",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/bomb.pt"],
        "Nothing was inflated",
    ),
    ("zip-bomb-listing", ["checkpoint", "{root}/bomb.pt"], "Nothing was inflated"),
    (
        "dcp-piece-2-40-bytes",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/dcp-huge-piece"],
        "which is shorter",
    ),
    (
        "dcp-length-2-62",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/dcp-length-2-62"],
        "which is shorter",
    ),
    (
        "dcp-million-square",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/dcp-million-square"],
        "claims shape (1000000, 1000000)",
    ),
    (
        "dcp-string-keys",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/dcp-string-keys"],
        "not by a tensor name",
    ),
    ("dcp-string-keys-listing", ["checkpoint", "{root}/dcp-string-keys"], "not by a tensor name"),
    (
        "dcp-no-properties",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/dcp-no-properties"],
        "no readable size, dtype (properties)",
    ),
    ("dcp-no-properties-listing", ["checkpoint", "{root}/dcp-no-properties"], "no readable size, dtype"),
    (
        "dcp-no-chunks",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/dcp-no-chunks"],
        "list of pieces (chunks)",
    ),
    (
        "dcp-many-claims",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/dcp-many-claims"],
        "nothing was allocated",
    ),
    ("hf-million-layers", ["summary", "hf:{root}/hf-million-layers"], "--max-model-size"),
    (
        "hf-million-layers-limit-raised",
        ["summary", "hf:{root}/hf-million-layers", "--max-model-size", "1TiB"],
        "modules, more than",
    ),
    (
        "hf-max-model-size-small",
        ["summary", "hf:{root}/hf-base", "--max-model-size", "1KB"],
        "Nothing was built",
    ),
    (
        "hf-max-model-size-text",
        ["summary", "hf:{root}/hf-base", "--max-model-size", "big"],
        "cannot read 'big'",
    ),
    ("hf-zip-bomb-weights", ["summary", "hf:{root}/hf-bomb"], "hf-bomb/pytorch_model.bin was refused"),
    ("hf-index-parent", ["summary", "hf:{root}/hf-index-up"], "lies outside the folder"),
    ("hf-index-absolute", ["summary", "hf:{root}/hf-index-absolute"], "lies outside the folder"),
    ("hf-attn-kernel", ["summary", "hf:{root}/hf-kernel"], "fetch and run kernel code"),
    ("hf-sub-config-kernel", ["summary", "hf:{root}/hf-sub-kernel"], "text_config.attn_implementation"),
    ("hf-experts-kernel", ["summary", "hf:{root}/hf-experts-kernel"], "_experts_implementation: sonicmoe"),
    ("hf-quantization-kernel", ["summary", "hf:{root}/hf-quant-kernel"], "quant_method: mxfp4"),
    (
        "sparse-checkpoint-tensor",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/sparse.pt"],
        "sparse_coo layout",
    ),
    (
        "meta-checkpoint-tensor",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/meta.pt"],
        "on the meta device",
    ),
    (
        "checkpoint-fills-nothing",
        ["summary", "{models}/nets.py:good", "--checkpoint", "{root}/unrelated.safetensors"],
        "fills none of the model's 2 tensors",
    ),
    (
        "devicemap-5000-digit-budget",
        ["devicemap", "sample:tiny-gpt2", "--max-memory", "cpu=" + "9" * 5000],
        "far larger than any memory",
    ),
    ("model-nested-2000-deep", ["summary", "{models}/loading.py:deep"], "more than 200 deep"),
    ("report-output-fifo", ["report", "sample:tiny-gpt2", "-o", "{root}/pipe"], "is a FIFO (named pipe)"),
    ("capture-json-fifo", ["capture", "sample:tiny-gpt2", "--json", "{root}/pipe"], "not a regular file"),
    ("report-output-dev-full", ["report", "sample:tiny-gpt2", "-o", "/dev/full"], "is a character device"),
    (
        "offsets-json-dev-null",
        ["offsets", "sample:tiny-gpt2", "--json", "/dev/null"],
        "give a regular file name",
    ),
    ("attribute-steps-billion", ["attribute", "sample:cnn-bn", "--steps", "1000000000"], "at most 10000"),
    ("attribute-batch-size-huge", ["attribute", "sample:cnn-bn", "--batch-size", "100000"], "at most 4096"),
    ("attribute-target-negative", ["attribute", "sample:cnn-bn", "--target", "-1"], "0 or more"),
    (
        "attribute-position-huge",
        ["attribute", "sample:tiny-gpt2", "--position", "99999999999"],
        "at most 2147483647",
    ),
    ("attribute-rows-huge", ["attribute", "sample:cnn-bn", "--rows", "10000000000"], "at most 1000000"),
    ("capture-batch-size-huge", ["capture", "sample:tiny-gpt2", "--batch-size", "5000"], "at most 4096"),
    (
        "capture-max-bytes-huge",
        ["capture", "sample:tiny-gpt2", "--max-bytes", "9" * 25],
        "at most 4611686018427387904",
    ),
    (
        "capture-max-bytes-float",
        ["capture", "sample:tiny-gpt2", "--max-bytes", "1e9"],
        "whole number, got '1e9'",
    ),
    (
        "offsets-locate-5000-digits",
        ["offsets", "sample:tiny-gpt2", "--locate", "7" * 5000],
        "at most 40 digits",
    ),
    ("offsets-top-huge", ["offsets", "sample:tiny-gpt2", "--top", "2000000"], "at most 1000000"),
    (
        "checkpoint-max-rows-huge",
        ["checkpoint", "{root}/wrong_shape.safetensors", "--max-rows", "2000000"],
        "at most 1000000",
    ),
    (
        "report-batch-size-huge",
        ["report", "sample:tiny-gpt2", "-o", "{root}/outdir/r.html", "--batch-size", "9999"],
        "at most 4096",
    ),
    (
        "report-attribution-steps-huge",
        ["report", "sample:tiny-gpt2", "-o", "{root}/outdir/r.html", "--attribution-steps", "1000000000"],
        "at most 10000",
    ),
    (
        "report-attribution-target-negative",
        ["report", "sample:tiny-gpt2", "-o", "{root}/outdir/r.html", "--attribution-target", "-3"],
        "0 or more",
    ),
    (
        "distributed-steps-huge",
        ["distributed", "sample:tiny-gpt2", "--steps", "10000000", "-o", "{root}/run.jsonl"],
        "at most 1000000",
    ),
    (
        "distributed-batch-size-huge",
        ["distributed", "sample:tiny-gpt2", "--batch-size", "100000", "-o", "{root}/run.jsonl"],
        "at most 4096",
    ),
    (
        "distributed-lr-huge",
        ["distributed", "sample:tiny-gpt2", "--lr", "1e9", "-o", "{root}/run.jsonl"],
        "at most 1e+06",
    ),
    (
        "distributed-lr-inf",
        ["distributed", "sample:tiny-gpt2", "--lr", "inf", "-o", "{root}/run.jsonl"],
        "must be a finite number above 0, got inf",
    ),
    ("serve-port-zero", ["serve", "--port", "0"], "at least 1"),
    ("serve-port-huge", ["serve", "--port", "70000"], "at most 65535"),
    ("serve-port-text", ["serve", "--port", "http"], "whole number, got 'http'"),
    ("no-source", ["summary"], "required: source"),
    ("unknown-command", ["explode", "sample:tiny-gpt2"], "invalid choice"),
]


def _argv(argv: list[str], files: dict[str, Path]) -> list[str]:
    return [a.format(root=files["root"], models=files["models"], outside=files["outside"], hf=files["hf"])
            for a in argv]


@pytest.mark.parametrize("argv, fix", [pytest.param(a, f, id=i) for i, a, f in CLI_CASES])
def test_cli_refuses_with_exit_2_a_fix_and_no_traceback(argv, fix, files, run_cli):
    before, cwd_before = _tree(files["root"]), sorted(os.listdir("."))
    status, _, err = run_cli(_argv(argv, files))
    assert status == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "error:" in last and fix in last, last
    assert _tree(files["root"]) == before  # nothing written, created or removed
    assert sorted(os.listdir(".")) == cwd_before
    assert not files["marker"].exists()


def test_debug_prints_the_traceback_of_model_code(files, capsys):
    assert main(["--debug", "summary", f"{files['models']}/nets.py:raises"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: factory is broken" in err


def test_report_output_folder_is_not_created(files, capsys):
    assert main(["report", "sample:tiny-gpt2", "-o", f"{files['root']}/new/r.md"]) == 2
    assert "create it first" in capsys.readouterr().err
    assert not (files["root"] / "new").exists()


# --------------------------------------------------------------------------- library


@pytest.fixture(scope="module")
def tiny():
    from inspector import load_model

    return load_model("sample:tiny-gpt2")


def _state(model: nn.Module) -> dict:
    tensors = {n: (id(t), t.dtype, t.device, t.requires_grad, t.detach().clone())
               for n, t in [*model.named_parameters(remove_duplicate=False),
                            *model.named_buffers(remove_duplicate=False)]}
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                for m in model.modules())
    return {"tensors": tensors, "training": [m.training for m in model.modules()], "hooks": hooks}


def _same(a: dict, b: dict) -> bool:
    if (
        a["training"] != b["training"]
        or a["hooks"] != b["hooks"]
        or a["tensors"].keys() != b["tensors"].keys()
    ):
        return False
    return all(x[:4] == y[:4] and torch.equal(x[4], y[4]) for x, y in
               zip(a["tensors"].values(), b["tensors"].values(), strict=True))


def _report_text(**fields) -> str:
    doc = {"schema_version": "1.0", "created": "t", "model": {}, "options": {}, "sections": []}
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not ...})


def _watch_bytes(metadata: str) -> bytes:
    """An Arrow stream of the watch schema whose run metadata is ``metadata``."""
    import pyarrow as pa

    from inspector.watching import META_KEY, schema

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema().with_metadata({META_KEY: metadata})):
        pass
    return sink.getvalue().to_pybytes()


def _lib_cases() -> list[tuple[str, Callable, str]]:
    from inspector import (
        apply_checkpoint,
        attribute,
        capture_activations,
        checkpoint_listing,
        compare_ties,
        gradient_norms,
        load_model,
        locate,
        model_summary,
        move_model,
        offset_map,
        plan_device_map,
        read_checkpoint,
        retie,
        snapshot_ties,
    )
    from inspector.comparison import compare
    from inspector.distributed import dcp_listing, read_dcp
    from inspector.offsets import run_backward
    from inspector.placement import parse_max_memory, parse_size
    from inspector.report import Report, build_report
    from inspector.watching import parse_run_bytes

    return [
        ("load-none", lambda t, f: load_model(None), "source must be a non-empty string"),
        ("load-int", lambda t, f: load_model(123), "source must be a non-empty string"),
        ("load-empty", lambda t, f: load_model("  "), "source must be a non-empty string"),
        (
            "load-checkpoint-int",
            lambda t, f: load_model("sample:tiny-gpt2", checkpoint=42),
            "checkpoint must be a path",
        ),
        (
            "load-dtype-int64",
            lambda t, f: load_model("sample:tiny-gpt2", dtype=torch.int64),
            "choose one of float32",
        ),
        (
            "load-dtype-int-name",
            lambda t, f: load_model("sample:tiny-gpt2", dtype="int64"),
            "choose one of float32",
        ),
        ("load-dtype-number", lambda t, f: load_model("sample:tiny-gpt2", dtype=5), "choose one of float32"),
        ("load-device-cpu1", lambda t, f: load_model("sample:tiny-gpt2", device="cpu:1"), "one cpu device"),
        ("load-device-int", lambda t, f: load_model("sample:tiny-gpt2", device=3), "device must be a name"),
        (
            "load-hf-remote-code",
            lambda t, f: load_model(f"hf:{f['hf']}"),
            "never runs code from a model folder",
        ),
        ("load-factory-exits", lambda t, f: load_model(f"{f['models']}/nets.py:exits"), "called sys.exit(3)"),
        (
            "legacy-pickle",
            lambda t, f: read_checkpoint(f["root"] / "evil_legacy.pt"),
            "asks to run Python code",
        ),
        (
            "text-checkpoint",
            lambda t, f: read_checkpoint(f["root"] / "notes.txt"),
            "give a .safetensors file",
        ),
        ("move-to-int64", lambda t, f: move_model(t.model, dtype=torch.int64), "choose one of float32"),
        ("move-to-cpu1", lambda t, f: move_model(t.model, device="cpu:1"), "one cpu device"),
        ("inputs-batch-zero", lambda t, f: t.example_inputs(0), "at least 1"),
        ("inputs-batch-negative", lambda t, f: t.example_inputs(-1), "at least 1"),
        ("inputs-batch-text", lambda t, f: t.example_inputs("2"), "at least 1"),
        (
            "attribute-n-steps-zero",
            lambda t, f: attribute(t, None, "ig", target=1, n_steps=0),
            "n_steps must be",
        ),
        (
            "attribute-internal-batch-zero",
            lambda t, f: attribute(t, None, "ig", target=1, internal_batch_size=0),
            "internal_batch_size must be",
        ),
        (
            "capture-negative-budget",
            lambda t, f: capture_activations(t.model, t.example_inputs(1), max_bytes=-1),
            "max_bytes must be 0 or more",
        ),
        (
            "capture-nan-budget",
            lambda t, f: capture_activations(t.model, t.example_inputs(1), max_bytes=float("nan")),
            "max_bytes must be a finite number",
        ),
        (
            "capture-inf-budget",
            lambda t, f: capture_activations(t.model, t.example_inputs(1), max_bytes=float("inf")),
            "max_bytes must be a finite number",
        ),
        (
            "capture-text-budget",
            lambda t, f: capture_activations(t.model, t.example_inputs(1), max_bytes="1GB"),
            "max_bytes must be a number of bytes",
        ),
        (
            "capture-bool-budget",
            lambda t, f: capture_activations(t.model, t.example_inputs(1), max_bytes=True),
            "max_bytes must be a number of bytes",
        ),
        (
            "plan-nan-budget",
            lambda t, f: plan_device_map(t.model, {"cpu": float("nan")}),
            "not a finite number",
        ),
        (
            "plan-inf-budget",
            lambda t, f: plan_device_map(t.model, {"cpu": float("inf")}),
            "not a finite number",
        ),
        ("plan-negative-budget", lambda t, f: plan_device_map(t.model, {"cpu": -1}), "is negative"),
        ("parse-nan-budget", lambda t, f: parse_max_memory("cpu=nan"), "20GiB"),
        ("locate-negative", lambda t, f: locate(offset_map(t.model), -1), "valid indices are 0..4079"),
        ("report-unknown-option", lambda t, f: build_report(t, ["summary"], colour="red"), "known options"),
        ("report-unknown-section", lambda t, f: build_report(t, ["everything"]), "choose from"),
        (
            "backward-forward-fails",
            lambda t, f: run_backward(load_model(f"{f['models']}/nets.py:bad_forward")),
            "fix its forward",
        ),
        ("offset-map-none", lambda t, f: offset_map(None), "needs a torch nn.Module"),
        ("summary-none", lambda t, f: model_summary(None), "needs a torch nn.Module"),
        ("plan-none", lambda t, f: plan_device_map(None, "cpu=1GB"), "needs a torch nn.Module"),
        ("capture-none", lambda t, f: capture_activations(None, torch.ones(1)), "needs a torch nn.Module"),
        ("compare-ties-none", lambda t, f: compare_ties(None, t.model), "needs a TieSnapshot"),
        ("retie-none", lambda t, f: retie(t.model, None), "needs a TieSnapshot"),
        ("report-of-none", lambda t, f: build_report(None), "needs a LoadedModel"),
        (
            "attribute-module-not-loaded",
            lambda t, f: attribute(t.model, None, "ig", target=1),
            "needs a LoadedModel",
        ),
        ("attribute-target-text", lambda t, f: attribute(t, None, "ig", target="a"), "must be an integer"),
        (
            "gradient-norms-by",
            lambda t, f: gradient_norms(t.model, by="layer"),
            "choose 'parameter' or 'module'",
        ),
        ("locate-text", lambda t, f: locate(offset_map(t.model), "3"), "must be an integer"),
        ("from-json-not-json", lambda t, f: Report.from_json("not json"), "not JSON"),
        ("from-json-list", lambda t, f: Report.from_json("[1, 2]"), "not an object"),
        ("from-json-null", lambda t, f: Report.from_json("null"), "not an object"),
        ("from-json-bytes-garbage", lambda t, f: Report.from_json(b"\xff\xfe"), "not JSON"),
        ("from-json-number", lambda t, f: Report.from_json(5), "expected the JSON text"),
        ("from-json-no-sections", lambda t, f: Report.from_json(_report_text(sections=...)), "missing field"),
        ("from-json-sections-int", lambda t, f: Report.from_json(_report_text(sections=5)), "report schema"),
        (
            "from-json-section-no-title",
            lambda t, f: Report.from_json(_report_text(sections=[{"id": "s"}])),
            "missing field 'title'",
        ),
        (
            "from-json-bad-severity",
            lambda t, f: Report.from_json(
                _report_text(
                    findings=[{"section": "s", "code": "c", "severity": "fatal", "where": "", "message": ""}]
                )
            ),
            "report schema",
        ),
        (
            "from-json-old-schema",
            lambda t, f: Report.from_json(_report_text(schema_version="0.1")),
            "not supported",
        ),
        ("read-zip-bomb", lambda t, f: read_checkpoint(f["root"] / "bomb.pt"), "inflate far beyond"),
        ("list-zip-bomb", lambda t, f: checkpoint_listing(f["root"] / "bomb.pt"), "inflate far beyond"),
        ("read-dcp-2-62", lambda t, f: read_dcp(f["root"] / "dcp-length-2-62"), "which is shorter"),
        (
            "read-dcp-million-square",
            lambda t, f: read_dcp(f["root"] / "dcp-million-square"),
            "pieces hold only",
        ),
        (
            "list-dcp-no-chunks",
            lambda t, f: dcp_listing(f["root"] / "dcp-no-chunks"),
            "list of pieces (chunks)",
        ),
        (
            "load-hf-million-layers",
            lambda t, f: load_model(f"hf:{f['root']}/hf-million-layers"),
            "was refused",
        ),
        (
            "load-hf-size-limit",
            lambda t, f: load_model(f"hf:{f['root']}/hf-base", max_model_size=1000),
            "more than the limit of",
        ),
        (
            "load-hf-size-limit-nan",
            lambda t, f: load_model(f"hf:{f['root']}/hf-base", max_model_size="nan"),
            "cannot read 'nan'",
        ),
        ("load-hf-index-outside", lambda t, f: load_model(f"hf:{f['root']}/hf-index-up"), "must be inside"),
        ("load-hf-kernel", lambda t, f: load_model(f"hf:{f['root']}/hf-kernel"), "never runs code"),
        (
            "apply-sparse-into-tiny",
            lambda t, f: apply_checkpoint(t.model, f["root"] / "sparse.pt"),
            "fills none",
        ),
        (
            "retie-other-models-snapshot",
            lambda t, f: retie(t.model, snapshot_ties(load_model("sample:cnn-bn").model)),
            "taken of another model",
        ),
        ("parse-5000-digits", lambda t, f: parse_size("9" * 5000 + "GiB"), "far larger than any memory"),
        (
            "load-deep-nesting",
            lambda t, f: load_model(f"{f['models']}/loading.py:deep"),
            "more than 200 deep",
        ),
        (
            "compare-safetensors-huge-shape",
            lambda t, f: compare(f["root"] / "huge-shape.safetensors", f["root"] / "wrong_shape.safetensors"),
            "is invalid",
        ),
        (
            "compare-safetensors-huge-offset",
            lambda t, f: compare(
                f["root"] / "huge-offset.safetensors", f["root"] / "wrong_shape.safetensors"
            ),
            "is invalid",
        ),
        (
            "compare-safetensors-nested",
            lambda t, f: compare(
                f["root"] / "nested-header.safetensors", f["root"] / "wrong_shape.safetensors"
            ),
            "is not JSON",
        ),
        (
            "watch-run-nested-metadata",
            lambda t, f: parse_run_bytes(_watch_bytes("[" * 100_000 + "]" * 100_000), "deep.inspect"),
            "deep.inspect",
        ),
        (
            "watch-run-huge-version",
            lambda t, f: parse_run_bytes(
                _watch_bytes('{"format": "inspector-watch", "version": 1e400}'), "big.inspect"
            ),
            "big.inspect",
        ),
    ]


LIB_IDS = [c[0] for c in _lib_cases()]


@pytest.mark.parametrize("case", LIB_IDS)
def test_library_refuses_with_inspector_error_naming_the_fix(case, tiny, files):
    _, call, fix = next(c for c in _lib_cases() if c[0] == case)
    before, tree = _state(tiny.model), _tree(files["root"])
    with pytest.raises(InspectorError) as info:
        call(tiny, files)
    assert fix in str(info.value), str(info.value)
    assert "Traceback" not in str(info.value)
    assert _same(before, _state(tiny.model))
    assert _tree(files["root"]) == tree
    assert not files["marker"].exists()


def test_the_table_has_at_least_60_cases():
    assert len(CLI_CASES) + len(LIB_IDS) >= 60


def test_a_forward_failure_is_still_a_runtime_error_for_callers_that_catch_one(files):
    from inspector import attribute, load_model

    loaded = load_model(f"{files['models']}/nets.py:bad_forward")
    with pytest.raises(RuntimeError, match="boom in forward"):
        attribute(loaded, None, "saliency", target=0)


def test_an_int64_checkpoint_tensor_in_a_float32_parameter_is_a_warning(tmp_path, files):
    from inspector import load_model

    path = tmp_path / "ints.safetensors"
    save_file({"fc.weight": torch.arange(6, dtype=torch.int64).reshape(2, 3),
               "fc.bias": torch.zeros(2, dtype=torch.float64)}, str(path))
    loaded = load_model(f"{files['models']}/nets.py:good", checkpoint=path)
    found = {(f.code, f.severity, f.where) for f in loaded.findings}
    assert ("dtype-mismatch", "warning", "fc.weight") in found
    assert ("dtype-cast", "info", "fc.bias") in found
    assert loaded.model.fc.weight.dtype == torch.float32
    assert loaded.model.fc.weight[1, 2].item() == 5.0  # cast, as load_state_dict does


def test_remote_code_folder_never_runs_even_through_transformers_directly(files):
    # the refusal comes first; transformers itself is also told not to trust remote code
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError):
        transformers.AutoConfig.from_pretrained(files["hf"], local_files_only=True, trust_remote_code=False)
    assert not files["marker"].exists()


def test_every_transformers_loader_call_passes_trust_remote_code_false():
    root = Path(__file__).resolve().parent.parent / "inspector"
    for path in root.rglob("*.py"):
        text = path.read_text()
        for chunk in text.split("from_pretrained(")[1:]:
            call = chunk[: chunk.index(")")]
            assert "trust_remote_code=False" in call, f"{path.name}: from_pretrained({call})"


def test_uploads_are_bounded_and_removed_with_their_session(tmp_path):
    import gc
    import subprocess
    import sys

    from ui.uploads import UploadStore, sweep_stale_uploads

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f"{done.stdout.strip()}-0123"  # a server that has exited
    stale.mkdir()
    (stale / "old.pt").write_bytes(b"x" * 10)
    running = tmp_path / f"{os.getppid()}-4567"  # another server that still runs
    running.mkdir()
    (tmp_path / "loose-file.pt").write_bytes(b"x")
    os.utime(tmp_path / "loose-file.pt", (1e9, 1e9))  # written long ago
    (tmp_path / "fresh-file.pt").write_bytes(b"x")  # just written by someone else: kept
    first, second = UploadStore(tmp_path, limit=100), UploadStore(tmp_path, limit=100)
    removed = sweep_stale_uploads(tmp_path)
    assert sorted(removed) == sorted([stale, tmp_path / "loose-file.pt"]) and not stale.exists()
    assert running.is_dir() and first.folder.name.startswith(f"{os.getpid()}-")
    running.rmdir()
    (tmp_path / "fresh-file.pt").unlink()
    a = Path(first.save("a.safetensors", b"1" * 60))
    with pytest.raises(InspectorError, match="INSPECTOR_UPLOAD_LIMIT"):
        second.save("b.pt", b"2" * 60)  # 60 + 60 > 100 bytes in all
    assert not list(second.folder.glob("*"))
    assert first.save("a.safetensors", b"1" * 60) == str(a)  # the same upload again: no new bytes
    with pytest.raises(InspectorError, match="not a checkpoint"):
        first.save("../../etc/passwd", b"x")
    folder = first.folder
    del first
    gc.collect()
    assert not folder.exists()  # the session ended: its uploads are gone
    assert Path(second.save("b.pt", b"2" * 60)).is_file()  # and their room is free again
    second.close()
    assert not any(tmp_path.iterdir())



def test_names_with_terminal_escapes_print_as_visible_text(files, tmp_path, capsys):
    osc_link = "\x1b]8;;http://evil/x\x1b\\click\x1b]8;;\x1b\\"
    path = tmp_path / "ansi.safetensors"
    save_file({f"\x1b[2J{osc_link}\r": torch.ones(1), "fc.bias": torch.zeros(2)}, str(path))
    assert main(["summary", f"{files['models']}/nets.py:good", "--checkpoint", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "unexpected-key" in out and "\\x1b]8;;http://evil/x" in out
    assert not any(c in out + err for c in "\x1b\r")


_NOISY = '''
import sys
from torch import nn


def noisy():
    sys.stderr.write("loading 50%|#####     |\\r")  # a progress bar, as tqdm draws it
    sys.stderr.flush()
    assert sys.stderr.encoding is not None and callable(sys.stderr.isatty)
    return nn.Linear(2, 2)


def loud():
    raise ValueError("\\x1b[31mred\\x1b]8;;http://evil/x\\x1b\\\\")
'''


def test_the_model_code_own_output_is_left_alone_and_names_are_escaped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    (tmp_path / "noisy.py").write_text(_NOISY, encoding="utf-8")
    assert main(["summary", f"{tmp_path}/noisy.py:noisy"]) == 0
    out, err = capsys.readouterr()
    assert "loading 50%|#####     |\r" in err and "\\x0d" not in err
    assert main(["summary", f"{tmp_path}/noisy.py:loud", "--debug"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" in err and "\\x1b[31mred" in err
    assert "\x1b" not in out + err


def test_a_refusal_reads_the_same_while_another_thread_writes_to_stderr(files, run_cli):
    """A browser driver's or server's thread left by an earlier test may print at any moment; what
    the command printed is judged without it, so a loaded machine cannot reorder it into the result."""
    import sys
    import threading

    stop = threading.Event()

    def noisy() -> None:
        while not stop.is_set():
            print("a background thread's warning", file=sys.stderr)
            stop.wait(0.0005)

    thread = threading.Thread(target=noisy)
    thread.start()
    try:
        for _ in range(20):
            status, _, err = run_cli(["report", "sample:tiny-gpt2", "-o", "/dev/full"])
            assert status == 2
            last = err.strip().splitlines()[-1]
            assert "error:" in last and "is a character device" in last, err
            assert "background" not in err
    finally:
        stop.set()
        thread.join()
