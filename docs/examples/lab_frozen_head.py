"""A teacher's lab: the frozen head. Drop this file into the folder named by INSPECTOR_LABS_DIR.

The story: a student meant to freeze the convolutions of ``cnn-bn`` and fine-tune the
classifier, but froze the classifier instead. Training runs, the loss barely moves. The
checker grades with the inspector's gradient norms, not with a list typed in here.
"""

from __future__ import annotations

from inspector.labs import CheckResult, Field, Lab, Scenario, Task, View
from inspector.loading.models import call_model, load_model
from inspector.offsets import gradient_norms
from inspector.utils.locks import model_lock


def build() -> Scenario:
    loaded = load_model("sample:cnn-bn")
    model = loaded.model
    model.fc.requires_grad_(False)          # the bug: this should have been model.conv1
    inputs = loaded.example_inputs(4)
    with model_lock(model):
        loaded.loss(call_model(model, inputs), inputs).backward()
    return Scenario(loaded)


def parameter_names(scenario: Scenario) -> list[str]:
    return [name for name, _ in scenario.model.named_parameters()]


def check_frozen(scenario: Scenario, answers: dict) -> CheckResult:
    norms = gradient_norms(scenario.model)
    frozen = set(norms.loc[norms["state"] == "frozen", "name"])
    if set(answers["names"]) != frozen:
        return CheckResult(False, "Not those: look at the state column of the gradient norms.")
    return CheckResult(True, f"Right: {', '.join(sorted(frozen))} get no gradient.",
                       (f"gradient_norms: state 'frozen' for {', '.join(sorted(frozen))}",))


LAB = Lab(
    id="frozen-head",
    title="The frozen head",
    story="You froze part of `cnn-bn` to fine-tune the rest, but the loss barely moves. "
          "Which parameters did you really freeze?",
    build=build,
    tasks=(
        Task(
            id="frozen",
            prompt="Name every parameter that gets no gradient because it is frozen.",
            fields=(Field("names", "Frozen parameters", "multi", parameter_names),),
            check=check_frozen,
            hints=("Open the gradient norms: frozen parameters have the state 'frozen'.",),
            solution={"names": ["fc.weight", "fc.bias"]},
        ),
    ),
    views=(View("Gradient norms per parameter", lambda s: gradient_norms(s.model)),),
    solution="`model.fc.requires_grad_(False)` froze the classifier; freeze `model.conv1` instead.",
)
