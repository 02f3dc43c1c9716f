"""The run file's schema: one typed, versioned record per (step, rank), written as an Arrow IPC stream.

The columns are defined once here (:func:`schema`); :class:`StepRecord` has exactly those
fields, :class:`~.stream.RunWriter` writes them and :func:`inspector.read_run` reads them back by
name. The file is an Arrow IPC *stream* (:mod:`.stream`): the schema (with :class:`RunMeta` as JSON in
its metadata) followed by record batches of one or more steps (the watch holds steps for at most
half a second), one row per rank and step. Each batch is flushed when written, so the file can be read
while it grows, and a crash leaves every complete batch readable (a reader stops at the first
incomplete one).

``check_step`` writes the same file (``RunMeta.kind`` ``"check"``): one row per step with rank -1 (the
whole world), the global numbers in the step columns, its findings, and the whole
:class:`~inspector.runfiles.CheckRecord` (per-tensor and per-rank numbers, replica hashes) in the
``check`` column (typed by :func:`.record.check_type`), and the ranks each finding is about in the
``finding_ranks`` column; a watch's file has neither column (:func:`file_schema`): they read as null,
as in version 1 files.

Per step and rank the file holds four numbers per module (gradient norm, parameter norm,
update-to-weight ratio as float32, non-finite count as int32) and one float32 gradient norm
per parameter: about 16 bytes per module plus 4 per parameter, and a few hundred bytes of
step scalars and framing.
"""

from __future__ import annotations

import json
import operator
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any

import numpy as np

from .record import check_type

FORMAT = "inspector-watch"
VERSION = 2  # 2: the check column and RunMeta.kind (check_step's records)
OPTIONAL = ("check", "finding_ranks")  # only in check_step's files (and not in older ones): read as null


def _whole_number(text: str) -> int:
    """A JSON integer of the metadata: at most 19 digits (a 5,000-digit one is refused in these words,
    not Python's own about its digit limit)."""
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"a number of {len(text.lstrip('-')):,} digits ({text[:12]}...), more than a run "
                         "file holds")
    return int(text)


