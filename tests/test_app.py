"""The home page and the sidebar picker, driven through streamlit's AppTest."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from inspector import format_count
from sample_models import SAMPLES
from ui.models import Selection, get_loaded

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")


def run_app(**query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def load(at: AppTest) -> AppTest:
    return at.button(key="mi_load").click().run()


def test_home_opens_with_tiny_gpt2_on_cpu():
    at = run_app()
    assert not at.exception
    assert not errors(at)
    assert at.session_state["mi_selection"] == Selection("sample:tiny-gpt2", None, "cpu", None)
    # tiny GPT-2: 4080 unique parameter elements, 4592 with the tie counted twice.
    assert metric(at, "Parameter elements") == "4,080"
    assert metric(at, "Counting every alias") == "4,592"
    assert metric(at, "Frozen") == "0"
    # Nothing changed in the picker, so there is nothing to load.
    assert at.button(key="mi_load").disabled
    # The aliases finding is listed (the tie between wte and lm_head).
    tables = [df.value for df in at.dataframe]
    assert any("aliases-present" in set(t.get("code", [])) for t in tables)
    # The same model from the command line and as a link.
    codes = [c.value for c in at.code]
    assert any("python -m inspector summary sample:tiny-gpt2 --device cpu" in c for c in codes)
    assert "?model=sample%3Atiny-gpt2&device=cpu" in codes


@pytest.mark.parametrize("name", list(SAMPLES))
def test_every_sample_loads_through_the_picker(name):
    at = run_app()
    at.selectbox(key="mi_sample").set_value(name).run()
    if SAMPLES[name].meta_only:
        assert at.selectbox(key="mi_device_meta").value == "meta"
    if name != "tiny-gpt2":  # the default is loaded already
        load(at)
    assert not at.exception
    assert not errors(at)
    sel = at.session_state["mi_selection"]
    assert sel.source == f"sample:{name}"
    assert sel.device == ("meta" if SAMPLES[name].meta_only else "cpu")
    expected = sum(p.numel() for p in get_loaded(sel).model.parameters())  # the cached object
    shown = next(m for m in at.metric if m.label == "Parameter elements")
    assert shown.value == format_count(expected)  # short above a million ("124.4 M")...
    assert shown.proto.help.startswith(f"{expected:,}")  # ...and exact in its help
    # The choice survives a rerun and the button says it is loaded.
    at.run()
    assert at.session_state["mi_selection"] == sel
    assert at.button(key="mi_load").disabled


def test_python_file_from_allowed_folder_loads():
    at = run_app()
    at.radio(key="mi_kind").set_value("Python file").run()
    at.text_input(key="mi_file").input(f"{ROOT}/sample_models/small.py:ConvNet").run()
    load(at)
    assert not at.exception and not errors(at)
    # ConvNet: conv1 224 + conv2 1168 + bn2 32 + fc 170 = 1594 parameter elements.
    assert metric(at, "Parameter elements") == "1,594"


def test_file_outside_allowed_folders_is_refused_and_not_imported(tmp_path):
    marker = tmp_path / "imported.txt"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                    "import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    at = run_app()
    at.radio(key="mi_kind").set_value("Python file").run()
    at.text_input(key="mi_file").input(f"{evil}:build").run()
    load(at)
    assert not at.exception
    assert any("outside the folders" in e and "evil.py" in e for e in errors(at))
    assert not marker.exists()
    # The previous model is still loaded and the app still works.
    assert at.session_state["mi_selection"] == Selection()
    assert metric(at, "Parameter elements") == "4,080"
    at.radio(key="mi_kind").set_value("Sample").run()
    at.selectbox(key="mi_sample").set_value("cnn-bn").run()
    load(at)
    assert not at.exception and not errors(at)
    assert at.session_state["mi_selection"].source == "sample:cnn-bn"


class Hostile:
    """Unpickling this calls open(marker, 'w'), which creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (builtins.open, (str(self.marker), "w"))


def test_hostile_pickle_checkpoint_is_refused_without_running_it(tmp_path):
    # First prove the file is really hostile: an unsafe load runs its code.
    proof_marker = tmp_path / "proof.txt"
    torch.save({"transformer.wte.weight": Hostile(proof_marker)}, tmp_path / "proof.pt")
    torch.load(tmp_path / "proof.pt", weights_only=False)
    assert proof_marker.exists()

    marker = tmp_path / "pwned.txt"
    ckpt = tmp_path / "hostile.pt"
    torch.save({"transformer.wte.weight": Hostile(marker)}, ckpt)
    at = run_app()
    at.text_input(key="mi_ckpt_path").input(str(ckpt)).run()
    load(at)
    assert not at.exception
    assert any("hostile.pt" in e and "refused" in e for e in errors(at))
    assert not marker.exists()
    assert at.session_state["mi_selection"] == Selection()
    assert metric(at, "Parameter elements") == "4,080"


