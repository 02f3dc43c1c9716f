"""The reader of run files in a child process under a memory limit, for the hostile-file tests.

Started as ``python tests/runfile_child.py LIMIT_MB``: it imports the reader, reads one good run (so
every import and cache is warm), then limits its address space to what it uses plus ``LIMIT_MB``
(``RLIMIT_AS``), says ``ready``, and for each path read from stdin reads the file every way the
dashboard and the CLI do (by path, as an upload's bytes, followed live, its runs-folder row) and
answers one JSON line: ``outcome`` (``ok``, ``refused`` for an InspectorError, ``bug`` for any other
exception), ``message``, ``rows`` and ``peak_mb`` (the growth of the process's peak RSS over the
baseline, in MiB: cumulative, so never below any one file's own peak).

A read that takes over ``INSPECTOR_CHILD_TIMEOUT_S`` seconds (60 by default) ends the process
(``SIGALRM``): the test reports a freeze, and a reader that spins after its test was stopped does not
outlive it by more than that.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inspector import InspectorError  # noqa: E402
from inspector.runfiles import RunMeta, RunWriter, StepRecord  # noqa: E402
from inspector.runfolders import RunEntry, describe  # noqa: E402
from inspector.watching import LiveRun, parse_run_bytes, read_run  # noqa: E402


def _exercise(path: Path) -> int:
    run = read_run(path)
    rows = len(run.steps)
    assert rows == run.table.num_rows or run.kind == "check"
    if rows and run.kind == "watch":
        run.matrix("grad_norm")
        run.at(int(run.steps["step"].iloc[-1]), int(run.steps["rank"].iloc[-1]))
    data = path.read_bytes() if path.stat().st_size < (64 << 20) else b""
    if data:
        assert len(parse_run_bytes(data, path.name).steps) == rows
    assert len(LiveRun(path).read().steps) == rows
    return rows


def _warm(folder: Path) -> None:
    meta = RunMeta(model="warm", world_size=1, every=1, modules=("a",), parameters=("a.w",),
                   parameter_modules=(0,))
    with RunWriter(folder / "warm.inspect", meta) as w:
        w.write([StepRecord(step=0, rank=0, time=0.0, lr=[0.1], scalar_names=["x"], scalar_values=[1.0],
                            module_grad_norm=np.ones(1, np.float32), param_grad_norm=np.ones(1, np.float32))])
    _exercise(folder / "warm.inspect")


def main() -> None:
    limit_mb = int(sys.argv[1])
    folder = Path(sys.argv[2])
    timeout = int(os.environ.get("INSPECTOR_CHILD_TIMEOUT_S", "60"))
    signal.alarm(timeout)
    _warm(folder)
    signal.alarm(0)
    with open("/proc/self/statm") as f:
        size_pages = int(f.read().split()[0])
    vsz = size_pages * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vsz + (limit_mb << 20), resource.RLIM_INFINITY))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        signal.alarm(timeout)  # the default action ends the process, even inside C code
        path = Path(line.strip())
        out: dict[str, object] = {"path": str(path)}
        try:
            out["rows"] = _exercise(path)
            out["outcome"] = "ok"
        except InspectorError as exc:
            out["outcome"], out["message"] = "refused", str(exc)
        except BaseException as exc:  # noqa: BLE001 - what the test reports as a bug
            out["outcome"] = "bug"
            out["message"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
        try:
            row = describe(RunEntry(path.name, path, path.parent, 0.0, 0, False))
            out["row"] = str(row["first finding"])
        except BaseException as exc:  # noqa: BLE001
            out["outcome"], out["message"] = "bug", f"describe raised {type(exc).__name__}: {exc}"
        out["peak_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        signal.alarm(0)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
