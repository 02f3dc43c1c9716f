"""Put back what a model's own forward (or backward) pass changes on its modules.

A forward pass may keep state of its own: ``self.calls += 1``, ``self.ema = 0.9 * self.ema + ...``,
a buffer written in place (``self.count.add_(1)``), a cache attribute set on first use. Run by
an inspection (a capture, a report, a gradient pass), that pass is not the user's, so
:func:`module_state_kept` puts every module back as it was, in training and eval mode alike:

- plain attributes that were rebound to another value, added or deleted (the module's ``__dict__``);
- buffers that were rebound (the same tensor objects come back);
- buffer values written in place (a copy of each buffer is taken first, and written back
  where the values differ afterwards).

Values mutated inside a container that stays bound (``self.log.append(x)``), and parameters or
submodules registered anew by the forward, are not tracked.
A module whose class changed during the pass (torch's lazy modules become their full class on
the first call) is left as it became: putting its old attributes back would break it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .labels import module_label


def _dicts(modules: list[nn.Module]) -> list[dict]:
    """Each module's ``__dict__`` and its buffer dict, in one flat list."""
    return [d for m in modules for d in (m.__dict__, m._buffers)]


def _unchanged(current: list[dict], saved: list[dict]) -> bool:
    """Whether every dict holds the same keys bound to the same (or equal) values: one comparison
    in C, which takes identical values as equal without comparing them."""
    try:
        return current == saved
    except Exception:  # noqa: BLE001 - a rebound value whose == raises (a tensor) is a change
        return False


def _restore(current: dict, saved: dict) -> list[str]:
    """Put ``saved``'s bindings back into ``current``; the names that had changed."""
    changed = [k for k in current if k not in saved]
    for key in changed:
        del current[key]
    for key, value in saved.items():
        if current.get(key, _MISSING) is not value:
            current[key] = value
            changed.append(key)
    return changed


_MISSING = object()


def _buffer_copies(named: list[tuple[str, nn.Module]]) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    found = [(prefix, m._buffers) for prefix, m in named if m._buffers]
    if not found:
        return []
    seen: set[int] = set()
    saved = []
    with torch.inference_mode(False), torch.no_grad():
        for prefix, buffers in found:
            for key, b in buffers.items():
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
            elif b.dtype == before.dtype:  # resized in place: its old shape and values back
                b.set_(before.untyped_storage(), 0, before.shape, before.stride())
            else:  # given another dtype through .data
                b.data = before
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
    modules = [m for _, m in named]
    classes = [type(m) for m in modules]
    live = _dicts(modules)
    saved = [d.copy() for d in live]
    buffers = _buffer_copies(named)
    restored: list[str] = []
    try:
        yield restored
    finally:
        if not _unchanged(live, saved):  # the common case: one comparison, nothing to do
            restored += _put_back(named, classes, live, saved)
        written = _restore_buffers(buffers)
        if written:
            shown = ", ".join(written[:5]) + (f" and {len(written) - 5} more" if len(written) > 5 else "")
            restored.append(f"buffers written in place: {shown}")


def _put_back(named: list[tuple[str, nn.Module]], classes: list[type], live: list[dict],
              saved: list[dict]) -> list[str]:
    lines = []
    for i, (name, m) in enumerate(named):
        if type(m) is not classes[i]:  # a lazy module became its full class: left as it became
            continue
        # __dict__ first: it binds the buffer dict that follows
        changed = [k for cur, old in zip(live[2 * i:2 * i + 2], saved[2 * i:2 * i + 2], strict=True)
                   if not _unchanged([cur], [old]) for k in _restore(cur, old)]
        if changed:
            lines.append(f"{module_label(name)}: {', '.join(sorted(set(changed)))}")
    return lines


def restored_message(restored: list[str]) -> str:
    """One sentence for a finding about what :func:`module_state_kept` put back."""
    shown = "; ".join(restored[:5]) + (f"; and {len(restored) - 5} more" if len(restored) > 5 else "")
    return ("the model's forward changed its own modules' state, which was put back as it was "
            f"before the pass ({shown})")
