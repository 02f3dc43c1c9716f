"""The home page's model tree: the module hierarchy (a treemap) sized by bytes, coloured by a lens,
searchable, and the selected module's tensors with their badges and the pages that explain them."""

from __future__ import annotations

from functools import partial

import pandas as pd
import streamlit as st

from inspector import LENSES, ModuleTree, format_bytes, gradient_report, module_tree, tensor_badges
from inspector.figures import module_tree_figure, shown_level
from inspector.utils import markdown_code, module_label

from .cache import cached_analysis
from .tables import paged_table

GRADS = "offsets_grads"     # per session: {model key: LossGradients}, written by the Flatten map page
CAPTURES = "cap_results"    # per session: {run key: Captures}, written by the Hook captures page
BADGE_PAGES = {             # badge kind -> (page that explains it, what it says there)
    "tied": ("pages/1_Alias_graph.py", "tied to / view of: Alias graph"),
    "view": ("pages/1_Alias_graph.py", "tied to / view of: Alias graph"),
    "dtype": ("pages/1_Alias_graph.py", "dtype conversions and ties: Alias graph"),
    "device": ("pages/3_Device_map.py", "device and buffers: Device map"),
    "buffer": ("pages/3_Device_map.py", "device and buffers: Device map"),
    "grad": ("pages/2_Flatten_map.py", "grad norm and frozen: Flatten map"),
    "frozen": ("pages/2_Flatten_map.py", "grad norm and frozen: Flatten map"),
    "captured": ("pages/4_Hook_captures.py", "captured outputs: Hook captures"),
}
MAX_TENSORS = 200


def session_tree(loaded) -> ModuleTree:
    """The loaded model's tree, with this session's gradients and captures when it has them."""
    key = st.session_state["mi_selection"].key
    grads = st.session_state.get(GRADS, {}).get(key)
    caps = [c for k, c in st.session_state.get(CAPTURES, {}).items() if k[0] == key]
    if grads is None and not caps:
        return cached_analysis(module_tree, loaded.model)
    with loaded.lock:
        # The lambda keeps the gradients out of the cache key (hashing them would read every value);
        # cache_key stands for them.
        report = None if grads is None else cached_analysis(
            lambda model: gradient_report(model, grads=grads.grads), loaded.model, cache_scope="session",
            cache_key=("tree gradients", id(grads)))
    captured = sorted({m for c in caps for m in c.outputs})
    mutated = sorted({m for c in caps for m in c.mutated})
    return cached_analysis(module_tree, loaded.model, report, captured=captured, mutated=mutated,
                           cache_scope="session", cache_key=(id(grads), tuple(id(c) for c in caps)))


def tensor_frame(tree: ModuleTree, module: str) -> pd.DataFrame:
    """The tensors at and below ``module`` with their badges, as the table shows them."""
    t = tree.tensors
    below = t[(t["module"] == module) | t["module"].str.startswith(module + ".")] if module else t
    rows = below.head(MAX_TENSORS)
    return pd.DataFrame(
        {
            "name": rows["name"],
            "kind": rows["kind"],
            "shape": rows["shape"],
            "size": rows["bytes"].map(format_bytes),
            "badges": [" · ".join(text for _, text in tensor_badges(r)) for _, r in rows.iterrows()],
        }
    )


def clicked_module(points: list, modules: list[str]) -> str | None:
    """The module of the box clicked in the treemap (``points``: the chart's selection), or None.

    The point's number indexes ``modules`` (the tree's rows, the order the figure draws them); its
    id (``"/h.0"``, see :func:`inspector.figures.tree.node_id`) is the fallback.

    >>> clicked_module([{"pointNumber": 1, "id": "/h.0"}], ["", "h.0"]), clicked_module([], ["", "h.0"])
    ('h.0', None)
    """
    if not points:
        return None
    point = points[0]
    number = point.get("pointNumber", point.get("point_number"))
    if isinstance(number, int) and 0 <= number < len(modules):
        return modules[number]
    node = point.get("id")
    if isinstance(node, str) and node.startswith("/") and node[1:] in modules:
        return node[1:]
    return None


def _clicked(modules: list[str]) -> None:
    """A box clicked: its module becomes the module picked (the search is emptied when it would hide it),
    so the tree's zoom, the picker and the tensor table agree."""
    event = st.session_state.get("home_tree")
    picked = clicked_module(list(event.selection.points) if event and event.selection else [], modules)
    if picked is None:
        return
    query = str(st.session_state.get("home_tree_search") or "").strip().lower()
    if query and query not in picked.lower():
        st.session_state["home_tree_search"] = ""
    st.session_state["home_tree_module"] = picked


def model_tree_section(loaded) -> None:
    """Draw the model tree: lens, search, module, the treemap, and the module's tensors."""
    st.subheader("Model tree")
    tree = session_tree(loaded)
    devices = {d for d in tree.modules["device"].astype(str) if d not in ("none", "mixed", "several")}
    default = "device" if len(devices) > 1 else "module kind"  # one device would colour every box alike
    lens = st.segmented_control("Colour by", LENSES, default=default, key="home_tree_lens") or default
    c2, c3 = st.columns([2, 3])
    query = c2.text_input("Search modules", key="home_tree_search", placeholder="attn, mlp.c_fc, Linear…",
                          help="Part of a module name or class; the module list below keeps the matches")
    matches = tree.search(query)
    if not matches:
        c3.warning(f"No module name or class contains {markdown_code(query)}.")
        matches = [""]
    focus = c3.selectbox(f"Module ({len(matches):,} of {len(tree.modules):,})", matches,
                         format_func=module_label, key="home_tree_module",
                         help="The tree opens at this module, outlined in red")
    notes = {"gradient norm": None if tree.has_gradients else
             "No gradients in this session yet: run a backward pass on the Flatten map page.",
             "captured": None if tree.has_captures else
             "Nothing captured in this session yet: capture on the Hook captures page."}
    if notes.get(lens):
        st.info(notes[lens])
    st.plotly_chart(module_tree_figure(tree, lens, focus=focus or ""), key="home_tree",
                    selection_mode="points", on_select=partial(_clicked, tree.modules["id"].tolist()))
    level = shown_level(tree, focus or "")
    if level != (focus or ""):
        st.caption(f"{markdown_code(focus)} holds no bytes of its own (a tied tensor is counted at its first "
                   f"holder), so the tree opens at {markdown_code(module_label(level))}.")
    st.caption("Area is bytes: each tensor counted once, at the module that holds it first (a tied "
               "weight's second holder adds nothing). Click a box to pick its module (the list and the "
               "tensors below follow) and go down; the bar above goes back up. "
               "Modules without tensors (activations, dropout) have no area; find them with the search.")
    frame = tensor_frame(tree, focus or "")
    st.markdown(f"**Tensors at and below {markdown_code(module_label(focus))}**")
    paged_table(
        frame,
        "home_tree_tensors",
        page_size=25,
        caption="" if len(frame) < MAX_TENSORS else f"the first {MAX_TENSORS:,}; narrow with the search",
    )
    kinds = {kind for _, r in tree.tensors.loc[frame.index].iterrows() for kind, _ in tensor_badges(r)}
    if lens == "captured":
        kinds.add("captured")
    links = dict.fromkeys(BADGE_PAGES[k] for k in sorted(kinds) if k in BADGE_PAGES)
    if links:
        cols = st.columns(len(links))
        for col, (page, label) in zip(cols, links, strict=True):
            col.page_link(page, label=label, icon=":material/help:")
