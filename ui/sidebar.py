"""The sidebar model picker every page calls first.

With a folder named ``pages/`` Streamlit runs each page on its own, so every page calls
:func:`model_picker`; the choice lives in ``st.session_state['mi_selection']`` (a
:class:`ui.models.Selection`) and survives page switches. The model itself is cached for
the whole server (:mod:`ui.models`).

The first run of a session also reads the URL: ``?model=sample:gpt2-small&device=meta&dtype=float16``
(``sample=<name>`` is short for ``model=sample:<name>``).
"""

from __future__ import annotations

import re
import time

import streamlit as st

from inspector import (
    DeviceInfo,
    Finding,
    InspectorError,
    LoadedModel,
    available_devices,
    format_bytes,
    format_count,
    model_summary,
    sort_findings,
)
from inspector.distributed import dcp_listing, is_dcp_folder
from inspector.loading import DTYPES, allowed_model_dirs, default_max_bytes
from inspector.placement import parse_size
from inspector.structure import model_bytes
from inspector.utils import grid_frame, markdown_code, markdown_text
from sample_models import SAMPLES

from .cache import cached_analysis
from .errors import finding_markdown, guarded, install_page_handler, show_error
from .models import Selection, get_loaded
from .paths import server_path
from .uploads import session_uploads, sweep_once

SELECTION = "mi_selection"
_QUERY_DONE = "mi_query_applied"
_LAST_LOAD = "mi_last_load"
_QUERY_FAILED = "mi_query_failed"
KINDS = ["Sample", "Python file", "Hugging Face folder"]
MODEL_FILES_ARE_CODE = ("A model file is Python code: loading it runs it in this server, with the server's "
                        "rights, for every session. It can read files, change settings or end the server "
                        "(os._exit). Load only files you trust; checkpoints and Hugging Face folders never "
                        "run code.")
AS_BUILT = "(as built)"


def current_selection() -> Selection:
    """This session's selection (the default ``tiny-gpt2`` on the CPU until the user picks)."""
    sel = st.session_state.get(SELECTION)
    if not isinstance(sel, Selection):
        sel = st.session_state[SELECTION] = Selection()
    return sel


def _severity_call(f: Finding):
    return st.error if f.severity == "error" else st.warning if f.severity == "warning" else st.info


def load_selection(wanted: Selection) -> LoadedModel | None:
    """Load ``wanted`` with progress in an ``st.status``; on success it becomes the selection.

    On failure the message is shown and the previous model stays selected.
    """
    failure: BaseException | None = None
    with st.status(f"Loading {markdown_text(wanted.label)}…", expanded=True) as status:
        st.write(f"Source {markdown_code(wanted.source)}"
                 + (f", checkpoint {markdown_code(wanted.checkpoint)}" if wanted.checkpoint else ""))
        t0 = time.perf_counter()
        try:
            loaded = get_loaded(wanted)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failed load keeps the previous model
            failure = exc
            status.update(label=f"Loading {markdown_text(wanted.label)} failed; the previous model is still "
                                "loaded", state="error", expanded=True)
        else:
            st.write(
                f"Built and placed on {markdown_code(loaded.device)} in {time.perf_counter() - t0:.1f} s."
            )
            findings = sort_findings(loaded.findings)
            for f in findings[:8]:
                _severity_call(f)(finding_markdown(f))
            if len(findings) > 8:
                st.caption(f"…and {len(findings) - 8} more on the home page.")
            if not findings:
                st.write("Loading found nothing to report.")
            status.update(label=f"Loaded {markdown_text(wanted.label)}", state="complete",
                          expanded=bool(findings))
    if failure is not None:  # the reason stands outside the status box, so it is never folded away
        show_error(failure, f"loading {wanted.label}")
        st.session_state[_LAST_LOAD] = ("error", wanted.label)
        return None
    st.session_state[SELECTION] = wanted
    st.session_state[_LAST_LOAD] = ("ok", wanted.label)
    return loaded


def _apply_query_params() -> None:
    """Once per session: load the model named in the URL, if any."""
    if st.session_state.get(_QUERY_DONE):
        return
    st.session_state[_QUERY_DONE] = True
    qp = st.query_params
    source = qp.get("model") or (f"sample:{qp['sample']}" if qp.get("sample") else None)
    if not source and not qp.get("device") and not qp.get("dtype"):
        return
    sel = current_selection()
    wanted = Selection(source or sel.source, qp.get("checkpoint") or None,
                       qp.get("device") or sel.device, qp.get("dtype") or None)
    if wanted != sel and load_selection(wanted) is None:
        st.session_state[_QUERY_FAILED] = wanted.label


