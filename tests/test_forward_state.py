"""A forward that keeps state of its own (a call counter, an EMA it rebinds, a buffer it writes
in place, a cache attribute it adds) leaves the model exactly as it was after every inspection
that runs it: capture, capture with gradients, the backward passes, attribution, the report,
the dtype check; in eval mode and in training mode."""

from __future__ import annotations

import pytest
import torch

from inspector import attribute, build_report, capture_activations, load_model
from inspector.offsets import loss_gradients, run_backward

MODEL_FILE = '''
import torch
from torch import nn


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.bn = nn.BatchNorm1d(3)
        self.head = nn.Linear(3, 2)
        self.calls = 0                                  # a plain counter, rebound by +=
        self.register_buffer("ema", torch.zeros(3))     # rebound to a new tensor
        self.register_buffer("seen", torch.zeros(()))   # written in place

    def forward(self, x):
        self.calls += 1
        h = self.bn(self.fc(x))
        self.ema = 0.9 * self.ema + 0.1 * h.detach().mean(0)
        self.seen.add_(x.shape[0])
        self.last_batch = x.shape[0]                    # an attribute the forward adds
        self.head.uses = getattr(self.head, "uses", 0) + 1
        return self.head(h)


def build():
    torch.manual_seed(0)
    return Stateful()


def example_inputs(batch_size):
    return torch.arange(batch_size * 3, dtype=torch.float32).reshape(batch_size, 3) / 5


def loss(outputs, inputs):
    return outputs.pow(2).mean()
'''


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stateful")
    (folder / "stateful.py").write_text(MODEL_FILE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INSPECTOR_MODEL_DIRS", str(folder))
        yield load_model(f"{folder}/stateful.py:build")


def _state(model: torch.nn.Module) -> list:
    """Every module's attributes by identity, and every tensor's values."""
    out = []
    for name, m in model.named_modules():
        attrs = {k: v for k, v in vars(m).items() if k not in ("_parameters", "_buffers", "_modules")}
        out.append((name, type(m), {k: (v if isinstance(v, (int, float, bool, str)) else id(v))
                                    for k, v in attrs.items()}))
        out.append((name, {k: (id(t), t.detach().clone()) for k, t in m._buffers.items()}))
        out.append((name, {k: (id(p), p.detach().clone(), p.grad) for k, p in m._parameters.items()}))
    return out


def _assert_same(before: list, after: list) -> None:
    assert len(before) == len(after)
    for a, b in zip(before, after, strict=True):
        if len(a) == 3 and isinstance(a[2], dict):
            assert a == b
            continue
        assert a[0] == b[0] and a[1].keys() == b[1].keys(), (a[0], a[1].keys(), b[1].keys())
        for key in a[1]:
            x, y = a[1][key], b[1][key]
            assert x[0] == y[0], f"{a[0]}.{key} was rebound"
            assert torch.equal(x[1], y[1]), f"{a[0]}.{key} changed values"
            assert x[2:] == y[2:], f"{a[0]}.{key}.grad changed"


CALLS = {
    "capture": lambda m: capture_activations(m.model, m.example_inputs(2)),
    "capture-grads": lambda m: capture_activations(m.model, m.example_inputs(2), grads=True),
    "capture-inference": lambda m: _inference(lambda: capture_activations(m.model, m.example_inputs(2))),
    "loss-gradients": lambda m: loss_gradients(m, batch_size=2),
    "attribute": lambda m: attribute(m, m.example_inputs(1), "saliency", target=0),
    "report": lambda m: build_report(m, ["summary", "offsets", "captures", "attribution"], backward=True),
}


def _inference(fn):
    with torch.inference_mode():
        return fn()


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("what", list(CALLS))
def test_inspection_leaves_a_stateful_forward_model_unchanged(loaded, what, training):
    model = loaded.model.train(training)
    model(loaded.example_inputs(2))  # the model has run once: its own state exists
    before = _state(model)
    calls, ema, seen = model.calls, model.ema, model.seen.clone()
    result = CALLS[what](loaded)
    _assert_same(before, _state(model))
    assert model.calls == calls and model.ema is ema and torch.equal(model.seen, seen)
    assert model.training is training and model.bn.training is training
    if what.startswith("capture"):
        notes = [f.message for f in result.findings if f.code == "forward-state-restored"]
        assert len(notes) == 1 and "(model): calls, ema" in notes[0] and "head: uses" in notes[0], notes
        assert "seen" in notes[0]
        assert ("bn.running_mean" in notes[0]) is training  # eval mode: the statistics are only read


def test_backward_sets_grads_and_changes_nothing_else(loaded):
    model = loaded.model.eval()
    model(loaded.example_inputs(2))
    calls, ema, seen, uses = model.calls, model.ema, model.seen.clone(), model.head.uses
    result = run_backward(loaded, batch_size=2)
    assert result.with_gradient == 6  # fc, bn and head weights and biases
    assert model.calls == calls and model.ema is ema and torch.equal(model.seen, seen)
    assert model.head.uses == uses and not hasattr(model.fc, "uses")
    for p in model.parameters():
        p.grad = None


def test_a_lazy_module_that_becomes_its_full_class_is_left_as_it_became():
    net = torch.nn.Sequential(torch.nn.LazyLinear(2))
    cap = capture_activations(net, torch.ones(1, 3))
    assert type(net[0]) is torch.nn.Linear and net[0].weight.shape == (2, 3)
    assert cap.outputs["0"].shape == (1, 2)
