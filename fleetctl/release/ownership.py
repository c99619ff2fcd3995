"""A rollout owns its hosts for its whole life: each host's deploy lock is taken when the rollout first
touches it and held until the run ends (``hostlock``: a holder with a ``run_id`` keeps it), and the
release the host ran then is recorded. Before any switch the rollout checks that the host still runs
what it recorded (or a release the rollout itself put there): a host changed behind it (its lock
broken from another controller, a resumed run's hosts deployed meanwhile) is halted with one line
naming who switched it, never silently replaced. Prune keeps every release the rollout may roll back to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import HostError
from fleetctl.release.hostlock import free_lock, take_lock
from fleetctl.release.service import HostLayout, layout_for
from fleetctl.transport.base import HostSession


class HostChanged(HostError):
    """The host no longer runs what the rollout recorded for it: nothing switched there."""


@dataclass
class Claim:
    """One host as a rollout took it: the release it ran (the rollback target) and the releases the
    rollout has put on it since (a resumed run's included)."""

    host: str
    recorded: str | None
    ours: set[str] = field(default_factory=set)
    targets: set[str] = field(default_factory=set)  # every rollback target recorded (one per play)

    def check(self, state: dict[str, Any], target: str) -> None:
        """Before switching to ``target``: the host runs what this rollout recorded or put there."""
        current = state.get("current")
        if current in {self.recorded, target, *self.ours}:
            return
        raise HostChanged(self.host, f"runs {current or 'no release'}, not {self.recorded or 'no release'} as this "
                                     f"rollout recorded{switched_by(state, current)}: halted on this host, "
                                     f"nothing switched to {target}")

    def protected(self) -> list[str]:
        """The releases prune must keep: every rollback target this rollout recorded."""
        return sorted(r for r in {self.recorded, *self.targets} if r)


def switched_by(state: dict[str, Any], current: str | None) -> str:
    """`` (switched by root@vm at 03:01:02 UTC: deploy)`` from the host's history, as far as it says."""
    entry = next((e for e in reversed(state.get("history") or []) if e.get("to") == current), None)
    if not entry:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry["time"])) if entry.get("time") else "?"
    return f" (switched by {entry.get('who') or '?'} at {when}: {entry.get('kind') or 'deploy'})"


class RunClaims:
    """The hosts one real run owns. ``start(run_id)`` marks its holder a rollout's (the same dict the
    run's deploys and rollbacks lock with, so their own locks are kept too); ``release_all`` at the end."""

    def __init__(self, holder: dict[str, Any], break_lock: bool = False, wait: float = 0.0) -> None:
        self.holder = holder
        self.break_lock = break_lock
        self.wait = wait
        self._claims: dict[str, Claim] = {}
        self._held: list[tuple[HostSession, HostLayout]] = []
        self._lock = threading.Lock()

    def start(self, run_id: str) -> None:
        self.holder["run_id"] = run_id

    def get(self, host: str) -> Claim | None:
        with self._lock:
            return self._claims.get(host)

    def claim(self, session: HostSession, recorded: str | None = None, known: bool = False,
              ours: Iterable[str] = ()) -> str | None:
        """Take the host's lock for the run (once: a later play finds it taken) and record what it runs
        (``known``: ``recorded`` comes from the resumed run's journal); the release recorded. HostLocked
        when another run holds it."""
        layout = layout_for(session.vars)
        claim = self.get(session.name)
        if claim is None:  # a lock --break-lock broke is reported by the run's own deploy (the agent says it)
            take_lock(session, layout, self.holder, self.break_lock, self.wait)
            with self._lock:
                self._held.append((session, layout))
        if not known:
            recorded = session.call("release_host", {"op": "state", **layout.params()}).get("current")
        if claim is None:
            claim = Claim(session.name, recorded, set(ours))
            with self._lock:
                self._claims[session.name] = claim
        if recorded:
            claim.targets.add(recorded)
        return recorded

    def release_all(self) -> None:
        """Every lock this run took, freed (best effort: an agent that exits frees its lock anyway)."""
        with self._lock:
            held, self._held = self._held, []
        for session, layout in held:
            try:
                free_lock(session, layout, end_run=True)
            except Exception:  # a lost host: its agent's exit freed the lock
                pass
