"""Activation capture: detached copies, in-place mutation detection, hook hygiene, threads."""

from __future__ import annotations

import dataclasses
import gc
import math
import threading
import weakref

import pytest
import torch
from torch import nn

from inspector import InspectorError
from inspector.capture import Captures, capture_activations, capturing, reference_drift, select_modules
from sample_models import get_sample

CNN_ORDER = ["conv1", "relu1", "conv2", "bn2", "relu2", "pool", "fc"]
# cnn-bn, batch 2, float32: conv1/relu1 (2, 8, 16, 16) = 4096 elements = 16384 bytes;
# conv2/bn2/relu2 (2, 16, 16, 16) = 32768 bytes; pool (2, 16, 1, 1) = 128; fc (2, 10) = 80.
CNN_BYTES = {"conv1": 16384, "relu1": 16384, "conv2": 32768, "bn2": 32768, "relu2": 32768,
             "pool": 128, "fc": 80}
GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.fixture
def cnn():
    sample = get_sample("cnn-bn")
    return sample.build().eval(), sample.example_inputs(2)


def hook_state(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The model's hooks by module; fails if any process-wide module hook is registered."""
    from torch.nn.modules import module as torch_module

    leaked = {kind: dict(getattr(torch_module, f"_global_{kind}"))
              for kind in ("forward_hooks", "forward_pre_hooks", "backward_hooks", "backward_pre_hooks")}
    assert not any(leaked.values()), f"process-wide module hooks left: {leaked}"
    return {n: (*m._forward_hooks, *m._forward_pre_hooks, *m._backward_hooks)
            for n, m in model.named_modules()}


@pytest.mark.parametrize("mode", list(GRAD_MODES))
def test_inplace_relu_copies_equal_captum_and_mutations_are_named(cnn, mode):
    from captum.attr import LayerActivation

    model, x = cnn
    expected = {name: LayerActivation(model, getattr(model, name)).attribute(x).detach()
                for name in CNN_ORDER}
    with GRAD_MODES[mode]():
        cap = capture_activations(model, x, keep_references=True)
    assert cap.order == CNN_ORDER
    for name in CNN_ORDER:
        assert torch.equal(cap.outputs[name], expected[name]), name
    # relu1 runs in place on conv1's output, relu2 on bn2's output
    assert cap.mutated == {"conv1": "relu1", "bn2": "relu2"}
    how = "value" if mode == "inference_mode" else "version"
    assert [(m.module, m.by, m.how) for m in cap.mutations] == [
        ("conv1", "relu1", how),
        ("bn2", "relu2", how),
    ]
    # the copy keeps conv1's negative values; the bare reference was overwritten by the ReLU
    assert (cap.outputs["conv1"] < 0).any()
    assert (cap.references["conv1"] >= 0).all()
    assert not torch.equal(cap.references["conv1"], cap.outputs["conv1"])
    assert torch.equal(cap.references["relu1"], cap.outputs["relu1"])
    assert [f.where for f in cap.findings if f.code == "capture-mutated"] == ["conv1", "bn2"]
    stats = cap.stats.set_index("module")
    assert stats.loc["conv1", "mutated"] and not stats.loc["relu1", "mutated"]
    assert stats.loc["conv2", "bytes"] == 32768 and stats.loc["conv2", "shape"] == "(2, 16, 16, 16)"
    assert cap.outputs["conv1"].device.type == "cpu" and not cap.outputs["conv1"].requires_grad


def test_copies_are_plain_tensors_after_inference_mode(cnn):
    model, x = cnn
    with torch.inference_mode():
        cap = capture_activations(model, x)
    out = cap.outputs["fc"]
    assert not out.is_inference()
    out.add_(1)  # a normal tensor can be changed outside inference mode


def test_model_output_and_state_unchanged(tiny_gpt2):
    ids = get_sample("tiny-gpt2").example_inputs(2)
    tiny_gpt2.eval()
    before_params = {n: id(p) for n, p in tiny_gpt2.named_parameters()}
    plain = tiny_gpt2(ids)
    grad_before = torch.is_grad_enabled()
    cap = capture_activations(tiny_gpt2, ids, grads=True)
    again = tiny_gpt2(ids)
    assert torch.equal(cap.model_output, plain)  # bitwise
    assert torch.equal(again, plain)
    assert torch.is_grad_enabled() == grad_before
    assert not tiny_gpt2.training
    assert {n: id(p) for n, p in tiny_gpt2.named_parameters()} == before_params
    assert all(p.grad is None for p in tiny_gpt2.parameters())
    assert hook_state(tiny_gpt2) == {n: () for n, _ in tiny_gpt2.named_modules()}
    # d(sum of logits)/d(lm_head output) is all ones
    assert torch.equal(cap.grads["lm_head"], torch.ones(2, 16, 32))


def test_training_flag_and_batchnorm_statistics_restored():
    model = get_sample("cnn-bn").build()  # training mode: BatchNorm updates running stats
    x = get_sample("cnn-bn").example_inputs(2)
    mean_before = model.bn2.running_mean.clone()
    count_before = int(model.bn2.num_batches_tracked)
    cap = capture_activations(model, x)
    assert model.training and model.bn2.training
    assert torch.equal(model.bn2.running_mean, mean_before)
    assert int(model.bn2.num_batches_tracked) == count_before
    assert cap.mutated == {"conv1": "relu1", "bn2": "relu2"}


def test_no_hooks_left_after_a_failing_forward(cnn):
    model, _ = cnn
    seen = []
    user = model.conv2.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    before = hook_state(model)
    wrong = torch.zeros(2, 4, 16, 16)  # conv1 expects 3 channels
    with pytest.raises(InspectorError, match="in module conv1"):
        capture_activations(model, wrong)
    assert hook_state(model) == before
    with pytest.raises(RuntimeError) as info:
        with capturing(model) as cap:
            model(wrong)
    assert "(raised inside module conv1)" in info.value.__notes__
    assert hook_state(model) == before
    model(torch.zeros(1, 3, 16, 16))
    assert seen == [torch.Size([1, 16, 16, 16])]  # the user's hook still works
    user.remove()
    done = capture_activations(model, torch.zeros(1, 3, 16, 16))
    model(torch.zeros(1, 3, 16, 16))  # no hook of either capture is left to record this pass
    assert cap.outputs == {} and list(done.outputs) == CNN_ORDER


def test_no_hooks_left_after_an_interrupt():
    class Interrupting(nn.Module):
        def forward(self, x):
            raise KeyboardInterrupt

    model = nn.Sequential(nn.Linear(2, 2), Interrupting())
    before = hook_state(model)
    with pytest.raises(KeyboardInterrupt):
        capture_activations(model, torch.zeros(1, 2))
    assert hook_state(model) == before
    with pytest.raises(KeyboardInterrupt):
        with capturing(model):
            model(torch.zeros(1, 2))
    assert hook_state(model) == before


def test_byte_budget_stops_and_lists_what_it_skipped(cnn):
    model, x = cnn
    # conv1 + relu1 = 32768 bytes fit in 40000; conv2 (32768 more) does not, so capturing
    # stops there: pool (128) would fit but comes after the budget was reached.
    cap = capture_activations(model, x, max_bytes=40000)
    assert cap.order == ["conv1", "relu1"]
    assert cap.total_bytes == 32768
    assert [(s.module, s.bytes) for s in cap.skipped] == [(n, CNN_BYTES[n]) for n in CNN_ORDER[2:]]
    # each says what, where and why: 32 KiB of the 40,000 bytes (39.1 KiB) were used when conv2 came
    assert {(s.kind, s.path, s.reason) for s in cap.skipped} == {
        ("output", "", "over the byte budget (32.0 KiB of 39.1 KiB used)")}
    assert cap.skipped_table["bytes"].sum() == 32768 * 3 + 128 + 80
    assert [f.code for f in cap.findings if f.code.startswith("capture-over")] == ["capture-over-budget"]
    # everything fits exactly at the total
    full = capture_activations(model, x, max_bytes=sum(CNN_BYTES.values()))
    assert full.order == CNN_ORDER and full.skipped == []


def test_zero_and_negative_budget(cnn):
    model, x = cnn
    cap = capture_activations(model, x, max_bytes=0)
    assert cap.outputs == {} and cap.total_bytes == 0
    assert [s.module for s in cap.skipped] == CNN_ORDER
    assert [f.code for f in cap.findings] == ["capture-budget-zero"]
    assert len(cap.stats) == 0
    with pytest.raises(InspectorError, match="max_bytes must be 0 or more"):
        capture_activations(model, x, max_bytes=-1)


class _Note:
    """Not a tensor: a capture cannot copy it."""


class _Odd(nn.Module):
    def forward(self, x: torch.Tensor):
        return {"y": x * 2, "note": _Note(), "n": 3}


class _Text(nn.Module):
    def forward(self, x: torch.Tensor) -> str:
        return "done"


class _OddNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.odd = _Odd()
        self.text = _Text()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.text(x)
        return self.odd(x)["y"]


def test_non_tensor_outputs_are_skipped_with_a_reason():
    cap = capture_activations(_OddNet(), torch.ones(2))
    assert list(cap.outputs) == ["odd"]
    assert torch.equal(cap.outputs["odd"]["y"], torch.full((2,), 2.0))
    assert cap.outputs["odd"]["n"] == 3 and cap.outputs["odd"]["note"] is None
    reasons = {(s.module, s.path): s.reason for s in cap.skipped}
    assert reasons[("text", "")] == "the output is a str, not a tensor or a structure holding tensors"
    assert "_Note is not a tensor" in reasons[("odd", "['note']")]
    assert [(s.module, s.kind, s.path, s.bytes, s.reason) for s in cap.skipped] == [
        ("text", "output", "", 0, "the output is a str, not a tensor or a structure holding tensors"),
        ("odd", "output", "['note']", 0, "a _Note is not a tensor; it was left out (None in its place)")]
    assert {f.code for f in cap.findings} == {"capture-not-tensor"}


def test_module_selection_by_name_pattern_and_class(cnn):
    model, x = cnn
    assert list(select_modules(model, ["conv*", nn.BatchNorm2d])) == ["conv1", "conv2", "bn2"]
    assert list(select_modules(model, "ReLU")) == ["relu1", "relu2"]
    assert list(select_modules(model, "fc, relu*")) == ["relu1", "relu2", "fc"]
    with pytest.raises(InspectorError, match="no modules were selected"):
        select_modules(model, [])
    cap = capture_activations(model, x, modules="conv1")
    assert cap.order == ["conv1"]
    assert cap.mutated == {"conv1": "relu1"}  # the overwriter is named even when it is not captured
    with pytest.raises(InspectorError, match=r"module name 'conv3'; close names: conv2, conv1"):
        capture_activations(model, x, modules="conv3")
    with pytest.raises(InspectorError, match=r"pattern 'layer\*'"):
        select_modules(model, "layer*")


def test_hugging_face_gpt2_structured_outputs():
    from transformers import GPT2Config
    from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
    from transformers.models.gpt2.modeling_gpt2 import GPT2Model

    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(0)

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = GPT2Model(config)

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.gpt(input_ids=input_ids).last_hidden_state

    model = Wrapper().eval()
    ids = torch.arange(8).view(1, 8)
    plain = model(ids)
    cap = capture_activations(model, {"input_ids": ids}, modules=["gpt", "gpt.h.0", "gpt.h.0.attn"])
    attn = cap.outputs["gpt.h.0.attn"]
    assert type(attn) is tuple and len(attn) == 2
    assert attn[0].shape == (1, 8, 16) and attn[1].shape == (1, 2, 8, 8)  # (B, nh, T, T) weights
    assert torch.allclose(attn[1].sum(-1), torch.ones(1, 2, 8))
    assert type(cap.outputs["gpt"]) is BaseModelOutputWithPastAndCrossAttentions
    assert torch.equal(cap.outputs["gpt"].last_hidden_state, plain)
    assert torch.equal(cap.model_output, plain)
    paths = cap.stats.query("module == 'gpt.h.0.attn'")["path"].tolist()
    assert paths == ["[0]", "[1]"]


class _Rendezvous(nn.Module):
    """Waits inside forward until the other thread is inside forward too."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.barrier.wait(timeout=10)
        return x + 1


def _meeting_model() -> tuple[nn.Sequential, threading.Barrier]:
    barrier = threading.Barrier(2)
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
        lin.bias.zero_()
    return nn.Sequential(lin, _Rendezvous(barrier), nn.ReLU()), barrier


def test_two_threads_capturing_at_once_each_see_only_their_own_pass():
    model, _ = _meeting_model()
    results: dict[str, Captures] = {}
    errors: list[BaseException] = []

    def work(tag: str, value: float) -> None:
        try:
            # hold_lock=False: both passes really run at the same time (they meet in forward)
            with capturing(model, hold_lock=False) as cap:
                model(torch.full((1, 2), value))
            results[tag] = cap
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t, v)) for t, v in (("a", 1.0), ("b", 5.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    for tag, value in (("a", 1.0), ("b", 5.0)):
        cap = results[tag]
        assert cap.order == ["0", "1", "2"]  # no "0#2": the other thread's pass is not recorded
        assert torch.equal(cap.outputs["0"], torch.full((1, 2), value))
        assert torch.equal(cap.outputs["2"], torch.full((1, 2), value + 1))
    assert hook_state(model) == {n: () for n, _ in model.named_modules()}


def test_capture_ignores_a_plain_forward_of_another_thread():
    model, _ = _meeting_model()
    other: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: other.append(model(torch.full((1, 2), 7.0))))
    thread.start()  # not locked: it meets the capture's pass inside forward
    cap = capture_activations(model, torch.full((1, 2), 2.0))
    thread.join(timeout=30)
    assert cap.order == ["0", "1", "2"]
    assert torch.equal(cap.outputs["1"], torch.full((1, 2), 3.0))
    assert torch.equal(other[0], torch.full((1, 2), 8.0))


def test_context_manager_inputs_and_grads(cnn):
    model, x = cnn
    with capturing(model, modules=["relu1", "fc"], grads=True, keep_inputs=True) as cap:
        with pytest.raises(InspectorError, match="when the `with capturing"):
            _ = cap.stats
        out = model(x)
        out.sum().backward()
    # relu1 ran in place on its input: the input copy keeps the negatives, the output has none
    assert (cap.inputs["relu1"] < 0).any() and (cap.outputs["relu1"] >= 0).all()
    assert torch.equal(cap.grads["fc"], torch.ones(2, 10))
    assert cap.grads["relu1"].shape == (2, 8, 16, 16)
    assert set(cap.stats["kind"]) == {"output", "input", "grad"}
    model.zero_grad(set_to_none=True)


def test_to_dict_is_json_safe(cnn):
    import json

    model, x = cnn
    data = capture_activations(model, torch.cat([x, torch.full((1, 3, 16, 16), float("nan"))])).to_dict()
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text)["mutated"]["conv1"] == "relu1"
    fc = next(r for r in data["stats"] if r["module"] == "fc")
    # eval-mode BatchNorm uses running stats: only the NaN image's 10 logits are NaN
    assert fc["nan"] == 10 and fc["shape"] == "(3, 10)"


def test_each_copy_owns_its_memory_and_frees_it_with_the_capture(cnn):
    model, x = cnn
    first = capture_activations(model, x, modules="conv2")
    second = capture_activations(model, 2 * x, modules="conv2")
    out = first.outputs["conv2"]
    # exactly its own bytes (2 x 16 x 16 x 16 float32 = 32768), not a view into a bigger block
    assert out.untyped_storage().nbytes() == CNN_BYTES["conv2"] == out.numel() * out.element_size()
    assert out.untyped_storage().data_ptr() != second.outputs["conv2"].untyped_storage().data_ptr()
    assert torch.equal(second.outputs["conv2"], model.conv2(model.relu1(model.conv1(2 * x))))
    gone = weakref.ref(out)
    del first, out
    gc.collect()
    assert gone() is None  # nothing inside the inspector holds a capture once it is dropped


@pytest.mark.cuda
def test_cuda_outputs_copied_to_pinned_cpu_memory():
    sample = get_sample("cnn-bn")
    model = sample.build().eval().cuda()
    x = sample.example_inputs(2).cuda()
    for mode in GRAD_MODES.values():
        with mode():
            on_cpu = capture_activations(model, x, keep_references=True)
            on_gpu = capture_activations(model, x, store_on="cuda")
        assert on_cpu.mutated == on_gpu.mutated == {"conv1": "relu1", "bn2": "relu2"}
        assert (on_cpu.store_on, on_gpu.store_on) == ("cpu", "cuda:0")
        for name in CNN_ORDER:
            assert on_cpu.outputs[name].is_pinned()
            assert on_gpu.outputs[name].device.type == "cuda"
            assert torch.equal(on_cpu.outputs[name], on_gpu.outputs[name].cpu()), name
        assert (on_cpu.outputs["conv1"] < 0).any() and (on_cpu.references["conv1"] >= 0).all()


def test_figures_histogram_heatmap_and_clone_vs_bare(cnn):
    from inspector.figures import (
        capture_heatmap,
        capture_histogram,
        capture_stats_figure,
        clone_vs_reference_figure,
        heatmap_slice,
        histogram_data,
    )

    model, x = cnn
    cap = capture_activations(model, x, keep_references=True)
    # conv1 (2, 8, 16, 16): 4096 values in the histogram
    assert histogram_data(cap.outputs["conv1"])["count"].sum() == 4096
    hist = capture_histogram(cap.outputs["conv1"], reference=cap.references["conv1"])
    # the reference is a step outline over the same bins (its last point repeats the last bin)
    assert len(hist.data) == 2 and sum(hist.data[1].y[:-1]) == 4096
    # legend swatches are the colours drawn: solid bars, an unblended outline
    assert hist.data[0].marker.color != hist.data[1].line.color and hist.data[0].opacity is None
    # convolution maps: samples x per-channel means; sequences: tokens x channels of sample 0
    m, rows, _ = heatmap_slice(cap.outputs["conv2"])
    assert tuple(m.shape) == (2, 16) and rows == "sample"
    assert torch.allclose(m[1, 3], cap.outputs["conv2"][1, 3].mean())
    m, rows, _ = heatmap_slice(torch.zeros(2, 512, 768))
    assert tuple(m.shape) == (128, 192) and rows == "token (sample 0)"  # pooled from 512 x 768
    assert capture_heatmap(cap.outputs["fc"]).data[0].type == "heatmap"
    drift = reference_drift(cap)
    table = drift.set_index("module")
    assert table["corrupted"].to_dict() == {n: n in ("conv1", "bn2") for n in CNN_ORDER}
    assert table.loc["conv1", "overwritten_by"] == "relu1"
    assert table.loc["relu1", "max_abs_diff"] == 0.0
    bars = clone_vs_reference_figure(drift).data[0]
    assert [c == "#d62728" for c in bars.marker.color] == [n in ("conv1", "bn2") for n in CNN_ORDER]
    assert len(capture_stats_figure(cap.stats).data) == 3


def test_figures_say_where_the_nan_and_inf_values_are():
    from inspector.figures import capture_heatmap, capture_histogram

    # the output of a softmax that overflowed: a NaN at (1, 2) and an Inf at (3, 0) among finite values
    t = torch.arange(16.0).reshape(4, 4)
    t[1, 2], t[3, 0] = float("nan"), float("inf")
    hist = capture_histogram(t, title="gate: output values")
    assert hist.layout.title.text == "gate: output values (1 NaN, 1 Inf of 16 values not drawn)"
    assert sum(hist.data[0].y) == 14
    heat = capture_heatmap(t, title="gate: output")
    marks = heat.data[1]
    assert (
        heat.layout.showlegend
        and marks.name == "NaN or Inf"
        and sorted(zip(marks.y, marks.x, strict=True)) == [(1, 2), (3, 0)]
    )
    assert heat.data[0].z[3][0] != heat.data[0].z[3][0]  # the Inf cell is left uncoloured, under its mark
    # finite values: no note, no marks
    assert capture_histogram(torch.ones(3), title="x").layout.title.text == "x"
    assert len(capture_heatmap(torch.ones(2, 2)).data) == 1


def test_command_line(cnn, tmp_path, capsys):
    import json

    from inspector.__main__ import main

    out = tmp_path / "cap.json"
    assert main(["capture", "sample:cnn-bn", "--modules", "conv*", "--modules", "bn2",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "conv1: overwritten by relu1" in text and "bn2: overwritten by relu2" in text
    data = json.loads(out.read_text())
    assert data["modules"] == ["conv1", "conv2", "bn2"]
    assert data["mutated"] == {"conv1": "relu1", "bn2": "relu2"}
    assert main(["capture", "sample:cnn-bn", "--modules", "conv3"]) == 2
    assert "close names: conv2, conv1" in capsys.readouterr().err


def test_bad_store_device(cnn):
    model, x = cnn
    with pytest.raises(InspectorError, match="not available on this machine"):
        capture_activations(model, x, store_on="cuda:7")
    with pytest.raises(InspectorError, match="would keep no values") as err:
        capture_activations(model, x, store_on="meta")
    assert str(err.value) == "store_on='meta' would keep no values; choose cpu or a GPU"
    assert hook_state(model) == {n: () for n, _ in model.named_modules()}


class _Probe(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        self.ref = weakref.ref(y)
        return y


class _Checker(nn.Module):
    def __init__(self, probe: _Probe) -> None:
        super().__init__()
        self.probe = [probe]  # a list, so it is not a submodule
        self.alive: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.alive.append(self.probe[0].ref() is not None)
        return x


def test_capture_keeps_no_activation_alive():
    probe = _Probe()
    checker = _Checker(probe)
    model = nn.Sequential(probe, nn.Identity(), nn.Linear(2, 2), checker)
    x = torch.ones(1, 2)
    with torch.inference_mode():
        model(x)
        cap = capture_activations(model, x)
    with torch.no_grad():
        on_versions = capture_activations(model, x)
    # plain pass: the probe's output is gone once the Linear ran; the same when capturing, in
    # inference mode and with version counters (no_grad): captured outputs are watched weakly
    assert checker.alive == [False, False, False]
    assert torch.equal(cap.outputs["0"], torch.full((1, 2), 2.0))
    assert torch.equal(on_versions.outputs["0"], torch.full((1, 2), 2.0)) and not on_versions.mutated


class _WritesThroughAView(nn.Module):
    """Keeps only a view of its first child's output and writes into it in place."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Identity()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.scale(x * 2)  # y = 2x: [-2, 4]
        flat = y.view(-1)  # the output object y may go; the view keeps it (and its version) alive
        del y
        return self.act(flat)  # writes [-2, 4] -> [0, 4] in place


def test_written_through_a_view_of_a_dropped_output_is_still_seen():
    model = _WritesThroughAView()
    # version counters only: an inference tensor's view does not keep its base object alive
    for mode in (torch.no_grad, torch.enable_grad):
        with mode():
            cap = capture_activations(model, torch.tensor([[-1.0, 2.0]]))
        assert torch.equal(cap.outputs["scale"], torch.tensor([[-2.0, 4.0]])), mode
        assert cap.mutated == {"scale": "act"}, mode
        assert cap.mutations[0].max_abs_change == 2.0  # |0 - (-2)|


def test_a_write_after_the_forward_is_seen_while_the_output_lives():
    net = nn.Sequential(nn.Linear(2, 2), nn.Identity())
    with torch.no_grad(), capturing(net) as cap:
        out = net(torch.ones(1, 2))
        out.add_(1)  # outside any module: the Identity's output is the Linear's output
    assert cap.mutated == {"0": None, "1": None}
    assert {m.how for m in cap.mutations} == {"version"}


def test_capturing_while_another_thread_runs_forward_many_times():
    # torch adds a hook to _forward_hooks before marking it as taking kwargs; a forward pass
    # in another thread at that moment calls it without kwargs. Fifty rounds hit that window
    # often (about a third of single rounds did before hooks accepted both call forms).
    for _ in range(50):
        test_two_threads_capturing_at_once_each_see_only_their_own_pass()


def _eye_net(relu_inplace: bool = False) -> nn.Sequential:
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
        lin.bias.zero_()
    return nn.Sequential(lin, nn.ReLU(inplace=relu_inplace))


def test_a_users_hook_that_replaces_the_output_is_captured_as_replaced():
    net = _eye_net()
    x = torch.tensor([[1.0, -2.0]])
    net[0].register_forward_hook(lambda m, a, o: o * 10)  # [[1, -2]] -> [[10, -20]]
    for cap in (
        capture_activations(net, x),
        capture_activations(net, x, keep_inputs=True, max_bytes=1 << 20),
    ):
        assert torch.equal(cap.outputs["0"], torch.tensor([[10.0, -20.0]]))  # what ReLU received
        assert torch.equal(cap.outputs["1"], torch.tensor([[10.0, 0.0]]))
        assert torch.equal(cap.model_output, torch.tensor([[10.0, 0.0]]))
        assert cap.mutated == {}


@pytest.mark.parametrize("mode", list(GRAD_MODES))
def test_a_users_hook_that_doubles_the_output_in_place_is_no_mutation(mode):
    net = _eye_net()
    x = torch.tensor([[1.0, -2.0]])
    net[0].register_forward_hook(lambda m, a, o: o.mul_(2))  # in place, returns the same tensor
    with GRAD_MODES[mode]():
        cap = capture_activations(net, x)
    assert cap.mutated == {} and cap.mutations == []
    assert torch.equal(cap.outputs["0"], torch.tensor([[2.0, -4.0]]))
    assert torch.equal(cap.outputs["1"], torch.tensor([[2.0, 0.0]]))
    assert [f.code for f in cap.findings] == []


def test_users_hooks_run_in_order_before_the_capture_and_stay_as_they_were():
    net = _eye_net(relu_inplace=True)
    x = torch.tensor([[1.0, -2.0]])
    calls: list[str] = []

    def plus_one(m, a, o):
        calls.append("plus_one")
        return o + 1

    def times_two(m, a, kwargs, o):
        calls.append("times_two")
        return o * 2

    def minus_three(m, a, o):
        calls.append("minus_three")
        return o - 3

    def first(m, a, o):
        calls.append("first")

    def pre(m, a):
        calls.append("pre")

    handles = [
        net[0].register_forward_hook(plus_one),
        net[0].register_forward_hook(times_two, with_kwargs=True),
        net[0].register_forward_hook(minus_three, always_call=True),
        net[0].register_forward_hook(first, prepend=True),
        net[0].register_forward_pre_hook(pre),
    ]

    def hooks() -> list[tuple]:
        m = net[0]
        return [tuple(m._forward_hooks.items()), tuple(m._forward_hooks_with_kwargs),
                tuple(m._forward_hooks_always_called), tuple(m._forward_pre_hooks.items())]

    before = hooks()
    plain = net(x)
    assert calls == ["pre", "first", "plus_one", "times_two", "minus_three"]
    cap = capture_activations(net, x, keep_references=True)
    # ((x + 1) * 2) - 3 = [[1, -5]]: the value the in-place ReLU received and then wrote
    assert torch.equal(cap.outputs["0"], torch.tensor([[1.0, -5.0]]))
    assert torch.equal(cap.outputs["1"], torch.tensor([[1.0, 0.0]]))
    assert cap.mutated == {"0": "1"}  # by the model's in-place ReLU, not by a hook
    assert hooks() == before
    assert [h for _, h in hooks()[0]] == [first, plus_one, times_two, minus_three]  # the same objects
    calls.clear()
    assert torch.equal(net(x), plain) and torch.equal(plain, torch.tensor([[1.0, 0.0]]))
    assert calls == ["pre", "first", "plus_one", "times_two", "minus_three"]
    for h in handles:
        h.remove()
    assert hook_state(net) == {n: () for n, _ in net.named_modules()}


class _Gate(nn.Module):
    """Tells that it is inside forward, then waits until it is let through."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.go = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inside.set()
        assert self.go.wait(timeout=30)
        return x + 1


def test_another_thread_running_another_model_during_a_capture_is_unaffected():
    gate = _Gate()
    captured = _eye_net()
    captured.insert(1, gate)  # Linear -> Gate -> ReLU
    captured[0].register_forward_hook(lambda m, a, o: o * 10)
    other = _eye_net()
    other_calls: list[tuple[str, torch.Tensor]] = []

    def other_hook(m, a, o):
        other_calls.append((type(m).__name__, o.clone()))
        return o - 1

    other[0].register_forward_hook(other_hook)
    other[1].register_forward_hook(lambda m, a, o: other_calls.append((type(m).__name__, o.clone())))
    inputs = [torch.tensor([[float(i), -3.0]]) for i in range(5)]
    alone = [other(v) for v in inputs]
    alone_calls = list(other_calls)
    other_calls.clear()
    during: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def run_other() -> None:
        try:
            assert gate.inside.wait(timeout=30)  # the capture's pass is inside forward now
            during.extend(other(v) for v in inputs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            gate.go.set()

    thread = threading.Thread(target=run_other)
    thread.start()
    cap = capture_activations(captured, torch.tensor([[1.0, -2.0]]))
    thread.join(timeout=30)
    assert not errors
    assert all(torch.equal(a, b) for a, b in zip(during, alone, strict=True))
    assert len(other_calls) == len(alone_calls) == 10
    assert all(n == m and torch.equal(a, b) for (n, a), (m, b) in zip(other_calls, alone_calls, strict=True))
    assert cap.order == ["0", "1", "2"]  # nothing of the other model
    assert torch.equal(cap.outputs["0"], torch.tensor([[10.0, -20.0]]))
    assert torch.equal(cap.outputs["1"], torch.tensor([[11.0, -19.0]]))
    assert torch.equal(cap.outputs["2"], torch.tensor([[11.0, 0.0]]))


def test_the_block_hands_out_a_frozen_result_built_when_it_ends():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    with torch.no_grad():
        nn.init.constant_(net[0].weight, -1.0)
        nn.init.zeros_(net[0].bias)
    with capturing(net) as cap:
        net(torch.ones(1, 2))
        inside = cap.outputs  # what was collected so far: a snapshot, the block is still running
        assert sorted(inside) == ["0", "1"] and cap.mutated == {}
        with pytest.raises(InspectorError, match="when the `with capturing"):
            _ = cap.result
        net(torch.ones(1, 2))
    assert sorted(inside) == ["0", "1"]  # the snapshot did not grow with the second pass
    result = cap.result
    assert isinstance(result, Captures) and cap.outputs is result.outputs
    assert result.order == ["0", "1", "0#2", "1#2"] and result.mutated == {"0": "1", "0#2": "1"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.findings = []  # type: ignore[misc]
    findings = list(result.findings)
    net(torch.ones(1, 2))  # the hooks are gone: nothing is added to the result afterwards
    assert result.order == ["0", "1", "0#2", "1#2"] and result.findings == findings


class _Meet(nn.Module):
    """Waits inside forward until the other thread is inside forward too, and notes which
    forward hooks the process has then: its own module's, and the process-wide ones."""

    def __init__(self, barrier: threading.Barrier, seen: list) -> None:
        super().__init__()
        self.barrier, self.seen = barrier, seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.modules import module as torch_module

        self.barrier.wait(timeout=10)
        self.seen.append((len(self._forward_hooks), len(torch_module._global_forward_hooks)))
        self.barrier.wait(timeout=10)  # both captures are open while the other one looks
        return x * 2


@pytest.mark.parametrize("modes", [("inference_mode", "no_grad"), ("grad", "inference_mode")])
def test_two_models_captured_in_two_threads_each_capture_sees_only_its_own_modules(modes):
    barrier, seen = threading.Barrier(2), []
    a = nn.Sequential(nn.Identity(), _Meet(barrier, seen), nn.ReLU())
    b = nn.Sequential(nn.Tanh(), nn.Identity(), _Meet(barrier, seen), nn.Sigmoid(), nn.Identity())
    plain_b = nn.Sequential(nn.Identity(), nn.Identity())  # run plainly, in b's thread, during both captures
    results: dict[str, Captures] = {}
    errors: list[BaseException] = []

    def work(tag: str, model: nn.Module, value: float, mode: str) -> None:
        try:
            with GRAD_MODES[mode](), capturing(model) as cap:
                model(torch.full((1, 2), value))
                if tag == "b":
                    plain_b(torch.ones(1))
            results[tag] = cap
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t, m, v, mode))
               for (t, m, v), mode in zip((("a", a, 1.0), ("b", b, -3.0)), modes, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert results["a"].order == ["0", "1", "2"]
    assert results["b"].order == ["0", "1", "2", "3", "4"]  # not plain_b's modules, not a's
    assert torch.equal(results["a"].outputs["2"], torch.full((1, 2), 2.0))
    assert torch.equal(results["b"].outputs["3"], torch.sigmoid(torch.tanh(torch.full((1, 2), -3.0)) * 2))
    # each capture hooked only its own model's modules (one hook on each), none process-wide
    assert seen == [(1, 0), (1, 0)]
    for model in (a, b, plain_b):
        assert hook_state(model) == {n: () for n, _ in model.named_modules()}


# -- tensor_stats, each figure worked out by hand ----------------------------------------------------
def _stats(values, dtype=None):
    from inspector.capture import tensor_stats
    return tensor_stats(torch.tensor(values, dtype=dtype))


def test_tensor_stats_of_finite_values():
    s = _stats([1.0, 2.0, 3.0, 0.0])  # mean 6/4; variance (0.25 + 0.25 + 2.25 + 2.25) / 4 = 1.25
    assert s == {"shape": "(4,)", "dtype": "float32", "device": "cpu", "bytes": 16, "mean": 1.5,
                 "std": pytest.approx(math.sqrt(1.25)), "min": 0.0, "max": 3.0, "nan": 0, "inf": 0,
                 "zero_fraction": 0.25}
    # one pass: the sums 6 and 14 are exact in float32, the variance 14/4 - 1.5**2 is worked in double
    assert s["std"] == math.sqrt(1.25)


def test_tensor_stats_keep_the_precision_of_float64_and_of_large_integers():
    f64 = _stats([0.1, 0.2], torch.float64)  # in float32, 0.1 would read 0.10000000149011612
    assert (f64["min"], f64["max"], f64["mean"]) == (0.1, 0.2, (0.1 + 0.2) / 2)
    big = _stats([2**24 + 1, 0], torch.int64)  # 16777217 has no float32: it would read 16777216
    assert (big["min"], big["max"], big["mean"], big["std"]) == (0.0, 16777217.0, 8388608.5, 8388608.5)


def test_tensor_stats_when_the_mean_dwarfs_the_spread_takes_the_exact_formula():
    # 1e6 +- 1: one pass would lose the variance of 1 in (1e12 + 1) - 1e12
    s = _stats([1e6 + 1, 1e6 - 1, 1e6 + 1, 1e6 - 1], torch.float64)
    assert (s["mean"], s["std"], s["min"], s["max"], s["zero_fraction"]) == (1e6, 1.0, 1e6 - 1, 1e6 + 1, 0.0)
    assert (s["dtype"], s["bytes"]) == ("float64", 32)


def test_tensor_stats_count_nan_and_inf_and_describe_the_rest():
    s = _stats([1.0, math.nan, math.inf, -3.0, 0.0])  # finite: 1, -3, 0
    assert (s["nan"], s["inf"], s["min"], s["max"]) == (1, 1, -3.0, 1.0)
    assert s["mean"] == pytest.approx(-2 / 3)
    assert s["std"] == pytest.approx(math.sqrt(((5 / 3) ** 2 + (7 / 3) ** 2 + (2 / 3) ** 2) / 3))
    assert s["zero_fraction"] == pytest.approx(1 / 5)  # the one 0 among all 5 values


def test_tensor_stats_of_integers_complex_numbers_and_nothing_finite():
    ints = _stats([3, -4], torch.int64)
    assert (ints["mean"], ints["std"], ints["min"], ints["max"], ints["dtype"]) == (
        -0.5, 3.5, -4.0, 3.0, "int64")
    cplx = _stats([3 + 4j, 0j], torch.complex64)  # their magnitudes: 5 and 0
    assert (cplx["mean"], cplx["std"], cplx["min"], cplx["max"], cplx["zero_fraction"]) == (
        2.5, 2.5, 0.0, 5.0, 0.5)
    only_nan = _stats([math.nan])
    assert (only_nan["nan"], only_nan["mean"], only_nan["std"], only_nan["min"], only_nan["max"],
            only_nan["zero_fraction"]) == (1, None, None, None, None, 0.0)


def test_tensor_stats_of_an_empty_or_meta_tensor_give_its_layout_only():
    from inspector.capture import tensor_stats
    empty = tensor_stats(torch.empty(0, 3))
    meta = tensor_stats(torch.empty(2, 3, device="meta", dtype=torch.bfloat16))
    for s in (empty, meta):
        assert (s["mean"], s["std"], s["min"], s["max"], s["nan"], s["inf"], s["zero_fraction"]) == (
            None, None, None, None, 0, 0, None)
    assert (empty["shape"], empty["bytes"]) == ("(0, 3)", 0)
    assert (meta["shape"], meta["dtype"], meta["device"], meta["bytes"]) == ("(2, 3)", "bfloat16", "meta", 12)


# -- reference_drift: how far the bare output moved from its copy, worked out by hand ---------------
class _Source(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class _Writes(nn.Module):
    def __init__(self, write) -> None:
        super().__init__()
        self.write = write

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        self.write(t)
        return t


def _drift(x, write, **options):
    net = nn.Sequential(_Source(), _Writes(write))
    with torch.no_grad():
        cap = capture_activations(net, x, keep_references=True, **options)
    rows = reference_drift(cap)[["module", "max_abs_diff", "corrupted", "overwritten_by"]].values.tolist()
    return [[m, d, c, by if isinstance(by, str) else None] for m, d, c, by in rows]  # pandas: None or NaN


@pytest.mark.parametrize(("x", "write", "moved"), [
    (torch.tensor([1.0, math.nan, 2.0]), lambda t: t[:1].add_(3), 3.0),  # a NaN kept is no change
    (torch.tensor([5, 1]), lambda t: t[:1].sub_(7), 7.0),  # integers: 5 -> -2
    (torch.tensor([math.nan, 1.0]), lambda t: t.nan_to_num_(0.0), math.inf),  # a NaN made finite
    (torch.arange(16, dtype=torch.float32), lambda t: t[15:].mul_(-1), 30.0),  # 15 -> -15, in 64 bytes
    (torch.ones(256, 257), lambda t: t[0, :1].sub_(2), 2.0),  # 1 -> -1 in 263,168 bytes (over 256 KiB)
])
def test_reference_drift_is_the_largest_change_written_into_an_output(x, write, moved):
    assert _drift(x, write) == [["0", moved, True, "1"], ["1", 0.0, False, None]]


def test_reference_drift_of_outputs_nobody_wrote_is_zero():
    assert _drift(torch.tensor([1.0, 2.0], dtype=torch.float64), lambda t: None) == [
        ["0", 0.0, False, None], ["1", 0.0, False, None]]
    # over 256 KiB (compared byte by byte) and written in place with the values it held
    assert _drift(torch.ones(256, 257), lambda t: t.mul_(1)) == [
        ["0", 0.0, False, None], ["1", 0.0, False, None]]
    net = nn.Sequential(_Source(), _Writes(lambda t: t.mul_(1)))
    with torch.no_grad():
        cap = capture_activations(net, torch.ones(256, 257))
    assert cap.mutated == {} and list(cap.outputs) == ["0", "1"]
    assert [(f.code, f.where, f.message) for f in cap.findings] == [
        ("capture-written-same-values", "0",
         "0 was written in place by 1 after its capture, but its values did not change")]


def test_reference_drift_without_references_or_captures_and_with_the_watch_off():
    from inspector.capture import DRIFT_COLUMNS, STATS_COLUMNS
    net = nn.Sequential(_Source(), _Writes(lambda t: t[1:].mul_(-1)))
    plain = reference_drift(capture_activations(net, torch.ones(2)))  # no references: no difference
    assert plain["max_abs_diff"].tolist() == [None, None] and plain["corrupted"].tolist() == [True, False]
    # the watch off: the bare reference moved (1 -> -1 in [1]), nobody named, still corrupted
    assert _drift(torch.ones(2), lambda t: t[1:].mul_(-1), watch_mutations=False) == [
        ["0", 2.0, True, None], ["1", 0.0, False, None]]
    empty = capture_activations(net, torch.ones(2), max_bytes=0, keep_references=True)
    assert list(reference_drift(empty).columns) == DRIFT_COLUMNS and len(reference_drift(empty)) == 0
    assert list(empty.stats.columns) == STATS_COLUMNS


# -- the recorder, path by path: what each kind of output leaves in the capture ----------------------
def test_a_meta_model_leaves_each_output_out_with_a_reason():
    from inspector.capture import Skipped
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU()).to("meta")
    for options in ({}, {"keep_references": True}):  # the short path and the long one
        cap = capture_activations(net, torch.ones(1, 2, device="meta"), **options)
        assert cap.outputs == {"0": None, "1": None} and cap.order == ["0", "1"]
        assert cap.skipped == [Skipped(n, "output", "", 0, "a meta tensor has no values") for n in "01"]
        assert [(f.code, f.severity, f.where, f.message) for f in cap.findings] == [
            ("capture-not-tensor", "info", n, f"{n}: a meta tensor has no values") for n in "01"]
    rows = reference_drift(cap)[["module", "max_abs_diff", "corrupted"]].values.tolist()
    assert rows == [["0", None, False], ["1", None, False]]


class _Triple(nn.Module):
    def forward(self, x: torch.Tensor):
        return x + 1, None, x.to_sparse()


class _Sparse(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to_sparse()


def test_a_sparse_tensor_alone_or_after_a_none_is_copied_as_it_is():
    cap = capture_activations(nn.Sequential(_Triple()), torch.eye(2))
    first, none, sparse = cap.outputs["0"]
    assert torch.equal(first, torch.eye(2) + 1) and none is None
    assert sparse.layout == torch.sparse_coo and torch.equal(sparse.to_dense(), torch.eye(2))
    assert cap.skipped == [] and cap.mutated == {}
    alone = capture_activations(nn.Sequential(_Sparse()), torch.eye(2)).outputs["0"]
    assert alone.layout == torch.sparse_coo and torch.equal(alone.to_dense(), torch.eye(2))


_Pair = __import__("collections").namedtuple("_Pair", "first second")


class _Named(nn.Module):
    def forward(self, x: torch.Tensor) -> _Pair:
        return _Pair(x + 1, x * 3)


def test_a_named_tuple_output_is_copied_as_that_named_tuple():
    cap = capture_activations(nn.Sequential(_Named()), torch.ones(2))
    out = cap.outputs["0"]
    assert type(out) is _Pair
    assert torch.equal(out.first, torch.full((2,), 2.0)) and torch.equal(out.second, torch.full((2,), 3.0))


class _WithNone(nn.Module):
    def forward(self, x: torch.Tensor):
        return x + 1, None, x * 2


class _WritesThird(nn.Module):
    def forward(self, out):
        out[2].add_(1)
        return out


@pytest.mark.parametrize("options", [{}, {"keep_inputs": True}], ids=["short", "long"])
def test_a_tuple_keeps_its_none_and_names_the_element_written(options):
    from inspector.capture import Mutation
    with torch.no_grad():
        cap = capture_activations(nn.Sequential(_WithNone(), _WritesThird()), torch.ones(2), **options)
    first, none, third = cap.outputs["0"]
    assert none is None and torch.equal(first, torch.full((2,), 2.0))
    assert torch.equal(third, torch.full((2,), 2.0))
    assert cap.mutations == [Mutation("0", "[2]", "1", "version", 1.0)]  # 2 -> 3
    assert cap.mutated == {"0": "1"}


class _Transposed(nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t.t()


def test_a_transposed_output_is_copied_contiguous_and_its_change_measured():
    net = nn.Sequential(_Source(), _Transposed(), _Writes(lambda t: t[0, :1].add_(5)))
    x = torch.arange(6.0).reshape(2, 3)  # 1 is x.t(): [[0, 3], [1, 4], [2, 5]]; 2 writes 0 -> 5 in both
    with torch.no_grad():
        cap = capture_activations(net, x, keep_references=True)
    assert cap.outputs["1"].is_contiguous() and torch.equal(cap.outputs["1"], x.t())
    assert cap.mutated == {"0": "2", "1": "2"}
    assert [(m.module, m.max_abs_change) for m in cap.mutations] == [("0", 5.0), ("1", 5.0)]
    drift = reference_drift(cap)[["module", "max_abs_diff", "corrupted"]].values.tolist()
    assert drift == [["0", 5.0, True], ["1", 5.0, True], ["2", 0.0, False]]
    short = capture_activations(net, x)  # the short path copies the view contiguous too
    assert short.outputs["1"].is_contiguous() and torch.equal(short.outputs["1"], x.t())


def test_copies_are_detached_and_say_where_they_are():
    net = nn.Sequential(nn.Linear(2, 2))
    cap = capture_activations(net, torch.ones(1, 2))
    assert cap.model_output.requires_grad
    assert not cap.outputs["0"].requires_grad and cap.outputs["0"].grad_fn is None
    assert cap.store_on == "cpu" and cap.placements == {}


class _Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _Thrice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.step = _Double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(self.step(self.step(x)))


@pytest.mark.parametrize("options", [{}, {"keep_inputs": True}], ids=["short", "long"])
def test_a_module_called_three_times_gives_three_keys(options):
    cap = capture_activations(_Thrice(), torch.ones(1), **options)
    assert cap.order == ["step", "step#2", "step#3"]
    assert [cap.outputs[k].item() for k in cap.order] == [2.0, 4.0, 8.0]
    if options:
        assert [cap.inputs[k].item() for k in cap.order] == [1.0, 2.0, 4.0]


class _ScalesItsInput(nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        t.mul_(3)  # written in place through its input; returns a new tensor
        return t + 1


class _ByKeyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.source, self.writer = _Source(), _ScalesItsInput()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.writer(t=self.source(x))


def test_a_write_through_an_input_names_its_writer_by_position_and_by_keyword():
    from inspector.capture import Mutation
    positional = capture_activations(nn.Sequential(_Source(), _ScalesItsInput()), torch.ones(2))
    assert positional.mutations == [Mutation("0", "", "1", "version", 2.0)]  # 1 -> 3
    keyword = capture_activations(_ByKeyword(), torch.ones(2))
    assert keyword.mutations == [Mutation("source", "", "writer", "version", 2.0)]
    assert torch.equal(keyword.outputs["source"], torch.ones(2))


class _Split(nn.Module):
    def forward(self, t: torch.Tensor):
        return t + 1, t * 2


def test_a_tuple_output_after_a_captured_inference_tensor():
    with torch.inference_mode():
        cap = capture_activations(nn.Sequential(_Source(), _Split()), torch.ones(2))
    first, second = cap.outputs["1"]
    assert torch.equal(first, torch.full((2,), 2.0)) and torch.equal(second, torch.full((2,), 2.0))
    assert cap.mutated == {} and not first.is_inference()


class _Combine(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        return (a + b) * (1 if scale is None else scale)


class _Inputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.one, self.two = _Combine(), _Combine()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.two(self.one(x, x), x, scale=torch.full((2,), 3.0))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inputs_keep_positions_and_keywords(mode):
    x = torch.tensor([1.0, 2.0])  # one: x + x = [2, 4]; two: ([2, 4] + x) * 3 = [9, 18]
    with GRAD_MODES[mode]():
        cap = capture_activations(_Inputs(), x, keep_inputs=True)
    one, two = cap.inputs["one"], cap.inputs["two"]
    assert type(one) is tuple and [t.tolist() for t in one] == [[1.0, 2.0], [1.0, 2.0]]
    assert list(two) == ["args", "kwargs"] and list(two["kwargs"]) == ["scale"]
    assert [t.tolist() for t in two["args"]] == [[2.0, 4.0], [1.0, 2.0]]
    assert two["kwargs"]["scale"].tolist() == [3.0, 3.0] and cap.outputs["two"].tolist() == [9.0, 18.0]
    assert not any(t.is_inference() for t in (*one, *two["args"], two["kwargs"]["scale"]))


def test_inputs_over_the_budget_are_named_as_inputs():
    from inspector.capture import Skipped
    cap = capture_activations(_Inputs(), torch.tensor([1.0, 2.0]), keep_inputs=True, max_bytes=8)
    # one's input (x, x) is 16 bytes: over 8 from the start; then nothing else is kept
    reason = "over the byte budget (0 B of 8 B used)"
    assert cap.skipped == [Skipped("one", "input", "", 16, reason), Skipped("one", "output", "", 8, reason),
                           Skipped("two", "input", "", 24, reason), Skipped("two", "output", "", 8, reason)]


class _Pairs(nn.Module):
    def forward(self, y: torch.Tensor):
        return y * 1, y * 3


class _Alone(nn.Module):
    def forward(self, y: torch.Tensor):
        return (y * 2,)


def _linear() -> nn.Linear:
    lin = nn.Linear(2, 2)
    nn.init.constant_(lin.weight, 1.0)
    nn.init.constant_(lin.bias, 0.0)
    return lin


def test_gradients_of_tuple_outputs_by_element():
    x = torch.ones(1, 2)
    # loss = 2 * sum(y) + 5 * sum(3y): d/d[0] = 2, d/d[1] = 5, d/dy = 2 + 15 = 17
    cap = capture_activations(nn.Sequential(_linear(), _Pairs()), x, grads=True,
                              loss_fn=lambda out, _: (out[0] * 2).sum() + (out[1] * 5).sum())
    assert sorted(cap.grads["1"]) == ["[0]", "[1]"]
    assert cap.grads["1"]["[0]"].tolist() == [[2.0, 2.0]] and cap.grads["1"]["[1]"].tolist() == [[5.0, 5.0]]
    assert cap.grads["0"].tolist() == [[17.0, 17.0]]
    alone = capture_activations(nn.Sequential(_linear(), _Alone()), x, grads=True)  # loss: sum of (2y,)
    assert list(alone.grads["1"]) == ["[0]"] and alone.grads["1"]["[0]"].tolist() == [[1.0, 1.0]]
    assert alone.grads["0"].tolist() == [[2.0, 2.0]]


def test_gradients_over_the_budget_are_named_as_gradients():
    from inspector.capture import Skipped
    # the output (1, 2) float32 = 8 bytes fits in 8; its gradient, 8 more, does not
    cap = capture_activations(nn.Sequential(_linear()), torch.ones(1, 2), grads=True, max_bytes=8)
    assert list(cap.outputs) == ["0"] and cap.grads == {}
    assert cap.skipped == [Skipped("0", "grad", "", 8, "over the byte budget (8 B of 8 B used)")]


class _Counts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + 1


def test_the_callers_findings_come_last_in_the_capture():
    net = nn.Sequential(_Counts())
    cap = capture_activations(net, torch.ones(1))
    assert net[0].calls == 0
    assert [(f.code, f.severity, f.where, f.message) for f in cap.findings] == [
        ("forward-state-restored", "info", "",
         "the model's forward changed its own modules' state, which was put back as it was before the pass "
         "(0: calls)")]


def test_a_block_puts_back_the_training_flags_changed_inside_it():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).eval()
    net[0].train()  # a mixed model: the root in eval mode, one child training
    with capturing(net) as cap:
        net.train()
        net(torch.ones(1, 2))
    assert list(cap.outputs) == ["0", "1"]
    assert (net.training, net[0].training, net[1].training) == (False, True, False)


class _Helper:
    def run(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"cannot run on {tuple(x.shape)}")


class _UsesHelper(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Helper().run(x)


def test_a_failure_inside_a_helper_object_names_the_module_that_called_it():
    net = nn.Sequential(nn.Linear(2, 2), _UsesHelper())
    with pytest.raises(InspectorError) as err:
        capture_activations(net, torch.ones(1, 2))
    assert str(err.value) == (
        "the forward pass of Sequential failed in module 1: ValueError: cannot run on (1, 2)")
    assert hook_state(net) == {n: () for n, _ in net.named_modules()}
