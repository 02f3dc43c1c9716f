"""Put back what a model's own forward (or backward) pass changes on its modules.

A forward pass may keep state of its own: ``self.calls += 1``, ``self.ema = 0.9 * self.ema + ...``,
a buffer written in place (``self.count.add_(1)``), a cache attribute set on first use. Run by
an inspection (a capture, a report, a gradient pass), that pass is not the user's, so
:func:`module_state_kept` puts every module back as it was, in training and eval mode alike:

- plain attributes that were rebound, added or deleted (the module's ``__dict__``);
- parameters, buffers and submodules that were rebound (the same tensor objects come back);
- buffer values written in place (a copy of each buffer is taken first, and written back
  where the values differ afterwards).

Values mutated inside a container that stays bound (``self.log.append(x)``) are not tracked.
A module whose class changed during the pass (torch's lazy modules become their full class on
the first call) is left as it became: putting its old attributes back would break it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

_SLOTS = ("_parameters", "_buffers", "_modules")


class _Saved:
    """One module's attributes and registered tensors, by identity."""

    __slots__ = ("name", "module", "cls", "attrs", "slots")

    def __init__(self, name: str, module: nn.Module) -> None:
        d = module.__dict__
        self.name, self.module, self.cls = name, module, type(module)
        self.attrs = dict(d)
        self.slots = tuple(dict(d[s]) if isinstance(d.get(s), dict) else None for s in _SLOTS)

    def changed(self) -> bool:
        d = self.module.__dict__
        if not _same(d, self.attrs):
            return True
        return any(saved is not None and not _same(d[s], saved) for s, saved in zip(_SLOTS, self.slots, strict=True))

    def restore(self) -> list[str]:
        """Put the attributes back; the names of what had changed."""
        d, changed = self.module.__dict__, []
        for key in [k for k in d if k not in self.attrs]:
            del d[key]
            changed.append(key)
        for key, value in self.attrs.items():
            if d.get(key, _MISSING) is not value:
                d[key] = value
                changed.append(key)
        for slot, saved in zip(_SLOTS, self.slots, strict=True):
            current = d.get(slot)
            if saved is None or not isinstance(current, dict) or _same(current, saved):
                continue
            changed += [k for k in {*current, *saved} if current.get(k, _MISSING) is not saved.get(k, _MISSING)]
            current.clear()
            current.update(saved)
        return changed


_MISSING = object()


def _same(current: dict, saved: dict) -> bool:
    """The same keys bound to the same objects (insertion order kept by a rebinding)."""
    return len(current) == len(saved) and current.keys() == saved.keys() and \
        all(map(operator.is_, current.values(), saved.values()))


def _buffer_copies(named: list[tuple[str, nn.Module]]) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    seen: set[int] = set()
    saved = []
    with torch.inference_mode(False), torch.no_grad():
        for prefix, m in named:
            for key, b in m._buffers.items():
                if b is None or id(b) in seen or b.is_meta or b.layout != torch.strided:
                    continue
                seen.add(id(b))
                saved.append((f"{prefix}.{key}" if prefix else key, b, b.clone()))
    return saved


def _restore_buffers(saved: list[tuple[str, torch.Tensor, torch.Tensor]]) -> list[str]:
    # compared by value: torch's batch_norm writes its running statistics without moving the
    # buffers' version counters
    written = []
    with torch.inference_mode(False), torch.no_grad():
        for name, b, before in saved:
            if b.shape == before.shape and b.dtype == before.dtype and torch.equal(b, before):
                continue
            if b.shape == before.shape and b.dtype == before.dtype:
                b.copy_(before)
            else:  # resized in place: give it its old shape and values back
                b.set_(before)
            written.append(name)
    return written


@contextmanager
def module_state_kept(named: list[tuple[str, nn.Module]]) -> Iterator[list[str]]:
    """Within the block the modules may change; afterwards each is as it was before.

    Yields a list that, when the block ends, holds one line per module whose state had to be
    put back (``"name: calls, ema"``; ``"buffers written in place: bn.running_mean, ..."``), for a
    finding.

    >>> class Counting(nn.Linear):
    ...     def forward(self, x):
    ...         self.calls = getattr(self, "calls", 0) + 1
    ...         return super().forward(x)
    >>> net = Counting(2, 2).eval()
    >>> with module_state_kept([("", net)]) as restored:
    ...     _ = net(torch.ones(1, 2))
    >>> hasattr(net, "calls"), restored
    (False, ['(model): calls'])
    """
    saved = [_Saved(n, m) for n, m in named]
    buffers = _buffer_copies(named)
    restored: list[str] = []
    try:
        yield restored
    finally:
        for s in saved:
            if type(s.module) is s.cls and s.changed():
                restored.append(f"{s.name or '(model)'}: {', '.join(sorted(s.restore()))}")
        written = _restore_buffers(buffers)
        if written:
            shown = ", ".join(written[:5]) + (f" and {len(written) - 5} more" if len(written) > 5 else "")
            restored.append(f"buffers written in place: {shown}")


def restored_message(restored: list[str]) -> str:
    """One sentence for a finding about what :func:`module_state_kept` put back."""
    shown = "; ".join(restored[:5]) + (f"; and {len(restored) - 5} more" if len(restored) > 5 else "")
    return ("the model's forward changed its own modules' state, which was put back as it was "
            f"before the pass ({shown})")
