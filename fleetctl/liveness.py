"""Is a local process alive, on a controller with or without ``/proc`` (pure, stdlib).

The deploy lock records its run's pid and start time (``/proc/PID/stat``). Where ``/proc`` is
missing (macOS, BSD, a container without procfs) the start time cannot be read, and "no start time"
must not read as "dead": a live run's lock would look stale and ``--break-lock`` would break it.
Without ``/proc`` the kernel is asked whether the pid exists (``kill(pid, 0)``): absent is dead; present
counts as alive, even if the pid was reused, the safe answer for a lock.
"""

from __future__ import annotations

import os

PROC_SELF = "/proc/self/stat"


def procfs_present() -> bool:
    return os.path.exists(PROC_SELF)


def pid_exists(pid: int) -> bool:
    """Whether any process has this pid (a zombie too): signal 0 checks without signalling."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True