@dataclass(frozen=True)
class RunMeta:
    """What a run file says about itself (stored once, in the schema's metadata).

    ``modules``: the modules that own parameters, in ``named_modules()`` order (the order of
    every per-module list); ``parameters``: the trainable parameters in ``named_parameters()``
    order and ``parameter_modules`` the index into ``modules`` of each one's owner.
    """

    model: str
    world_size: int
    every: int
    modules: tuple[str, ...]
    parameters: tuple[str, ...]
    parameter_modules: tuple[int, ...]
    checks: tuple[str, ...] = ()
    update_ratio: bool = False
    started: float = 0.0
    note: str = ""
    format: str = FORMAT
    version: int = VERSION
    kind: str = "watch"  # "watch" (inspector.watch) or "check" (check_step: modules and parameters empty)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RunMeta:
        """Parse the metadata ``to_json`` wrote; unknown keys of a newer version are ignored.

        Raises:
            ValueError: not a watch run's metadata, or a newer major version.
        """
        data = json.loads(text, parse_int=_whole_number)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} run file")
        version = data.get("version", 0)
        if type(version) is not int:
            raise ValueError(f"run file version {str(version)[:20]!r} is not a whole number")
        if version > VERSION:
            raise ValueError(f"run file version {data['version']} is newer than this reader ({VERSION}); "
                             "upgrade model-inspector")
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known
        }
        try:
            meta = cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"run metadata lacks a field ({exc})") from None
        problem = meta._problem()
        if problem:
            raise ValueError(f"run metadata: {problem}")
        return meta

    def _problem(self) -> str:
        """What is wrong with the types a reader relies on ("" when nothing)."""
        def whole(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if not whole(self.world_size) or self.world_size < 1 or not whole(self.every) or self.every < 1:
            return "world_size and every must be positive integers"
        if not all(isinstance(n, str) for n in (*self.modules, *self.parameters, *self.checks)):
            return "modules, parameters and checks must be lists of strings"
        if len(self.parameter_modules) != len(self.parameters) or not all(
                whole(i) and 0 <= i < len(self.modules) for i in self.parameter_modules):
            return "parameter_modules must give each parameter the index of a module"
        if not isinstance(self.model, str) or not isinstance(self.note, str):
            return "model and note must be strings"
        if not isinstance(self.update_ratio, bool) or not isinstance(self.started, (int, float)) \
                or isinstance(self.started, bool) or not whole(self.version):
            return "update_ratio must be a boolean, started a number and version an integer"
        if self.kind not in ("watch", "check"):
            return f"kind must be watch or check, not {self.kind!r}"
        return ""


@dataclass(frozen=True)
class StepRecord:
    """One rank's numbers at one step: one row of the run file (field order = column order).

    Lists run over ``RunMeta.modules`` (``module_*``) or ``RunMeta.parameters``
    (``param_grad_norm``); ``None`` where a number was not taken at this step (a parameter
    norm between checks, device memory on a CPU). ``findings`` holds ``Finding.to_dict()``s.
    """

    step: int
    rank: int
    time: float
    step_time: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    nonfinite: int = 0
    lr: list[float] = field(default_factory=list)
    scale: float | None = None
    skipped: bool = False
    device_allocated: int | None = None
    device_peak: int | None = None
    rss: int | None = None
    scalar_names: list[str] = field(default_factory=list)
    scalar_values: list[float] = field(default_factory=list)
    module_grad_norm: Any = None      # float32 array-like, one per module
    module_param_norm: Any = None     # float32, or None between checks
    module_update_ratio: Any = None   # float32, or None when update ratios are off
    module_nonfinite: Any = None      # int32: NaN/Inf gradient elements below each module
    param_grad_norm: Any = None       # float32, one per parameter
    findings: list[dict[str, str]] = field(default_factory=list)
    check: dict[str, Any] | None = None  # a check_step record (CheckRecord.to_json(), less format/findings)
    finding_ranks: list[list[int]] | None = None  # check_step: the ranks each finding is about ([]: all)


@lru_cache(maxsize=1)
def schema() -> Any:
    """The Arrow schema of a run file's rows (``pyarrow.Schema``; pyarrow is imported on first use)."""
    import pyarrow as pa

    f32, f64, i64 = pa.float32(), pa.float64(), pa.int64()
    types = {
        "step": i64, "rank": pa.int32(), "time": f64, "step_time": f64, "loss": f64, "grad_norm": f64,
        "nonfinite": i64, "lr": pa.list_(f64), "scale": f64, "skipped": pa.bool_(),
        "device_allocated": i64, "device_peak": i64, "rss": i64,
        "scalar_names": pa.list_(pa.string()), "scalar_values": pa.list_(f64),
        "module_grad_norm": pa.list_(f32), "module_param_norm": pa.list_(f32),
        "module_update_ratio": pa.list_(f32), "module_nonfinite": pa.list_(pa.int32()),
        "param_grad_norm": pa.list_(f32),
        "findings": pa.list_(pa.struct([(k, pa.string()) for k in ("code", "severity", "where", "message")])),
        "check": check_type(),
        "finding_ranks": pa.list_(pa.list_(pa.int32())),
    }
    names = [f.name for f in fields(StepRecord)]
    assert sorted(names) == sorted(types), "StepRecord and the Arrow schema must name the same columns"
    return pa.schema([(n, types[n]) for n in names])


def _column(name: str, values: list[Any], typ: Any) -> Any:
    import pyarrow as pa

    if name.startswith(("module_", "param_")):  # numeric lists: from numpy, no per-element Python
        value_type = typ.value_type.to_pandas_dtype()
        present = [v is not None for v in values]
        flat = _joined(values, value_type)
        if flat is not None:  # the watch's rows: 1-d arrays of the column's type already, none None
            lengths = list(map(len, values))
            offsets = np.zeros(len(values) + 1, dtype=np.int32)
            offsets[1:] = np.cumsum(lengths)
        else:
            arrays = [np.asarray(v, dtype=value_type).reshape(-1) for v in values if v is not None]
            lengths = [len(a) for a in arrays]
            offsets = np.zeros(len(values) + 1, dtype=np.int32)
            it = iter(lengths)
            offsets[1:] = np.cumsum([next(it) if p else 0 for p in present])
            flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=value_type)
        mask = pa.array([not p for p in present])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=typ.value_type), mask=mask)
    return pa.array(values, type=typ)


def _joined(values: list[Any], value_type: Any) -> np.ndarray | None:
    """``values`` end to end, as ``value_type``, when every one is a 1-d array of that kind of number (float
    or integer): what each row's array converted on its own comes to, with one conversion; else None."""
    if not values or set(map(type, values)) != {np.ndarray}:
        return None
    try:
        flat = np.concatenate(values)
    except ValueError:  # 0-d arrays, or arrays of several dimensions
        return None
    if flat.ndim != 1 or flat.dtype.kind != np.dtype(value_type).kind:  # (joined: each was 1-d)
        return None
    return flat if flat.dtype == value_type else flat.astype(value_type)


@lru_cache(maxsize=2)
def file_schema(kind: str = "watch") -> Any:
    """The columns a file of ``kind`` holds: :func:`schema` less the ``check`` column in a watch's file
    (a null nested column would add its framing to every step's batch)."""
    sch = schema()
    return sch if kind == "check" else _without(sch, OPTIONAL)


def _without(sch: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        sch = sch.remove(sch.get_field_index(name))
    return sch


def record_batch(records: list[StepRecord], kind: str = "watch") -> Any:
    """The ``pyarrow.RecordBatch`` of ``records`` (one row each), in the schema of a file of ``kind``
    (:func:`file_schema`)."""
    import pyarrow as pa

    sch = file_schema(kind)
    # every field of a record in one call, then the rows turned into columns (not one getattr a cell)
    rows = list(map(operator.attrgetter(*sch.names), records))
    values = list(zip(*rows, strict=True)) if rows else [() for _ in sch.names]
    columns = [_column(f.name, list(v), f.type) for f, v in zip(sch, values, strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=sch)
