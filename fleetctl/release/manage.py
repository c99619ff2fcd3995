"""After a deploy: roll back by release id, and report status and the releases on each host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import HostError
from fleetctl.release.deploy import ReleaseRefused, host_lock, restart, switch
from fleetctl.release.gates import GateResult, wait_healthy
from fleetctl.release.service import control, layout_for
from fleetctl.release.spec import Health
from fleetctl.transport.base import HostSession


@dataclass
class RollbackResult:
    host: str
    outcome: str  # rolled-back | unchanged
    from_id: str | None
    to_id: str
    gates: list[GateResult] = field(default_factory=list)
    broke_lock: dict[str, Any] | None = None  # the stale lock's holder, when --break-lock broke one

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.gates)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "outcome": self.outcome, "from": self.from_id, "to": self.to_id,
                "gates": [g.to_dict() for g in self.gates], "broke_lock": self.broke_lock}


def rollback_host(session: HostSession, to: str | None, timeout: float, holder: dict[str, Any],
                  break_lock: bool = False) -> RollbackResult:
    """Switch ``current`` to ``to`` (a release id, the same on every host) or to the recorded
    previous release, restart, and wait for health. Nothing is reinstalled."""
    layout = layout_for(session.vars)
    with host_lock(session, layout, holder, break_lock) as broke:
        state = session.call("release_host", {"op": "state", **layout.params()})
        target = to or state.get("previous")
        known = [r["id"] for r in state["releases"]]
        if not target:
            raise ReleaseRefused(session.name, "no previous release recorded: nothing to roll back to")
        if target not in known:
            raise ReleaseRefused(session.name, f"release {target} is not on this host "
                                               f"(has: {', '.join(known) or 'none'})")
        if target == state.get("current"):
            return RollbackResult(session.name, "unchanged", target, target, broke_lock=broke)
        switch(session, layout, target, "rollback", holder)
        failed = restart(session, layout)
        if failed and state.get("current"):  # not serving the target: back where it was, as deploy does
            switch(session, layout, state["current"], f"restart failed for {target}", holder)
            restart(session, layout)
            raise HostError(session.name, f"restart failed: {failed}; switched back to {state['current']}")
        service = session.call("release_host", {"op": "state", **layout.params()}).get("service") or {}
        health = Health(path=str(service.get("health_path") or "/health"), timeout=timeout)
        gate = wait_healthy(session, health, layout, int(service.get("port") or 30000))
        return RollbackResult(session.name, "rolled-back", state.get("current"), target, [gate], broke_lock=broke)


@dataclass
class HostStatus:
    host: str
    current: str | None
    previous: str | None
    releases: list[str]
    service: dict[str, Any]
    health: str
    canary: dict[str, Any] | None = None  # the current release's warm-up numbers on this host
    argv: list[str] = field(default_factory=list)  # the launch command as rendered for this host (masked)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def status_host(session: HostSession, state: dict[str, Any] | None = None) -> HostStatus:
    """``state``: the host's ``release_host state`` answer when the caller already has it."""
    from fleetctl.probes.http import HttpRequest, probe_http

    layout = layout_for(session.vars)
    if state is None:
        state = session.call("release_host", {"op": "state", **layout.params()})
    service = session.call("service_host", control(layout, "status"))
    stored = state.get("service") or {}
    health = "-"
    if service.get("running"):
        answer = probe_http(session, HttpRequest(str(stored.get("health_path") or "/health"),
                                                 port=int(stored.get("port") or 30000), timeout=5))
        health = str(answer.status) if answer.status else str(answer.error_kind)
    service.pop("log_tail", None)
    from fleetctl.release import warmup
    from fleetctl.secrets import mask_values, secret_values

    hidden = secret_values(session.vars)
    argv = [mask_values(str(a), hidden) for a in stored.get("command") or []]
    return HostStatus(session.name, state.get("current"), state.get("previous"), [r["id"] for r in state["releases"]],
                      service, health, warmup.load(session, layout, state.get("current")), argv)
