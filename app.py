"""Model Inspector: home page — what the tool is, the loaded model in numbers, and its findings."""

from __future__ import annotations

import shlex
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from inspector import LoadedModel, format_bytes, format_count, model_summary, summary_findings, tensor_table
from inspector.utils import markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.navigation import all_views, navigation
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table, show_frame
from ui.tree_view import model_tree_section


def home() -> None:
    """The home page: what the tool is, the loaded model in numbers, and its findings."""
    st.title("Model Inspector")
    st.markdown(
        "Model Inspector loads a PyTorch model onto the device you choose and shows what silently "
        "breaks training and multi-GPU inference: tensors that are secretly one tensor, where each "
        "parameter sits in the flat vector and how big its gradient is, which device holds every "
        "parameter *and buffer*, and what each layer really output. "
        "Pick a model in the sidebar, read its summary and findings here, then open a view.")

    loaded = model_picker()

    with st.container(border=True):
        st.markdown("**What each view answers**")
        for view in all_views():
            c1, c2 = st.columns([1, 3], vertical_alignment="center")
            with c1:
                st.page_link(view.file, label=view.title, icon=view.icon)
            c2.markdown(view.question)

    if loaded is None:
        st.info("No model is loaded. Pick one in the sidebar.")
        return
    _summary(loaded)
    _tree_and_tensors(loaded)
    _command_line()


def _summary(loaded: LoadedModel) -> None:
    """The model in numbers, bytes by dtype and device, and its findings."""
    with guarded("summarising the model"):
        s = cached_analysis(model_summary, loaded.model)
        st.subheader(f"{markdown_text(loaded.name)} on {markdown_text(loaded.device)}"
                     + (" (structure only)" if loaded.is_meta else ""))
        cols = [*st.columns(3), *st.columns(3)]  # two rows: "69.0 billion" needs the room
        cols[0].metric("Modules", format_count(s.modules), help=f"{s.modules:,} modules")
        cols[1].metric(
            "Parameter elements",
            format_count(s.parameter_elements),
            help=f"{s.parameter_elements:,}: each Parameter object once, as parameters() yields them",
        )
        cols[2].metric(
            "Counting every alias",
            format_count(s.parameter_elements_with_aliases),
            delta=f"+{format_count(s.aliased_elements)} aliased" if s.aliased_elements else "no aliases",
            delta_color="off",
            delta_arrow="off",
            help=f"{s.parameter_elements_with_aliases:,}: named_parameters(remove_duplicate=False), "
            "a tied tensor counted once per name",
        )
        cols[3].metric(
            "Trainable", format_count(s.trainable_elements), help=f"{s.trainable_elements:,} elements"
        )
        cols[4].metric("Frozen", format_count(s.frozen_elements), help=f"{s.frozen_elements:,} elements")
        cols[5].metric(
            "Buffers",
            format_count(s.buffers),
            delta=f"{format_count(s.buffer_elements)} elements",
            delta_color="off",
            delta_arrow="off",
            help=f"{s.buffers:,} buffers, {s.buffer_elements:,} elements",
        )

        st.markdown("**Bytes by dtype and device**")
        show_frame(s.bytes_table.rename(columns={"bytes": "size"})
                   .assign(size=s.bytes_table["bytes"].map(format_bytes)), width="content")
        total = int(s.bytes_table["bytes"].sum()) if len(s.bytes_table) else 0
        st.caption(f"{format_bytes(total)} in all"
                   + (" — on the meta device nothing is allocated; this is what it would take."
                      if loaded.is_meta else "."))
        st.markdown("**Findings, most severe first**")
        findings_table(loaded.findings + summary_findings(s), "home_findings",
                       empty="Loading found nothing to report.")


def _tree_and_tensors(loaded: LoadedModel) -> None:
    """The module tree and every parameter and buffer."""
    with guarded("drawing the model tree"):
        model_tree_section(loaded)

    with guarded("listing the tensors"):
        with st.expander("Parameters and buffers", expanded=False):
            listing: pd.DataFrame = cached_analysis(tensor_table, loaded.model)
            paged_table(listing, "home_tensors", caption="every name, aliases included")


def _command_line() -> None:
    """The same model from the command line, or as a link."""
    sel = st.session_state["mi_selection"]
    with st.expander("The same model from the command line, or as a link"):
        args = [sel.source, "--device", sel.device]
        args += ["--dtype", sel.dtype] if sel.dtype else []
        args += ["--checkpoint", sel.checkpoint] if sel.checkpoint else []
        quoted = " ".join(shlex.quote(a) for a in args)
        commands = {"summary": "", "aliases": "", "offsets": "", "devicemap": "", "capture": "",
                    "report": " -o report.html"}
        st.code("\n".join(f"python -m inspector {cmd} {quoted}{extra}" for cmd, extra in commands.items()),
                language="bash")
        query = {"model": sel.source, "device": sel.device, **({"dtype": sel.dtype} if sel.dtype else {})}
        st.caption("Open the dashboard with this model already chosen (uploads are not part of the link):")
        st.code(f"?{urlencode(query)}", language="text")


def main() -> None:
    st.set_page_config(
        page_title="Model Inspector", layout="wide"
    )  # a Material page icon is fetched from the web
    navigation(home).run()


main()
