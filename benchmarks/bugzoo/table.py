"""The zoo's tables (Markdown, readable in a terminal too) and its summary figures."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .core import Judged


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def progress_line(j: Judged) -> str:
    c = j.case
    what = j.error if j.status == "crash" else (
        f"{j.code} at {j.where} step {j.step} (planted {j.planted})" if not c.healthy else
        (", ".join(f"{k} x{v}" for k, v in j.counts.items()) or "silent"))
    return f"{c.name:34} {j.variant:9} {j.status:7} {j.seconds:5.1f}s  {what}"


def _module(j: Judged) -> str:
    if j.module_right is None:
        return "-"
    return "right" if j.module_right else "wrong"


def _cause(j: Judged) -> str:
    if j.cause_right is None:
        return "-"
    return "right" if j.cause_right else "wrong"


def _reported(j: Judged) -> str:
    if j.status == "crash":
        return f"crash: {j.error}"
    if not j.code:
        others = sorted({f.code for f in j.findings if f.severity in ("warning", "error")})
        return "nothing" + (f" (other: {', '.join(others)})" if others else "")
    return f"`{j.code}` at `{j.where}`"


def _expected(codes: tuple[str, ...]) -> str:
    return f"`{codes[0]}`" + (f" (or {len(codes) - 1} other)" if len(codes) > 1 else "")


def _others(j: Judged) -> str:
    """The warnings and errors besides the answer, from the plant on: what a reader wades through."""
    if not j.others:
        return "-"
    counts = Counter(f.code for f in j.others)
    return f"{len(j.others)}: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def zoo_tables(rows: list[Judged]) -> str:
    bugs = [j for j in rows if not j.case.healthy]
    healthy = [j for j in rows if j.case.healthy]
    out = []
    if bugs:
        out.append(_md(
            ["case", "model", "stack", "loop", "options", "expected", "caught", "reported", "step (planted)",
             "module", "stated cause", "other findings"],
            [[j.case.name, j.case.model, j.case.stack, j.case.loop,
              "nonfinite=True" if j.variant == "nonfinite" else "default",
              _expected(j.case.expect_nonfinite if j.variant == "nonfinite" and j.case.expect_nonfinite
                        else j.case.expect),
              {"caught": "yes", "missed": "no"}.get(j.status, j.status), _reported(j),
              f"{'-' if j.step is None else j.step} "
              f"({j.planted if j.planted is not None else j.case.plant_at})",
              _module(j), _cause(j), _others(j)] for j in bugs]))
    if healthy:
        out.append(_md(
            ["healthy case", "model", "stack", "loop", "options", "warnings", "errors", "codes"],
            [[j.case.name, j.case.model, j.case.stack, j.case.loop,
              "nonfinite=True" if j.variant == "nonfinite" else "default",
              "crash" if j.status == "crash" else sum(1 for f in j.findings if f.severity == "warning"),
              "crash" if j.status == "crash" else sum(1 for f in j.findings if f.severity == "error"),
              j.error if j.status == "crash" else
              ", ".join(f"`{k}` x{v}" for k, v in sorted(j.counts.items())) or "-"] for j in healthy]))
    return "\n\n".join(out)


def figures(rows: list[Judged], variant: str = "default") -> dict[str, Any]:
    """Recall and false alarms: a bug counts as found when caught within ±1 step with the right
    module (``strict``); ``caught`` also counts a catch inside the case's grace or with the wrong
    module."""
    bugs = [j for j in rows if not j.case.healthy and j.variant == variant]
    healthy = [j for j in rows if j.case.healthy and j.variant == variant]
    alarms: Counter[str] = Counter()
    for j in healthy:
        alarms.update(j.counts)
    return {
        "bugs": len(bugs),
        "caught": sum(j.status == "caught" for j in bugs),
        "module_right": sum(j.status == "caught" and bool(j.module_right) for j in bugs),
        "within_one": sum(j.status == "caught" and j.within_one for j in bugs),
        "strict": sum(j.status == "caught" and j.within_one and bool(j.module_right) for j in bugs),
        "right": sum(j.status == "caught" and bool(j.module_right) for j in bugs),
        "cause_right": sum(j.status == "caught" and bool(j.cause_right) for j in bugs),
        "crashed": sum(j.status == "crash" for j in bugs),
        "healthy": len(healthy),
        "healthy_silent": sum(j.status == "ok" for j in healthy),
        "healthy_alarmed": sum(j.status == "alarm" for j in healthy),
        "healthy_crashed": sum(j.status == "crash" for j in healthy),
        "alarms": dict(alarms),
    }


GOALS = {"bugs": 80, "healthy": 50, "right": 90.0, "cause": 90.0}


def _pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:.0f}%" if n else "-"


def goals_line(rows: list[Judged]) -> str:
    """The zoo's goals in one line (default options): at least 80 bugs and 50 healthy recipes,
    every healthy recipe with no warning or error, at least 90% of the bugs caught at the right
    module within one step (the windowed checks within their grace), and their stated cause right."""
    f = figures(rows, "default")
    n = f["bugs"]
    met = (n >= GOALS["bugs"] and f["healthy"] >= GOALS["healthy"] and f["healthy_silent"] == f["healthy"]
           and n and 100.0 * f["right"] / n >= GOALS["right"]
           and 100.0 * f["cause_right"] / n >= GOALS["cause"])
    return (f"goals ({'met' if met else 'not met'}): bugs {n} (goal >= {GOALS['bugs']}), "
            f"healthy {f['healthy']} "
            f"(goal >= {GOALS['healthy']}), healthy with 0 warning/error findings {f['healthy_silent']}/"
            f"{f['healthy']} (goal all; {f['healthy_crashed']} crashed), bugs caught at the right module "
            f"within one step (windowed checks within their grace) {f['right']}/{n} = {_pct(f['right'], n)} "
            f"(goal >= {GOALS['right']:.0f}%), stated cause right {f['cause_right']}/{n} = "
            f"{_pct(f['cause_right'], n)} (goal >= {GOALS['cause']:.0f}%), crashed {f['crashed']}")


def summary(rows: list[Judged]) -> str:
    lines = []
    for variant in ("default", "nonfinite"):
        f = figures(rows, variant)
        if not f["bugs"]:
            continue
        n = f["bugs"]
        pct = 100.0 * f["strict"] / n
        label = ("default options" if variant == "default"
                 else "nonfinite=True (the cases that name a producer)")
        lines.append(f"- **{label}**: recall {f['strict']}/{n} ({pct:.0f}%: caught within ±1 step with the "
                     f"right module); caught at all {f['caught']}/{n}, module right {f['module_right']}/{n}, "
                     f"within one step {f['within_one']}/{n}, stated cause right {f['cause_right']}/{n}, "
                     f"crashed {f['crashed']}.")
        others = Counter(o.code for j in rows if not j.case.healthy and j.variant == variant
                         for o in j.others)
        listed = ", ".join(f"`{k}` x{v}" for k, v in others.most_common()) or "none"
        lines.append(f"  Besides the answer, the caught bugs' runs gave {sum(others.values())} other "
                     f"warnings/errors from the plant on ({listed}).")
    for variant in ("default", "nonfinite"):
        f = figures(rows, variant)
        if f["healthy"]:
            alarms = ", ".join(f"`{k}` x{v}" for k, v in sorted(f["alarms"].items())) or "none"
            label = "default options" if variant == "default" else "nonfinite=True"
            lines.append(f"- **healthy configurations** ({label}): {f['healthy_silent']}/{f['healthy']} "
                         f"silent (no warning or error), {f['healthy_crashed']} crashed; "
                         f"false alarms: {alarms}.")
    misses = [j for j in rows if not j.case.healthy and (j.status != "caught" or not j.within_one
                                                        or not j.module_right)]
    if misses:
        lines.append("\nMisses (not caught within ±1 step with the right module):\n")
        for j in misses:
            seen = sorted({f"{f.code}@{f.step}" for f in j.findings})[:6]
            lines.append(f"- `{j.case.name}` ({j.variant}): {j.status}; {_reported(j)}, step {j.step} vs "
                         f"{j.planted}; the run reported: {', '.join(seen) or 'nothing'}")
    wrong = [j for j in rows if j.status == "caught" and j.cause_right is False]
    if wrong:
        lines.append("\nCaught, but the message does not state the planted cause (the case's rule):\n")
        for j in wrong:
            wants = ", ".join(repr(c) for c in j.case.cause)
            lines.append(f"- `{j.case.name}` ({j.variant}): wants one of {wants}; "
                         f"said: {j.message[:200]}")
    alarmed = [j for j in rows if j.case.healthy and j.status != "ok"]
    if alarmed:
        lines.append("\nHealthy recipes that alarmed or crashed:\n")
        for j in alarmed:
            bad = [f"{f.code}@{f.step} at {f.where}" for f in j.findings
                   if f.severity in ("warning", "error")]
            what = j.error if j.status == "crash" else "; ".join(bad)[:300]
            lines.append(f"- `{j.case.name}` ({j.variant}): {j.status}: {what}")
    return "\n".join(lines)


def baseline_table(results: list[dict[str, Any]]) -> str:
    """One row per bug: what each baseline saw (step), beside the watch."""
    if not results:
        return "(no baseline rows: the baselines run on the plain-loop bugs only)"
    names = [k for k in results[0] if k not in ("case", "model", "planted", "watch")]
    body = [[r["case"], r["model"], r["planted"], r["watch"]] + [r[k] for k in names] for r in results]
    totals = ["**caught (±1 step)**", "", "", sum(1 for r in results if r["watch"].startswith("yes"))]
    totals += [sum(1 for r in results if str(r[k]).startswith("yes")) for k in names]
    return _md(["case", "model", "planted", "watch (default)"] + names, body + [totals])


def healthy_baseline_table(results: list[dict[str, Any]]) -> str:
    if not results:
        return ""
    return _md(["healthy case", "TerminateOnNaN", "TensorBoard scalars (loss, grad norm)"],
               [[r["case"], r["TerminateOnNaN"], r["TensorBoard scalars"]] for r in results])