def test_missing_checkpoint_shows_error_and_keeps_model(tmp_path):
    at = run_app()
    at.text_input(key="mi_ckpt_path").input(str(tmp_path / "nowhere.safetensors")).run()
    load(at)
    assert not at.exception
    assert any("does not exist" in e for e in errors(at))
    assert at.session_state["mi_selection"] == Selection()


def test_checkpoint_from_safetensors_path_loads(tmp_path):
    from safetensors.torch import save_file

    model = SAMPLES["tiny-gpt2"].build()
    state = {k: v.detach().clone() + 1.0 for k, v in model.state_dict().items()
             if k != "lm_head.weight" and v.is_floating_point()}
    save_file(state, tmp_path / "plus1.safetensors")
    at = run_app()
    at.text_input(key="mi_ckpt_path").input(str(tmp_path / "plus1.safetensors")).run()
    load(at)
    assert not at.exception and not errors(at)
    assert at.session_state["mi_selection"].checkpoint == str(tmp_path / "plus1.safetensors")


@pytest.mark.parametrize("query, needle", [
    ({"device": "cuda:7"}, "cuda:7"),
    ({"device": "tpu"}, "tpu"),
    ({"sample": "no-such-model"}, "no-such-model"),
    ({"model": "sample:llama-70b-meta", "device": "cpu"}, "meta"),
])
def test_bad_url_choice_shows_error_and_keeps_default(query, needle):
    at = run_app(**query)
    assert not at.exception
    assert any(needle in e for e in errors(at)), errors(at)
    assert at.session_state["mi_selection"] == Selection()
    assert metric(at, "Parameter elements") == "4,080"
    # said on the page itself, not only in the sidebar
    assert any("The link asked for" in e.value and needle in e.value for e in at.main.error)
    # Still usable: another sample loads afterwards.
    at.selectbox(key="mi_sample").set_value("frozen-adapter").run()
    load(at)
    assert not at.exception
    assert at.session_state["mi_selection"].source == "sample:frozen-adapter"


