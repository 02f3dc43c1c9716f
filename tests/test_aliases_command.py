"""The aliases command: the table it prints and its conversion check, through the command line."""

from __future__ import annotations

from inspector.__main__ import main


def test_cli_prints_groups_and_conversion_table(capsys):
    argv = ["aliases", "sample:tiny-gpt2", "--convert", "to-float64-overwrite",
            "--convert", "move-model-float64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "transformer.wte.weight, lm_head.weight same-object" in out
    assert "4,080 unique, 4,592 counting aliases" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["overwrite", "flag", "+", ".to(float64)", "transformer.wte.weight,", "lm_head.weight",
            "broken", "False", "False", "4592"] in lines
    assert "tie-broken" in out
    assert main(["aliases", "sample:tiny-gpt2", "--convert", "nope"]) == 2
    assert "unknown conversion 'nope'" in capsys.readouterr().err
