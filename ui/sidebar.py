"""The sidebar model picker every page calls first."""

from __future__ import annotations

import streamlit as st

from inspector.devices import available_devices
from inspector.findings import InspectorError, sort_findings
from inspector.models import DTYPES
from sample_models import SAMPLES

from .errors import guarded
from .models import Selection, get_loaded, save_upload

SELECTION = "mi_selection"


def current_selection() -> Selection:
    if SELECTION not in st.session_state:
        st.session_state[SELECTION] = Selection()
    return st.session_state[SELECTION]


def model_picker():
    """Draw the picker in the sidebar and return the selected LoadedModel (None if it failed)."""
    sel = current_selection()
    with st.sidebar:
        st.header("Model")
        kinds = ["Sample", "Python file", "Hugging Face folder"]
        kind_now = ("Sample" if sel.source.startswith("sample:") else
                    "Hugging Face folder" if sel.source.startswith("hf:") else "Python file")
        kind = st.radio("Source", kinds, index=kinds.index(kind_now), horizontal=True, key="mi_kind")
        if kind == "Sample":
            names = list(SAMPLES)
            current = sel.source.removeprefix("sample:") if kind_now == "Sample" else names[0]
            name = st.selectbox("Sample", names, index=names.index(current), key="mi_sample")
            st.caption(SAMPLES[name].description)
            source = f"sample:{name}"
        elif kind == "Python file":
            source = st.text_input("File and factory", value="" if kind_now != kind else sel.source,
                                   placeholder="sample_models/small.py:ConvNet", key="mi_file")
        else:
            path = st.text_input("Local model folder", key="mi_hf",
                                 value="" if kind_now != kind else sel.source.removeprefix("hf:"))
            source = f"hf:{path}" if path else ""
        devices = available_devices()
        dev_names = [d.name for d in devices]
        default_dev = "meta" if kind == "Sample" and SAMPLES[name].meta_only else \
            (sel.device if sel.device in dev_names else "cpu")
        device = st.selectbox("Device", dev_names, index=dev_names.index(default_dev),
                              format_func=lambda n: next(d.label for d in devices if d.name == n),
                              key=f"mi_device_{source}")
        dtypes = ["(as built)", *DTYPES]
        dtype = st.selectbox("Dtype", dtypes, index=dtypes.index(sel.dtype or "(as built)"), key="mi_dtype")
        with st.expander("Checkpoint (optional)"):
            upload = st.file_uploader("Upload .safetensors / .pt / .bin",
                                      type=["safetensors", "pt", "pth", "bin"], key="mi_upload")
            ckpt_path = st.text_input("…or a path on the server", key="mi_ckpt_path")
        checkpoint = save_upload(upload.name, upload.getvalue()) if upload is not None else (ckpt_path or None)
        wanted = Selection(source, checkpoint, device, None if dtype == "(as built)" else dtype)
        if wanted != sel and st.button("Load model", type="primary", key="mi_load"):
            if not source:
                st.error("Give a source first.")
            else:
                with st.status(f"Loading {source} on {device}…", expanded=False) as status:
                    try:
                        get_loaded(wanted)
                    except InspectorError as exc:
                        status.update(label="Loading failed", state="error")
                        st.error(str(exc))
                    else:
                        st.session_state[SELECTION] = sel = wanted
                        status.update(label=f"Loaded {source}", state="complete")
        loaded = None
        with guarded("loading the model"):
            loaded = get_loaded(sel)
        if loaded is not None:
            st.caption(f"Loaded: **{loaded.name}** on `{loaded.device}`"
                       + (f", `{loaded.dtype}`" if loaded.dtype else ""))
            for f in sort_findings(loaded.findings)[:5]:
                (st.error if f.severity == "error" else st.warning if f.severity == "warning"
                 else st.info)(f"{f.code}: {f.message}")
    return loaded
