"""The public API: every name is imported eagerly from ``inspector``; heavy libraries are not."""

from __future__ import annotations

import subprocess
import sys

import pytest

import inspector

CONTRACT = ["load_model", "available_devices", "move_model", "alias_groups", "snapshot_ties", "compare_ties",
            "retie", "offset_map", "locate", "gradient_norms", "plan_device_map", "audit_device_map",
            "placement_table", "capture_activations", "attribute", "build_report", "Finding"]


def test_the_contract_names_and_every_listed_name_are_attributes_of_the_package():
    assert set(CONTRACT) <= set(inspector.__all__)
    assert len(inspector.__all__) == len(set(inspector.__all__))
    for name in inspector.__all__:
        value = vars(inspector).get(name)  # in the module's namespace: no lazy lookup
        assert value is not None, name
        if callable(value) and not isinstance(value, type):
            assert value.__module__.startswith("inspector."), name
    assert "__getattr__" not in vars(inspector)


def test_import_inspector_leaves_the_heavy_libraries_unimported():
    # plotly is imported by the report's figure modules; its submodules load lazily (about 20 ms)
    heavy = ["transformers", "accelerate", "captum", "streamlit", "matplotlib"]
    code = ("import sys, inspector; "
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_attribute_without_captum_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "captum", None)  # as where the attribution extra is not installed
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    loaded = inspector.load_model("sample:cnn-bn")
    with pytest.raises(inspector.InspectorError, match=r"pip install 'model-inspector\[attribution\]'"):
        inspector.attribute(loaded, loaded.example_inputs(1), method="saliency", target=0)
