"""A multi-node server's nodes, changed in one batch behind a gateway, move in step.

Only rank 0 is a gateway worker, but every rank serves each request: SGLang's collectives span all
the nodes, so stopping a rank > 0 breaks every request rank 0 has in flight. And rank 0 serves
again only once all its ranks are back. Hence, for the hosts of one batch (``run_batched`` builds
this per batch; the hosts' threads share it):

- a rank > 0 stops its server (deploy, rollback, ``service restart|stop``) only once its rank 0 is
  out of every gateway with 0 requests in flight (``leader_drained``, said by ``drain.py``); a rank 0
  that could not drain, or ended without draining, leaves its ranks > 0 untouched;
- rank 0 goes back into its gateways only once every other rank of the batch has finished its change
  and passed its gates (``wait_members``); one that failed leaves rank 0's worker out.

A group is the hosts sharing ``dist_init_addr`` (``nodegroups.node_vars``); ranks by ``node_rank``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetctl.errors import HostError

T = TypeVar("T")


@dataclass
class _Signal:
    event: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    why: str = ""

    def say(self, ok: bool, why: str) -> None:
        if not self.event.is_set():
            self.ok, self.why = ok, why
            self.event.set()


class GroupSync:
    """The batch's multi-node groups: who is rank 0, who waits on whom."""

    def __init__(self, host_vars: Mapping[str, Mapping[str, Any]], leaderless_ok: bool = False,
                 threads: int = 0) -> None:
        self.leaderless_ok = leaderless_ok  # a group's return after a failure: a rank 0 not in it is out already
        self.threads = threads  # hosts changed at once (--forks; 0: all): rank 0 waits for its ranks only if they run
        self.group: dict[str, str] = {}  # host -> its group (dist_init_addr)
        self.rank: dict[str, int] = {}
        for name, hv in host_vars.items():
            try:
                nnodes, rank = int(hv.get("nnodes") or 1), int(hv.get("node_rank") or 0)
            except (TypeError, ValueError):
                continue
            if nnodes > 1 and hv.get("dist_init_addr"):
                self.group[name], self.rank[name] = str(hv["dist_init_addr"]), rank
        self.leaders = {self.group[h]: h for h in self.group if self.rank[h] == 0}
        self.drained = {g: _Signal() for g in self.leaders}
        self.done = {h: _Signal() for h in self.group if self.rank[h] > 0}

    @classmethod
    def for_hosts(cls, contexts: Mapping[str, Any], names: Iterable[str], leaderless_ok: bool = False,
                  threads: int = 0) -> GroupSync:
        return cls({n: contexts[n].vars for n in names}, leaderless_ok, threads)

    def leader_drained(self, host: str, ok: bool, why: str = "") -> None:
        """Rank 0 says it is out of its gateways and drained (or why not)."""
        if host in self.group and self.rank[host] == 0:
            self.drained[self.group[host]].say(ok, why)

    def wait_leader(self, host: str, seconds: float) -> str:
        """A rank > 0, before it stops its server: until its rank 0 is drained. Raises HostError
        (this node not touched) when rank 0 is not in the batch, could not drain, or took too long."""
        group = self.group.get(host)
        if group is None or self.rank[host] == 0:
            return ""
        leader = self.leaders.get(group)
        if leader is None and self.leaderless_ok:
            return ""
        if leader is None:
            raise HostError(host, f"rank 0 of its group ({group}) is not in this batch: behind a gateway a "
                                  "rank > 0 stops only after its rank 0 drained (select the whole group); "
                                  "not touched")
        signal = self.drained[group]
        if not signal.event.wait(seconds):
            raise HostError(host, f"rank 0 ({leader}) not drained within {seconds:.0f}s; not touched")
        if not signal.ok:
            raise HostError(host, f"rank 0 ({leader}) was not drained ({signal.why}); not touched")
        return f"rank 0 ({leader}) drained before this node stopped"

    def wait_members(self, host: str, seconds: float) -> list[str]:
        """Rank 0, before it goes back into its gateways: each other rank's failure (empty: all passed)."""
        group = self.group.get(host)
        if group is None or self.rank[host] != 0:
            return []
        members = sorted((h for h in self.done if self.group[h] == group), key=lambda h: self.rank[h])
        if self.threads and len(members) + 1 > self.threads:  # they start only once rank 0 has ended
            return []
        failed = []
        for member in members:
            signal = self.done[member]
            if not signal.event.wait(seconds):
                failed.append(f"rank {self.rank[member]} ({member}) not done within {seconds:.0f}s")
            elif not signal.ok:
                failed.append(f"rank {self.rank[member]} ({member}) failed: {signal.why}")
        return failed

    def finish(self, host: str, ok: bool, why: str) -> None:
        """A host's change ended (any way): what it did not say yet, it says now, so nobody waits on it."""
        if host not in self.group:
            return
        if self.rank[host] == 0:
            self.leader_drained(host, False, f"it ended without draining: {why or 'nothing to drain'}")
        else:
            self.done[host].say(ok, why)


def of(session: Any) -> GroupSync | None:
    """The batch's GroupSync a host's context carries (``HostContext.node_sync``), if any."""
    sync = getattr(session, "node_sync", None)
    return sync if isinstance(sync, GroupSync) else None


def ending(sync: GroupSync | None, host: str, change: Callable[[], T],
           judge: Callable[[T], tuple[bool, str]] | None = None) -> T:
    """``change()`` of ``host``; its end, however it ends, said to ``sync`` (``finish``; ``judge``,
    default ``verdict``: ok or why not), so that no other node of its group waits on it."""
    if sync is None:
        return change()
    try:
        value = change()
    except Exception as exc:
        sync.finish(host, False, str(getattr(exc, "reason", None) or exc))
        raise
    sync.finish(host, *(judge or verdict)(value))
    return value


def verdict(value: Any) -> tuple[bool, str]:
    """(ok, why not) of a host's answer: its ``ok`` and its first failed gate."""
    if bool(getattr(value, "ok", True)):
        return True, ""
    gate = next((g for g in getattr(value, "gates", []) if not g.ok), None)
    if getattr(value, "restart_error", None):
        return False, f"restart failed: {value.restart_error}"
    return False, f"{gate.name}: {gate.detail}" if gate else str(getattr(value, "outcome", "failed"))
