"""Mutation testing with mutmut: each module against the tests that cover it (``make mutate``).

For each entry of ``MODULES`` a scratch folder ``build/mutate/<name>/`` gets the project's
``pyproject.toml`` with its ``[tool.mutmut]`` settings plus that entry's ``only_mutate`` and tests, and
links to the sources; ``mutmut run --max-children N`` runs there (one worker unless ``--workers``), then
this prints the module's score and each survivor's diff. A rerun keeps mutmut's results and tests only
what changed; ``--fresh`` starts over.

Score: killed (a timeout counts as killed, as mutmut counts it) over every mutant that ran or had no
test to run: a mutant that no covering test calls is a survivor too.

    python -m benchmarks.mutate                       # every module, one worker
    python -m benchmarks.mutate ties guard --fresh    # some of them, from scratch
    python -m benchmarks.mutate ties --survivors      # the survivors again, after adding tests
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "build" / "mutate"
LINKED = ["inspector", "sample_models", "tests", "ui", "pages", "app.py", ".streamlit", "docs"]

# name -> (the files mutated, the tests that cover them, as pytest arguments). Small modules whose word
# users act on; tests that start process groups (``collectives``) are left out: they take minutes each.
MODULES: dict[str, tuple[list[str], list[str]]] = {
    "ties": (["inspector/aliases/ties.py"],
             ["tests/test_aliases.py", "tests/test_alias_properties.py"]),
    "paths": (["inspector/utils/paths.py"],
              ["tests/test_path_gate.py", "tests/test_paths_refused.py"]),
    "guard": (["inspector/runfiles/guard.py"],
              ["tests/internals/test_runfile_hostile.py", "tests/test_distributed_run_hostile.py"]),
    "distributed-findings": (["inspector/distributed/findings.py"],
                             ["tests/internals/test_distributed_findings.py", "-m", "not collectives"]),
    "offsets": (["inspector/offsets/map.py"],
                ["tests/test_offsets.py", "tests/test_offsets_properties.py"]),
    "capture": (["inspector/capture/recorder.py", "inspector/capture/compare.py",
                 "inspector/capture/stats.py"],
                ["tests/test_capture.py", "tests/test_capture_unwatched.py",
                 "tests/internals/test_capture_chains.py"]),
    # last: inspector/watching is being reshaped; its mutants are named by function and move with it
    "watching-detect": (["inspector/watching/detect.py"],
                        ["tests/test_watch.py", "tests/test_watch_checks.py", "tests/test_watch_planted.py",
                         "tests/test_watch_detectors.py", "tests/test_watch_intent.py"]),
    "watching-rules": (["inspector/watching/rules/before.py", "inspector/watching/rules/after.py",
                        "inspector/watching/rules/around.py", "inspector/watching/rules/updates.py"],
                       ["tests/test_watch.py", "tests/test_watch_checks.py", "tests/test_watch_planted.py",
                        "tests/test_watch_intent.py", "tests/internals/test_watch_table.py"]),
}

KILLED = {"killed", "timeout"}
UNCHECKED = "not checked"  # a run stopped before it reached the mutant


def _toml_value(v: object) -> str:
    return json.dumps(v)  # strings, booleans, numbers and lists of them read the same in TOML


def _pyproject(files: list[str], tests: list[str]) -> str:
    """The project's pyproject.toml with its [tool.mutmut] table given ``files`` and ``tests``."""
    text = (ROOT / "pyproject.toml").read_text()
    settings = dict(tomllib.loads(text)["tool"]["mutmut"])
    settings["only_mutate"] = files
    settings["pytest_add_cli_args_test_selection"] = tests
    kept = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
    return kept.rstrip() + "\n\n[tool.mutmut]\n" + "".join(f"{k} = {_toml_value(v)}\n"
                                                          for k, v in settings.items())


def _prepare(name: str, fresh: bool) -> Path:
    files, tests = MODULES[name]
    where = SCRATCH / name
    if fresh and where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True, exist_ok=True)
    for item in LINKED:
        link = where / item
        if not link.is_symlink():
            link.symlink_to(ROOT / item)
    (where / "pyproject.toml").write_text(_pyproject(files, tests))
    return where


