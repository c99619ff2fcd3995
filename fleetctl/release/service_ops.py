"""``fleetctl service status|start|stop|restart [INSTANCE]``: the servers of ``current`` on each host.

A start or restart waits for each server's ``/health`` (on the port its release recorded), so a
server that does not come back fails its host, and with ``--serial`` stops the rollout the way a
failed deploy does. Changing ops hold the host's deploy lock (a deploy never races a restart).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import HostError
from fleetctl.release import gateway_steps as gateway
from fleetctl.release import instances, servers
from fleetctl.release.gates import GateResult
from fleetctl.release.hostlock import host_lock
from fleetctl.release.manage import server_status
from fleetctl.release.service import control, layout_for
from fleetctl.transport.base import HostSession

OPS = ("status", "start", "stop", "restart")


@dataclass
class ServiceResult:
    host: str
    op: str
    current: str | None
    servers: list[dict[str, Any]] = field(default_factory=list)
    gates: list[GateResult] = field(default_factory=list)
    would: list[str] = field(default_factory=list)  # --check: per server, what the op would do

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.gates)

    def failed_gate(self) -> GateResult | None:
        return next((g for g in self.gates if not g.ok), None)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "op": self.op, "current": self.current, "servers": self.servers,
                "gates": [g.to_dict() for g in self.gates], **({"would": self.would} if self.would else {})}


def service_host(session: HostSession, op: str, instance: str | None, holder: dict[str, Any],
                 timeout: float = 300.0, check: bool = False) -> ServiceResult:
    """``op`` on the chosen servers of ``current``; ``check``: what it would do to each, read from
    their status (no lock taken, nothing started or stopped)."""
    layout = layout_for(session.vars)
    state = session.call("release_host", {"op": "state", **layout.params()})
    names = instances.names_of(state.get("service"))
    if not names and op != "status":
        raise HostError(session.name, "no release on this host: nothing to " + op)
    chosen = instances.select(names or [None], instance, session.name)
    result = ServiceResult(session.name, op, state.get("current"))
    if op == "status" or check:
        result.servers = [server_status(session, layout, n) for n in chosen]
        result.would = [would_do(op, server) for server in result.servers] if check else []
        if check:  # with router_url: the gateway steps a real run takes, for the servers it changes
            changing = [n for n, line in zip(chosen, result.would, strict=True) if not line.startswith("nothing")]
            result.gates = gateway.service_plan(session, layout, changing, op) if changing else []
        return result
    with host_lock(session, layout, holder):
        for name in chosen:
            if op == "start" and session.call("service_host", control(layout, "status", name)).get("running"):
                continue  # already serving: a start changes nothing
            # out of the gateways first, back in after its health gate (a stopped server stays out)
            result.gates += gateway.service_op(session, layout, name, op,
                                               functools.partial(_change, session, layout, name, op, timeout))
            if not all(g.ok for g in result.gates):
                break
    result.servers = [server_status(session, layout, n) for n in chosen]
    return result


def _change(session: HostSession, layout: Any, name: str | None, op: str, timeout: float, one: Any) -> None:
    """Stop, start or restart one server; a start or restart then waits for its /health."""
    if op == "stop":
        servers.stop(session, layout, name)
        return
    failed = servers.restart(session, layout, name) if op == "restart" else _start(session, layout, name)
    if failed:
        one.gates.append(GateResult(f"{instances.ServerInstance(name).label}: {op}", False, failed))
        return
    one.gates += servers.healthy_all(session, layout, [name], timeout)


def _start(session: HostSession, layout: Any, name: str | None) -> str | None:
    from fleetctl.errors import RemoteOperationError

    try:
        session.call("service_host", control(layout, "start", name))
    except RemoteOperationError as exc:
        return exc.reason
    return None


def would_do(op: str, server: dict[str, Any]) -> str:
    """Check mode's line for one server, from its status."""
    running = bool(server.get("running"))
    if op == "start":
        return "nothing: running" if running else "would start, then wait for /health"
    if op == "stop":
        return "would stop" if running else "nothing: stopped"
    return "would restart, then wait for /health" if running else "would start (not running), then wait for /health"
