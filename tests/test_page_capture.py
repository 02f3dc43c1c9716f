"""The Hook captures page: stats, mutated modules, figures, errors, per-session results."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.apptest import run_page


def _run(source: str | None = None) -> AppTest:
    return run_page("4_Hook_captures.py", source)


def test_cnn_mutated_modules_stats_and_figures():
    at = _run("sample:cnn-bn")
    assert not at.error
    warning = " ".join(w.value for w in at.warning)
    assert "`conv1` overwritten by `relu1`" in warning and "`bn2` overwritten by `relu2`" in warning
    stats = at.dataframe[0].value
    assert list(stats["module"]) == ["conv1", "relu1", "conv2", "bn2", "relu2", "pool", "fc"]
    assert at.selectbox(key="cap_show").value == "conv1"  # the first corrupted capture is shown
    assert [c.key for c in at.get("plotly_chart")] == ["cap_hist", "cap_heatmap", "cap_clone_vs_bare"]

    # a pattern, in inference mode: mutations are found by comparing values
    at.text_input(key="cap_patterns").set_value("conv*, bn2")
    at.radio(key="cap_mode").set_value("inference_mode").run()
    assert not at.exception and not at.error
    assert list(at.dataframe[0].value["module"]) == ["conv1", "conv2", "bn2"]
    assert "seen by value" in " ".join(w.value for w in at.warning)


def test_unknown_module_and_zero_budget():
    at = _run("sample:cnn-bn")
    at.text_input(key="cap_patterns").set_value("conv3").run()
    assert not at.exception
    assert any("close names: conv2, conv1" in e.value for e in at.error)

    at.text_input(key="cap_patterns").set_value("").run()
    at.number_input(key="cap_budget").set_value(0.0).run()
    assert not at.exception and not at.error
    assert at.metric[0].value == "0"  # nothing captured
    assert at.metric[3].value == "7"  # every module listed as skipped
    assert not at.success  # no "nothing was changed in place": conv1 and bn2 are, but were not captured
    assert any(w.value.startswith("Nothing was captured: the byte budget of 0 MiB left out all 7") and
               "**Budget (MiB)**" in w.value for w in at.warning)
    assert "capture-budget-zero" in set(at.dataframe[-1].value["code"])


def test_sessions_keep_their_own_captures():
    a = _run("sample:cnn-bn")
    b = _run("sample:cnn-bn")
    a.text_input(key="cap_patterns").set_value("fc").run()
    assert not a.exception
    caps_a = next(iter(a.session_state["cap_results"].values()))
    caps_b = next(iter(b.session_state["cap_results"].values()))
    assert caps_a is not caps_b
    assert caps_a.order == ["fc"] and len(caps_b.order) == 7


def test_default_tiny_gpt2():
    at = _run()
    assert not at.error
    assert any("No captured output was changed" in s.value for s in at.success)
    assert at.metric[0].value == str(len(at.dataframe[0].value))
    assert at.button(key="cap_again").label == "Capture again"  # drawn on the run that captured


def test_mid_size_model_waits_for_the_button(mid_size_model):
    at = _run(mid_size_model)
    assert not at.error
    assert not at.session_state["cap_results"]  # nothing captured on first render
    assert not at.metric and not at.get("plotly_chart")
    assert any("18.0 MiB" in i.value and "waits for the button" in i.value for i in at.info)
    at.run()  # a rerun does not capture either
    assert not at.session_state["cap_results"]

    at.button(key="cap_again").click().run()
    assert not at.exception and not at.error
    assert list(at.dataframe[0].value["module"]) == ["0", "1", "2"]
    assert at.metric[0].value == "3"
    at.run()  # the capture stays on later reruns, and the button now offers to capture again
    assert at.metric[0].value == "3" and at.button(key="cap_again").label == "Capture again"


def test_capture_stats_put_nan_and_inf_first_and_read_as_numbers():
    import pandas as pd

    from ui.run_captures import stats_layout

    stats = pd.DataFrame(
        {
            "module": ["gate"],
            "kind": ["output"],
            "path": [""],
            "shape": ["(16, 16)"],
            "dtype": ["float32"],
            "device": ["cpu"],
            "bytes": [1024],
            "mean": [0.2],
            "std": [0.8],
            "min": [-6.1e-10],
            "max": [5.6],
            "nan": [2],
            "inf": [0],
            "zero_fraction": [0.11],
            "mutated": [False],
        }
    )
    layout = stats_layout(stats)
    assert layout["column_order"][:6] == ["module", "kind", "shape", "dtype", "nan", "inf"]
    assert sorted(layout["column_order"]) == sorted(set(stats.columns) - {"path"})  # every path empty
    assert "path" in stats_layout(stats.assign(path=["[0]"]))["column_order"]
    assert layout["column_config"]["min"]["type_config"]["format"] == "%.4g"
    assert layout["column_config"]["nan"]["label"] == "NaN"


def test_a_wide_table_keeps_its_first_column_whole_whatever_order_its_settings_come_in():
    import pandas as pd
    import streamlit as st

    from ui.tables import fit_columns

    # the row names come first; the settings name other columns first (as a page's number formats do)
    df = pd.DataFrame({"module": ["transformer.h.0.attn.c_attn"], "note": ["x" * 200], "other": ["y" * 200],
                       "min": [1.5]})
    config = fit_columns(df, {"min": st.column_config.NumberColumn(format="%.4g")})
    assert config["module"]["width"] >= len("transformer.h.0.attn.c_attn") * 8
    assert config["note"]["width"] < 480  # the wide text columns give way instead
