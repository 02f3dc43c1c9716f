"""The aliases command module: its arguments and the table it prints."""

from __future__ import annotations

import pytest

from inspector import InspectorError


def _cli(argv: list[str]) -> int:
    import argparse

    from inspector.commands import aliases as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.run(parser.parse_args(argv))


def test_cli_prints_groups_and_conversion_table(capsys):
    assert (
        _cli(["sample:tiny-gpt2", "--convert", "to-float64-overwrite", "--convert", "move-model-float64"])
        == 0
    )
    out = capsys.readouterr().out
    assert "transformer.wte.weight, lm_head.weight same-object" in out
    assert "4,080 unique, 4,592 counting aliases" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["overwrite", "flag", "+", ".to(float64)", "transformer.wte.weight,", "lm_head.weight",
            "broken", "False", "False", "4592"] in lines
    assert "tie-broken" in out
    with pytest.raises(InspectorError, match="unknown conversion 'nope'"):
        _cli(["sample:tiny-gpt2", "--convert", "nope"])
