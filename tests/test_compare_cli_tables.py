"""compare's tables on the terminal are whole: every row they say they print, or a line saying how many
they left out and the option that shows them; numbers in four significant digits, an empty cell for a
number that does not exist (never ``NaN``), and never pandas' truncated ``..`` form."""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from torch import nn

from inspector.__main__ import main


def _pair(tmp_path, layers: int, zero_bias: bool = False) -> list[str]:
    """A and B of ``layers`` Linear(4, 4) blocks (``2 * layers`` tensors), every tensor of B moved by 0.5
    (and with ``zero_bias``, ``0.bias`` zero in A and 0.5 in B)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(layers)])
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if zero_bias:
        a["0.bias"] = torch.zeros(4)
    b = {k: v + 0.5 for k, v in a.items()}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    return ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]


def _tables(out: str) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """``(tensor rows, module rows, notes)``: the cells of each row under a table's header line, and the
    lines that say rows were left out."""
    lines = out.splitlines()
    t_head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["name", "name_b"])
    m_title = next(i for i, line in enumerate(lines) if line.startswith("modules that changed most"))
    end = next(i for i, line in enumerate(lines) if line.startswith("findings"))
    notes = [line for line in lines if "not shown" in line]
    tensors = [line.split() for line in lines[t_head + 1:m_title] if "not shown" not in line]
    modules = [line.split() for line in lines[m_title + 2:end] if "not shown" not in line]
    return tensors, modules, notes


def test_a_compare_of_a_40_tensor_model_prints_40_rows_with_all(tmp_path, capsys):
    args = _pair(tmp_path, 20)
    assert main([*args, "--all"]) == 0
    out = capsys.readouterr().out
    tensors, modules, notes = _tables(out)
    names = [f"{i}.{kind}" for i in range(20) for kind in ("bias", "weight")]
    assert sorted(row[0] for row in tensors) == sorted(names) and len(tensors) == 40
    assert sorted(row[0] for row in modules) == sorted(str(i) for i in range(20)) and notes == []
    assert ".." not in out and "rows x" not in out and "NaN" not in out
    # every tensor moved by 0.5: max_abs reads 0.5, and rel_change in four significant digits
    torch.manual_seed(0)
    a = nn.Sequential(*[nn.Linear(4, 4) for _ in range(20)])
    w = a[3].weight.detach()
    expected = f"{float(torch.full_like(w, 0.5).norm() / w.norm()):.4g}"  # ‖B − A‖ / ‖A‖ = 2 / ‖A‖
    row = next(r for r in tensors if r[0] == "3.weight")  # the shapes (4, 4) are two words each
    assert row[9:] == ["0.5", expected, "1"], row  # B − A is 0.5 everywhere: rank 1


def test_a_table_cut_short_says_how_many_rows_it_left_out_and_which_option_shows_them(tmp_path, capsys):
    args = _pair(tmp_path, 23)  # 46 tensors, 23 modules: over the default 20 modules
    assert main(args) == 0
    tensors, modules, notes = _tables(capsys.readouterr().out)
    assert len(tensors) == 46 and len(modules) == 20
    assert notes == ["(3 more rows not shown, 23 in all: --all or --max-rows N shows them)"]
    assert main([*args, "--max-rows", "7"]) == 0
    tensors, modules, notes = _tables(capsys.readouterr().out)
    assert len(tensors) == 7 and len(modules) == 7
    assert notes == ["(39 more rows not shown, 46 in all: --max-rows N shows them)",
                     "(16 more rows not shown, 23 in all: --max-rows N shows them)"]
    assert main([*args, "--all"]) == 0
    tensors, modules, notes = _tables(capsys.readouterr().out)
    assert (len(tensors), len(modules), notes) == (46, 23, [])


def test_a_zero_initialised_tensor_has_an_empty_rel_change_cell(tmp_path, capsys):
    assert main([*_pair(tmp_path, 2, zero_bias=True), "--all"]) == 0
    out = capsys.readouterr().out
    tensors, _, _ = _tables(out)
    bias = next(r for r in tensors if r[0] == "0.bias")
    # name name_b status shape_a shape_b dtype_a dtype_b max_abs, then no rel_change and no update_rank
    assert bias == ["0.bias", "0.bias", "changed", "(4,)", "(4,)", "float32", "float32", "0.5"]
    assert "NaN" not in out and "<NA>" not in out and "changed-from-zero" in out
