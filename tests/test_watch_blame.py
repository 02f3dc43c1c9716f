"""watch(nonfinite=True): the backward producer is named only where it is true.

A module is blamed in backward when its forward was finite, the gradients of its outputs
were seen and finite, and a gradient of its inputs was not. Planted bugs (a custom autograd
function whose backward returns NaN) must be named; innocent modules (after a forward NaN,
after NaN weights, under gradient checkpointing, Llama's rotary embedding, GPT-2's dropout)
must not be.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from inspector import watch

transformers = pytest.importorskip("transformers")


class NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * math.nan


class Armed(nn.Module):
    """``inner``, then (when armed) an Inf in the forward or a NaN in the backward."""

    def __init__(self, inner: nn.Module, mode: str) -> None:
        super().__init__()
        self.inner, self.mode, self.armed = inner, mode, False

    def forward(self, x):
        y = self.inner(x)
        if not self.armed:
            return y
        return y * math.inf if self.mode == "forward" else NanGrad.apply(y)


def _codes(w, code):
    return [(f.step, f.where) for f in w.findings if f.code == code]


def _findings(w, code):
    return [f for f in w.findings if f.code == code]


def _checkpoint(model, reentrant):
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    kwargs = {"use_reentrant": reentrant}
    if enable.__name__ == "activation_checkpointing_enable":
        enable(kwargs)
    else:
        enable(gradient_checkpointing_kwargs=kwargs)


def _llama(checkpointing=None):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    if checkpointing is not None:
        _checkpoint(model, checkpointing)
    return model.train()


def _gpt2(checkpointing=None, dropout=0.0):
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                  resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    if checkpointing is not None:
        _checkpoint(model, checkpointing)
    return model.train()


def _train_lm(model, path, steps, before):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with watch(model, opt, path, nonfinite=True) as w:
        for s in range(steps):
            before(s)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return w


def _plant(model, parent: nn.Module, attr: str, mode: str, step: int):
    armed = Armed(getattr(parent, attr), mode)
    setattr(parent, attr, armed)
    return lambda s: setattr(armed, "armed", s == step)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(8, 8)
        self.gate = nn.Sigmoid()
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.gate(self.fc2(self.act(self.fc1(x)))))


def _nan_backward_at_step_2(model, module, tmp_path):
    """Four SGD steps under ``watch(nonfinite=True)``, ``module``'s backward made NaN at step 2."""
    arm = _plant(model, model, module, "backward", 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(0)
    xs = torch.randn(4, 3, 4)
    with watch(model, opt, tmp_path / "r.inspect", nonfinite=True) as w:
        for s in range(4):
            arm(s)
            model(xs[s]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return w


def test_mlp_custom_function_nan_backward_names_its_module(tmp_path):
    w = _nan_backward_at_step_2(MLP(), "gate", tmp_path)
    # not fc2 / act / fc1 (their output gradient was already NaN), not gate.inner (its output
    # gradient is the NaN one), not the root (no floating input gradient)
    assert _codes(w, "nonfinite-backward") == [(2, "gate")]
    found = _findings(w, "nonfinite-backward")[0]
    assert "the backward of gate turned a finite output gradient" in found.message
    # the forward of step 2 was finite; SGD then wrote NaN into fc1 and fc2: fc1's NaN output at step 3
    # follows from those weights (named at step 2), so it is not a new producer
    assert _codes(w, "nonfinite-forward") == []
    assert _codes(w, "nonfinite-parameter") == [(2, "fc1.weight")]


@pytest.mark.parametrize("checkpointing", [None, False, True], ids=["plain", "checkpoint", "reentrant"])
def test_gpt2_block_nan_backward_names_its_module(tmp_path, checkpointing):
    model = _gpt2(checkpointing)
    arm = _plant(model, model.transformer.h[0].mlp, "act", "backward", 1)
    w = _train_lm(model, tmp_path / "r.inspect", 2, arm)
    assert _codes(w, "nonfinite-backward") == [(1, "transformer.h.0.mlp.act")]
    assert _codes(w, "nonfinite-forward") == []


@pytest.mark.parametrize("checkpointing", [None, False, True], ids=["plain", "checkpoint", "reentrant"])
def test_llama_block_nan_backward_names_its_module(tmp_path, checkpointing):
    model = _llama(checkpointing)
    arm = _plant(model, model.model.layers[1].mlp, "act_fn", "backward", 1)
    w = _train_lm(model, tmp_path / "r.inspect", 2, arm)
    assert _codes(w, "nonfinite-backward") == [(1, "model.layers.1.mlp.act_fn")]
    assert _codes(w, "nonfinite-forward") == []


def test_shared_input_names_every_module_that_took_it(tmp_path):
    # q_proj, k_proj and v_proj take the same tensor: a hook on it sees the sum of their gradients
    model = _llama()
    attn = model.model.layers[0].self_attn
    arm = _plant(model, attn, "k_proj", "backward", 1)
    w = _train_lm(model, tmp_path / "r.inspect", 2, arm)
    found = _findings(w, "nonfinite-backward")
    assert [(f.step, f.where) for f in found] == [(1, "model.layers.0.self_attn.q_proj")]
    for name in ("q_proj", "k_proj", "v_proj"):
        assert f"model.layers.0.self_attn.{name}" in found[0].message
    assert "cannot tell which" in found[0].message


@pytest.mark.parametrize("checkpointing", [None, False, True], ids=["plain", "checkpoint", "reentrant"])
def test_llama_forward_nan_is_named_once_and_nothing_in_backward(tmp_path, checkpointing):
    model = _llama(checkpointing)
    arm = _plant(model, model.model.layers[1].mlp, "act_fn", "forward", 1)
    w = _train_lm(model, tmp_path / "r.inspect", 3, arm)
    # step 1: the planted Inf; step 2: SGD wrote NaN into every weight, so the embedding's output is
    # NaN, which follows from weights named at step 1: not a new producer
    assert _codes(w, "nonfinite-forward") == [(1, "model.layers.1.mlp.act_fn")]
    assert _codes(w, "nonfinite-backward") == []  # not rotary_emb, not input_layernorm


@pytest.mark.parametrize("checkpointing", [None, False], ids=["plain", "checkpoint"])
def test_gpt2_forward_nan_under_checkpointing_blames_nothing_in_backward(tmp_path, checkpointing):
    model = _gpt2(checkpointing)
    arm = _plant(model, model.transformer.h[1].mlp, "act", "forward", 1)
    w = _train_lm(model, tmp_path / "r.inspect", 2, arm)
    assert _codes(w, "nonfinite-forward") == [(1, "transformer.h.1.mlp.act")]
    assert _codes(w, "nonfinite-backward") == []  # not ln_1


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_nan_weights_blame_the_forward_only(tmp_path, family):
    # GPT-2 with dropout: the dropout after the NaN weights sees NaN in its forward
    model = _llama() if family == "llama" else _gpt2(dropout=0.1)
    lin = model.model.layers[1].mlp.down_proj if family == "llama" else model.transformer.h[1].mlp.c_proj
    name = "model.layers.1.mlp.down_proj" if family == "llama" else "transformer.h.1.mlp.c_proj"

    def poison(s):
        if s == 2:
            with torch.no_grad():
                lin.weight.fill_(math.nan)

    w = _train_lm(model, tmp_path / "r.inspect", 4, poison)
    # step 3's NaN out of the embedding follows from the weights step 2's update made NaN: folded
    assert _codes(w, "nonfinite-forward") == [(2, name)]
    assert _codes(w, "nonfinite-backward") == []


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_healthy_training_has_no_nonfinite_finding(tmp_path, family):
    model = _llama(False) if family == "llama" else _gpt2(dropout=0.1)
    hooks = [len(m._forward_hooks) for m in model.modules()]
    w = _train_lm(model, tmp_path / "r.inspect", 4, lambda s: None)
    assert not [f for f in w.findings if f.code.startswith("nonfinite-")]
    assert hooks == [len(m._forward_hooks) for m in model.modules()]  # every hook of the watch gone
    assert not [p for p in model.parameters() if p._backward_hooks]


def test_compiled_model_names_the_backward_producer(tmp_path):
    model = MLP()
    arm = _plant(model, model, "gate", "backward", 1)
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(0)
    xs = torch.randn(3, 3, 4)
    with watch(compiled, opt, tmp_path / "r.inspect", nonfinite=True) as w:
        for s in range(3):
            arm(s)
            compiled(xs[s]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert _codes(w, "nonfinite-backward") == [(1, "gate")]
    assert _codes(w, "nonfinite-forward") == []  # step 2's NaN out of fc1 follows from its NaN weights


class Split(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)

    def forward(self, x):
        return self.body(x).chunk(2, dim=-1)  # two outputs of one SplitBackward node


class SplitHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.split = Split()
        self.left = nn.Linear(4, 1)
        self.right = nn.Linear(4, 1)

    def forward(self, x):
        a, b = self.split(x)
        return self.left(a) + self.right(b)


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_second_output_of_one_node_is_followed_in_the_backward(tmp_path, side):
    w = _nan_backward_at_step_2(SplitHeads(), side, tmp_path)
    assert _codes(w, "nonfinite-backward") == [(2, side)]


def test_a_graph_kept_past_the_watch_holds_none_of_it(tmp_path):
    """The gradient hooks a step's graph carries are emptied when the watch ends: a loss kept and
    backpropagated after it runs nothing of the watch, and holds none of its buffers."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "r.inspect", nonfinite=True) as w:
        loss = model(torch.randn(3, 4)).pow(2).mean()
    tracer = weakref.ref(w.tracer)
    del w
    gc.collect()
    assert tracer() is None
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


class InPlaceNaN(nn.Module):
    """Writes NaN into its input in place, when armed, and returns that same tensor."""

    armed = False

    def forward(self, x):
        return x.mul_(math.nan) if self.armed else x


def test_a_module_writing_its_input_in_place_is_not_blamed_on_the_one_before(tmp_path):
    """The output a module handed on is read when that module ends: the next module writing NaN into
    that very tensor (in place) does not make the first one its producer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), InPlaceNaN(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "r.inspect", nonfinite=True) as w:
        for s in range(3):
            model[1].armed = s == 1
            model(torch.randn(3, 4)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    blamed = [(f.step, f.where) for f in w.findings if f.code == "nonfinite-forward"]
    assert (1, "0") not in blamed


class LossOut(nn.Module):
    """Returns its loss in a dict (as Hugging Face models do); the logits are its head's output."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 50)

    def forward(self, x, labels):
        return {"loss": nn.functional.cross_entropy(self.head(torch.tanh(self.body(x))), labels)}


def test_the_watch_holds_no_output_once_the_loop_drops_it(tmp_path):
    """A module's output the loop no longer holds is freed as without the watch (logits before the
    backward, a memory peak), not at the step's end."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = LossOut()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    logits: list[weakref.ref] = []
    handle = model.head.register_forward_hook(lambda m, a, out: logits.append(weakref.ref(out)))
    try:
        with watch(model, opt, tmp_path / "r.inspect", nonfinite=True):
            for _ in range(2):
                loss = model(torch.randn(3, 4), torch.tensor([1, 2, 3]))["loss"]
                gc.collect()
                assert logits[-1]() is None  # cross_entropy keeps its log-softmax, not the logits
                loss.backward()
                opt.step()
                opt.zero_grad()
    finally:
        handle.remove()
