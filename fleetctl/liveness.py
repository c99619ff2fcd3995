"""Who runs this command, and is a run that holds a lock still alive, on a controller with or without
``/proc`` (stdlib).

The deploy lock records its run's pid and start time (``/proc/PID/stat``). Where ``/proc`` is
missing (macOS, BSD, a container without procfs) the start time cannot be read, and "no start time"
must not read as "dead": a live run's lock would look stale and ``--break-lock`` would break it.
Without ``/proc`` the kernel is asked whether the pid exists (``kill(pid, 0)``): absent is dead; present
counts as alive, even if the pid was reused, the safe answer for a lock.
"""

from __future__ import annotations

import getpass
import os
import socket
from pathlib import Path
from typing import Any

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


def who(command: str) -> dict[str, Any]:
    return {"user": getpass.getuser(), "controller": socket.gethostname(), "pid": os.getpid(),
            "pid_start": process_start(os.getpid()), "command": command}


def process_start(pid: int) -> str | None:
    """Start time of a local process (clock ticks since boot), None when it is not running: with the
    pid it names one process, never a later one that reused the pid."""
    try:
        fields = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


def holder_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the run holding a lock is alive: True/False when it ran on this controller (its pid and
    start time checked), None when it ran elsewhere (nothing here can tell)."""
    if holder.get("controller") != socket.gethostname() or not holder.get("pid"):
        return None
    if not procfs_present():  # no start times to compare: never "dead" for a live pid
        return pid_exists(int(holder["pid"]))
    start = process_start(int(holder["pid"]))
    return start is not None and (holder.get("pid_start") in (None, start))