_FREE = re.compile(r"\s*\([^()]* of [^()]* free\)")


def device_label(devices: list[DeviceInfo], name: str) -> str:
    """The picker's label for a device: fixed text, without the live free memory.

    The widget's value stays the device name; a label that changed between two runs (free
    memory does) would no longer match the option the browser sent back.

    >>> device_label([DeviceInfo("cpu", "cpu (20.0 GiB of 23.5 GiB free)", "cpu")], "cpu")
    'cpu'
    """
    label = next((d.label for d in devices if d.name == name), name)
    return "meta (structure only)" if name == "meta" else _FREE.sub("", label)


def _memory_caption(devices: list[DeviceInfo], name: str) -> str:
    info = next((d for d in devices if d.name == name), None)
    free = "" if info is None or info.free_bytes is None or info.total_bytes is None else \
        f"{format_bytes(info.free_bytes)} of {format_bytes(info.total_bytes)} free on {name}. "
    gpus = [d for d in devices if d.kind in ("cuda", "mps")]
    return free + ("" if gpus else "No GPU found on this server: cpu and meta only.")


def _source_inputs(sel: Selection) -> tuple[str, bool]:
    """Source widgets; returns the source string and whether it is a structure-only sample."""
    kind_now = ("Sample" if sel.source.startswith("sample:") else
                "Hugging Face folder" if sel.source.startswith("hf:") else "Python file")
    kind = st.radio("Source", KINDS, index=KINDS.index(kind_now), horizontal=True, key="mi_kind")
    if kind == "Sample":
        names = list(SAMPLES)
        current = sel.source.removeprefix("sample:")
        name = st.selectbox("Sample", names, index=names.index(current) if current in names else 0,
                            key="mi_sample")
        st.caption(SAMPLES[name].description)
        return f"sample:{name}", SAMPLES[name].meta_only
    if kind == "Python file":
        source = st.text_input("File and factory", value=sel.source if kind_now == kind else "",
                               placeholder="sample_models/small.py:ConvNet", key="mi_file",
                               help="A Python file and a function or class in it that returns an "
                                    "nn.Module. Optional module-level example_inputs(batch_size) "
                                    "and loss(outputs, inputs) are used too.")
        st.caption("Allowed folders: " + ", ".join(markdown_code(d) for d in allowed_model_dirs())
                   + " (add more with INSPECTOR_MODEL_DIRS).")
        st.warning(MODEL_FILES_ARE_CODE, icon=":material/warning:")
        return source.strip(), False
    path = st.text_input(
        "Local model folder",
        value=sel.source.removeprefix("hf:") if kind_now == kind else "",
        placeholder="/models/gpt2 (with config.json)",
        key="mi_hf",
    )
    return (f"hf:{path.strip()}" if path.strip() else ""), False


def _max_size_input(sel: Selection, source: str) -> str | None:
    """The largest Hugging Face model to build, as the user typed it (None: the server's default)."""
    if not source.startswith("hf:"):
        return sel.max_model_size
    text = st.text_input(
        "Largest model",
        value=sel.max_model_size or "",
        key="mi_max_size",
        placeholder=f"default {format_bytes(default_max_bytes())}",
        help="The folder's config.json is sized on the meta device first; a larger model "
        "is refused before anything is built. E.g. 40GiB. The folder cannot change this.",
    )
    if not text.strip():
        return None
    with guarded("reading the largest model size"):
        parse_size(text.strip(), "Largest model")
        return text.strip()
    return sel.max_model_size


def _previewable(typed: str) -> str | None:
    """A typed checkpoint path the gate lets through (:func:`ui.paths.server_path`), to preview; None
    otherwise (loading it then says why)."""
    if not typed.strip():
        return None
    try:
        return server_path(typed)
    except InspectorError:
        return None


