"""The servers of ``current`` on one host: switch, restart each instance in order, stop the ones the
new release no longer runs, and their health.

``current`` switches once for the whole host; then the instances restart one after the other, so
a two-instance host never has both down at once unless both fail. Which instances a release runs
is read from its ``service.json`` on the host (``release/instances.py``).
"""

from __future__ import annotations

from typing import Any

from fleetctl.errors import RemoteOperationError
from fleetctl.release import instances
from fleetctl.release.gates import GateResult, wait_healthy
from fleetctl.release.service import HostLayout, control
from fleetctl.release.spec import Health
from fleetctl.transport.base import HostSession, Step


def switch_params(layout: HostLayout, release_id: str, reason: str, holder: dict[str, Any],
                  kind: str = "deploy") -> dict[str, Any]:
    return {"op": "switch", **layout.params(), "release_id": release_id, "reason": reason, "kind": kind,
            "who": f"{holder['user']}@{holder['controller']}"}


def switch_over(session: HostSession, layout: HostLayout, release_id: str, reason: str, holder: dict[str, Any],
                gone: list[str | None], restart: list[str | None], kind: str = "deploy") -> str | None:
    """Switch ``current``, stop the servers ``gone`` (the old release's, that this one does not run)
    and restart ``restart`` in order, as one sequence the host finishes even if the controller dies
    meanwhile: a killed run never leaves ``current`` moved while the old server still serves. The
    failed restart (``instance: why``, the host's line), or None; a failed switch or stop raises,
    as its own call would. ``kind``: deploy, rollback or revert (the host's history: the release a
    rollback or a revert leaves is rejected as a rollback target)."""
    steps = [Step("release_host", switch_params(layout, release_id, reason, holder, kind)),
             *(Step("service_host", control(layout, "stop", name)) for name in gone),
             *(Step("service_host", control(layout, "restart", name)) for name in restart)]
    done = session.sequence(steps)
    for i, outcome in enumerate(done):
        if isinstance(outcome, RemoteOperationError):
            if i < len(steps) - len(restart):
                raise outcome
            name = restart[i - (len(steps) - len(restart))]
            return f"{name}: {outcome.reason}" if name else outcome.reason
    return None


def names_in(state: dict[str, Any], release_id: str) -> list[str | None]:
    """The servers release ``release_id`` runs, from the host's ``state`` (``[]``: not there)."""
    found = next((r for r in state.get("releases") or [] if r.get("id") == release_id), None)
    return instances.names_of((found or {}).get("service"))


def current_names(session: HostSession, layout: HostLayout) -> list[str | None]:
    """The instances the release ``current`` points at runs (``[]``: no release)."""
    state = session.call("release_host", {"op": "state", **layout.params()})
    return instances.names_of(state.get("service"))


def restart(session: HostSession, layout: HostLayout, instance: str | None = None) -> str | None:
    """Restart one server of ``current``; why it failed (the host's own line), or None. A lost host
    or agent is not caught: nothing could be switched back there."""
    try:
        session.call("service_host", control(layout, "restart", instance))
    except RemoteOperationError as exc:
        return exc.reason
    return None


def stop(session: HostSession, layout: HostLayout, instance: str | None = None) -> None:
    session.call("service_host", control(layout, "stop", instance))


def running(session: HostSession, layout: HostLayout, names: list[str | None]) -> bool:
    return bool(names) and all(session.call("service_host", control(layout, "status", n)).get("running")
                               for n in names)


def healthy_all(session: HostSession, layout: HostLayout, names: list[str | None], timeout: float,
                health_path: str | None = None) -> list[GateResult]:
    """``/health`` of every server of ``current``, each on the port its release recorded."""
    gates = []
    for name in names:
        stored = session.call("service_host", control(layout, "status", name))
        health = Health(path=health_path or str(stored.get("health_path") or "/health"), timeout=timeout,
                        interval=float(stored.get("health_interval") or 1.0))
        gate = wait_healthy(session, health, layout, int(stored.get("port") or 30000), name)
        gates.append(gate if not name else GateResult(f"{name}: {gate.name}", gate.ok, gate.detail, gate.seconds))
    return gates
