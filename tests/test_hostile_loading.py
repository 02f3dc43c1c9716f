"""Loading untrusted files: bounded memory, nothing from the file changes the process, and the
odd-but-valid inputs (non-UTF-8 names, upper-case suffixes, tutorial DCP layouts) load right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from inspector import InspectorError
from inspector.__main__ import main
from tests.hostile_loading import write_loading_files, zip_bomb

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("loading")
    (root / "models").mkdir()
    (root / "models" / "nets.py").write_text(
        "from torch import nn\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(3, 2)\n\n    def forward(self, x):\n        return self.fc(x)\n\n\n"
        "def good():\n    return Net()\n"
    )
    write_loading_files(root)
    return root


@pytest.fixture(autouse=True)
def _model_dirs(files, monkeypatch):
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(files / "models"))


_PEAK = textwrap.dedent('''
    import resource, sys
    import torch
    from inspector import InspectorError, read_checkpoint
    from inspector.distributed import read_dcp
    def vm():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    limit = vm() + (128 << 20)  # 128 MiB above what is mapped now; each bomb asks for 256 MiB or more
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for reader, path in ((read_checkpoint, sys.argv[1]), (read_dcp, sys.argv[2]), (read_dcp, sys.argv[3])):
        try:
            reader(path)
        except InspectorError as exc:
            print("REFUSED", exc)
        except MemoryError:
            print("memory error"); sys.exit(1)
    print("peak MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
''')


def test_bombs_are_refused_before_they_allocate_under_a_memory_limit(tmp_path, files):
    # a 256 KiB torch zip whose entry inflates to 256 MiB; DCP indexes claiming (40000, 40000) and
    # 10**6 x 10**6
    zip_bomb(tmp_path / "gib.pt", mebibytes=256)
    assert (tmp_path / "gib.pt").stat().st_size < 1 << 20
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PEAK,
            str(tmp_path / "gib.pt"),
            str(files / "dcp-huge-piece"),
            str(files / "dcp-million-square"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("REFUSED") == 3, done.stdout
    for said in ("Nothing was inflated", "which is shorter", "claims shape (1000000, 1000000)"):
        assert said in done.stdout, done.stdout


def test_a_model_file_cannot_change_torch_settings_for_later_models(files):
    from inspector import load_model

    loaded = load_model(f"{files}/models/loading.py:sets_globals")
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    changed = sorted(f.message.split("(")[1].split(")")[0] for f in loaded.findings
                     if f.code == "torch-state-restored")
    assert changed == ["default dtype: torch.float32 -> torch.float64", "grad mode: True -> False"]
    assert loaded.model.weight.dtype == torch.float64  # built while the file's setting held


def test_complex_tensors_stay_complex_when_the_model_is_cast(files):
    from inspector import load_model

    loaded = load_model(f"{files}/models/loading.py:complex_buffer", dtype="float16")
    freqs = loaded.model.freqs
    assert freqs.dtype == torch.complex32 and loaded.model.fc.weight.dtype == torch.float16
    assert freqs.to(torch.complex64).tolist() == [1 + 2j, -3 + 0.5j]  # imaginary parts kept, exact in half
    assert [(f.code, f.where) for f in loaded.findings if f.code == "complex-kept"] == [
        ("complex-kept", "freqs")
    ]


def test_scripted_and_sparse_models_load_and_report(files, tmp_path, capsys):
    assert main(["summary", f"{files}/models/loading.py:scripted"]) == 0
    out = tmp_path / "r.json"
    assert (
        main(["report", f"{files}/models/loading.py:sparse_param", "-o", str(out), "--sections", "aliases"])
        == 0
    )
    doc = json.loads(out.read_text())
    assert [s["status"] for s in doc["sections"] if s["id"] == "aliases"] == ["ok"]


def test_a_bad_checkpoint_tensor_is_found_before_anything_is_copied(files):
    from inspector import load_model

    loaded = load_model(f"{files}/models/nets.py:good")
    before = loaded.model.fc.bias.detach().clone()
    from inspector import apply_checkpoint

    for name in ("sparse.pt", "meta.pt"):  # fc.bias (7.0) comes first in meta.pt: it must not be copied
        with pytest.raises(InspectorError, match="nothing was loaded"):
            apply_checkpoint(loaded.model, files / name)
        assert torch.equal(loaded.model.fc.bias, before)


def test_odd_but_valid_names_load(files, tmp_path, capsys):
    from inspector import load_model
    from ui.uploads import UploadStore

    weird = os.fsdecode(b"w\xff")
    for name in (f"{weird}.pt", f"{weird}.safetensors", "UPPER.SAFETENSORS"):
        loaded = load_model(f"{files}/models/nets.py:good", checkpoint=files / name)
        assert torch.equal(loaded.model.fc.bias, torch.ones(2)), name
    assert main(["checkpoint", str(files / f"{weird}.safetensors")]) == 0
    assert "w\\xff.safetensors" in capsys.readouterr().out
    store = UploadStore(tmp_path / "uploads", limit=10**6)
    path = store.save("X.SAFETENSORS", (files / "UPPER.SAFETENSORS").read_bytes())
    assert torch.equal(
        load_model(f"{files}/models/nets.py:good", checkpoint=path).model.fc.weight, torch.ones(2, 3)
    )
    store.close()


def test_a_key_that_is_not_text_is_escaped_everywhere(files, tmp_path, capsys):
    from inspector import build_report, load_model

    loaded = load_model(f"{files}/models/nets.py:good", checkpoint=files / "surrogate.pt")
    found = {f.code: f for f in loaded.findings}
    assert found["checkpoint-key-not-text"].where == "bad\\ud800key"
    assert found["unexpected-key"].where == "bad\\ud800key"
    assert main(["checkpoint", str(files / "surrogate.pt")]) == 0
    assert "bad\\ud800key" in capsys.readouterr().out
    report = build_report(loaded, ["summary"])
    for text in (report.to_json(), report.to_markdown(), report.to_html()):
        text.encode("utf-8")  # a lone surrogate would make every format unwritable


def test_architectures_given_as_one_string_names_the_class(files):
    from inspector import load_model

    loaded = load_model(f"hf:{files}/hf-arch-string")
    classes = [f.message for f in loaded.findings if f.code.startswith("hf-class")]
    assert classes == ["loaded as GPT2LMHeadModel, the class the folder was saved from"]


def test_tutorial_dcp_layout_loads_the_model_part_and_names_what_it_skipped(files):
    from inspector import load_model

    loaded = load_model(f"{files}/models/nets.py:good", checkpoint=files / "dcp-tutorial")
    assert torch.equal(loaded.model.fc.weight, torch.full((2, 3), 5.0))
    found = {f.code: f for f in loaded.findings}
    assert "used the 'model' part of dcp-tutorial" in found["checkpoint-part"].message
    assert "optim (" in found["checkpoint-part"].message
    assert "step" in found["checkpoint-non-tensor"].message
    assert not any(f.code in ("missing-key", "unexpected-key") for f in loaded.findings)


def test_the_dashboard_refuses_a_huge_config_from_a_shared_url_and_takes_a_limit_from_the_user(files):
    from streamlit.testing.v1 import AppTest

    from ui.models import Selection

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["model"] = f"hf:{files}/hf-million-layers"
    at.run()
    assert not at.exception
    assert any("was refused" in e.value and "Largest model" in e.value for e in at.error), [
        e.value for e in at.error
    ]
    assert at.session_state["mi_selection"] == Selection()  # the default model stays
    at.radio(key="mi_kind").set_value("Hugging Face folder").run()
    at.text_input(key="mi_hf").input(f"{files}/hf-base").run()
    at.text_input(key="mi_max_size").input("1KB").run()
    at.button(key="mi_load").click().run()
    assert any("more than the limit of 1000 B" in e.value for e in at.error), [e.value for e in at.error]
    at.text_input(key="mi_max_size").input("1MiB").run()
    at.button(key="mi_load").click().run()
    assert at.session_state["mi_selection"].source == f"hf:{files}/hf-base"
    at.radio(key="mi_kind").set_value("Python file").run()
    assert any("A model file is Python code" in w.value for w in at.warning)
