"""The captum adapter: same numbers as captum, exact completeness, state kept, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from captum.attr import (
    InputXGradient,
    IntegratedGradients,
    LayerConductance,
    LayerGradCam,
    LayerIntegratedGradients,
    Saliency,
)
from torch import nn

from inspector import InspectorError, LoadedModel, load_model
from inspector.attribution import attribute, methods_for, preserved_state
from inspector.figures import completeness_line, conductance_bars, image_overlay, token_heatmap


def wrap(model: nn.Module, name: str = "toy", inputs=None) -> LoadedModel:
    return LoadedModel(model, name, f"test:{name}",
                       inputs_fn=None if inputs is None else (lambda b: inputs))


@pytest.fixture
def cnn() -> LoadedModel:
    return load_model("sample:cnn-bn")


@pytest.fixture
def gpt() -> LoadedModel:
    return load_model("sample:tiny-gpt2")


def linear_model(weights: list[float], bias: float) -> nn.Linear:
    lin = nn.Linear(len(weights), 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([weights]))
        lin.bias.fill_(bias)
    return lin


# ---------------------------------------------------------------- same as captum


@pytest.mark.parametrize("method, cls, layer, kwargs", [
    ("ig", IntegratedGradients, None, {"n_steps": 16, "return_convergence_delta": True}),
    ("saliency", Saliency, None, {}),
    ("input_x_gradient", InputXGradient, None, {}),
    ("layer_conductance", LayerConductance, "conv2", {"n_steps": 16, "return_convergence_delta": True}),
    ("layer_gradcam", LayerGradCam, "conv2", {}),
    ("layer_ig", LayerIntegratedGradients, "relu2", {"n_steps": 16, "return_convergence_delta": True}),
])
def test_cnn_attributions_equal_captum(cnn, method, cls, layer, kwargs):
    x = cnn.example_inputs(2)
    ours = attribute(cnn, x, method, target=3, layer=layer, **kwargs)
    model = cnn.model.eval()  # the adapter runs in eval mode; call captum the same way
    algo = cls(model) if layer is None else cls(model, dict(model.named_modules())[layer])
    direct = algo.attribute(x.clone(), target=3, **kwargs)
    if kwargs.get("return_convergence_delta"):
        direct, delta = direct
        assert torch.equal(ours.delta, delta)
    else:
        assert ours.delta is None
    assert ours.captum_method == cls.__name__
    assert torch.equal(ours.attributions[0], direct)


def test_token_ig_equals_layer_ig_on_the_embedding(gpt):
    ids = gpt.example_inputs(2)  # (2, 16) token ids
    ours = attribute(gpt, ids, "ig", target=7, n_steps=20)
    assert ours.method == "layer_ig" and ours.requested == "ig" and ours.layer == "transformer.wte"
    assert "method-switched" in [f.code for f in ours.findings]
    model = gpt.model.eval()
    lig = LayerIntegratedGradients(lambda t: model(t)[:, -1], model.transformer.wte)
    direct, delta = lig.attribute(ids, target=7, n_steps=20, return_convergence_delta=True)
    assert torch.equal(ours.attributions[0], direct) and torch.equal(ours.delta, delta)
    # the per-token summary: one row per (sample, position), the score summed over the width 16
    assert len(ours.summary) == 2 * 16
    assert ours.summary["token"].tolist() == ids.reshape(-1).tolist()
    assert torch.allclose(torch.tensor(ours.summary["score"].to_numpy()).float(),
                          direct.sum(-1).reshape(-1), atol=1e-6)
    assert ours.position == 15


def test_token_target_at_a_chosen_position(gpt):
    ids = gpt.example_inputs(1)
    ours = attribute(gpt, ids, "layer_ig", target=2, position=4, n_steps=8)
    model = gpt.model.eval()
    direct = LayerIntegratedGradients(lambda t: model(t)[:, 4], model.transformer.wte).attribute(
        ids, target=2, n_steps=8)
    assert torch.equal(ours.attributions[0], direct)
    # causal attention: tokens after position 4 cannot move its logit
    assert (ours.summary["score"][5:] == 0).all()


# ---------------------------------------------------------------- completeness


def test_ig_completeness_is_exact_on_a_linear_model():
    # f(x) = 1*x0 + 2*x1 - 3*x2 + 0.5; the gradient is constant, so IG from the zero baseline is
    # exactly x * w = [2*1, 1*2, 1*(-3)] = [2, 2, -3], summing to 1 = f(x) - f(0) = 1.5 - 0.5.
    lin = linear_model([1.0, 2.0, -3.0], 0.5)
    x = torch.tensor([[2.0, 1.0, 1.0]])
    r = attribute(wrap(lin), x, "ig", target=None, n_steps=10)
    assert torch.allclose(r.attributions[0], torch.tensor([[2.0, 2.0, -3.0]]), atol=1e-6, rtol=0)
    comp = r.completeness()
    assert abs(comp.output_diff[0] - 1.0) < 1e-6 and comp.max_abs_delta < 1e-6 and comp.trusted
    assert r.summary["score"].tolist() == pytest.approx([2.0, 2.0, -3.0], abs=1e-6)
    assert "small enough to trust" in completeness_line(r)


def test_poor_completeness_is_reported():
    # f(x) = x0**3 from 0 to 2: F difference 8. Two midpoint steps (riemann_middle, n_steps=2)
    # at alpha 0.25 and 0.75: gradients 3*(0.5)**2 = 0.75 and 3*(1.5)**2 = 6.75, mean 3.75,
    # times x = 2 -> 7.5; delta 7.5 - 8 = -0.5, 6.25% of 8 (over the 5% tolerance).
    cube = wrap(_Cube())
    r = attribute(cube, torch.tensor([[2.0]]), "ig", target=None, n_steps=2,
                  integration_method="riemann_middle")
    assert r.attributions[0].item() == pytest.approx(7.5)
    comp = r.completeness()
    assert comp.delta[0] == pytest.approx(-0.5) and comp.output_diff[0] == pytest.approx(8.0)
    assert not comp.trusted
    assert "completeness-poor" in [f.code for f in r.findings]
    assert "too large to trust" in completeness_line(r)


class _Cube(nn.Module):
    def forward(self, x):
        return x[:, 0] ** 3  # (B,)


# ---------------------------------------------------------------- state kept


class _Raising(nn.Module):
    """Raises when the batch has more than one row: IG expands the batch, so it always raises."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):
        h = self.drop(self.fc1(x))
        if x.shape[0] > 1 or self.fail_always:
            raise RuntimeError("forward failed")
        return self.fc2(h)

    fail_always = False


