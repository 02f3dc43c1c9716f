"""Whether a rank's process still runs, from another rank on the same machine: where a process id means
the same process (:data:`_SPACE`: the host, its boot and the PID namespace, published by each rank when
its watch opens) and :func:`_alive` (a process that ended, or a zombie, does not). The ranks' meeting
(:mod:`.ranks`) names a rank that vanished with them."""

from __future__ import annotations

import os
import socket


def _space() -> str:
    """Where a process id means the same process: this machine (its host name and boot) and this PID
    namespace (containers on one host share its name but not their process ids)."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            parts.append(fh.read().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        parts.append("no /proc")
    return "/".join(parts)


_SPACE = _space()
_PROC = os.path.isdir("/proc/self")  # Linux: a process's state, zombies told apart


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs (a zombie, ended but not yet reaped, does not)."""
    if pid <= 0:
        return True  # nothing to look at: not called vanished
    if _PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rpartition(b")")[2].split()[:1]
            return state not in ([b"Z"], [b"X"])
        except FileNotFoundError:
            return False
        except OSError:
            pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: it runs
    return True
