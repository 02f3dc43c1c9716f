"""Finding: the one currency every analysis reports problems in."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One thing an analysis found.

    Args:
        code: short stable identifier, e.g. ``"tie-broken"``.
        severity: ``"error"``, ``"warning"`` or ``"info"``.
        where: the tensor or module name it is about ("" for the whole model).
        message: a sentence for people: what is wrong and what to do.

    >>> Finding("tie-broken", "error", "lm_head.weight", "split").severity
    'error'
    """

    code: str
    severity: Severity
    where: str
    message: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITY_ORDER:
            raise ValueError(
                f"Finding severity must be one of {sorted(SEVERITY_ORDER)}, got {self.severity!r}"
            )

    def to_dict(self) -> dict[str, str]:
        # the four strings as dataclasses.asdict gives them, without its recursive copy
        return {"code": self.code, "severity": self.severity, "where": self.where, "message": self.message}

    @classmethod
    def from_dict(cls, data: Any) -> Finding:
        """The finding ``to_dict`` wrote, checked: exactly the four keys, each a string.

        Raises:
            ValueError: ``data`` is not such a dict, or its severity is unknown.

        >>> Finding.from_dict({"code": "c", "severity": "info", "where": "", "message": "m"}).code
        'c'
        """
        keys = ("code", "severity", "where", "message")
        if not isinstance(data, dict) or sorted(data) != sorted(keys):
            got = ", ".join(sorted(map(str, data))) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"a finding has exactly the keys {', '.join(keys)}; got {got}")
        if not all(isinstance(data[k], str) for k in keys):
            raise ValueError(f"a finding's {', '.join(keys)} are strings")
        return cls(data["code"], data["severity"], data["where"], data["message"])


FindingKey = tuple[str, str, int | None]
Sighting = tuple[int, int | None, Finding]  # (step, rank, finding)


def group_findings(
    found: Iterable[tuple[int, int | None, Finding]],
) -> dict[FindingKey, tuple[list[int], int | None, Finding]]:
    """Each distinct finding once, told apart by ``(code, where, rank)``: ``key -> (steps, rank,
    finding)`` with the steps it was seen at and the first one seen, in the order first seen.

    ``found``: ``(step, rank, finding)`` triples (``rank`` None for the whole world).

    >>> f = Finding("dead-gradient", "warning", "fc", "zero")
    >>> [(s, r) for s, r, _ in group_findings([(3, 0, f), (4, 0, f), (4, 1, f)]).values()]
    [([3, 4], 0), ([4], 1)]
    """
    groups: dict[FindingKey, tuple[list[int], int | None, Finding]] = {}
    for step, rank, f in found:
        key = (f.code, f.where, rank)
        if key in groups:
            groups[key][0].append(step)
        else:
            groups[key] = ([step], rank, f)
    return groups


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; stable within one severity."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])


class InspectorError(ValueError):
    """A user's mistake: bad input that gets a clear message, never a traceback."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message ("" when it has none), for one-line error reports.

    >>> first_line(ValueError("bad shape\\n  details"))
    'bad shape'
    """
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class Episodes:
    """Which findings begin something, step after step (the state :func:`episode_starts` keeps): a
    finding's first sighting at its ``(code, where, rank)``; for a code that ``recurs(code)`` says is
    ``"episode"``, also a sighting after more than ``clear`` steps without one (it cleared, then came
    back); for ``"every"``, each step it is seen at."""

    def __init__(self, recurs: Callable[[str], str], clear: int) -> None:
        self.recurs, self.clear = recurs, clear
        self.last: dict[FindingKey, int] = {}

    def would_start(self, step: int, rank: int, f: Finding) -> bool:
        """Whether ``f`` at ``(step, rank)`` would begin something (nothing is noted)."""
        before = self.last.get((f.code, f.where, rank))
        how = self.recurs(f.code)
        return (before is None or (how == "every" and step != before)
                or (how == "episode" and step - before > self.clear))

    def starts(self, found: Iterable[Sighting]) -> list[Sighting]:
        """The triples of ``found`` (in step order) that begin something, each noted as seen."""
        out = []
        for step, rank, f in found:
            key = (f.code, f.where, rank)
            before = self.last.get(key)
            self.last[key] = step
            how = self.recurs(f.code)
            if (before is None or (how == "every" and step != before)
                    or (how == "episode" and step - before > self.clear)):
                out.append((step, rank, f))
        return out


def episode_starts(
    found: Iterable[Sighting], recurs: Callable[[str], str], clear: int) -> list[Sighting]:
    """The ``(step, rank, finding)`` triples of ``found`` (in step order) that begin something
    (:class:`Episodes`).

    >>> f = Finding("loss-spike", "warning", "(model)", "x")
    >>> [s for s, _, _ in episode_starts([(7, 0, f), (8, 0, f), (20, 0, f)], lambda c: "episode", 5)]
    [7, 20]
    >>> [s for s, _, _ in episode_starts([(7, 0, f), (8, 0, f), (20, 0, f)], lambda c: "once", 5)]
    [7]
    """
    return Episodes(recurs, clear).starts(found)