def _checkpoint_inputs(sel: Selection) -> str | None:
    with st.expander("Checkpoint (optional)", expanded=bool(sel.checkpoint)):
        upload = st.file_uploader("Upload .safetensors / .pt / .bin", key="mi_upload",
                                  type=["safetensors", "pt", "pth", "bin"],
                                  help="Read with safetensors or torch.load(weights_only=True); "
                                       "nothing in it is executed.")
        path = st.text_input("…or a path on the server", value=sel.checkpoint or "", key="mi_ckpt_path",
                             help="A file, or a torch.distributed.checkpoint folder (put together here)")
        folder = _previewable(path)
        if folder and is_dcp_folder(folder):
            with guarded("reading the distributed checkpoint"):
                listing = dcp_listing(folder)
                st.caption(
                    f"Distributed checkpoint: {len(listing)} entries in {int(listing['pieces'].sum())} pieces"
                )
                st.dataframe(grid_frame(listing[["name", "shape", "pieces"]].astype(str)), hide_index=True,
                             height=160)
    if upload is not None:
        with guarded("storing the upload"):
            return session_uploads().save(upload.name, upload.getvalue())
        return None
    return path.strip() or None


def model_picker() -> LoadedModel | None:
    """Draw the picker in the sidebar and return the selected LoadedModel (None if it failed).

    A failed load shows its message and keeps the previous model, so the page stays usable.
    """
    install_page_handler()
    sweep_once()
    with st.sidebar:
        st.header(":material/model_training: Model")
        _apply_query_params()
        sel = current_selection()
        source, meta_only = _source_inputs(sel)
        devices = available_devices()
        names = [d.name for d in devices]
        was_meta_only = sel.source.startswith("sample:") and getattr(
            SAMPLES.get(sel.source.removeprefix("sample:")), "meta_only", False)
        default_dev = ("meta" if meta_only else
                       "cpu" if was_meta_only or sel.device not in names else sel.device)
        device = st.selectbox("Device", names, index=names.index(default_dev),
                              format_func=lambda n: device_label(devices, n),
                              key=f"mi_device_{'meta' if meta_only else 'any'}",
                              help="Every device on this server; meta keeps the structure without "
                                   "any memory (structure views only).")
        if device not in names:  # never a label: fall back to the device it names, or the default
            device = next((n for n in names if str(device).startswith(n)), default_dev)
        st.caption(_memory_caption(devices, device))
        dtypes = [AS_BUILT, *DTYPES]
        dtype = st.selectbox("Dtype", dtypes, index=dtypes.index(sel.dtype) if sel.dtype in dtypes else 0,
                             key="mi_dtype")
        checkpoint = _checkpoint_inputs(sel)
        max_size = _max_size_input(sel, source)
        wanted = Selection(source, checkpoint, device, None if dtype == AS_BUILT else dtype, max_size)
        changed = wanted != sel
        slot = st.empty()
        if slot.button("Load model" if changed else "Loaded", type="primary" if changed else "secondary",
                       icon=None if changed else ":material/check:",
                       disabled=not changed, key="mi_load", width="stretch"):
            if not source:
                st.error("Give a source first: a sample, a `file.py:factory` or a model folder.")
            elif load_selection(wanted) is not None:
                slot.button(
                    "Loaded", icon=":material/check:", disabled=True, key="mi_loaded_now", width="stretch"
                )
        sel = current_selection()
        loaded = None
        with guarded("loading the model"):
            loaded = get_loaded(sel)
        if loaded is None and sel != Selection():
            st.warning("Falling back to the default model.")
            st.session_state[SELECTION] = sel = Selection()
            with guarded("loading the default model"):
                loaded = get_loaded(sel)
        if loaded is not None:
            _loaded_caption(loaded)
    failed = st.session_state.pop(_QUERY_FAILED, None)
    if failed:  # the link's model failed: say so where the reader looks, not only in the sidebar
        st.error(f"The link asked for {markdown_code(failed)}, which could not be loaded (the reason is in "
                 f"the sidebar). Showing {markdown_code(current_selection().label)} instead.")
    return loaded


def _loaded_caption(loaded: LoadedModel) -> None:
    n = cached_analysis(model_summary, loaded.model).parameter_elements
    size = cached_analysis(model_bytes, loaded.model)  # parameters and buffers, as every page counts them
    st.caption(f"Loaded **{markdown_text(loaded.name)}** on {markdown_code(loaded.device)}"
               + (f" as {markdown_code(loaded.dtype)}" if loaded.dtype else "")
               + f" · {format_count(n)} parameter elements, {format_bytes(size)} with buffers"
               + (" · structure only" if loaded.is_meta else ""))
    if loaded.findings:
        worst = sort_findings(loaded.findings)
        with st.expander(f"Findings of loading ({len(worst)})", expanded=worst[0].severity == "error"):
            for f in worst[:10]:
                _severity_call(f)(finding_markdown(f))
            if len(worst) > 10:
                st.caption(f"…{len(worst) - 10} more on the home page.")
