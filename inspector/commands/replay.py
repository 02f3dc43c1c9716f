"""``python -m inspector replay run.inspect --step N [--model SPEC]``: run a kept step again, name the first
NaN/Inf op."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import InspectorError, read_run, replay, run_report
from . import argtypes as types
from .common import (
    add_fail_on,
    failing_status,
    print_findings,
    print_table,
    progress,
    say,
    write_json,
    write_text,
)

HELP = (
    "run a step the watch kept (watch --keep) again on the model: whether the loss comes back bit for bit, "
    "the op, module and source line that made the first NaN/Inf, every module's output"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="the run file (its replay files lie next to it)")
    parser.add_argument("--step", type=types.non_negative_int, required=True, help="the step to replay")
    parser.add_argument(
        "--model",
        default=None,
        help="path/to/file.py:factory, hf:<dir> or sample:<name> (default: the source the "
        "watch command recorded in the run file)",
    )
    parser.add_argument(
        "--rank", type=types.non_negative_int, default=0, help="which rank's kept step (default 0)"
    )
    parser.add_argument(
        "--max-bytes",
        type=types.non_negative_int,
        default=256 << 20,
        help="byte budget of the module captures (default 256 MiB)",
    )
    parser.add_argument(
        "--json",
        default=None,
        metavar="OUT",
        type=types.output_file,
        help="write the replay (ops, losses, gradients, findings) as JSON",
    )
    parser.add_argument(
        "--report",
        default=None,
        metavar="OUT",
        type=types.output_file,
        help="write the run's report with a 'replayed step' section (.html, .json or .md)",
    )
    add_fail_on(parser)


def run(args: argparse.Namespace) -> int:
    kind = Path(args.report).suffix.lower().lstrip(".") if args.report else ""
    if args.report and kind not in ("html", "json", "md"):
        raise InspectorError(f"--report {args.report}: name a .html, .json or .md file")
    spec = args.model
    if spec is None:
        spec = read_run(args.run).meta.note
        if not spec or ":" not in spec:
            raise InspectorError(
                f"{args.run} does not say which model it trained; give --model file.py:factory, "
                "hf:<dir> or sample:<name>"
            )
    progress(f"replaying step {args.step} of {args.run} on {spec}")
    r = replay(args.run, args.step, spec, rank=args.rank, capture_bytes=args.max_bytes)
    say(r.verdict())
    say(f"replay file: {r.file}")
    if r.grad_norm is not None and r.recorded_grad_norm is not None:
        say(f"gradient norm: {r.grad_norm!r} replayed, {r.recorded_grad_norm!r} recorded "
            f"({'the same' if r.gradients_match else 'different'})")
    if r.ops:
        say(
            f"ops that made NaN/Inf from finite inputs ({len(r.ops)}; forward first, in the order they ran):"
        )
        for o in r.ops:
            say(f"  {o.line()}")
            if o.code:
                say(f"      {o.code}")
    for note in r.notes:
        say(f"note: {note}")
    grads = r.gradients[["name", "norm", "state"]]
    say(
        f"gradients at step {r.step}: {len(grads)} parameters, {int((grads['state'] == 'nonfinite').sum())} "
        "with NaN/Inf"
    )
    print_table(grads, 20, more="--json OUT")
    say(
        f"captured: {len(r.captures.outputs)} module outputs"
        + (f", {len(r.captures.skipped)} left out by the budget" if r.captures.skipped else "")
    )
    print_findings(list(r.findings))
    if args.json:
        write_json(args.json, r.to_dict(), strict=True)
    if args.report:
        report = run_report(read_run(args.run), replayed=r)
        write_text(
            args.report, {"html": report.to_html, "json": report.to_json, "md": report.to_markdown}[kind]()
        )
        progress(f"wrote {args.report}")
    return failing_status(list(r.findings), args.fail_on)
