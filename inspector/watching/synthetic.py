"""A synthetic run file of any size, for tests and for timing what reads run files."""

from __future__ import annotations

import os
import time

import numpy as np

from ..runfiles import RunMeta, RunWriter, StepRecord
from ..utils.codes import coded


def synthetic_run(path: str | os.PathLike, steps: int = 100, modules: int = 10, *, world_size: int = 1,
                  every: int = 1, seed: int = 0, chunk: int = 500) -> RunMeta:
    """Write a run file of ``steps`` steps × ``modules`` modules (one parameter each) to ``path``.

    Gradient norms decay slowly with noise; module ``modules // 2`` explodes at step
    ``steps * 3 // 4`` (an ``exploding-gradient`` finding there). Steps are written
    ``chunk`` at a time (one Arrow batch per chunk), so 10,000 × 1,000 takes a few seconds.

    Returns:
        the :class:`RunMeta` written.

    >>> import tempfile, pathlib
    >>> folder = tempfile.TemporaryDirectory()
    >>> synthetic_run(pathlib.Path(folder.name) / "r.inspect", steps=3, modules=2).modules
    ('layers.0', 'layers.1')
    >>> folder.cleanup()
    """
    rng = np.random.default_rng(seed)
    names = tuple(f"layers.{i}" for i in range(modules))
    meta = RunMeta(model="synthetic", world_size=world_size, every=every, modules=names,
                   parameters=tuple(f"{n}.weight" for n in names), parameter_modules=tuple(range(modules)),
                   started=time.time())
    scale = np.exp(rng.normal(0.0, 1.0, modules)).astype(np.float32)
    bad_step, bad_module = steps * 3 // 4, modules // 2
    with RunWriter(path, meta) as writer:
        for start in range(0, steps, chunk):
            batch = []
            for step in range(start, min(start + chunk, steps)):
                decay = np.float32(1.0 / (1.0 + step / 1000.0))
                for rank in range(world_size):
                    norms = scale * decay * (1.0 + 0.1 * rng.standard_normal(modules).astype(np.float32))
                    findings = []
                    if step == bad_step and modules:
                        norms[bad_module] *= 1000.0
                        findings = [coded("exploding-gradient", names[bad_module],
                                            "gradient norm 1000x its running median").to_dict()]
                    batch.append(
                        StepRecord(
                            step=step,
                            rank=rank,
                            time=meta.started + step,
                            step_time=0.1,
                            loss=2.0 * float(decay),
                            grad_norm=float(np.sqrt(np.sum(norms.astype(np.float64) ** 2))),
                            lr=[1e-3],
                            module_grad_norm=norms,
                            module_param_norm=np.full(modules, 10.0, np.float32)
                            if step % every == 0
                            else None,
                            module_nonfinite=np.zeros(modules, np.int32),
                            param_grad_norm=norms,
                            findings=findings if rank == 0 else [],
                        )
                    )
            writer.write(batch)
    return meta
