"""The host's deploy lock and who holds it: a flock held by the run's agent, so a run that dies
cannot leave it behind; a stale one is broken only on request, a live one never."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetctl.errors import FleetError, HostError
from fleetctl.liveness import holder_alive
from fleetctl.release.service import HostLayout
from fleetctl.transport.base import HostSession


class HostLocked(HostError):
    """Another fleetctl run holds this host's deploy lock."""


@contextmanager
def host_lock(session: HostSession, layout: HostLayout, holder: dict[str, Any],
              break_lock: bool = False, wait: float | None = None) -> Iterator[dict[str, Any] | None]:
    """The host's deploy lock for the duration; refused naming the holder. The lock is a flock held by
    this run's agent, so a run that dies cannot leave it behind unless its agent lives on (its SSH
    session still open: a half-open connection, or an operation still running). Such a lock is
    stale when its holder's pid is dead on this controller; ``break_lock`` then ends the holding
    agent (pid and start time checked on the host) and takes the lock. A live holder is never
    broken. A rollout's holder (one with a ``run_id``, ``release/ownership.py``) keeps the lock past
    the block until its run ends. Yields the broken lock's holder, or None."""
    broke = take_lock(session, layout, holder, break_lock, wait)
    try:
        yield broke
    except BaseException:
        # The deploy failed: what failed it is what the user must read. A host that stopped
        # answering cannot be told to unlock, and need not be: the lock is its agent's flock.
        try:
            free_lock(session, layout)
        except FleetError:
            pass
        raise
    free_lock(session, layout)


def take_lock(session: HostSession, layout: HostLayout, holder: dict[str, Any], break_lock: bool = False,
              wait: float | None = None) -> dict[str, Any] | None:
    """Take the host's deploy lock (``wait``: up to that many seconds for its holder to free it; None:
    the command has no --wait); HostLocked naming the holder when refused. The broken stale lock's
    holder, or None."""
    # The host first checks it may write every folder the deploy writes (else one line, nothing changed).
    params = {"op": "lock", **layout.params(), "holder": holder, "manager": layout.service_manager,
              "hold": bool(holder.get("run_id")), "wait": wait or 0}
    answer = session.call("release_host", params, timeout=(wait + 60) if wait else None)
    if not answer.get("locked") and break_lock and holder_alive(answer.get("holder") or {}) is not True:
        theirs = answer.get("holder") or {}
        answer = session.call("release_host", {**params, "wait": 0, "break_holder": {
            "agent_pid": theirs.get("agent_pid"), "agent_start": theirs.get("agent_start")}})
    if not answer.get("locked"):
        if same_run(holder, answer.get("holder") or {}):
            return None  # this run's other session (another become user) holds it: ours already
        raise HostLocked(session.name, locked_message(answer.get("holder") or {}, break_lock, wait))
    broke: dict[str, Any] | None = answer.get("broke")
    return broke


def free_lock(session: HostSession, layout: HostLayout, end_run: bool = False) -> None:
    """Free the lock this session's agent holds; a rollout's only with ``end_run``."""
    session.call("release_host", {"op": "unlock", **layout.params(), "end_run": end_run})


def same_run(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Whether a lock's holder is this very run (a rollout holding it through another of its sessions)."""
    keys = ("run_id", "controller", "pid", "pid_start")
    return bool(mine.get("run_id")) and all(mine.get(k) == theirs.get(k) for k in keys)


def locked_message(h: dict[str, Any], break_lock: bool, wait: float | None = None) -> str:
    line = (f"locked by another run: {h.get('user', '?')}@{h.get('controller', '?')} pid {h.get('pid', '?')} "
            f"({h.get('command', '?')})" + held_since(h))
    alive = holder_alive(h)
    if alive is False:
        line += (f"; stale: pid {h.get('pid')} is no longer running on {h.get('controller')}, its agent "
                 f"(pid {h.get('agent_pid', '?')}) still holds the lock")
        return line + ("" if break_lock else "; --break-lock ends that agent and takes the lock")
    if alive and break_lock:
        return line + "; that run is alive: not breaking its lock"
    if wait is None:
        return line
    return line + (f"; still held after --wait {wait:g}" if wait else "; --wait SECONDS waits for it to end")


def held_since(h: dict[str, Any]) -> str:
    """`` since 2026-12-05 03:01:02 UTC, run 20261205-...`` as far as the holder's record says."""
    out = ""
    if isinstance(h.get("since"), (int, float)):
        out += " since " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(h["since"]))
    return out + (f", run {h['run_id']}" if h.get("run_id") else "")
