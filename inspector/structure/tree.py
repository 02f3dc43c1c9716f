"""The module tree as data: every module with its bytes, devices, dtypes, gradient norm, alias
group and capture state, and every tensor name with its badges (tied to…, view of…).

The home page draws it as a treemap (:func:`inspector.figures.module_tree_figure`), the report
lists it; both read :func:`module_tree`. Metadata only (works on the meta device); gradient
norms and capture states come from results the caller already has.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
from torch import nn

from ..aliases import analyse_inventory
from ..inventory import TensorEntry, TensorInventory, tensor_inventory
from ..offsets import ROOT, GradientNorms
from ..utils.checks import require_module
from ..utils.labels import ROOT_LABEL

LENSES = ("device", "module kind", "dtype", "gradient norm", "alias group", "captured")
MODULE_COLUMNS = ["id", "parent", "label", "cls", "depth", "bytes", "tensors", "device", "dtype",
                  "grad_norm", "alias_group", "captured"]
TENSOR_COLUMNS = ["name", "module", "kind", "shape", "dtype", "device", "bytes", "requires_grad",
                  "grad_norm", "tied_to", "view_of", "alias_group"]
MIXED = "mixed"
NONE = "none"


@dataclass(frozen=True)
class ModuleTree:
    """One row per module (``modules``) and one per tensor name (``tensors``).

    ``modules`` columns: ``id`` (the module's dotted name, ``""`` for the model), ``parent``,
    ``label`` (last part of the name), ``cls``, ``depth``, ``bytes`` (every distinct tensor
    below it, counted at its first holder), ``tensors`` (names it holds itself), ``device`` and
    ``dtype`` (of every tensor below it, or ``"mixed"``; ``"none"`` where it holds none),
    ``grad_norm`` (L2 over the parameters below it, NaN without gradients), ``alias_group``
    (``"group 1"``… where it holds a name of an alias group, ``"several"`` for more than one,
    else ``"none"``), ``captured`` (``"captured"``, ``"mutated after capture"`` or
    ``"not captured"``).

    ``tensors`` columns: ``name, module, kind, shape, dtype, device, bytes, requires_grad,
    grad_norm, tied_to`` (other names of the same object), ``view_of`` (names of other objects
    over the same memory), ``alias_group``.
    """

    modules: pd.DataFrame = field(repr=False)
    tensors: pd.DataFrame = field(repr=False)
    has_gradients: bool = False
    has_captures: bool = False

    def tensors_of(self, module: str) -> pd.DataFrame:
        """The tensor names ``module`` holds itself (not those of its children)."""
        return self.tensors[self.tensors["module"] == module]

    def search(self, text: str) -> list[str]:
        """Module ids whose name or class contains ``text`` (case ignored), tree order."""
        text = text.strip().lower()
        if not text:
            return self.modules["id"].tolist()
        hit = (self.modules["id"].str.lower().str.contains(text, regex=False)
               | self.modules["cls"].str.lower().str.contains(text, regex=False))
        return self.modules.loc[hit, "id"].tolist()


def module_tree(model: nn.Module, gradients: GradientNorms | None = None, captured: Iterable[str] = (),
                mutated: Iterable[str] = ()) -> ModuleTree:
    """The module hierarchy with what each lens colours it by, and every tensor's badges.

    Args:
        model: any ``nn.Module``; it is not changed (metadata only, meta device included).
        gradients: a :func:`~inspector.gradient_report` result, for the gradient-norm lens.
        captured: names of modules whose output was captured (:attr:`Captures.outputs`).
        mutated: names of modules whose live output was changed after capture.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> t = module_tree(m)
    >>> t.modules[["id", "bytes", "alias_group"]].values.tolist()
    [['', 16, 'none'], ['0', 16, 'group 1'], ['1', 0, 'group 1']]
    >>> t.tensors.loc[1, ["name", "tied_to"]].tolist()
    ['1.weight', '0.weight']
    """
    model = require_module(model, "module_tree")
    inv = tensor_inventory(model, what="module_tree")
    param_norms, module_norms = _norms(gradients)
    tensors = _tensor_rows(inv, param_norms)
    modules = _module_rows(model, inv, tensors, module_norms, set(captured), set(mutated))
    return ModuleTree(modules, tensors, has_gradients=bool(module_norms),
                      has_captures=bool(modules["captured"].ne("not captured").any()))


def _norms(gradients: GradientNorms | None) -> tuple[dict[str, float], dict[str, float]]:
    if gradients is None:
        return {}, {}
    p = dict(zip(gradients.by_parameter["name"], gradients.by_parameter["norm"].astype(float), strict=True))
    m = {("" if n == ROOT else n): float(v)
         for n, v in zip(gradients.by_module["name"], gradients.by_module["norm"], strict=True)}
    if all(math.isnan(v) for v in m.values()):
        return {}, {}
    return p, m


def _alias_labels(inv: TensorInventory) -> dict[str, tuple[str, list[str], list[str]]]:
    """Name -> (group label, names of the same object, names of other objects on the same memory)."""
    out: dict[str, tuple[str, list[str], list[str]]] = {}
    by_name = inv.by_name
    for k, group in enumerate(analyse_inventory(inv).groups, 1):
        for name in group.names:
            obj = by_name[name].obj
            same = [n for n in group.names if n != name and by_name[n].obj == obj]
            other = [n for n in group.names if by_name[n].obj != obj]
            out[name] = (f"group {k}", same, other)
    return out


def _tensor_rows(inv: TensorInventory, norms: dict[str, float]) -> pd.DataFrame:
    aliases = _alias_labels(inv)
    rows = []
    for e in inv.entries:
        group, same, other = aliases.get(e.name, (NONE, [], []))
        rows.append((e.name, e.module, e.kind, str(e.shape), e.dtype_name, str(e.device),
                     0 if e.is_alias else e.nbytes, e.requires_grad if e.kind == "parameter" else None,
                     norms.get(e.first_name, math.nan), ", ".join(same), ", ".join(other), group))
    return pd.DataFrame(rows, columns=TENSOR_COLUMNS)


def _below(inv: TensorInventory, attr: str) -> dict[str, set[str]]:
    """Module name -> the values of ``attr`` over every distinct tensor below it (one pass)."""
    out: dict[str, set[str]] = {}
    for e in inv.unique_entries():
        value = _entry_value(e, attr)
        parts = e.module.split(".") if e.module else []
        for k in range(len(parts) + 1):
            out.setdefault(".".join(parts[:k]), set()).add(value)
    return out


def _entry_value(e: TensorEntry, attr: str) -> str:
    return e.dtype_name if attr == "dtype" else str(e.device)


def _one(values: set[str] | None) -> str:
    if not values:
        return NONE
    return next(iter(values)) if len(values) == 1 else MIXED


def _module_rows(model: nn.Module, inv: TensorInventory, tensors: pd.DataFrame, norms: dict[str, float],
                 captured: set[str], mutated: set[str]) -> pd.DataFrame:
    sizes = inv.module_bytes()
    devices, dtypes = _below(inv, "device"), _below(inv, "dtype")
    held = tensors.groupby("module")["name"].count().to_dict()
    groups = tensors[tensors["alias_group"] != NONE].groupby("module")["alias_group"].agg(set).to_dict()
    rows = []
    for name, mod in model.named_modules():
        parent = "" if "." not in name else name.rpartition(".")[0]
        own = groups.get(name, set())
        state = ("mutated after capture" if name in mutated else "captured" if name in captured
                 else "not captured")
        rows.append(
            (
                name,
                None if name == "" else parent,
                name.rpartition(".")[2] if name else ROOT_LABEL,
                type(mod).__name__,
                name.count(".") + 1 if name else 0,
                sizes.get(name, 0),
                held.get(name, 0),
                _one(devices.get(name)),
                _one(dtypes.get(name)),
                norms.get(name, math.nan),
                (next(iter(own)) if len(own) == 1 else "several") if own else NONE,
                state,
            )
        )
    return pd.DataFrame(rows, columns=MODULE_COLUMNS)


def tensor_badges(row: pd.Series) -> list[tuple[str, str]]:
    """The badges of one tensor row of :attr:`ModuleTree.tensors`: ``(kind, text)`` pairs.

    Kinds: ``tied``, ``view``, ``device``, ``dtype``, ``grad``, ``frozen``, ``buffer``; the UI
    links each kind to the page that explains it.

    >>> tensor_badges(pd.Series({"kind": "parameter", "tied_to": "a.w", "view_of": "", "device": "cpu",
    ...                   "dtype": "float32", "grad_norm": 0.5, "requires_grad": True}))
    [('tied', 'tied to a.w'), ('device', 'cpu'), ('dtype', 'float32'), ('grad', 'grad norm 0.5')]
    """
    out = []
    if row["tied_to"]:
        out.append(("tied", f"tied to {row['tied_to']}"))
    if row["view_of"]:
        out.append(("view", f"view of {row['view_of']}"))
    if row["kind"] == "buffer":
        out.append(("buffer", "buffer"))
    out += [("device", str(row["device"])), ("dtype", str(row["dtype"]))]
    if row["kind"] == "parameter" and row["requires_grad"] is False:
        out.append(("frozen", "frozen"))
    norm = row["grad_norm"]
    if isinstance(norm, float) and not math.isnan(norm):
        out.append(("grad", f"grad norm {norm:.4g}"))
    return out
