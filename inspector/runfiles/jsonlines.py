"""The JSON lines ``check_step`` wrote in older versions, one record a line, read one line at a time:
:func:`parse_lines` keeps the records it parses, never the text or a list of its lines, and refuses a
line that packs more objects or lists into its characters than a record holds, before parsing it.
The budget of one file: at most ``MAX_JSONL_BYTES`` bytes and ``MAX_JSONL_RECORDS`` lines, both known
before the first line is parsed (a few seconds of work at most)."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

from ..utils.budget import check_budget
from ..utils.findings import Finding, InspectorError
from .record import FORMAT, VERSION, CheckRecord

MAX_JSONL_BYTES = 64 << 20  # the largest JSON-lines run file (the format of older versions) read
# The most lines (step records) of one JSON-lines run file: parsing and checking a record costs tens of
# microseconds however small it is, so 64 MiB of the smallest records (660,000 of them) would keep a
# server thread busy for most of a minute; 100,000 read in a few seconds. The lines are counted before
# any is parsed.
MAX_JSONL_RECORDS = 100_000
# A line is refused before it is parsed when it packs more objects or lists into its characters than a
# record check_step writes (about 300 characters per tensor or rank, and a list holds a number per rank):
# what JSON parsing and the records cost per character stays bounded.
OBJECT_CHARS, LIST_CHARS = 64, 12


def file_lines(fh: Any, name: str) -> Iterator[str]:
    """The lines of the binary file ``fh``, read one at a time (each with its newline; CR, LF and CRLF
    end a line, a leading BOM is dropped)."""
    try:
        yield from io.TextIOWrapper(fh, encoding="utf-8-sig", newline=None)
    except (OSError, UnicodeDecodeError) as exc:
        raise InspectorError(f"run file {name} cannot be read as UTF-8 text ({exc})") from None


_NEWLINE = re.compile(r"\r\n|\r|\n")


def text_lines(text: str) -> Iterator[str]:
    """The lines of ``text``, one at a time (each with its newline), without a list of them all."""
    start = 0
    for match in _NEWLINE.finditer(text):
        yield text[start:match.end()]
        start = match.end()
    if start < len(text):
        yield text[start:]


def too_long(name: str, size: int) -> str:
    return (f"{name} is a JSON-lines run file of {size:,} bytes; this older format is read up to "
            f"{MAX_JSONL_BYTES:,} bytes (its records take many times their size in memory): not read")


def too_many(name: str, lines: int) -> str:
    return (f"{name} is a JSON-lines run file of {lines:,} lines; this older format is read up to "
            f"{MAX_JSONL_RECORDS:,} step records (each costs its parsing and checks whatever its size): "
            "not read. Write new runs with check_step, whose Arrow run file has no such limit")


def count_lines(fh: Any, limit: int = MAX_JSONL_BYTES) -> int:
    """The lines of the binary file ``fh`` (CR, LF or CRLF end one; a last line without its end counts),
    counted in blocks of 64 KiB from where it stands (at most ``limit`` bytes); ``fh`` is left where it
    was."""
    start, lines, last, read = fh.tell(), 0, b"", 0
    while read < limit:
        block = fh.read(min(1 << 16, limit - read))
        if not block:
            break
        read += len(block)
        lines += block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")
        lines -= last == b"\r" and block[:1] == b"\n"  # a CRLF split between two blocks
        last = block[-1:]
    fh.seek(start)
    return lines + (read > 0 and last not in (b"\n", b"\r"))


def text_line_count(text: str) -> int:
    """The lines of ``text`` as :func:`text_lines` gives them, counted without splitting it."""
    lines = text.count("\n") + text.count("\r") - text.count("\r\n")
    return lines + bool(text and text[-1] not in "\r\n")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a run file holds")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is out of range for a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"the integer {text[:20]}... has {len(text)} digits, more than a run file holds")
    return int(text)


def loads(line: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity, floats out of range and integers past 64 bits."""
    return json.loads(
        line, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int
    )