@pytest.mark.parametrize("method, layer", [("ig", None), ("saliency", None), ("input_x_gradient", None),
                                           ("layer_conductance", "fc1"), ("layer_ig", "fc1")])
def test_state_restored_after_a_raising_forward(method, layer):
    model = _Raising()
    model.fail_always = True
    model.train()
    model.drop.eval()  # mixed flags must come back exactly, not as model.train(True)
    kept = model.fc1.register_forward_hook(lambda m, i, o: None)
    grad = torch.ones(4, 3)
    model.fc1.weight.grad = grad
    x = torch.ones(1, 3)
    with pytest.raises(RuntimeError, match="forward failed"):
        attribute(wrap(model), x, method, target=1, layer=layer)
    assert model.training and model.fc1.training and not model.drop.training
    assert x.requires_grad is False
    assert model.fc1.weight.grad is grad and model.fc2.weight.grad is None
    assert list(model.fc1._forward_hooks) == [kept.id]
    assert all(not m._forward_pre_hooks and not m._backward_hooks for m in model.modules())
    assert all(not m._forward_hooks for m in model.modules() if m is not model.fc1)
    kept.remove()


def test_captum_alone_leaks_requires_grad_when_the_forward_raises():
    # the reason for preserved_state: Saliency flips requires_grad without a finally
    model = _Raising()
    model.fail_always = True
    x = torch.ones(1, 3)
    with pytest.raises(RuntimeError):
        Saliency(model).attribute(x, target=1)
    assert x.requires_grad is True


def test_attribution_leaves_the_model_unchanged(cnn):
    model = cnn.model  # in training mode: BatchNorm would update its running stats
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = cnn.example_inputs(2)
    r = attribute(cnn, x, "ig", target=1, n_steps=8)
    assert model.training and x.requires_grad is False
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert "eval-mode" in [f.code for f in r.findings]


