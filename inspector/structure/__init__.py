"""What a model is made of, as data: the summary the home page shows and the module tree.

- :mod:`.summary`: modules, parameter elements (unique and with aliases), buffers, bytes, the tensor table;
- :mod:`.tree`: every module with its bytes, devices, dtypes, gradient norm and aliases, seen through a lens.
"""

from __future__ import annotations

from .summary import ModelSummary, model_bytes, model_summary, summary_findings, tensor_table
from .tree import LENSES, ModuleTree, module_tree, tensor_badges

__all__ = ["LENSES", "ModelSummary", "ModuleTree", "model_bytes", "model_summary", "module_tree",
           "summary_findings", "tensor_badges", "tensor_table"]
