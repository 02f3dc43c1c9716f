"""Cheap per-step digests of this rank's tensor pieces: position-dependent hashes and NaN/Inf counts.

A hash is one int64 per tensor: the wrapping sum, over the elements, of a mixing function
(multiply, xor-shift, multiply) of each element's raw bits plus its position times an odd
constant. Any change of bits changes one term unpredictably, so two swapped elements, a
+1/-1 ulp pair or any other edit that keeps a plain sum changes the hash (a collision needs
two different sets of 64-bit mixes to add up the same: about 2^-64 per change).

Reading every element every step would cost as much as a copy of the model, so each call
reads only part of the values (:func:`schedule`): every tensor of up to :data:`WHOLE` global
elements whole, and one of :data:`PARTS` equal windows of the larger ones laid end to end. A
value that differs between replicas is found within ``PARTS`` calls of ``check_step``, and
within one call when it differs in a small tensor. The slices of all tensors of one device and
bit width are hashed together in one pass (a handful of kernels, not a few per tensor), on the
device that holds them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..utils.norms import grouped_norms

PARTS = 128           # the large pieces are read in 128 windows, one per call: drift found within 128 calls
WHOLE = 4096          # pieces up to 4,096 elements are hashed (and checked for NaN/Inf) whole every call
_GOLDEN = -7046029254386353131   # 0x9E3779B97F4A7C15 (as int64): position multiplier
_MIX1 = -4658895280553007687     # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685     # 0x94D049BB133111EB
_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flat(piece: torch.Tensor) -> torch.Tensor:
    """``piece`` as a 1-D contiguous tensor (a view when it already is contiguous)."""
    out = piece.reshape(-1)
    return out if out.is_contiguous() else out.contiguous()


def _bits(values: torch.Tensor) -> torch.Tensor:
    """The raw bits of a 1-D contiguous tensor as integers of the same width (a view)."""
    if values.dtype == torch.bool:
        return values.view(torch.int8)
    view = _INT.get(values.element_size())
    return values.view(view) if view is not None else values.view(torch.uint8)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Multiply, xor-shift, multiply, in place on int64 (multiplications wrap): every input bit
    reaches every output bit, and the map is not additive."""
    x.mul_(_MIX1)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 32).bitwise_and_(0xFFFFFFFF))
    return x.mul_(_MIX2)


def _ramp(lengths: torch.Tensor, values: torch.Tensor, total: int) -> torch.Tensor:
    """``values[k]`` repeated ``lengths[k]`` times (``repeat_interleave``, as a cheaper cumsum)."""
    steps = torch.zeros(total, dtype=torch.int64, device=values.device)
    steps[0] = values[0]
    ends = torch.cumsum(lengths, 0)[:-1]
    steps.index_add_(0, ends, values[1:] - values[:-1])
    return torch.cumsum(steps, 0)


