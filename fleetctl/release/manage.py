"""After a deploy: roll back by release id, and report status and the releases on each host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import HostError
from fleetctl.release import gateway_steps as gateway
from fleetctl.release import instances, servers
from fleetctl.release.deploy import ReleaseRefused
from fleetctl.release.gates import GateResult
from fleetctl.release.hostlock import host_lock
from fleetctl.release.ownership import Claim
from fleetctl.release.service import control, layout_for
from fleetctl.transport.base import HostSession


@dataclass
class RollbackResult:
    host: str
    outcome: str  # rolled-back | unchanged | planned (check mode)
    from_id: str | None
    to_id: str
    gates: list[GateResult] = field(default_factory=list)
    broke_lock: dict[str, Any] | None = None  # the stale lock's holder, when --break-lock broke one
    note: str = ""  # why nothing was done (already rolled back)

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.gates)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "outcome": self.outcome, "from": self.from_id, "to": self.to_id,
                "gates": [g.to_dict() for g in self.gates], "broke_lock": self.broke_lock, "note": self.note}


def rollback_host(session: HostSession, to: str | None, timeout: float, holder: dict[str, Any],
                  break_lock: bool = False, check: bool = False, claim: Claim | None = None) -> RollbackResult:
    """Switch ``current`` to ``to`` (a release id, the same on every host) or to the release before
    it in the host's switch history that was never rejected, restart, and wait for health. Nothing is
    reinstalled. Idempotent, as Capistrano's rollback: a host an operator's rollback already brought
    back stays where it is (``--to`` goes further back), so re-running a fleet rollback after a partial
    failure moves only the hosts that did not make it. ``check``: the target, nothing switched.
    ``claim``: the rollout's record of the host (``ownership.py``), checked before the switch."""
    layout = layout_for(session.vars)
    with host_lock(session, layout, holder, break_lock) as broke:
        state = session.call("release_host", {"op": "state", **layout.params()})
        current = state.get("current")
        if to is None and state.get("rolled_back_from"):
            return RollbackResult(session.name, "unchanged", current, current or "-", broke_lock=broke,
                                  note=f"already rolled back from {state['rolled_back_from']} to {current}; "
                                       "--to RELEASE_ID goes further back")
        target = to or state.get("previous")
        known = [r["id"] for r in state["releases"]]
        if not target:
            raise ReleaseRefused(session.name, "no earlier release to roll back to (none on the host that was "
                                               "not itself rolled back from)")
        if target not in known:
            raise ReleaseRefused(session.name, f"release {target} is not on this host "
                                               f"(has: {', '.join(known) or 'none'})")
        if target == current:
            return RollbackResult(session.name, "unchanged", target, target, broke_lock=broke)
        if check:
            return RollbackResult(session.name, "planned", current, target, gateway.rollback_plan(session, layout),
                                  broke_lock=broke)
        if claim is not None:
            claim.check(state, target)
        return gateway.rollback(session, layout, lambda: _switch_to(session, layout, holder, state, target, timeout,
                                                                    broke, claim))


def _switch_to(session: HostSession, layout: Any, holder: dict[str, Any], state: dict[str, Any], target: str,
               timeout: float, broke: dict[str, Any] | None, claim: Claim | None) -> RollbackResult:
    current = state.get("current")
    before, names = instances.names_of(state.get("service")), servers.names_in(state, target)
    # every instance of the target restarted, in order, in the one sequence of the switch
    failed = servers.switch_over(session, layout, target, "rollback", holder,
                                 [n for n in before if n not in names], names, kind="rollback")
    if failed and current:  # not serving the target: back where it was, as deploy does
        servers.switch_over(session, layout, current, f"restart failed for {target}", holder,
                            [n for n in names if n not in before], before, kind="revert")
        raise HostError(session.name, f"restart failed: {failed}; switched back to {current}")
    if claim is not None:
        claim.ours.add(target)  # the rollout put it there: its next switch may leave it
    gates = servers.healthy_all(session, layout, names, timeout)
    return RollbackResult(session.name, "rolled-back", current, target, gates, broke_lock=broke)


@dataclass
class HostStatus:
    host: str
    current: str | None
    previous: str | None
    releases: list[str]
    service: dict[str, Any]  # the first (or only) server's; every server's is in ``instances``
    health: str
    canary: dict[str, Any] | None = None  # the current release's warm-up numbers on this host
    argv: list[str] = field(default_factory=list)  # the launch command as rendered for this host (masked)
    instances: list[dict[str, Any]] = field(default_factory=list)  # per server: name, running, health, restarts
    models: list[dict[str, Any]] = field(default_factory=list)  # the current release's models (quick tier)

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def status_host(session: HostSession, state: dict[str, Any] | None = None) -> HostStatus:
    """``state``: the host's ``release_host state`` answer when the caller already has it."""
    from fleetctl.release import warmup

    layout = layout_for(session.vars)
    if state is None:
        state = session.call("release_host", {"op": "state", **layout.params()})
    servers_ = [server_status(session, layout, name) for name in instances.names_of(state.get("service")) or [None]]
    first = servers_[0]
    service = {k: v for k, v in first.items() if k not in ("argv", "health", "name")}
    return HostStatus(session.name, state.get("current"), state.get("previous"), [r["id"] for r in state["releases"]],
                      service, first["health"], warmup.load(session, layout, state.get("current")), first["argv"],
                      servers_, current_models(session) if state.get("current") else [])


def current_models(session: HostSession) -> list[dict[str, Any]]:
    """role, revision, state (and the first problem) of each model the current release names."""
    from fleetctl.models.status import current_on_host

    return [{"role": s.role, "path": s.path, "revision": s.revision, "state": s.state,
             "problem": s.first_problem() if s.problems else None} for s in current_on_host(session)]


def server_status(session: HostSession, layout: Any, name: str | None) -> dict[str, Any]:
    """One server: running, its /health, the supervisor's restarts and last exit, its argv (masked)."""
    from fleetctl.probes.http import HttpRequest, probe_http
    from fleetctl.secrets import mask_values, secret_values

    answer = session.call("service_host", control(layout, "status", name))
    health = "-"
    if answer.get("running"):
        got = probe_http(session, HttpRequest(str(answer.get("health_path") or "/health"),
                                              port=int(answer.get("port") or 30000), timeout=5))
        health = str(got.status) if got.status else str(got.error_kind)
    hidden = secret_values(session.vars)
    argv = [mask_values(str(a), hidden) for a in answer.pop("command", None) or []]
    answer.pop("log_tail", None)
    return dict(answer, name=instances.ServerInstance(name).label, health=health, argv=argv)
