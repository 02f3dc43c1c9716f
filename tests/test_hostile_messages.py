"""Messages that say what is wrong: a FIFO given to compare is a FIFO, a run file that is not there does
not exist, an empty upload is empty (each once told something else)."""

from __future__ import annotations

import os

import pytest

from inspector import InspectorError, compare
from inspector.__main__ import main
from inspector.watching import parse_run_bytes, synthetic_run


@pytest.fixture
def good(tmp_path):
    synthetic_run(tmp_path / "good.inspect", steps=3, modules=2)
    return tmp_path / "good.inspect"


def test_compare_names_a_fifo_as_a_fifo(good, tmp_path):
    os.mkfifo(tmp_path / "pipe.inspect")
    for a, b in ((good, tmp_path / "pipe.inspect"), (tmp_path / "pipe.inspect", good)):
        with pytest.raises(InspectorError, match=r"pipe.inspect is a FIFO \(named pipe\), not a regular"):
            compare(a, b)


def test_a_missing_run_file_does_not_exist(good, tmp_path, capsys):
    with pytest.raises(InspectorError, match=r"run file .*none.inspect does not exist"):
        compare(good, tmp_path / "none.inspect")
    assert main(["report", str(tmp_path / "no" / "run.inspect"), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "run.inspect does not exist" in err and "cannot tell what kind of source" not in err


@pytest.mark.parametrize("data", [b"", b"  \n\n"])
def test_an_empty_upload_is_empty(data):
    with pytest.raises(InspectorError, match=r"up.inspect is empty( \(blank lines only\))?: upload"):
        parse_run_bytes(data, "up.inspect")


def test_a_checkpoint_with_no_tensor_in_common_shows_on_the_compare_page(tmp_path):
    """B shares no name with A: no modules to draw, and the page says so instead of a KeyError box."""
    import torch
    from safetensors.torch import save_file
    from streamlit.testing.v1 import AppTest

    from inspector.comparison import compare_weights
    from inspector.figures import module_change_bars
    from tests.apptest import PAGES

    save_file({"other.weight": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    result = compare_weights(torch.nn.Linear(2, 2), str(tmp_path / "b.safetensors"))
    assert len(result.modules) == 0 and len(module_change_bars(result.modules).data[0].x) == 0
    at = AppTest.from_file(str(PAGES / "9_Compare.py"), default_timeout=120).run()
    at.text_input(key="cmp_b").input(str(tmp_path / "b.safetensors")).run()
    assert not at.exception and not [e.value for e in at.error if "KeyError" in e.value]


def test_a_column_of_true_false_and_blanks_reaches_the_grid(capfd):
    """requires_grad is None for a buffer: the Home page's tensor table once logged a pyarrow traceback on
    every render (None made '' in a bool column)."""
    import pandas as pd
    import pyarrow as pa
    from streamlit.testing.v1 import AppTest

    from ui.tables import plain_cells

    cells = plain_cells(pd.DataFrame({"requires_grad": [True, False, None]}))
    assert pa.Table.from_pandas(cells).column("requires_grad").to_pylist() == ["True", "False", ""]
    from tests.apptest import PAGES

    at = AppTest.from_file(str(PAGES.parent / "app.py"), default_timeout=120).run()
    assert not at.exception and "ArrowInvalid" not in capfd.readouterr().err
