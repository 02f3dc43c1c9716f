"""The tables of a run file's steps, built column-wise in one step (a run of 10,000 learning rates or
10,000 scalar names reads in well under a second): :func:`run_table`, :func:`steps_frame`,
:func:`finding_rows`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..utils.findings import InspectorError
from .columns import OPTIONAL, schema
from .guard import list_lengths, max_cells
from .tail import RunTail

STEP_COLUMNS = ["step", "rank", "time", "step_time", "loss", "grad_norm", "nonfinite", "scale", "skipped",
                "device_allocated", "device_peak", "rss"]


def run_table(tail: RunTail) -> Any:
    """The ``pyarrow.Table`` of the steps ``tail`` kept, in the columns of
    :func:`~inspector.runfiles.schema` (a column a version 1 file lacks reads as null)."""
    import pyarrow as pa

    table = pa.Table.from_batches(tail.batches(), schema=tail.schema)
    for column in OPTIONAL:  # a column of a later version: null in an older file
        if column not in table.column_names:
            field_ = schema().field(column)
            table = table.append_column(field_, pa.nulls(table.num_rows, field_.type))
    return table.select(schema().names)


def steps_frame(table: Any, size: int | None = None, name: str = "run file") -> pd.DataFrame:
    """The ``steps`` table, built column-wise in one step: the step columns, ``lr_0 ...`` and one column
    per logged scalar name (the last value logged in a row wins; a name taken by a column is left out).

    Raises:
        InspectorError: for a file of ``size`` bytes, more cells than :func:`.guard.max_cells` (naming
            ``name``).
    """
    import pyarrow.compute as pc

    frame = table.select(STEP_COLUMNS).to_pandas()
    frame["loss_logged"] = pc.is_valid(table.column("loss")).to_numpy(zero_copy_only=False)  # NaN logged
    n = table.num_rows
    lr_lengths, lr_start, lrs = _flat(table.column("lr"))
    names_lengths, _, names = _flat(table.column("scalar_names"))
    values = _flat(table.column("scalar_values"))[2].to_numpy(zero_copy_only=False).astype(np.float64)
    width = int(lr_lengths.max()) if n else 0
    codes = pc.dictionary_encode(names)
    labels = [str(x) for x in codes.dictionary.to_pylist()]
    if size is not None and n * (width + len(labels)) > max_cells(size):
        raise InspectorError(f"{name}: {n:,} rows × {width + len(labels):,} learning rates "
                             f"and scalar names is more than a file of {size:,} bytes may hold")
    lr = np.full((n, width), np.nan)
    rows = np.repeat(np.arange(n), lr_lengths)
    lr[rows, np.arange(len(rows)) - np.repeat(lr_start, lr_lengths)] = \
        lrs.to_numpy(zero_copy_only=False).astype(np.float64)
    logged = np.full((n, len(labels)), np.nan)
    index = codes.indices.to_numpy(zero_copy_only=False)
    named = ~np.asarray(codes.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    logged[np.repeat(np.arange(n), names_lengths)[named], index[named].astype(np.int64)] = values[named]
    # lr_0 ... lr_{width-1} made in Arrow: no Python string per learning rate (100,000 of them at the limit)
    import pyarrow as pa

    lr_names = pc.binary_join_element_wise("lr_", pc.cast(pa.array(np.arange(width)), pa.string()), "")
    own = set(frame.columns)
    keep = [i for i, label in enumerate(dict.fromkeys(labels))
            if label not in own and not _lr_name(label, width)]
    lr_index = pd.Index(pd.arrays.ArrowStringArray(lr_names)) if width else pd.Index([], dtype=object)
    parts = [frame, pd.DataFrame(lr, columns=lr_index, index=frame.index),
             pd.DataFrame(logged[:, keep], columns=[labels[i] for i in keep], index=frame.index)]
    return pd.concat(parts, axis=1, copy=False)


def _lr_name(label: str, width: int) -> bool:
    """Whether ``label`` is one of ``lr_0 ... lr_{width-1}`` as :func:`steps_frame` names them."""
    digits = label[3:]
    return label.startswith("lr_") and digits.isdigit() and digits == str(int(digits)) and int(digits) < width


def _flat(column: Any) -> tuple[np.ndarray, np.ndarray, Any]:
    """``(lengths, starts, values)`` of a list column: each row's length (0 when null), where its values
    start in ``values``, and the values of every row in order."""
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = list_lengths(arr)[0]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
    return lengths, starts, arr.flatten()


def finding_rows(table: Any) -> list[tuple[int, int | None, str, str, str, str]]:
    """``(step, rank, code, severity, where, message)`` of each finding, in file order (rank None for
    the whole world); only the rows that hold findings are read into Python."""
    lengths = _flat(table.column("findings"))[0]
    rows = np.flatnonzero(lengths)
    if not len(rows):
        return []
    sub = table.select(["step", "rank", "findings"]).take(rows).to_pydict()
    out = []
    for step, rank, fs in zip(sub["step"], sub["rank"], sub["findings"], strict=True):
        for f in fs or []:
            f = f or {}
            out.append((step, None if rank < 0 else rank,
                        *(str(f.get(k) or "") for k in ("code", "severity", "where", "message"))))
    return out
