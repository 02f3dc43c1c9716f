"""The dashboard's pages, their titles and icons, for ``st.navigation`` and the home page's list.

The files stay in ``pages/`` (each runs on its own too, as the page tests do); the
navigation gives each a title instead of its file name. A file in ``pages/`` that is not
listed in ``VIEWS`` still gets a place, titled from its file name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import streamlit as st
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class View:
    """One page: its file (relative to the project root), title, Material icon and question."""

    file: str
    title: str
    icon: str
    question: str

    @property
    def url_path(self) -> str:
        """``pages/4_Hook_captures.py`` -> ``Hook_captures`` (the address the pages had before)."""
        return re.sub(r"^\d+_", "", Path(self.file).stem)


VIEWS = [
    View("pages/1_Alias_graph.py", "Alias graph", ":material/link:",
         "Which tensors are really the same tensor, and does a conversion keep, weaken or break the ties?"),
    View("pages/2_Flatten_map.py", "Flatten map & gradients", ":material/straighten:",
         "Where does each parameter sit in the flat vector, and how big is its gradient?"),
    View("pages/3_Device_map.py", "Device map", ":material/lan:",
         "Which device holds every parameter and every buffer, and does a plan leave any out?"),
    View("pages/4_Hook_captures.py", "Hook captures", ":material/phishing:",
         "What did each layer really output, and which outputs were overwritten in place?"),
    View("pages/5_Attributions.py", "Attributions", ":material/target:",
         "Which inputs and neurons drive an output (captum)?"),
    View("pages/6_Report.py", "Report", ":material/description:",
         "Everything above in one HTML, JSON or Markdown file to share."),
    View("pages/7_Labs.py", "Labs", ":material/science:",
         "Guided exercises: break a model on purpose, then find the bug with the views."),
    View("pages/8_Training.py", "Training", ":material/monitoring:",
         "In a training run, live: which module's gradient exploded or died, at which step, and do the "
         "ranks' gradients, memory and replicas agree?"),
    View("pages/9_Compare.py", "Compare", ":material/compare_arrows:",
         "What changed between two models or checkpoints, and where do two runs part?"),
]
REDIRECTS = {"Distributed": "pages/8_Training.py"}  # old address -> the page that took it over


def all_views() -> list[View]:
    """``VIEWS`` whose files exist, then any other page file in ``pages/``, in file-name order."""
    listed = {v.file for v in VIEWS}
    views = [v for v in VIEWS if (ROOT / v.file).is_file()]
    for path in sorted((ROOT / "pages").glob("*.py")):
        rel = f"pages/{path.name}"
        if (
            rel not in listed
            and not path.name.startswith("_")
            and re.sub(r"^\d+_", "", path.stem) not in REDIRECTS
        ):
            title = re.sub(r"^\d+_", "", path.stem).replace("_", " ")
            views.append(View(rel, title, ":material/article:", ""))
    return views


@functools.cache
def page_icon() -> Image.Image:
    """The browser tab's icon, drawn here (a lens): a Material page icon would be fetched from the web."""
    img = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    draw.ellipse((6, 6, 44, 44), outline=(255, 75, 75, 255), width=7)
    draw.line((38, 38, 58, 58), fill=(255, 75, 75, 255), width=9)
    return img


def navigation(home: Callable[[], None]) -> st.navigation:
    """The sidebar navigation: ``home`` first (titled Home), then every view.

    Every page keeps one locally drawn tab icon (:func:`page_icon`); the Material icons show in
    the navigation only.
    """
    pages = [st.Page(home, title="Home", icon=":material/home:", default=True)]
    pages += [st.Page(v.file, title=v.title, icon=v.icon, url_path=v.url_path) for v in all_views()]
    pages += [st.Page(functools.partial(_redirect, target), title=old, url_path=old, visibility="hidden")
              for old, target in REDIRECTS.items()]
    st.set_page_config(page_icon=page_icon())
    return st.navigation(pages)


def leave_pages_folder_mode() -> None:
    """A page opened by its address before ``app.py`` ran once in this server runs the way a plain
    ``pages/`` folder does: its sidebar lists the file names ("app", the old "Distributed") instead of
    this navigation. Switch the server to the navigation and run again: ``app.py`` then routes to the
    same page (both name it by its address)."""
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


def _redirect(target: str) -> None:
    """An old page address: go to the page that took it over, with the same URL parameters."""
    st.switch_page(target, query_params=dict(st.query_params))
