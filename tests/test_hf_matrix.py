"""Real architectures end to end: saved with ``save_pretrained``, loaded through ``hf:``, run
through every command and every page; the inspected weights are the saved ones."""

from __future__ import annotations

import json

import pytest
import torch
from apptest import PAGES, run_page
from hf_folders import ARCHITECTURES, SAVED_CLASS
from safetensors.torch import load_file

from inspector.__main__ import main
from inspector.hf import saved_form
from inspector.models import load_model

pytest.importorskip("transformers")

COMMANDS = {  # the smallest inputs each command takes
    "summary": [],
    "aliases": ["--convert", "to-float64-overwrite", "--retie"],
    "offsets": ["--backward", "--locate", "0"],
    "devicemap": ["--max-memory", "0=8KB,cpu=1GB"],
    "capture": ["--batch-size", "1"],
    "attribute": ["--target", "1", "--steps", "2"],
    # the report page builds every section for every architecture; here the command itself
    "report": ["--format", "json", "--sections", "summary", "aliases"],
}


#: Views that cannot apply, and the reason the command gives (exit 2); every other pair exits 0.
CANNOT = {("t5-bare", "attribute"): "model without a head", ("t5-bare", "offsets"): "defines no loss"}


def assert_saved_weights(model: torch.nn.Module, folder) -> None:
    """Every saved tensor equals the model's, under the names save_pretrained writes."""
    saved = load_file(str(folder / "model.safetensors"))
    mine = saved_form(model, model.state_dict())
    assert set(saved) <= set(mine), sorted(set(saved) - set(mine))
    for key, value in saved.items():
        assert torch.equal(mine[key], value), key


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_loads_the_saved_class_and_weights(hf_folders, arch):
    loaded = load_model(f"hf:{hf_folders[arch]}")
    assert type(loaded.model).__name__ == SAVED_CLASS[arch]
    assert [(f.code, f.severity) for f in loaded.findings] == [("hf-class", "info")]
    assert_saved_weights(loaded.model, hf_folders[arch])
    inputs = loaded.example_inputs(2)
    with torch.no_grad():
        out = loaded.model(**inputs)
    if loaded.has_loss:
        assert torch.isfinite(loaded.loss(out, inputs))


def test_ties_are_the_saved_ones(hf_folders):
    llama = load_model(f"hf:{hf_folders['llama-tied']}").model
    assert llama.lm_head.weight is llama.model.embed_tokens.weight
    llama = load_model(f"hf:{hf_folders['llama-untied']}").model
    assert llama.lm_head.weight is not llama.model.embed_tokens.weight
    bart = load_model(f"hf:{hf_folders['bart']}").model  # one shared table: encoder, decoder and head
    shared = bart.model.shared.weight
    assert bart.model.encoder.embed_tokens.weight is shared and bart.model.decoder.embed_tokens.weight is shared
    assert bart.lm_head.weight is shared


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_command(hf_folders, arch, command, capsys, tmp_path):
    argv = [command, f"hf:{hf_folders[arch]}", *COMMANDS[command]]
    if command == "report":
        argv += ["-o", str(tmp_path / "r.json")]
    code = main(argv)
    out, err = capsys.readouterr()
    reason = CANNOT.get((arch, command))
    assert code == (2 if reason else 0), (code, err[-2000:])
    if reason:
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: ") and reason in last, err[-2000:]
    if command == "report":
        report = json.loads((tmp_path / "r.json").read_text())
        failed = {s["id"]: s.get("note") for s in report["sections"] if s["status"] == "error"}
        assert not failed, failed
    elif code == 0:
        assert out.startswith("model: ") or "device map" in out, out[:500]


def _page_files() -> list[str]:
    return ["../app.py", *sorted(p.name for p in PAGES.glob("*.py"))]


ACTIONS = {  # the button each page computes with, after setting its smallest inputs
    "1_Alias_graph.py": ("aliases_check", {}),
    "2_Flatten_map.py": ("offsets_backward", {}),
    "5_Attributions.py": ("attr_compute", {"attr_steps": 4}),
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_page(hf_folders, arch):
    from ui.models import Selection, get_loaded

    source = f"hf:{hf_folders[arch]}"
    for page in _page_files():
        at = run_page(page, source, timeout=120)
        errors = [e.value for e in at.error]
        assert all(e.strip() for e in errors), page
        if page == "../app.py":
            assert "hf-class" in "\n".join(df.value.to_string() for df in at.dataframe)
        key, values = ACTIONS.get(page, (None, {}))
        if key is not None and not errors and at.button(key=key).disabled:
            assert at.info, (page, "a disabled action says why")  # e.g. no loss: no backward pass
        elif key is not None and not errors:
            for widget, value in values.items():
                at.slider(key=widget).set_value(value)
            at.button(key=key).click().run()
            assert not at.exception, (page, [e.value for e in at.exception])
        if page == "6_Report.py":
            at.number_input[0].set_value(1)  # batch size
            at.number_input[1].set_value(2)  # attribution steps
            at.button[0].click().run()
            assert not at.exception, [e.value for e in at.exception]
            assert not at.error, (page, [e.value for e in at.error])
        assert all(e.value.strip() for e in at.error), page
    loaded = get_loaded(Selection(source=source))
    assert_saved_weights(loaded.model, hf_folders[arch])  # the pages inspected the saved weights, unchanged


def _copy(folder, to, architectures):
    to.mkdir()
    for f in folder.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    config = json.loads((to / "config.json").read_text())
    if architectures is None:
        config.pop("architectures", None)
    else:
        config["architectures"] = architectures
    (to / "config.json").write_text(json.dumps(config))
    return to


def test_home_page_shows_a_model_that_is_not_the_saved_one(hf_folders, tmp_path):
    # The folder holds BartForConditionalGeneration's tensors but names BartForCausalLM: the
    # encoder (and the shared table) have no place in it, its decoder embedding and head are random.
    folder = _copy(hf_folders["bart"], tmp_path / "bart", ["BartForCausalLM"])
    at = run_page("../app.py", f"hf:{folder}", timeout=120)
    shown = "\n".join(df.value.to_string() for df in at.dataframe)
    assert "hf-not-saved-model" in shown and "left-at-init" in shown
    assert any("hf-not-saved-model" in e.value for e in at.error)
