"""Two gloo ranks under the watch: findings merged by rank, a stop taken together, failures and
vanished ranks recorded, a rank out of step named instead of a hang."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from ranks import init, leave, spawn_ranks
from torch import nn


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))


def _merged_worker(rank: int, world: int, port: int, out: str) -> None:
    from inspector import watch
    from inspector.integrations import WatchedTraining

    torch.set_num_threads(1)
    init(rank, world, port)
    try:
        # 1. rank 1 alone forgets zero_grad: its finding reaches rank 0 and the file, labelled rank 1
        model = nn.parallel.DistributedDataParallel(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with watch(model, opt, Path(out) / "zero.inspect") as w:
            for _ in range(4):
                model(torch.ones(2, 4) * (rank + 1)).pow(2).mean().backward()
                opt.step()
                if rank == 0:
                    opt.zero_grad()
        zero = [(f.step, f.rank, f.code) for f in w.findings]
        # 2. a NaN in rank 1's batch at step 2, stop_on_error: every rank stops after the same step,
        # only rank 0 reports, and each finding once
        model = nn.parallel.DistributedDataParallel(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        printed = []
        session = WatchedTraining(Path(out) / "nan.inspect", stop_on_error=True, report=printed.append,
                                  nonfinite=True, timeout=60)
        session.start(model, opt)
        steps = 0
        for step in range(6):
            x = torch.ones(2, 4) * (rank + 1)
            if rank == 1 and step == 2:
                x[0, 0] = float("nan")
            loss = model(x).pow(2).mean()
            loss.backward()
            session.log(loss=loss)
            opt.step()
            opt.zero_grad()
            steps += 1
            if session.should_stop:
                break
        session.finish(completed=not session.should_stop)
        # 3. a NaN written into rank 1's copy of a plain (unsynchronised) weight: check_step's findings
        # are placed on rank 1's row too, and with the loss logged none asks for loss=
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with watch(model, opt, Path(out) / "check.inspect") as checked:
            for step in range(2):
                if rank == 1 and step == 1:
                    with torch.no_grad():
                        model[0].weight[0, 0] = float("nan")
                loss = model(torch.ones(2, 4)).pow(2).mean()
                loss.backward()
                checked.log(loss=loss)
                opt.step()
                opt.zero_grad()
        # 4. check_step alone, the loss given: a NaN in rank 1's batch reaches every rank's gradients through
        # the reduction, and its file names rank 1 as the finding's rank
        from inspector.distributed import check_step

        model = nn.parallel.DistributedDataParallel(_net())
        for step in range(2):
            x = torch.ones(2, 4)
            if rank == 1 and step == 1:
                x[0, 0] = float("nan")
            loss = model(x).pow(2).mean()
            loss.backward()
            check_step(model, step, Path(out) / "check_step.inspect", loss=loss, timeout=60)
            model.zero_grad()
        (Path(out) / f"merged{rank}.json").write_text(json.dumps({
            "zero": zero, "steps": steps, "printed": [f.line() for f in printed],
            "stopped": session.stop_finding().code}))
    finally:
        leave()


def test_findings_of_every_rank_reach_the_file_and_the_stop_is_taken_together(tmp_path):
    spawn_ranks(_merged_worker, 2, str(tmp_path), timeout=240)
    from inspector import read_run

    on = [json.loads((tmp_path / f"merged{r}.json").read_text()) for r in (0, 1)]
    zero = read_run(tmp_path / "zero.inspect")
    missed = [(f.step, f.rank) for f in zero.findings if f.code == "gradient-not-cleared"]
    assert missed and {r for _, r in missed} == {1}  # only rank 1 forgot, and rank 0's file says so
    assert on[0]["zero"] == on[1]["zero"]  # every rank holds every rank's findings
    assert [tuple(f) for f in on[0]["zero"]] == [(f.step, f.rank, f.code) for f in zero.findings]

    assert on[0]["steps"] == on[1]["steps"] == 3  # both stopped after step 2, the step of the NaN
    run = read_run(tmp_path / "nan.inspect")
    batch = [f for f in run.findings if f.code == "nonfinite-forward"]
    assert [(f.step, f.rank, f.where) for f in batch] == [(2, 1, "(batch)")]
    assert not any("pass loss=" in f.message for f in run.findings)  # the loss was logged
    assert on[1]["printed"] == [] and len(on[0]["printed"]) == len(run.findings)  # printed once, on rank 0
    assert any("rank 1" in line for line in on[0]["printed"])
    assert on[0]["stopped"] == on[1]["stopped"] == "nonfinite-forward"

    check = read_run(tmp_path / "check.inspect")
    found = {(f.step, f.rank, f.code, f.where) for f in check.findings}
    # check_step's own findings (drift, spread) and the watch's, each on rank 1's row: the rank at fault
    assert {(1, 1, "replica-drift", "0.weight"), (1, 1, "nonfinite-parameter", "0.weight")} <= found
    assert any(code == "nonfinite-gradient" for _, _, code, _ in found)
    assert {r for _, r, _, _ in found} == {1}
    assert not any("pass loss=" in f.message for f in check.findings)

    alone = read_run(tmp_path / "check_step.inspect")
    assert alone.kind == "check"
    assert [(f.step, f.rank, f.code) for f in alone.findings] == [(1, 1, "nonfinite-gradient")]
    assert "start at the loss of rank 1" in alone.findings[0].message


def _failing_worker(rank: int, world: int, port: int, out: str, how: str) -> None:
    from inspector import watch

    torch.set_num_threads(1)
    init(rank, world, port)
    try:
        model = nn.parallel.DistributedDataParallel(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        try:
            with watch(model, opt, Path(out) / "run.inspect", timeout=8):
                for step in range(6):
                    if rank == 1 and step == 3:
                        if how == "kill":
                            os._exit(0)  # what a SIGKILL leaves: no exception, no goodbye
                        raise ValueError("bad batch 3 on rank 1")
                    model(torch.ones(2, 4)).pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad()
        except Exception as exc:  # noqa: BLE001 - the test reads what the file says about it
            (Path(out) / f"error{rank}.txt").write_text(f"{type(exc).__name__}: {exc}")
    finally:
        from inspector.distributed import end_group

        end_group(wait=False)  # the other rank failed or is gone: no barrier with it


def test_a_rank_that_raises_is_recorded_with_its_step_and_exception(tmp_path):
    spawn_ranks(_failing_worker, 2, str(tmp_path), "raise", timeout=240)
    from inspector import read_run

    run = read_run(tmp_path / "run.inspect")
    assert not run.complete
    assert run.failure.rank == 1 and "step 3" in run.failure.message and "ValueError" in run.failure.message
    assert "bad batch 3 on rank 1" in run.failure.message
    assert sorted(set(run.steps["step"])) == [0, 1, 2]


def test_a_rank_that_vanishes_is_recorded_without_a_hang(tmp_path):
    spawn_ranks(_failing_worker, 2, str(tmp_path), "kill", timeout=240)
    from inspector import read_run

    run = read_run(tmp_path / "run.inspect")
    assert not run.complete
    assert run.failure.rank == 1 and "vanished" in run.failure.message and "step 2" in run.failure.message
    assert (tmp_path / "error0.txt").exists()  # rank 0's own step failed with it, and it ended


def _out_of_step_worker(rank: int, world: int, port: int, out: str) -> None:
    from inspector import watch

    torch.set_num_threads(1)
    init(rank, world, port)
    try:
        said = {}
        for case in ("batch", "step", "last"):
            model = _net()
            opt = torch.optim.SGD(model.parameters(), lr=0.01) if case == "batch" else None
            try:
                with watch(model, opt, Path(out) / f"{case}.inspect", timeout=8) as w:
                    for step in range(4):
                        loss = model(torch.ones(2, 4)).pow(2).mean()
                        if case == "batch" and rank == 1 and step == 1:
                            continue  # an exception caught after the forward pass: the batch is skipped
                        loss.backward()
                        if case == "batch":
                            opt.step()
                            opt.zero_grad()
                        elif not (rank == 1 and step == (1 if case == "step" else 3)):
                            w.step()
                said[case] = ""
            except Exception as exc:  # noqa: BLE001
                said[case] = str(exc)
        # a rank that sleeps 1.5 s before its forward pass at step 1: named, though both ranks' step time
        # is the same (the other waited for it)
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with watch(model, opt, Path(out) / "slow.inspect", timeout=60):
            for step in range(3):
                if rank == 1 and step == 1:
                    time.sleep(1.5)
                model(torch.ones(2, 4)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        (Path(out) / f"said{rank}.json").write_text(json.dumps(said))
    finally:
        leave()


def test_a_rank_out_of_step_is_named_instead_of_a_hang(tmp_path):
    spawn_ranks(_out_of_step_worker, 2, str(tmp_path), timeout=240)
    from inspector import read_run

    said = [json.loads((tmp_path / f"said{r}.json").read_text()) for r in (0, 1)]
    for case, named in (("batch", "rank 1 ran an extra training forward pass at step 1"),
                        ("step", "rank 1 skipped optimizer.step() (or w.step()) at step 1")):
        run = read_run(tmp_path / f"{case}.inspect")
        assert not run.complete and run.failure.rank == 1, case
        assert named in run.failure.message
        assert all(named in s[case] for s in said), (case, said)
    last = read_run(tmp_path / "last.inspect")  # rank 1 never made its last step: rank 0 is not left waiting
    assert not last.complete and last.failure.rank == 1 and "skipped a step" in last.failure.message
    assert "rank 1" in said[0]["last"]
    slow = read_run(tmp_path / "slow.inspect")
    assert [(f.step, f.rank, f.code) for f in slow.findings] == [(1, 1, "slow-rank")]
    assert "rank 1 took 1.5" in slow.findings[0].message


def _mesh_worker(rank: int, world: int, port: int, out: str) -> None:
    from distributed_checks import TPBlock
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from inspector import watch

    torch.set_num_threads(1)
    init(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        model = parallelize_module(TPBlock(), mesh["tp"], plan)
        fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 + mesh["dp"].get_local_rank()))
        with watch(model, opt, Path(out) / "mesh.inspect", distributed=False):
            model(x).pow(2).sum().backward()
            full = {n: p.grad.full_tensor() for n, p in model.named_parameters()}  # the reference
            opt.step()
        from inspector.distributed import check_step

        check_step(model, 0, Path(out) / "check.inspect")  # the same gradients, read by check_step
        ref = {n: float(g.double().norm()) for n, g in full.items()}
        ref["(total)"] = sum(v * v for v in ref.values()) ** 0.5
        (Path(out) / f"mesh{rank}.json").write_text(json.dumps(ref))
    finally:
        leave()


def test_the_watch_is_exact_on_fsdp_over_tensor_parallel_on_a_2x2_mesh(tmp_path):
    import numpy as np

    spawn_ranks(_mesh_worker, 4, str(tmp_path), timeout=240)
    from inspector import read_run

    run = read_run(tmp_path / "mesh.inspect")
    ref = json.loads((tmp_path / "mesh0.json").read_text())
    params = run.parameters
    for rank in range(4):  # every rank's row holds the whole model's norms, each element counted once
        got = params.query(f"rank == {rank}").set_index("parameter")["grad_norm"]
        for name in ("norm.weight", "up.weight", "down.weight", "down.bias"):
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, err_msg=f"rank {rank} {name}")
        row = run.steps.query(f"rank == {rank}")["grad_norm"].iloc[0]
        np.testing.assert_allclose(row, ref["(total)"], rtol=1e-5, err_msg=f"rank {rank}")
    # one meaning of grad_norm in both kinds of run: the whole model's, on every rank's row
    check = read_run(tmp_path / "check.inspect")
    np.testing.assert_allclose(check.steps["grad_norm"].to_numpy(), [ref["(total)"]] * 4, rtol=1e-5)
    assert (check.per_rank["grad_norm"] < ref["(total)"] * 0.99).all()  # each rank's own pieces: less


def _lightning_worker(rank: int, world: int, port: int, out: str) -> None:
    """Lightning's DDP on 2 ranks as torchrun starts it; a NaN in rank 1's batch at step 2."""
    import pytorch_lightning as pl

    from inspector.integrations import LightningWatch

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", NODE_RANK="0",
                      TORCHELASTIC_RUN_ID="test")

    class Poisoned(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch, batch_idx):
            x = batch[0].clone()
            if self.global_rank == 1 and batch_idx == 2:
                x[0, 0] = float("nan")
            return self.net(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(24, 4)), batch_size=2)
    printed: list = []
    callback = LightningWatch(Path(out) / "pl.inspect", stop_on_error=True, report=printed.append,
                              nonfinite=True)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_steps=8, callbacks=[callback],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False)
    try:
        trainer.fit(Poisoned(), data)
    finally:
        (Path(out) / f"pl{rank}.json").write_text(json.dumps({"steps": trainer.global_step,
                                                             "printed": [f.line() for f in printed]}))
        leave()


def test_lightning_ddp_stops_every_rank_at_the_same_step(tmp_path):
    pytest.importorskip("pytorch_lightning")
    spawn_ranks(_lightning_worker, 2, str(tmp_path), timeout=240)
    from inspector import read_run

    on = [json.loads((tmp_path / f"pl{r}.json").read_text()) for r in (0, 1)]
    assert on[0]["steps"] == on[1]["steps"] == 3  # both stopped after step 2: no rank left waiting
    run = read_run(tmp_path / "pl.inspect")
    assert [(f.step, f.rank, f.code) for f in run.findings] == [(2, 1, "nonfinite-forward")]
    assert on[1]["printed"] == [] and on[0]["printed"] == [f.line() for f in run.findings]


class _OneOutput(nn.Module):
    """A 1-output head and a learned scalar: under FSDP2 on 2 ranks, rank 1 holds an empty piece of each."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(64, 256)  # split evenly; the head's 258 elements on rank 0 are 1.5% more
        self.head = nn.Linear(256, 1)
        self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x))) * self.temperature


