"""``fleetctl router status``: each gateway's workers (health, load) beside the workers the inventory
says it should have (each selected host's servers, one per instance), and which are out and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.gateway.client import Gateway, GatewayError, Worker
from fleetctl.transport.base import HostResult


@dataclass
class WorkerRow:
    gateway: str
    url: str
    host: str = ""  # the inventory host serving it ("" when no selected host does)
    id: str = ""
    status: str = "out"  # ready | pending | draining | out (not registered)
    healthy: bool = False
    load: int = 0
    why: str = ""  # why it is out or not healthy

    @property
    def serving(self) -> bool:
        return self.status == "ready" and self.healthy

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, serving=self.serving)


@dataclass
class GatewayStatus:
    url: str
    error: str = ""  # the gateway did not answer
    workers: list[WorkerRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "error": self.error, "workers": [w.to_dict() for w in self.workers]}


def gateway_status(gateways: list[str], hosts: dict[str, HostResult[list[dict[str, Any]]]]) -> list[GatewayStatus]:
    """Each gateway's listing joined with the hosts' expected workers."""
    expected = {(g, w["url"]): (name, w) for name, res in hosts.items() if res.ok and res.value
                for w in res.value for g in w["gateways"]}
    out = []
    for url in gateways:
        status = GatewayStatus(url)
        try:
            listed = Gateway(url).workers()
        except GatewayError as exc:
            status.error = str(exc)
            out.append(status)
            continue
        seen = set()
        for worker in listed:
            host, server = expected.get((url, worker.url), ("", None))
            seen.add(worker.url)
            status.workers.append(_listed(url, worker, host, server))
        for (g, wurl), (host, server) in sorted(expected.items()):
            if g == url and wurl not in seen:
                status.workers.append(WorkerRow(url, wurl, host, why=_why_out(server)))
        out.append(status)
    return out


def _listed(gateway: str, worker: Worker, host: str, server: dict[str, Any] | None) -> WorkerRow:
    row = WorkerRow(gateway, worker.url, host, worker.id, worker.status, worker.healthy, worker.load)
    if worker.status == "draining":
        row.why = "being removed (draining: no new requests)"
    elif not worker.healthy:
        row.why = "the gateway's health checks fail" + (f" (server /health: {server['health']})" if server else "")
    elif not host:
        row.why = "no selected inventory host serves this URL"
    return row


def _why_out(server: dict[str, Any]) -> str:
    if not server["running"]:
        return "not registered: its server is not running"
    return (f"not registered: left out by a change that failed, or never added (server running "
            f"{server['release']}, /health {server['health']})")