REPORT = """
import json
from mutmut.__main__ import (SourceFileMutationData, get_diff_for_mutant, status_by_exit_code,
                             walk_mutatable_files)
out = {}
for path in walk_mutatable_files():
    m = SourceFileMutationData(path=path)
    m.load()
    for key, code in m.exit_code_by_key.items():
        status = status_by_exit_code[code]
        out[key] = [status, "" if status in ("killed", "timeout") else get_diff_for_mutant(key, path=path)]
print(json.dumps(out))
"""


def _results(where: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """mutant name -> ``[status, diff]`` (no diff for a killed one) of the results kept in ``where``."""
    if not (where / "mutants").is_dir():
        return {}
    report = subprocess.run([sys.executable, "-c", REPORT], cwd=where, env=env, capture_output=True,
                            text=True, check=True)
    return json.loads(report.stdout.strip().splitlines()[-1])


def run(name: str, workers: int, fresh: bool, survivors: bool = False) -> dict:
    """mutmut on module ``name``: ``{"seconds", "status" (name -> count), "survivors" (name -> diff)}``.
    ``survivors``: run again only the mutants that survived last time (after tests were added)."""
    where = _prepare(name, fresh)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           # a mutant that makes the run-file reader spin in the hostile tests' child process fails
           # that test (and ends the child) in 15 s, not 60 (tests/runfile_child.py)
           "INSPECTOR_CHILD_TIMEOUT_S": "15"}
    again = [k for k, (s, _) in _results(where, env).items() if s not in KILLED | {UNCHECKED}] \
        if survivors else []
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(workers), *again],
                          cwd=where, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"mutmut failed on {name} (exit {done.returncode}):\n{tail}")
    results = _results(where, env)
    status: dict[str, int] = {}
    for s, _ in results.values():
        status[s] = status.get(s, 0) + 1
    survivors = {k: diff for k, (s, diff) in sorted(results.items()) if s not in KILLED | {UNCHECKED}}
    return {"seconds": seconds, "status": status, "survivors": survivors}


def score(status: dict[str, int]) -> tuple[int, int]:
    """``(killed, counted)``: skipped mutants (none here) are left out, as mutmut leaves them, and so are
    those a stopped run did not reach (``status`` says how many)."""
    counted = sum(n for s, n in status.items() if s not in ("skipped", UNCHECKED))
    return sum(status.get(s, 0) for s in KILLED), counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", choices=[[], *MODULES], metavar="MODULE",
                        help=f"some of: {', '.join(MODULES)} (default: all)")
    parser.add_argument("--workers", type=int, default=1, help="mutmut's --max-children (default 1)")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results")
    parser.add_argument("--survivors", action="store_true",
                        help="run again only the mutants that survived the last run (after adding tests); "
                             "not those a stopped run did not reach")
    parser.add_argument("--quiet", action="store_true", help="scores only, no survivor diffs")
    args = parser.parse_args(argv)
    rows = []
    for name in args.modules or list(MODULES):
        print(f"== {name}: {', '.join(MODULES[name][0])}", flush=True)
        result = run(name, args.workers, args.fresh, args.survivors)
        killed, counted = score(result["status"])
        rows.append((name, killed, counted, result["seconds"]))
        print(f"   {killed}/{counted} killed ({100 * killed / max(counted, 1):.1f}%) in "
              f"{result['seconds']:.0f} s; {json.dumps(result['status'], sort_keys=True)}", flush=True)
        for key, diff in result["survivors"].items():
            print(f"   survived: {key}")
            if not args.quiet:
                print("\n".join("      " + line for line in diff.splitlines()[2:]))
    print("\nmodule                  killed  mutants  score    seconds")
    for name, killed, counted, seconds in rows:
        pct = 100 * killed / max(counted, 1)
        print(f"{name:<22}  {killed:>6}  {counted:>7}  {pct:5.1f}%  {seconds:8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