def _parse_line(line: str, number: int, name: str, names: dict[str, str]) -> CheckRecord:
    """The record of one line; the tensors' strings that repeat from step to step (name, kind, dtype,
    placements) are the ones of ``names`` (which keeps each once)."""
    objects, lists = line.count("{"), line.count("[")
    if ((line.lstrip().startswith("{") or len(line) > 1 << 20)
            and len(line) < OBJECT_CHARS * max(0, objects - 2) + LIST_CHARS * lists):
        raise InspectorError(f"{name} line {number} packs {objects:,} objects and {lists:,} lists into "
                             f"{len(line):,} characters: not a check_step record (it writes over "
                             f"{OBJECT_CHARS} characters per tensor or rank and {LIST_CHARS} per list)")
    try:
        rec = loads(line)
    except RecursionError:
        raise InspectorError(f"{name} line {number} nests brackets too deeply to be a check_step "
                             "record") from None
    except json.JSONDecodeError as exc:
        raise InspectorError(f"{name} line {number} is not JSON ({exc}); a run file holds one "
                             "check_step record per line") from None
    except ValueError as exc:  # NaN, Infinity, out-of-range numbers
        raise InspectorError(f"{name} line {number} is not a valid check_step record: {exc}") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise InspectorError(f"{name} line {number} is not a check_step record (no "
                             f"\"format\": \"{FORMAT}\")")
    missing = [k for k in ("step", "world_size", "ranks", "tensors", "global") if k not in rec]
    if missing:
        raise InspectorError(f"{name} line {number} lacks {', '.join(missing)}")
    if isinstance(rec["tensors"], list):
        if len(names) > 1 << 20:
            names.clear()
        for t in rec["tensors"]:
            for key in ("name", "kind", "dtype", "placements") if isinstance(t, dict) else ():
                if type(t.get(key)) is str:
                    t[key] = names.setdefault(t[key], t[key])
    try:
        return CheckRecord.from_json(rec)
    except ValueError as exc:
        raise InspectorError(f"{name} line {number} is not a valid check_step record: {exc}") from None


def parse_lines(lines: Iterable[str], name: str) -> tuple[list[CheckRecord], list[Finding]]:
    """The records of ``lines`` (each with its newline but a last one cut short), parsed one at a time:
    only the records are kept, never the text or a list of its lines (at most ``MAX_JSONL_BYTES``), and
    the file's notes (``run-file-truncated``, ``run-file-newer``).

    Raises:
        InspectorError: a line is not a record (naming ``name`` and the line), or there is none.
    """
    records: list[CheckRecord] = []
    notes: list[Finding] = []
    names: dict[str, str] = {}
    read = 0
    for number, line in enumerate(lines, 1):
        if number % 1024 == 0:
            check_budget()
        read += len(line)
        if read > MAX_JSONL_BYTES:  # a file that grew past the limit while it was read
            raise InspectorError(too_long(name, read))
        if number > MAX_JSONL_RECORDS:  # the same for lines
            raise InspectorError(too_many(name, number))
        if not line.strip():
            continue
        try:
            records.append(_parse_line(line, number, name, names))
        except InspectorError as exc:
            # a run stopped while writing leaves a last line without its newline
            if line.endswith(("\n", "\r")) or not records or "is not JSON" not in str(exc):
                raise
            notes.append(
                Finding(
                    "run-file-truncated",
                    "warning",
                    name,
                    f"the last line of {name} (line {number}) is cut short ({len(line)} characters "
                    f"that are not a whole record): the run stopped while writing it. Read "
                    f"{len(records)} complete steps before it.",
                )
            )
    if not records:
        raise InspectorError(f"{name} holds no step records")
    newer = sorted({rec.version for rec in records if rec.version is not None and rec.version > VERSION})
    if newer:
        notes.insert(
            0,
            Finding(
                "run-file-newer",
                "warning",
                name,
                f"{name} was written by a newer version of the record (version "
                f"{', '.join(str(v) for v in newer)}; this one reads version {VERSION}): fields "
                "it does not know are left out; update model-inspector to read them all.",
            ),
        )
    return records, notes