def test_url_choice_loads_that_model():
    at = run_app(model="sample:llama-70b-meta", device="meta")
    assert not at.exception and not errors(at)
    assert at.session_state["mi_selection"] == Selection("sample:llama-70b-meta", None, "meta", None)
    # The tensor listing of a 70B model is paged, not drawn in one go.
    listing = [df.value for df in at.dataframe if "requires_grad" in df.value.columns]
    # 723 parameters + 1 buffer (rotary inv_freq): 50 rows a page, 15 pages.
    assert len(listing) == 1 and len(listing[0]) == 50
    assert at.number_input(key="home_tensors_page_15").max == 15
    at.text_input(key="home_tensors_filter").input("layers.79.mlp").run()
    listing = next(df.value for df in at.dataframe if "requires_grad" in df.value.columns)
    assert list(listing["name"]) == [f"layers.79.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]


def _counting_script(counter_path: str, scope: str, clear: bool = False) -> None:
    import streamlit as st

    from ui.cache import cached_analysis, clear_analyses
    from ui.sidebar import model_picker

    loaded = model_picker()
    if clear:
        clear_analyses()

    def count_parameters(model, scale):
        with open(counter_path, "a") as f:
            f.write("x")
        return sum(p.numel() for p in model.parameters()) * scale

    st.metric("counted", cached_analysis(count_parameters, loaded.model, 1, cache_scope=scope,
                                         cache_key=counter_path))


def _counting(counter, scope, clear=False):
    return AppTest.from_function(
        _counting_script, args=(str(counter), scope, clear), default_timeout=60
    ).run()


def test_cached_analysis_is_shared_per_model_across_sessions(tmp_path):
    counter = tmp_path / "calls.txt"
    a = _counting(counter, "model")
    b = _counting(counter, "model")
    a.run()
    assert not a.exception and not b.exception
    assert metric(a, "counted") == metric(b, "counted") == "4080"
    assert counter.read_text() == "x"  # computed once for both sessions and the rerun


def test_clear_analyses_drops_the_models_shared_and_session_results(tmp_path):
    for scope in ("model", "session"):
        counter = tmp_path / f"{scope}.txt"
        a = _counting(counter, scope)
        assert counter.read_text() == "x"
        _counting(counter, scope, clear=True)  # cleared, then computed again
        assert counter.read_text() == "xx"
        if scope == "model":
            _counting(counter, scope)  # a new session finds the recomputed shared result
            assert counter.read_text() == "xx"
        a.run()  # session a's own result is its own (session) or still shared (model)
        assert counter.read_text() == "xx"
        assert metric(a, "counted") == "4080"


def _many_keys_script(counter_path: str) -> None:
    import streamlit as st

    from ui.cache import MAX_SHARED, cached_analysis, clear_analyses, shared_key_count
    from ui.sidebar import model_picker

    loaded = model_picker()

    def numel(model, i):
        if i == MAX_SHARED + 4:
            with open(counter_path, "a") as f:
                f.write("x")
        return i

    for i in range(MAX_SHARED + 5):
        cached_analysis(numel, loaded.model, i, cache_key=counter_path)
    st.metric("held", shared_key_count())
    clear_analyses()
    st.metric("after clear", shared_key_count())
    cached_analysis(numel, loaded.model, MAX_SHARED + 4, cache_key=counter_path)  # cleared: computed again


def test_shared_cache_keys_stay_bounded_and_clear_still_drops_the_newest(tmp_path):
    from ui.cache import MAX_SHARED

    counter = tmp_path / "calls.txt"
    at = AppTest.from_function(_many_keys_script, args=(str(counter),), default_timeout=120).run()
    assert not at.exception
    assert metric(at, "held") == str(MAX_SHARED)  # not MAX_SHARED + 5: the oldest keys went
    assert metric(at, "after clear") == "0"  # every key held was this model's
    assert counter.read_text() == "xx"


def test_a_result_is_computed_once_while_other_callers_wait_and_a_failure_caches_nothing():
    import threading
    import time

    from ui.cache import _Results

    store, calls = _Results(limit=2), []

    def slow() -> int:
        calls.append(1)
        time.sleep(0.2)
        return 7

    threads = [threading.Thread(target=store.get_or_compute, args=(("m", 1), slow)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and store.items[("m", 1)] == 7

    with pytest.raises(ZeroDivisionError):
        store.get_or_compute(("m", 2), lambda: 1 // 0)
    assert ("m", 2) not in store.items and not store.computing
    for i in range(3, 6):
        store.get_or_compute(("n", i), lambda i=i: i)
    assert list(store.items) == [("n", 4), ("n", 5)]  # the least recently used went first
    store.drop_model("n")
    assert not store.items


def test_cached_analysis_session_scope_is_per_session(tmp_path):
    counter = tmp_path / "calls.txt"
    a = _counting(counter, "session")
    a.run()
    assert counter.read_text() == "x"  # the rerun reuses this session's result
    b = _counting(counter, "session")
    assert metric(b, "counted") == "4080"
    assert counter.read_text() == "xx"  # another session computes its own


def _failing_script() -> None:
    import streamlit as st

    from inspector import InspectorError
    from ui.errors import guarded

    with guarded("reading the table"):
        raise InspectorError("tensor lm_head.weight is missing; load a checkpoint that has it")
    with guarded("drawing the chart"):
        raise RuntimeError("shape mismatch in the figure builder")
    st.write("still here")


def test_guarded_shows_user_errors_plainly_and_bugs_with_a_traceback():
    at = AppTest.from_function(_failing_script, default_timeout=30).run()
    assert not at.exception
    assert errors(at)[0] == "tensor lm_head.weight is missing; load a checkpoint that has it"
    assert errors(at)[1].startswith("Something went wrong while drawing the chart: RuntimeError")
    assert len(at.expander) == 1 and "Traceback" in at.expander[0].label
    assert "shape mismatch" in at.expander[0].code[0].value
    assert at.markdown[-1].value == "still here"


def test_uploaded_checkpoint_loads_and_hostile_upload_is_refused(tmp_path):
    from safetensors.torch import save_file

    from ui.uploads import upload_dir

    model = SAMPLES["tiny-gpt2"].build()
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "weights.safetensors")
    at = run_app()
    at.file_uploader(key="mi_upload").upload("weights.safetensors",
                                             (tmp_path / "weights.safetensors").read_bytes()).run()
    load(at)
    assert not at.exception and not errors(at)
    ckpt = at.session_state["mi_selection"].checkpoint
    assert Path(ckpt).parent.parent == upload_dir() and ckpt.endswith("-weights.safetensors")
    # lm_head.weight is not in the file but is tied to transformer.wte.weight, which is.
    tables = [df.value for df in at.dataframe]
    assert any("tie-restored" in set(t.get("code", [])) for t in tables)

    marker = tmp_path / "pwned.txt"
    torch.save({"transformer.wte.weight": Hostile(marker)}, tmp_path / "evil.pt")
    at.file_uploader(key="mi_upload").upload("evil.pt", (tmp_path / "evil.pt").read_bytes()).run()
    load(at)
    assert not at.exception
    assert any("evil.pt" in e and "refused" in e for e in errors(at))
    assert not marker.exists()
    assert at.session_state["mi_selection"].checkpoint == ckpt  # the previous model stays


def test_local_hugging_face_folder_loads(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config)
    hf.save_pretrained(tmp_path / "tiny-hf")
    unique = sum(p.numel() for p in hf.parameters())
    at = run_app()
    at.radio(key="mi_kind").set_value("Hugging Face folder").run()
    at.text_input(key="mi_hf").input(str(tmp_path / "tiny-hf")).run()
    load(at)
    assert not at.exception and not errors(at)
    assert at.session_state["mi_selection"].source == f"hf:{tmp_path / 'tiny-hf'}"
    assert metric(at, "Parameter elements") == f"{unique:,}"
    # lm_head.weight is tied to transformer.wte.weight: 32 * 16 = 512 elements counted twice.
    assert metric(at, "Counting every alias") == f"{unique + 512:,}"


def test_folder_without_config_is_a_clear_error(tmp_path):
    at = run_app()
    at.radio(key="mi_kind").set_value("Hugging Face folder").run()
    at.text_input(key="mi_hf").input(str(tmp_path)).run()
    load(at)
    assert not at.exception
    assert any("no config.json" in e for e in errors(at))
    assert at.session_state["mi_selection"] == Selection()


def test_leaving_a_structure_only_sample_goes_back_to_the_cpu():
    at = run_app(model="sample:llama-70b-meta", device="meta")
    at.selectbox(key="mi_sample").set_value("cnn-bn").run()
    assert at.selectbox(key="mi_device_any").value == "cpu"
    load(at)
    assert not at.exception and not errors(at)
    assert at.session_state["mi_selection"] == Selection("sample:cnn-bn", None, "cpu", None)


def test_home_findings_name_the_alias_and_views_have_titles():
    at = run_app()
    findings = next(df.value for df in at.dataframe if "code" in df.value.columns)
    row = findings[findings["code"] == "aliases-present"].iloc[0]
    assert row["where"] == "lm_head.weight"
    assert row["message"].startswith("1 parameter name is an alias of another name")
    # the sidebar and the page give one size for the model: parameters and buffers
    assert "16.2 KiB with buffers" in " ".join(c.value for c in at.sidebar.caption)
    assert any(c.value.startswith("16.2 KiB in all") for c in at.main.caption)
    assert "lm_head.weight is transformer.wte.weight" in row["message"]
    links = [link.proto.label for link in at.get("page_link")]
    assert links[:3] == ["Alias graph", "Flatten map & gradients", "Device map"]


def test_big_counts_fit_and_stay_exact_in_help():
    at = run_app(model="sample:llama-70b-meta", device="meta")
    assert not at.exception and not errors(at)
    shown = next(m for m in at.metric if m.label == "Parameter elements")
    assert shown.value == "69.0 billion" and shown.proto.help.startswith("68,976,648,192")
    table = next(df for df in at.dataframe if "elements" in df.value.columns)
    assert table.value["elements"].tolist() == [68_976_648_192, 64]  # parameters, the rotary buffer
    assert table.value["size"].tolist()[0] == "257.0 GiB"
    # every column is wide enough for its widest value, written with thousands separators
    import json

    widths = {c: cfg.get("width") for c, cfg in json.loads(table.proto.columns).items()}
    assert widths["elements"] >= len("68,976,648,192") * 8 and "bytes" not in widths  # sizes read "257.0 GiB"


def test_device_picker_value_is_the_device_name():
    from inspector import available_devices

    at = run_app()
    picker = at.selectbox(key="mi_device_any")
    assert picker.value == "cpu" and picker.options[0] == "cpu"  # the label carries no live memory
    captions = " ".join(c.value for c in at.sidebar.caption)
    if not any(d.kind in ("cuda", "mps") for d in available_devices()):
        assert "No GPU found on this server" in captions
    assert "free on cpu" in captions
