"""Capture with ``watch_mutations=False``: the same copies and stats, no in-place write watch, and
a result that says the watch was off."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from inspector import InspectorError
from inspector.capture import capture_activations, capturing
from sample_models import get_sample

GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.fixture
def cnn():
    sample = get_sample("cnn-bn")
    return sample.build().eval(), sample.example_inputs(2)


def relu_net() -> nn.Module:
    """The docstring's example: the ReLU writes into the Linear's output, which is below zero."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    nn.init.constant_(net[0].weight, -1.0)
    return net


def hooks(model: nn.Module) -> dict[str, tuple[int, ...]]:
    from torch.nn.modules import module as torch_module

    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks
    return {n: (*m._forward_hooks, *m._forward_pre_hooks, *m._backward_hooks)
            for n, m in model.named_modules()}


def leaves(value) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else [t for v in value for t in leaves(v)]


@pytest.mark.parametrize("mode", list(GRAD_MODES))
@pytest.mark.parametrize("options", [{}, {"keep_inputs": True, "max_bytes": 100_000}],
                         ids=["short-path", "inputs-and-budget"])
def test_outputs_stats_and_skips_equal_the_default(cnn, mode, options):
    model, x = cnn
    with GRAD_MODES[mode]():
        default = capture_activations(model, x, **options)
        fast = capture_activations(model, x, watch_mutations=False, **options)
    assert fast.order == default.order and list(fast.outputs) == list(default.outputs)
    for store in ("outputs", "inputs"):
        ours, theirs = getattr(fast, store), getattr(default, store)
        assert list(ours) == list(theirs)
        for key in theirs:
            assert all(torch.equal(a, b) for a, b in zip(leaves(ours[key]), leaves(theirs[key]), strict=True))
    assert fast.stats.drop(columns="mutated").equals(default.stats.drop(columns="mutated"))
    assert not fast.stats["mutated"].any() and default.stats["mutated"].any()  # cnn-bn's ReLUs are in place
    assert fast.skipped == default.skipped and (options == {}) == (not default.skipped)
    codes = [f.code for f in default.findings if f.code != "capture-mutated"]
    assert [f.code for f in fast.findings] == [*codes, "mutation-watch-off"]
    assert default.mutations_watched and not fast.mutations_watched


@pytest.mark.parametrize("mode", list(GRAD_MODES))
def test_mutated_is_empty_and_says_the_watch_was_off_where_the_default_reports_it(mode):
    net, x = relu_net(), torch.ones(1, 2)
    with GRAD_MODES[mode]():
        default = capture_activations(net, x)
        fast = capture_activations(net, x, watch_mutations=False)
        with capturing(net, watch_mutations=False) as block:
            net(x)
    assert default.mutated == {"0": "1"} and [m.module for m in default.mutations] == ["0"]
    for cap in (fast, block.result):
        assert cap.mutated == {} and cap.mutations == [] and not cap.mutations_watched
        off = [f for f in cap.findings if f.code == "mutation-watch-off"]
        assert len(off) == 1 and off[0].severity == "info"
        assert "not checked" in off[0].message and ".mutated is empty" in off[0].message
        assert (off[0].where, off[0].message) == (
            "", "in-place writes to the captured outputs were not watched (watch_mutations=False): .mutated "
            "is empty because it was not checked, not because nothing was overwritten")
        assert not any(f.code == "capture-mutated" for f in cap.findings)
        assert (cap.outputs["0"] < 0).all()  # the copy was taken before the ReLU wrote
        assert torch.equal(cap.outputs["0"], default.outputs["0"])
    assert not any(f.code == "mutation-watch-off" for f in default.findings)
    assert default.to_dict()["mutated"] == {"0": "1"} and fast.to_dict()["mutated"] == {}
    assert "mutation-watch-off" in [f["code"] for f in fast.to_dict()["findings"]]


def test_copies_stay_inference_tensors_only_in_inference_mode(cnn):
    model, x = cnn
    with torch.inference_mode():
        fast = capture_activations(model, x, watch_mutations=False, keep_inputs=True)
        default = capture_activations(model, x)
        assert fast.stats["mean"].notna().all()
    assert all(t.is_inference() for v in (*fast.outputs.values(), *fast.inputs.values()) for t in leaves(v))
    assert not any(t.is_inference() for v in default.outputs.values() for t in leaves(v))
    assert len(fast.stats) == len(default.stats) + len(fast.inputs)  # stats read them outside it too
    with torch.no_grad():
        plain = capture_activations(model, x, watch_mutations=False)
    assert not any(t.is_inference() or t.requires_grad for v in plain.outputs.values() for t in leaves(v))
    plain.outputs["fc"].add_(1)  # a plain tensor, as by default


def test_no_hooks_left_also_after_a_failing_forward(cnn):
    model, x = cnn
    before = hooks(model)
    with torch.inference_mode():
        capture_activations(model, x, watch_mutations=False)
    assert hooks(model) == before == {n: () for n, _ in model.named_modules()}
    with pytest.raises(InspectorError, match="in module conv1"):
        capture_activations(model, torch.ones(2, 5, 16, 16), watch_mutations=False)
    with pytest.raises(RuntimeError), capturing(model, watch_mutations=False):
        model(torch.ones(2, 5, 16, 16))
    assert hooks(model) == before


def test_command_line_flag(tmp_path, capsys):
    from inspector.__main__ import main

    out = tmp_path / "cap.json"
    assert main(["capture", "sample:cnn-bn", "--no-mutation-watch", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mutated after capture: not checked" in text and "mutation-watch-off" in text
    data = json.loads(out.read_text())
    assert data["mutated"] == {} and "mutation-watch-off" in [f["code"] for f in data["findings"]]
    assert main(["capture", "sample:cnn-bn"]) == 0
    text = capsys.readouterr().out
    assert "conv1: overwritten by relu1" in text and "mutation-watch-off" not in text
