"""A run's per-step table: learning rates of every group and logged scalars, each in its own column,
empty where a step did not record it (read without a Python object per step)."""

from __future__ import annotations

import numpy as np
import pytest

from inspector.watching import RunMeta, RunWriter, StepRecord, read_run

NAMES = [["acc"], [], ["acc", "tok"], ["tok", "acc"], ["loss"], ["acc", "acc"], []]
VALUES = [[1.0], [], [2.0, 3.0], [4.0, 5.0], [9.0], [6.0, 7.0], []]


@pytest.fixture
def run(tmp_path):
    meta = RunMeta(model="m", world_size=1, every=1, modules=("a",), parameters=("a.w",),
                   parameter_modules=(0,))
    one = np.ones(1, np.float32)
    records = [
        StepRecord(step=s, rank=0, time=float(s), loss=1.0, grad_norm=1.0, module_grad_norm=one,
                   module_nonfinite=np.zeros(1, np.int32), param_grad_norm=one,
                   lr=[0.1 * s, 0.2][: s % 3], scalar_names=NAMES[s], scalar_values=VALUES[s])
        for s in range(7)
    ]
    with RunWriter(tmp_path / "r.inspect", meta) as writer:
        writer.write(records)
    return read_run(tmp_path / "r.inspect")


def test_learning_rates_per_group(run):
    steps = run.steps
    # step s logs the first s % 3 of [0.1 s, 0.2]: none at 0, 3, 6; one at 1, 4; two at 2, 5
    np.testing.assert_allclose(steps["lr_0"], [np.nan, 0.1, 0.2, np.nan, 0.4, 0.5, np.nan])
    np.testing.assert_allclose(steps["lr_1"], [np.nan, np.nan, 0.2, np.nan, np.nan, 0.2, np.nan])


def test_scalars_in_order_of_first_appearance(run):
    steps = run.steps
    assert [c for c in steps.columns if c in ("acc", "tok")] == ["acc", "tok"]
    np.testing.assert_allclose(steps["acc"], [1.0, np.nan, 2.0, 5.0, np.nan, 7.0, np.nan])  # the later of two
    np.testing.assert_allclose(steps["tok"], [np.nan, np.nan, 3.0, 4.0, np.nan, np.nan, np.nan])
    assert (steps["loss"] == 1.0).all()  # a scalar named like a step column does not replace it
