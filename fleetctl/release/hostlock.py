"""The host's deploy lock and who holds it: a flock held by the run's agent, so a run that dies
cannot leave it behind; a stale one is broken only on request, a live one never."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleetctl import liveness
from fleetctl.errors import HostError
from fleetctl.release.service import HostLayout
from fleetctl.transport.base import HostSession


class HostLocked(HostError):
    """Another fleetctl run holds this host's deploy lock."""


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
    if not liveness.procfs_present():  # no start times to compare: never "dead" for a live pid
        return liveness.pid_exists(int(holder["pid"]))
    start = process_start(int(holder["pid"]))
    return start is not None and (holder.get("pid_start") in (None, start))


@contextmanager
def host_lock(session: HostSession, layout: HostLayout, holder: dict[str, Any],
              break_lock: bool = False) -> Iterator[dict[str, Any] | None]:
    """The host's deploy lock for the duration; refused naming the holder. The lock is a flock held by
    this run's agent, so a run that dies cannot leave it behind unless its agent lives on (its SSH
    session still open: a half-open connection, or an operation still running). Such a lock is
    stale when its holder's pid is dead on this controller; ``break_lock`` then ends the holding
    agent (pid and start time checked on the host) and takes the lock. A live holder is never
    broken. Yields the broken lock's holder, or None."""
    # The host first checks it may write every folder the deploy writes (else one line, nothing changed).
    params = {"op": "lock", **layout.params(), "holder": holder, "manager": layout.service_manager}
    answer = session.call("release_host", params)
    if not answer.get("locked") and break_lock and holder_alive(answer.get("holder") or {}) is not True:
        theirs = answer.get("holder") or {}
        answer = session.call("release_host", {**params, "break_holder": {
            "agent_pid": theirs.get("agent_pid"), "agent_start": theirs.get("agent_start")}})
    if not answer.get("locked"):
        raise HostLocked(session.name, locked_message(answer.get("holder") or {}, break_lock))
    try:
        yield answer.get("broke")
    finally:
        session.call("release_host", {"op": "unlock", **layout.params()})


def locked_message(h: dict[str, Any], break_lock: bool) -> str:
    line = (f"locked by another run: {h.get('user', '?')}@{h.get('controller', '?')} pid {h.get('pid', '?')} "
            f"({h.get('command', '?')})")
    alive = holder_alive(h)
    if alive:
        return line + ("; that run is alive: not breaking its lock" if break_lock else "")
    if alive is False:
        line += (f"; stale: pid {h.get('pid')} is no longer running on {h.get('controller')}, its agent "
                 f"(pid {h.get('agent_pid', '?')}) still holds the lock")
        return line + ("" if break_lock else "; --break-lock ends that agent and takes the lock")
    return line
