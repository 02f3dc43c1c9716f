"""The replay file: what the watch kept of a few steps, next to the run file, read back as untrusted input.

``run.inspect.step30.replay.safetensors`` (``run.inspect.rank1.step30.replay.safetensors`` under several
ranks) is a safetensors file. Its tensors: ``s30/w/<parameter>`` and ``s30/b/<buffer>`` (the weights
as that step's forward used them, where kept), ``s30/c0/t0, t1, ...`` (the tensors of the step's first
forward call), ``s30/c0/rng/cpu`` and ``s30/c0/rng/cuda0`` (the generators' states as that call
began). Its metadata (``format``, ``version``, ``replay``): one :class:`ReplayMeta` as JSON, the one
record written and read (floats as ``float.hex``, so a loss comes back bit for bit).

Reading follows the run file's rules (:mod:`inspector.runfiles.guard`): a regular file only; the header's
length checked against the file before safetensors parses it; the metadata's size, every field's type
and every name checked before use; every tensor the record names must be in the file with the dtype
and rank it must have, and the file holds nothing else. The file holds data only: nothing in it is
imported or executed.

Modules: ``record``: :class:`ReplayMeta` and its parts, the one record written and read, and the limits;
``places``: where the files lie (:func:`replay_path`, :func:`replay_files`, :func:`kept_steps`), removing
and writing them; ``reading``: :class:`ReplayFile`, a file read back and checked (:func:`parse_meta`,
:func:`expected_keys`).
"""

from __future__ import annotations

from .places import kept_steps, remove_replay_files, replay_files, replay_path, write_replay
from .reading import ReplayFile, expected_keys, parse_meta
from .record import FORMAT, MAX_CALLS, MAX_NAMES, MAX_STEPS, SUFFIX, VERSION, KeptCall, KeptStep, ReplayMeta

__all__ = [
    "FORMAT",
    "MAX_CALLS",
    "MAX_NAMES",
    "MAX_STEPS",
    "SUFFIX",
    "VERSION",
    "KeptCall",
    "KeptStep",
    "ReplayFile",
    "ReplayMeta",
    "expected_keys",
    "kept_steps",
    "parse_meta",
    "remove_replay_files",
    "replay_files",
    "replay_path",
    "write_replay",
]