def _clipped(how: str, mesh, rank: int, out: Path) -> dict:
    """Three FSDP2 steps of :class:`_OneOutput` inside a watch, clipped by torch's ``clip_grad_norm_`` or
    by ``w.clip_grad_norm_``: the totals, the pre-clip norms, the findings, how many norm passes the
    clips and steps made, and the weights after."""
    from torch.distributed.fsdp import fully_shard

    from inspector import watch

    model = _OneOutput()
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    totals, pre, calls = [], [], [0]
    real = torch._foreach_norm, torch.linalg.vector_norm

    def counted(real_norm):
        def norm(*args, **kwargs):
            calls[0] += 1
            return real_norm(*args, **kwargs)
        return norm

    def torch_clip(max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    with watch(model, opt, out / f"clip-{how}.inspect") as w:
        clip = w.clip_grad_norm_ if how == "watch" else torch_clip
        for step in range(3):
            x = torch.randn(4, 64, generator=torch.Generator().manual_seed(step * 10 + rank))
            model(x).pow(2).mean().backward()
            pre.append({n: float(p.grad.full_tensor().double().norm()) for n, p in model.named_parameters()})
            torch._foreach_norm, torch.linalg.vector_norm = map(counted, real)  # the norm passes
            try:
                totals.append(float(clip(0.05)))
                opt.step()
            finally:
                torch._foreach_norm, torch.linalg.vector_norm = real
            opt.zero_grad()
    return {"totals": totals, "pre": pre, "findings": [f.code for f in w.findings], "calls": calls[0],
            "weights": {n: p.full_tensor().tolist() for n, p in model.named_parameters()}}


def _empty_piece_worker(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from inspector import watch

    torch.set_num_threads(1)
    init(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = _OneOutput()
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        pieces = {n: p.to_local().numel() for n, p in model.named_parameters()}
        refs = []
        with watch(model, opt, Path(out) / "empty.inspect") as w:
            for step in range(3):
                x = torch.randn(4, 64, generator=torch.Generator().manual_seed(step * 10 + rank))
                model(x).pow(2).mean().backward()
                refs.append({n: float(p.grad.full_tensor().double().norm())
                             for n, p in model.named_parameters()})
                opt.step()
                opt.zero_grad()
        findings = [(f.step, f.rank, f.code) for f in w.findings]
        # the same training clipped by torch's clip_grad_norm_, then by the watch's from its own norms
        clipped = {how: _clipped(how, mesh, rank, Path(out)) for how in ("torch", "watch")}
        # a sharded module whose updates are under its weights' precision stands still: named, from each
        # rank's own piece
        model = _OneOutput()
        fully_shard(model, mesh=mesh)
        rest = [p for n, p in model.named_parameters() if not n.startswith("body.")]
        opt = torch.optim.SGD([{"params": list(model.body.parameters()), "lr": 1e-12}, {"params": rest}],
                              lr=0.05)
        with watch(model, opt, Path(out) / "still.inspect") as w:
            for step in range(5):
                x = torch.randn(4, 64, generator=torch.Generator().manual_seed(step * 10 + rank))
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        still = [(f.rank, f.code, f.where) for f in w.findings if f.code != "frozen-parameters"]
        (Path(out) / f"empty{rank}.json").write_text(json.dumps(
            {"pieces": pieces, "refs": refs, "findings": findings, "clipped": clipped, "still": still}))
    finally:
        leave()


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory) -> Path:
    """The folder of :func:`_empty_piece_worker`'s runs on 2 ranks (made once for the tests that read it)."""
    out = tmp_path_factory.mktemp("sharded")
    spawn_ranks(_empty_piece_worker, 2, str(out), timeout=180)
    return out


def test_an_empty_local_piece_under_fsdp2_is_empty_not_nan(sharded_runs):
    import numpy as np

    from inspector import read_run

    tmp_path = sharded_runs
    got = [json.loads((tmp_path / f"empty{r}.json").read_text()) for r in (0, 1)]
    assert got[1]["pieces"]["head.weight"] == 0 and got[1]["pieces"]["temperature"] == 0  # the case itself
    for r in (0, 1):
        assert [f for f in got[r]["findings"] if f[2] not in ("frozen-parameters",)] == []
    run = read_run(tmp_path / "empty.inspect")
    assert np.isfinite(run.steps["grad_norm"].to_numpy()).all()
    params = run.parameters
    for rank in (0, 1):
        for step in range(3):
            rows = params.query(f"rank == {rank} and step == {step}").set_index("parameter")
            for name, ref in got[0]["refs"][step].items():
                np.testing.assert_allclose(rows.loc[name, "grad_norm"], ref, rtol=1e-5,
                                           err_msg=f"rank {rank} step {step} {name}")


def test_a_sharded_module_that_stands_still_is_named_on_every_rank(sharded_runs):
    tmp_path = sharded_runs
    got = [json.loads((tmp_path / f"empty{r}.json").read_text())["still"] for r in (0, 1)]
    assert got[0] == got[1]  # every rank has the same findings
    assert sorted({(r, code, where) for r, code, where in got[0]}) == [(0, "no-update", "body.weight"),
                                                                        (1, "no-update", "body.weight")]


def test_the_watchs_clip_under_fsdp2_is_torchs_from_the_norms_it_took(sharded_runs):
    """Sharded gradients with empty pieces on rank 1: ``w.clip_grad_norm_`` gives torch's total on every
    rank and the same training, and the run still holds each parameter's global pre-clip norm (the clip's
    reduction is not made twice)."""
    import numpy as np

    from inspector import read_run

    tmp_path = sharded_runs
    got = [json.loads((tmp_path / f"empty{r}.json").read_text())["clipped"] for r in (0, 1)]
    for r in (0, 1):
        mine, torchs = got[r]["watch"], got[r]["torch"]
        assert max(torchs["totals"]) > 0.05  # the clip acted
        np.testing.assert_allclose(mine["totals"], torchs["totals"], rtol=1e-6)
        np.testing.assert_allclose(mine["totals"], got[0]["torch"]["totals"], rtol=1e-6)  # every rank's
        for name, weights in torchs["weights"].items():
            np.testing.assert_allclose(mine["weights"][name], weights, rtol=1e-5, atol=1e-7, err_msg=name)
        assert [c for c in mine["findings"] if c != "frozen-parameters"] == []
        assert mine["calls"] < torchs["calls"]  # torch's clip in the watch reads the gradients a second time
    run = read_run(tmp_path / "clip-watch.inspect")
    np.testing.assert_allclose(run.steps.query("rank == 0")["grad_norm"], got[0]["watch"]["totals"],
                               rtol=1e-6)
    params = run.parameters
    for rank in (0, 1):
        for step in range(3):
            rows = params.query(f"rank == {rank} and step == {step}").set_index("parameter")
            for name, ref in got[0]["watch"]["pre"][step].items():
                np.testing.assert_allclose(rows.loc[name, "grad_norm"], ref, rtol=1e-5,
                                           err_msg=f"rank {rank} step {step} {name}")
