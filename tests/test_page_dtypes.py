"""Every page in every dtype the sidebar offers, on cnn-bn, with each page's main control.

Example inputs follow the model's dtype, so float16, bfloat16 and float64 models run like
float32 ones. A dtype that cannot run on this device (here: a Cholesky whitening layer in
float16 on a CPU) is found by one small forward pass and named on the page, with the
control to change.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from inspector.loading import DTYPES
from tests.apptest import run_page

CNN = "sample:cnn-bn"


def _page(page: str, dtype: str, model: str = CNN) -> AppTest:
    at = run_page(page, timeout=120, query={"model": model, "dtype": dtype})
    assert at.session_state["mi_selection"].dtype == dtype
    assert not at.error, [e.value for e in at.error]
    return at


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_pages_that_run_the_model(dtype):
    at = _page("2_Flatten_map.py", dtype)
    at.button(key="offsets_backward").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _metric(at, "ok") == "8"  # conv1, conv2, bn2, fc: weight and bias each

    at = _page("4_Hook_captures.py", dtype)
    assert _metric(at, "Captured outputs") == "7"
    warning = " ".join(w.value for w in at.warning)
    assert "`conv1` overwritten by `relu1`" in warning

    at = _page("5_Attributions.py", dtype)  # Integrated Gradients runs as soon as the page opens
    assert at.get("plotly_chart") and at.dataframe

    at = _page("6_Report.py", dtype)
    at.multiselect[0].set_value(["captures", "attribution"])
    at.button[0].click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _metric(at, "Errors") == "0" and _metric(at, "Sections") == "3"  # with the findings


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_structure_pages(dtype):
    for page in ("1_Alias_graph.py", "3_Device_map.py"):  # the Labs page runs each lab's own model
        at = _page(page, dtype)
        assert at.get("plotly_chart")


WHITENED = '''
import torch
from torch import nn


class Whitened(nn.Module):
    """A Cholesky whitening layer (no float16 kernel on a CPU) before a Linear: 4*4 + 4 = 20 weights."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        cov = x.T @ x + torch.eye(4, dtype=x.dtype)
        return self.fc(x @ torch.linalg.inv(torch.linalg.cholesky(cov)).T)


def example_inputs(batch_size):
    return torch.randn(batch_size + 4, 4, generator=torch.Generator().manual_seed(0))


def loss(outputs, inputs):
    return outputs.pow(2).mean()
'''


def test_a_dtype_that_cannot_run_here_is_named_with_the_control(tmp_path, monkeypatch):
    (tmp_path / "whitened.py").write_text(WHITENED)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    source = f"{tmp_path / 'whitened.py'}:Whitened"
    for page in ("4_Hook_captures.py", "5_Attributions.py"):
        at = run_page(page, timeout=120, query={"model": source, "dtype": "float16"})
        message = " ".join(e.value for e in at.error)
        assert "cannot run as float16 on cpu" in message and "cholesky" in message.lower()
        assert "**float32**" in message and "**Dtype**" in message
        assert not at.get("plotly_chart")
    at = run_page("2_Flatten_map.py", timeout=120, query={"model": source, "dtype": "float16"})
    at.button(key="offsets_backward").click().run()
    assert not at.exception
    assert any("**Dtype**" in e.value for e in at.error)
    # in float32 the same model runs
    at = run_page("4_Hook_captures.py", timeout=120, query={"model": source, "dtype": "float32"})
    assert not at.error and _metric(at, "Captured outputs") == "1"
