"""Where deploy, rollback and service ops meet the gateway: which of a host's servers (ports) go out
before a change and which come back after it. A host without ``router_url`` costs nothing here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetctl.gateway.workers import gateways_of
from fleetctl.release import group_sync
from fleetctl.release import instances as insts
from fleetctl.release.drain import R, planned, seconds_var, through_gateways
from fleetctl.release.gates import GateResult
from fleetctl.release.service import HostLayout, control, listen
from fleetctl.release.spec import ReleaseSpec
from fleetctl.transport.base import HostSession


def configured(session: HostSession) -> bool:
    """Behind a gateway, and a worker there: a multi-node server's rank > 0 node serves no requests
    (its rank 0 is the group's worker), so it is never taken out nor added."""
    from fleetctl.release.nodegroups import rank_of

    return bool(gateways_of(session.name, session.vars)) and not rank_of(session.vars)


def after_leader(session: HostSession, change: Callable[[], R]) -> R:
    """A rank > 0 behind a gateway (not a worker itself): its server stops only once its rank 0 is
    out of the gateways and drained (``group_sync.py``); anyone else changes at once."""
    from fleetctl.release.nodegroups import rank_of

    sync = group_sync.of(session)
    if sync is None or not rank_of(session.vars) or not gateways_of(session.name, session.vars):
        return change()
    said = sync.wait_leader(session.name, seconds_var(session.vars, "router_drain_timeout", 300.0) + 60)
    result = change()
    if said:
        result.gates.insert(0, GateResult("gateway: after its rank 0", True, said))
    return result


def leader_plan(session: HostSession) -> list[GateResult]:
    """Check mode, a rank > 0 behind a gateway: the wait a real run takes before its server stops."""
    from fleetctl.release.nodegroups import rank_of

    if not rank_of(session.vars) or not gateways_of(session.name, session.vars):
        return []
    return [GateResult("gateway: would wait for its rank 0", True, f"rank {rank_of(session.vars)} stops only once "
                       f"its rank 0 (dist_init_addr {session.vars.get('dist_init_addr')}) is out and drained")]


def port_of(session: HostSession, layout: HostLayout, name: str | None) -> int:
    """The port a server of ``current`` listens on, as its release recorded it."""
    stored = session.call("service_host", control(layout, "status", name))
    return int(stored.get("port") or 30000)


def current_ports(session: HostSession, layout: HostLayout) -> list[int]:
    state = session.call("release_host", {"op": "state", **layout.params()})
    return [port_of(session, layout, n) for n in insts.names_of(state.get("service"))]


def spec_ports(spec: ReleaseSpec, layout: HostLayout) -> list[int]:
    return [listen(spec, layout, inst)[1] for inst in insts.of_spec(spec)]


def deploy(session: HostSession, spec: ReleaseSpec, layout: HostLayout, change: Callable[[], R]) -> R:
    """A deploy's switch half: the servers running now and the release's own go out; the release's
    servers come back once they pass their gates."""
    if not configured(session):
        return after_leader(session, change)
    out = sorted(set(current_ports(session, layout)) | set(spec_ports(spec, layout)))
    return through_gateways(session, out, lambda: spec_ports(spec, layout), change)


def deploy_plan(session: HostSession, spec: ReleaseSpec, layout: HostLayout) -> list[GateResult]:
    if not configured(session):
        return leader_plan(session)
    ours = spec_ports(spec, layout)
    return planned(session, sorted(set(current_ports(session, layout)) | set(ours)), ours)


def rollback(session: HostSession, layout: HostLayout, change: Callable[[], R]) -> R:
    """A rollback: the servers running now go out; the target's come back (read after the switch)."""
    if not configured(session):
        return after_leader(session, change)
    return through_gateways(session, current_ports(session, layout), lambda: current_ports(session, layout), change)


def rollback_plan(session: HostSession, layout: HostLayout) -> list[GateResult]:
    if not configured(session):
        return leader_plan(session)
    ports = current_ports(session, layout)
    return planned(session, ports, ports)


@dataclass
class OneServer:
    """One server's op (``service restart|stop|start``), as the gateway steps see it."""

    gates: list[GateResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.gates)


def service_op(session: HostSession, layout: HostLayout, name: str | None, op: str,
               change: Callable[[OneServer], Any]) -> list[GateResult]:
    """One server stopped, started or restarted: out of the gateways first; back in after a start or
    a restart that passed its health gate (a stopped server stays out). ``change`` fills the gates."""
    def run() -> OneServer:
        one = OneServer()
        change(one)
        return one

    if not configured(session):  # a start stops nothing: no rank 0 to wait for
        return (run() if op == "start" else after_leader(session, run)).gates
    port = port_of(session, layout, name)

    done = through_gateways(session, [port], lambda: [] if op == "stop" else [port], run)
    return done.gates


def service_plan(session: HostSession, layout: HostLayout, names: list[str | None], op: str) -> list[GateResult]:
    if not configured(session):  # a start stops nothing: no rank 0 to wait for
        return [] if op == "start" else leader_plan(session)
    ports = [port_of(session, layout, n) for n in names]
    return planned(session, ports, [] if op == "stop" else ports)