def test_preserved_state_removes_a_hook_added_inside():
    lin = nn.Linear(2, 2).eval()
    findings = []
    with preserved_state(lin, [], findings):
        lin.register_forward_hook(lambda m, i, o: None)
        lin.register_forward_pre_hook(lambda m, i: None)
    assert not lin._forward_hooks and not lin._forward_pre_hooks
    assert [f.code for f in findings] == ["hook-removed"]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="ig", target=10), r"target 10 is out of range .* class index must be in 0\.\.9"),
        (dict(method="saliency", target=-1), r"target -1 is out of range .* 0\.\.9"),
        (
            dict(method="layer_conductance", target=1, layer="conv3"),
            r"no layer named 'conv3'; did you mean conv2, conv1",
        ),
        (dict(method="layer_gradcam", target=1, layer="fcc"), r"did you mean fc\?"),
        (
            dict(method="layer_gradcam", target=1, layer="fc"),
            r"spatial output .* Convolution layers: conv1, conv2",
        ),
        (
            dict(method="layer_conductance", target=1),
            r"needs a layer: choose one of cnn-bn's modules, e\.g\. conv1",
        ),
        (dict(method="intgrad", target=1), r"unknown attribution method 'intgrad'"),
        (dict(method="ig", target=1, n_step=5), r"no option 'n_step'; did you mean n_steps"),
        (dict(method="ig", target=1.5), r"target must be an integer index"),
    ],
)
def test_bad_input_on_cnn(cnn, kwargs, message):
    with pytest.raises(InspectorError, match=message):
        attribute(cnn, None, **kwargs)


def test_no_target_attributes_the_predicted_class(cnn):
    # the first example's largest logit is the class attributed, and a finding says so
    inputs = cnn.example_inputs(1)
    with torch.no_grad():
        predicted = int(cnn.model(inputs)[0].argmax())
    result = attribute(cnn, inputs, "saliency", None)
    assert result.target == predicted
    note = next(f for f in result.findings if f.code == "attribution-target")
    assert f"the predicted class, {predicted}" in note.message
    assert torch.equal(result.attributions[0], attribute(cnn, inputs, "saliency", predicted).attributions[0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="layer_gradcam", target=1), r"tiny-gpt2 has no convolution layer"),
        (
            dict(method="saliency", target=1),
            r"integer token ids, .* Use 'layer_ig' on the input embedding \(transformer\.wte\)",
        ),
        (dict(method="layer_conductance", target=1, layer="transformer.h.0"), r"cannot be interpolated"),
        (
            dict(method="layer_ig", target=32),
            r"target 32 is out of range .* next-token id must be in 0\.\.31",
        ),
        (
            dict(method="layer_ig", target=1, position=16),
            r"position 16 is outside the sequence of tiny-gpt2 \(length 16\); choose 0\.\.15",
        ),
        (dict(method="layer_ig", target=1, layer="transformer.h.O"), r"did you mean transformer\.h\.0"),
    ],
)
def test_bad_input_on_tiny_gpt2(gpt, kwargs, message):
    with pytest.raises(InspectorError, match=message):
        attribute(gpt, None, **kwargs)


def test_bad_input_leaves_no_hook(gpt):
    with pytest.raises(InspectorError):
        attribute(gpt, None, "layer_ig", target=99)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in gpt.model.modules())
    assert gpt.model.training


def test_in_place_successor_gets_a_clear_message(cnn):
    # bn2's output is overwritten by relu2(inplace=True): layer IG cannot replace it
    with pytest.raises(InspectorError, match=r"changes that output in place .*relu2"):
        attribute(cnn, None, "layer_ig", target=1, layer="bn2", n_steps=4)


def test_single_output_model_takes_no_target():
    with pytest.raises(
        InspectorError,
        match="one output per sample, so there is no target 3 to choose; leave the target empty",
    ):
        attribute(wrap(_Cube()), torch.ones(1, 1), "saliency", target=3)


def test_meta_model_is_refused():
    meta = load_model("sample:llama-70b-meta", device="meta")
    with pytest.raises(InspectorError, match="meta device"):
        attribute(meta, None, "layer_ig", target=1)


def test_methods_for_each_kind(cnn, gpt):
    assert methods_for(gpt) == ["ig", "layer_ig"]
    assert methods_for(cnn)[-1] == "layer_gradcam"
    assert "layer_gradcam" not in methods_for(wrap(nn.Linear(3, 2)), torch.ones(1, 3))


# ---------------------------------------------------------------- NaN reporting


