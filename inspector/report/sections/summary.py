"""The summary section: sizes, dtypes, devices, the module tree and the loading findings."""

from __future__ import annotations

from ...structure.summary import model_summary, summary_findings
from ...structure.tree import module_tree
from ...utils.labels import ROOT_LABEL
from ..data import Section, Table, make_figure, plain
from ..options import SECTION_TITLES
from .context import Context

TREE_DEPTH = 2  # module levels the tree's table lists (the figure opens four levels, and zooms)


def summary_section(ctx: Context) -> Section:
    from ...figures.tree import module_tree_figure
    s = model_summary(ctx.model)
    facts = {k: v for k, v in s.as_dict().items() if k != "bytes"}
    findings = [*ctx.loaded.findings, *summary_findings(s)]
    tree = module_tree(ctx.model)
    top = tree.modules[tree.modules["depth"] <= TREE_DEPTH]
    tree_table = Table.from_frame(
        "Module tree (top levels)",
        top[["id", "cls", "bytes", "tensors", "device", "dtype", "alias_group"]]
        .rename(columns={"id": "module", "cls": "class"})
        .assign(module=lambda f: f["module"].replace("", ROOT_LABEL)),
        "bytes: every distinct tensor below the module, counted once at its first holder",
    )
    return Section("summary", SECTION_TITLES["summary"], facts=plain(facts),
                   tables=(Table.from_frame("Bytes by kind, dtype and device", s.bytes_table), tree_table),
                   figures=(make_figure("Model tree (area: bytes, colour: device)",
                                        module_tree_figure(tree, "device"), tree_table),),
                   findings=tuple(findings))