def hashes(pieces: Sequence[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """One int64 hash per ``(values, start)``: ``values`` is a 1-D contiguous slice of a piece
    that begins at element ``start`` of it. All on one device; returns an (n,) int64 tensor there.

    >>> a = torch.tensor([1.0, 2.0, 3.0])
    >>> h = hashes([(a, 0), (a[[1, 0, 2]], 0), (a[1:], 1)])
    >>> bool(h[0] != h[1]), bool(hashes([(a[1:], 1)])[0] == h[2])
    (True, True)
    """
    if not pieces:
        return torch.zeros(0, dtype=torch.int64)
    return run(prepare(pieces), len(pieces), pieces[0][0].device)


Prepared = list[tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor | list[int]]]


def prepare(pieces: Sequence[tuple[torch.Tensor, int]], keep: bool = False) -> Prepared:
    """What :func:`run` needs to hash ``pieces`` (all on one device): per bit width, the positions
    in ``pieces``, the bit views, their lengths, ends, and each element's position term (``keep``:
    worked out now, 8 bytes per element kept) or the pieces' starts (worked out at each run). It
    holds views, no copies of the values: keep it while the pieces' storage stays the same, and
    hash again with :func:`run`."""
    if not pieces:
        return []
    device = pieces[0][0].device
    groups: dict[torch.dtype, list[int]] = {}
    bits = [_bits(v) for v, _ in pieces]
    for i, b in enumerate(bits):
        if b.numel():
            groups.setdefault(b.dtype, []).append(i)
    out: Prepared = []
    for idx in groups.values():
        sizes = [bits[i].numel() for i in idx]
        lengths = torch.tensor(sizes, device=device)
        ends = torch.cumsum(lengths, 0)
        starts = [pieces[i][1] for i in idx]
        term: torch.Tensor | list[int] = _positions(sizes, starts, device).mul_(_GOLDEN) if keep else starts
        out.append((torch.tensor(idx, device=device), [bits[i] for i in idx], lengths, ends, term))
    return out


def _positions(sizes: list[int], starts: list[int], device: torch.device) -> torch.Tensor:
    """Each element's position in its tensor: ``start + k`` for element k of each piece."""
    if len(sizes) <= 64:  # a few pieces (one window): one arange each
        return torch.cat([torch.arange(a, a + n, device=device, dtype=torch.int64)
                          for a, n in zip(starts, sizes, strict=True)])
    total = sum(sizes)
    lengths = torch.tensor(sizes, device=device)
    ends = torch.cumsum(lengths, 0)
    offsets = torch.tensor(starts, device=device) - (ends - lengths)
    return torch.arange(total, device=device, dtype=torch.int64).add_(_ramp(lengths, offsets, total))


def run(prepared: Prepared, n: int, device: torch.device) -> torch.Tensor:
    """The (n,) int64 hashes of pieces made ready by :func:`prepare` (a few kernels per bit width)."""
    out = torch.zeros(n, dtype=torch.int64, device=device)
    for idx, bits, lengths, ends, term in prepared:
        x = torch.cat(bits).to(torch.int64)
        # element k of a piece at position p of its tensor: x = bits + p * golden
        if isinstance(term, torch.Tensor):
            x.add_(term)
        else:
            x.add_(_positions(lengths.tolist(), term, device).mul_(_GOLDEN))
        _mix(x)
        running = torch.cumsum(x, 0)  # wraps like the sum; a piece's sum is a difference of two
        summed = running[ends - 1]
        summed[1:] -= running[ends[:-1] - 1]
        out[idx] = summed
    return out


def schedule(numels: Sequence[int], lengths: Sequence[int], call: int | None) -> list[tuple[int, int, int]]:
    """``(tensor, start, end)``: the local elements call number ``call`` reads of the tensors of
    more than :data:`WHOLE` global elements; with ``call=None``, the smaller ones, which every
    call reads whole.

    ``numels`` are the global element counts (the same on every rank), ``lengths`` this rank's
    local ones. The larger tensors, laid end to end by global size, are cut into :data:`PARTS`
    equal windows, one window per call; each tensor's local piece is cut in the same
    proportions, so every local element is read exactly once in ``PARTS`` consecutive calls, at
    the same call on every rank holding the same piece, and one call reads only the few tensors
    its window touches.

    >>> sorted(a for _, a, b in schedule([9000], [9000], 0) + schedule([9000], [9000], 1))[:2]
    [0, 70]
    """
    if call is None:
        return [(i, 0, lengths[i]) for i, n in enumerate(numels) if n <= WHOLE and lengths[i]]
    out = []
    large = [(i, n) for i, n in enumerate(numels) if n > WHOLE]
    total = sum(n for _, n in large)
    c = call % PARTS
    lo, hi = c * total // PARTS, (c + 1) * total // PARTS
    offset = 0
    for i, n in large:
        a, b = max(offset, lo), min(offset + n, hi)
        if a < b:
            start, end = (a - offset) * lengths[i] // n, (b - offset) * lengths[i] // n
            if start < end:
                out.append((i, start, end))
        offset += n
        if offset >= hi:
            break
    return out


def nonfinite_columns(groups: Sequence[tuple[torch.Tensor, list[torch.Tensor]]], n: int) -> torch.Tensor:
    """An (n, 2) float64 tensor of (NaN, Inf) counts: ``groups`` are (positions, values) of one
    device and floating dtype each, checked with one concatenation and one pass; counted one
    tensor at a time only in a group that holds a NaN or Inf."""
    out = torch.zeros(n, 2, dtype=torch.float64)
    for index, values in groups:
        if math.isfinite(float(torch.cat(values).sum())):  # a NaN or Inf makes the sum so (an overflow too)
            continue
        for i, v in zip(index.tolist(), values, strict=True):
            out[i, 0], out[i, 1] = int(torch.isnan(v).sum()), int(torch.isinf(v).sum())
    return out


def float_groups(
    index: Sequence[int], values: Sequence[torch.Tensor]
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """``values`` (at positions ``index``) grouped by device and floating dtype, for
    :func:`nonfinite_columns`; other dtypes hold no NaN."""
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[int], list[torch.Tensor]]] = {}
    for i, v in zip(index, values, strict=True):
        if v.numel() and (v.is_floating_point() or v.is_complex()):
            at, vs = groups.setdefault((v.device, v.dtype), ([], []))
            at.append(i)
            vs.append(v)
    return [(torch.tensor(at, dtype=torch.long), vs) for at, vs in groups.values()]


def nonfinite_counts(values: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """(NaN, Inf) counts of each tensor: one fused norm pass, then exact counts only where a
    norm is not finite (it also overflows for large finite values; those count (0, 0))."""
    out = [(0, 0)] * len(values)
    floating = [v if v.numel() and (v.is_floating_point() or v.is_complex()) else None for v in values]
    for idx, stacked in grouped_norms(floating):
        norms = stacked.double().cpu().tolist()
        for i, norm in zip(idx, norms, strict=True):
            if not math.isfinite(norm):
                v = values[i]
                out[i] = (int(torch.isnan(v).sum()), int(torch.isinf(v).sum()))
    return out