def test_nans_are_reported_not_zeroed():
    # f(x) = 1*x0 + nan*x1 + 2*x2: the gradient is the weights [1, nan, 2]
    lin = linear_model([1.0, float("nan"), 2.0], 0.0)
    r = attribute(wrap(lin), torch.ones(1, 3), "saliency", target=None, abs=False)
    a = r.attributions[0]
    assert a[0, 0] == 1.0 and torch.isnan(a[0, 1]) and a[0, 2] == 2.0
    nan = [f for f in r.findings if f.code == "attribution-nan"]
    assert len(nan) == 1 and nan[0].severity == "error" and "1 of 3" in nan[0].message
    assert r.summary["nans"].tolist() == [0, 1, 0]
    assert r.summary["score"].isna().tolist() == [False, True, False]  # NaN, not 0
    d = r.to_dict()
    assert d["summary"][1]["score"] is None
    json.dumps(d, allow_nan=False)
    fig = conductance_bars(r)
    assert list(fig.data[0].x) == ["feature 1", "feature 2", "feature 0"]  # NaN first, then by |score|
    assert list(fig.data[0].text) == ["NaN", "", ""] and list(fig.data[0].y)[1:] == [2.0, 1.0]


# ---------------------------------------------------------------- figures and export


def test_figures_from_real_results(cnn, gpt):
    tok = attribute(gpt, gpt.example_inputs(2), "ig", target=5, n_steps=8)
    fig = token_heatmap(tok)
    assert fig.data[0].z.shape == (2, 16)
    assert "completeness" in completeness_line(tok).lower()
    cam = attribute(cnn, None, "layer_gradcam", target=3)
    over = image_overlay(cam)
    assert over.data[1].z.shape == (16, 16)  # GradCAM of conv2 upsampled to the 16x16 input
    cond = [attribute(cnn, None, "layer_conductance", target=3, layer=n, n_steps=8) for n in ("conv2", "bn2")]
    bars = conductance_bars(cond)
    assert list(bars.data[0].x) == ["conv2", "bn2"]
    assert len(conductance_bars(cond[0]).data[0].x) == 16  # the 16 channels of conv2
    json.dumps(cam.to_dict(), allow_nan=False)


# ---------------------------------------------------------------- command line


def test_cli_attribute(capsys, tmp_path):
    from inspector.__main__ import main

    out_json = tmp_path / "attr.json"
    assert main(["attribute", "sample:tiny-gpt2", "--method", "ig", "--target", "5", "--steps", "8",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert (
        "method: layer_ig (LayerIntegratedGradients) on layer transformer.wte, target 5 at position 15" in out
    )
    assert "Completeness:" in out and "method-switched" in out
    assert json.loads(out_json.read_text())["options"]["n_steps"] == 8
    assert main(["attribute", "sample:cnn-bn", "--method", "layer_gradcam", "--target", "10"]) == 2
    assert "class index must be in 0..9" in capsys.readouterr().err


def test_target_info(cnn, gpt):
    from inspector.attribution import target_info

    assert (target_info(cnn).outputs, target_info(cnn).positions, target_info(cnn).kind) == (
        10,
        None,
        "class index",
    )
    assert target_info(gpt).kind == "next-token id" and cnn.model.training


def test_no_requires_grad_warning_and_flag_restored(cnn, recwarn):
    x = cnn.example_inputs(1)
    attribute(cnn, x, "saliency", target=2)
    assert not [w for w in recwarn if "require gradients" in str(w.message)]
    assert x.requires_grad is False


class _MaskedTokens(nn.Module):
    """ids (B, T) and a 0/1 mask (B, T) -> logits (B, T, 5); masked tokens contribute nothing."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.emb = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5)

    def forward(self, input_ids, attention_mask):
        x = self.emb(input_ids) * attention_mask[..., None]  # (B, T, 3)
        return self.head(x.cumsum(1))  # (B, T, 5)


def test_token_model_with_a_mask_passes_the_mask_through():
    model = _MaskedTokens()
    inputs = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "attention_mask": torch.tensor([[1, 1, 0, 1]])}
    r = attribute(wrap(model), inputs, "ig", target=2, n_steps=8)
    assert r.layer == "emb" and r.to_dict()["options"]["additional_forward_args"] == ["tensor[1, 4]"]
    direct = LayerIntegratedGradients(lambda ids, mask: model(ids, mask)[:, -1], model.emb).attribute(
        inputs["input_ids"], target=2, n_steps=8, additional_forward_args=(inputs["attention_mask"],))
    assert torch.equal(r.attributions[0], direct)
    assert r.summary["score"][2] == 0  # the masked token (position 2) drove nothing


def test_the_result_is_the_public_attribution_type():
    from inspector.attribution import Attribution, AttributionResult

    result = attribute(load_model("sample:cnn-bn"), None, "saliency", target=3)
    assert type(result) is Attribution and AttributionResult is Attribution
