"""Where tensors sit in their storage, and which views of one storage overlap.

The views over one storage are swept by byte extent and joined with a union-find: equal
memory by key, partial overlaps exactly (every element's byte offset) for dense and small
strided views, by byte extent beyond that. Never all pairs.
"""

from __future__ import annotations

import torch

_EXACT_OVERLAP_MAX_NUMEL = 1 << 22  # beyond this, strided views are compared by byte extent


class _Obj:
    """One distinct tensor object and every name it has."""

    __slots__ = ("tensor", "names", "kinds", "order", "first", "span", "memkey")

    def __init__(self, tensor: torch.Tensor, first: int) -> None:
        self.tensor = tensor
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.order: list[int] = []  # walk position of each name
        self.first = first
        self.span: tuple[int, int] = (0, 0)
        self.memkey: tuple = ()


def _not_analysable(t: torch.Tensor) -> str | None:
    """Why ``t``'s memory cannot be compared, or None when it can."""
    if t.layout != torch.strided:
        return f"its layout is {str(t.layout).removeprefix('torch.')}"
    if t.is_quantized:
        return "it is quantized"
    return None


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [start, end) of ``t`` in its storage, from offset, shape and strides."""
    es = t.element_size()
    start = int(t.storage_offset()) * es
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return start, start + extent * es


def _dense(t: torch.Tensor, span: tuple[int, int]) -> bool:
    return t.numel() * t.element_size() == span[1] - span[0]


def _byte_offsets(t: torch.Tensor) -> torch.Tensor:
    offsets = torch.tensor([t.storage_offset()], dtype=torch.long)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = (offsets[:, None] + torch.arange(size, dtype=torch.long)[None, :] * stride).reshape(-1)
    return offsets * t.element_size()


def _overlap(a: _Obj, b: _Obj) -> bool:
    """Exact for dense views and small strided ones; by byte extent otherwise."""
    (sa, ea), (sb, eb) = a.span, b.span
    if sa >= eb or sb >= ea:
        return False
    ta, tb = a.tensor, b.tensor
    if _dense(ta, a.span) and _dense(tb, b.span):
        return True
    if (ta.element_size() != tb.element_size()
            or max(ta.numel(), tb.numel()) > _EXACT_OVERLAP_MAX_NUMEL):
        return True
    return bool(torch.isin(_byte_offsets(ta), _byte_offsets(tb)).any())


def _union_by_elements(objs: list[_Obj], index: list[int], parent: list[int]) -> bool:
    """Join views that share an element: one sort of every element's byte offset, no pairs.

    Returns False (nothing done) when element sizes differ or the views are too big.
    """
    if len({o.tensor.element_size() for o in objs}) != 1 or \
            sum(o.tensor.numel() for o in objs) > _EXACT_OVERLAP_MAX_NUMEL:
        return False
    offsets = [_byte_offsets(o.tensor) for o in objs]
    labels = torch.cat([torch.full((len(off),), k, dtype=torch.long) for k, off in enumerate(offsets)])
    flat = torch.cat(offsets)
    order = torch.argsort(flat, stable=True)
    flat, labels = flat[order], labels[order]
    hit = (flat[1:] == flat[:-1]) & (labels[1:] != labels[:-1])
    for a, b in set(zip(labels[:-1][hit].tolist(), labels[1:][hit].tolist(), strict=True)):
        ra, rb = _find(parent, index[a]), _find(parent, index[b])
        if ra != rb:
            parent[ra] = rb
    return True


def _memkey(t: torch.Tensor, span: tuple[int, int]) -> tuple:
    """Equal keys mean exactly the same bytes."""
    if _dense(t, span):
        return span
    return (span[0], tuple(t.shape), tuple(t.stride()), t.element_size())


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _components_of_storage(objs: list[_Obj]) -> list[list[_Obj]]:
    """Objects over one storage, split into groups of overlapping bytes (sweep, not all pairs)."""
    for o in objs:
        o.span = _span(o.tensor)
        o.memkey = _memkey(o.tensor, o.span)
    objs = sorted(objs, key=lambda o: (o.span[0], o.first))
    parent = list(range(len(objs)))
    clusters: list[list[int]] = []
    end = -1
    for i, o in enumerate(objs):
        if o.span[0] >= end:
            clusters.append([])
        clusters[-1].append(i)
        end = max(end, o.span[1])
    for cluster in clusters:
        by_mem: dict[tuple, int] = {}
        for i in cluster:
            j = by_mem.setdefault(objs[i].memkey, i)
            if j != i:
                parent[_find(parent, i)] = _find(parent, j)
        heads = list(by_mem.values())
        if len(heads) > 2 and _union_by_elements([objs[i] for i in heads], heads, parent):
            continue
        for x in range(len(heads)):  # distinct memories in one extent cluster: usually one or two
            for y in range(x + 1, len(heads)):
                a, b = heads[x], heads[y]
                if _find(parent, a) != _find(parent, b) and _overlap(objs[a], objs[b]):
                    parent[_find(parent, a)] = _find(parent, b)
    comps: dict[int, list[_Obj]] = {}
    for i, o in enumerate(objs):
        comps.setdefault(_find(parent, i), []).append(o)
    return sorted(comps.values(), key=lambda c: min(o.first for o in c))
