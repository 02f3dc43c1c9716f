"""W&B export: the watch's numbers and findings logged to an offline W&B run, read back from the run's
own ``.wandb`` log by W&B's reader (``wandb leet inspect --json``). Nothing is contacted: every W&B
folder (run, cache, config, data) is under tmp_path, and W&B's service process ends with each test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inspector import InspectorError
from inspector.integrations import WandbExport
from tests.watched_loop import loop

wandb = pytest.importorskip("wandb")

FOLDERS = {"WANDB_DIR": "wandb", "WANDB_CACHE_DIR": "cache", "WANDB_CONFIG_DIR": "config",
           "WANDB_DATA_DIR": "data", "WANDB_ARTIFACT_DIR": "artifacts"}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B in offline mode, writing only under tmp_path; its service is torn down afterwards."""
    env = {k: str(tmp_path / v) for k, v in FOLDERS.items()}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_ERROR_REPORTING="false")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in FOLDERS:
        Path(env[k]).mkdir()
    try:
        yield env
    finally:
        wandb.teardown()


def start_run():
    return wandb.init(project="inspector-test", settings=wandb.Settings(
        silent=True, x_disable_stats=True, disable_git=True, save_code=False, console="off"))


def records(env, run) -> list[dict]:
    """Every record of the run's ``.wandb`` log, as W&B's own reader prints them."""
    folder = Path(run.dir).parent  # <WANDB_DIR>/wandb/offline-run-.../files -> the run folder
    (log,) = folder.glob("run-*.wandb")
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                         capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def history(recs) -> list[dict]:
    return [r["history"]["item"] for r in recs if r["type"] == "history"]


def test_wandb_gets_every_step_and_every_finding(tmp_path, offline):
    run = start_run()
    run_file = loop(tmp_path, [WandbExport(run)], poison=2)
    run.finish()
    assert Path(run.dir).resolve().is_relative_to(tmp_path.resolve())  # nothing written elsewhere
    recs = records(offline, run)
    rows = history(recs)
    steps = run_file.steps
    assert [r["inspector/step"] for r in rows] == [0, 1, 2, 3]
    # steps 2 and 3 have NaN gradient norms (the Inf input): not logged
    assert [r["inspector/step"] for r in rows if "inspector/grad_norm" in r] == [0, 1]
    first_two = rows[:2]
    np.testing.assert_allclose([r["inspector/grad_norm"] for r in first_two], steps.grad_norm[:2], rtol=1e-6)
    np.testing.assert_allclose([rows[i]["inspector/loss"] for i in (0, 1)], steps.loss[:2], rtol=1e-6)
    assert [r["inspector/nonfinite"] for r in rows] == steps.nonfinite.tolist()
    _, grads = run_file.matrix("grad_norm")  # steps x modules ("0", "2")
    np.testing.assert_allclose([rows[i]["inspector/grad_norm/0"] for i in (0, 1)], grads[:2, 0], rtol=1e-6)
    assert all("inspector/update_ratio/2" in r for r in rows[:2])
    # per-module nonfinite counts only on the steps that had any: 2 (the Inf input) and 3
    assert [r["inspector/step"] for r in rows if "inspector/nonfinite/0" in r] == [2, 3]
    first = run_file.findings[0]
    text = rows[first.step]["inspector/findings"]
    assert f"step {first.step}" in text and first.code in text and first.where in text
    assert not any("inspector/findings" in r for r in rows[:first.step])
    # every inspector/* line is drawn against the watch's own step axis
    metrics = [r["metric"] for r in recs if r["type"] == "metric"]
    assert {"glob_name": "inspector/*", "step_metric": "inspector/step"} in [
        {k: m.get(k) for k in ("glob_name", "step_metric")} for m in metrics]


def test_wandb_by_name_logs_to_the_active_run(tmp_path, offline):
    with pytest.raises(InspectorError, match=r"wandb.init"):
        loop(tmp_path, ["wandb"], steps=1)  # no run started yet: said before any step
    run = start_run()
    assert WandbExport(depth=0).run is run
    run_file = loop(tmp_path, ["wandb"], steps=2)
    run.finish()
    rows = history(records(offline, run))
    assert [r["inspector/step"] for r in rows] == [0, 1]
    # every module that holds parameters ("0" and "2"), as the run file names them
    assert run_file.meta.modules == ("0", "2")
    assert {k for k in rows[0] if k.startswith("inspector/grad_norm/")} == {
        "inspector/grad_norm/0", "inspector/grad_norm/2"}
