"""Every change to a serving host goes through its gateways: out, drained, changed, back in.

With the inventory variable ``router_url`` (one URL or a list; per host or per group) a host's
change (deploy, rollback, service restart|stop|start, the playbook's release/service modules) is:

1. every gateway answers ``GET /workers`` (one that does not refuses the host before its server is
   touched); each of the host's workers (one per server instance, ``http://ADDRESS:PORT``) is
   removed from each gateway (``DELETE /workers/{id}``: no new requests);
2. the worker's own ``/metrics`` (read on its host) say ``sglang:num_running_reqs`` +
   ``sglang:num_queue_reqs`` is 0, within ``router_drain_timeout`` seconds (300) - past it the host
   fails with its server untouched and its worker out;
3. the change itself (stop, switch, start, gates, canary);
4. passed: each worker added back (``POST /workers``) and waited for until the gateway calls it
   healthy (``router_add_timeout``, 120 s); failed: the workers stay out, and the result says so.

ADDRESS is ``router_worker_host``, else ``ansible_host``, else the inventory name. A server without
``--enable-metrics`` has no in-flight count: the step says so and SGLang's own SIGTERM drain finishes
what is in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from fleetctl.errors import HostError, InputError
from fleetctl.gateway.client import Gateway, GatewayError, Worker
from fleetctl.gateway.workers import gateways_of, worker_url
from fleetctl.release import group_sync
from fleetctl.release.gates import GateResult
from fleetctl.transport.base import HostSession

POLL = 0.2
GROUP_WAIT = 3600.0  # rank 0 for its other ranks' changes: each ends (group_sync.finish), this only bounds a hang


class Changed(Protocol):
    gates: list[GateResult]

    @property
    def ok(self) -> bool: ...


R = TypeVar("R", bound=Changed)


def seconds_var(host_vars: Mapping[str, Any], var: str, default: float) -> float:
    try:
        return float(host_vars.get(var) or default)
    except (TypeError, ValueError):
        raise InputError(f"{var} must be a number of seconds, got {host_vars.get(var)!r}") from None


def through_gateways(session: HostSession, ports_out: list[int], ports_in: Callable[[], list[int]],
                     change: Callable[[], R]) -> R:
    """``change()`` with the host's workers out of every gateway meanwhile (module docstring). A
    host without ``router_url`` runs ``change()`` as it is."""
    gateways = gateways_of(session.name, session.vars)
    if not gateways:
        return change()
    sync = group_sync.of(session)
    try:
        out = take_out(session, gateways, ports_out)
    except HostError as exc:
        if sync is not None:  # its ranks > 0 stay untouched too
            sync.leader_drained(session.name, False, exc.reason)
        raise
    if sync is not None:
        sync.leader_drained(session.name, True)
    try:
        result = change()
    except HostError as exc:
        raise HostError(session.name, f"{exc.reason}; {_left_out(session, gateways, ports_out)}") from exc
    result.gates[:0] = out
    if not result.ok:
        result.gates.append(GateResult("gateway", False, _left_out(session, gateways, ports_out)))
        return result
    # a multi-node server serves only with every rank back: its other ranks' changes end first
    failed = sync.wait_members(session.name, GROUP_WAIT) if sync is not None else []
    if failed:
        result.gates.append(GateResult("node group", False, f"{'; '.join(failed)}; "
                                                            f"{_left_out(session, gateways, ports_out)}"))
        return result
    result.gates += put_back(session, gateways, ports_in())
    return result


def _left_out(session: HostSession, gateways: list[str], ports: list[int]) -> str:
    urls = ", ".join(worker_url(session.name, session.vars, p) for p in ports)
    return f"worker {urls} left out of gateway {', '.join(gateways)}"


def listings(session: HostSession, gateways: list[str]) -> dict[str, list[Worker]]:
    """Each gateway's workers; one that does not answer refuses the host (nothing touched yet)."""
    try:
        return {g: Gateway(g).workers() for g in gateways}
    except GatewayError as exc:
        raise HostError(session.name, f"{exc}: refused before its server was touched") from None


def take_out(session: HostSession, gateways: list[str], ports: list[int]) -> list[GateResult]:
    """Steps 1 and 2: removed from every gateway, then nothing in flight at the worker."""
    found, steps = listings(session, gateways), []
    deadline = time.monotonic() + seconds_var(session.vars, "router_drain_timeout", 300.0)
    for gateway in gateways:
        for port in ports:
            url, start = worker_url(session.name, session.vars, port), time.monotonic()
            ids = [w.id for w in found[gateway] if w.url == url and w.status != "draining"]
            for worker_id in ids:
                Gateway(gateway).remove(worker_id)
            while any(w.url == url and w.status != "draining" for w in Gateway(gateway).workers()):
                if time.monotonic() > deadline:
                    raise HostError(session.name, f"gateway {gateway} still routes to {url}; server not touched")
                time.sleep(POLL)
            what = "removed" if ids else "was not registered"
            steps.append(GateResult(f"gateway: out of {gateway}", True, f"{url} {what}", time.monotonic() - start))
    for port in ports:
        steps.append(wait_drained(session, port, deadline))
    return steps


def wait_drained(session: HostSession, port: int, deadline: float) -> GateResult:
    url, start, first = worker_url(session.name, session.vars, port), time.monotonic(), None
    while True:
        left = in_flight(session, port)
        if left is None:
            return GateResult("gateway: drained", True, f"{url}: no /metrics (start SGLang with --enable-metrics); "
                                                        "SGLang's SIGTERM drain finishes what is in flight")
        first = left if first is None else first
        if left == 0:
            waited = f" (waited for {first} to finish)" if first else ""
            return GateResult("gateway: drained", True, f"{url}: 0 requests in flight{waited}",
                              time.monotonic() - start)
        if time.monotonic() > deadline:
            raise HostError(session.name, f"drain deadline: {left} requests still in flight on {url} after "
                                          f"{time.monotonic() - start:.0f}s; server not touched, worker left out")
        time.sleep(POLL)


def in_flight(session: HostSession, port: int) -> int | None:
    """Running + queued requests from the worker's ``/metrics`` (read on its host); 0 when nothing
    listens; None when the server has no metrics."""
    from fleetctl.probes.http import HttpRequest, probe_http

    answer = probe_http(session, HttpRequest("/metrics", port=port, timeout=5, max_text=1 << 20))
    if answer.error_kind == "refused":
        return 0
    if answer.status != 200:
        return None
    total = 0.0
    for line in (answer.text or "").splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def put_back(session: HostSession, gateways: list[str], ports: list[int]) -> list[GateResult]:
    """Step 4: each worker added to each gateway and healthy there; a failure fails the host."""
    steps = []
    wait = seconds_var(session.vars, "router_add_timeout", 120.0)
    for gateway in gateways:
        for port in ports:
            url, start = worker_url(session.name, session.vars, port), time.monotonic()
            try:
                worker_id = add_when_gone(Gateway(gateway), url, start + wait)
                healthy = wait_healthy(Gateway(gateway), worker_id, url, start + wait)
            except GatewayError as exc:
                raise HostError(session.name, f"{exc}; worker {url} left out") from None
            if not healthy:
                raise HostError(session.name, f"gateway {gateway} did not call {url} healthy within {wait:.0f}s; "
                                              "worker left out")
            steps.append(GateResult(f"gateway: back in {gateway}", True, f"{url} healthy", time.monotonic() - start))
    return steps


def add_when_gone(gateway: Gateway, url: str, deadline: float) -> str:
    """Add ``url`` once its old (draining) entry is gone; one already ready stays as it is."""
    while True:
        mine = [w for w in gateway.workers() if w.url == url]
        if any(w.status != "draining" for w in mine):
            return next(w.id for w in mine if w.status != "draining")
        if not mine:
            return gateway.add(url)
        if time.monotonic() > deadline:
            raise GatewayError(f"gateway {gateway.url}: {url} still draining")
        time.sleep(POLL)


def wait_healthy(gateway: Gateway, worker_id: str, url: str, deadline: float) -> bool:
    while True:
        if any(w.url == url and w.healthy and (w.id == worker_id or not worker_id) for w in gateway.workers()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL)


def planned(session: HostSession, ports_out: list[int], ports_in: list[int]) -> list[GateResult]:
    """Check mode: the steps a real run takes (each gateway is asked, nothing is changed)."""
    gateways = gateways_of(session.name, session.vars)
    found = listings(session, gateways) if gateways else {}
    steps = []
    for gateway in gateways:
        for port in ports_out:
            url = worker_url(session.name, session.vars, port)
            now = "registered" if any(w.url == url for w in found[gateway]) else "not registered"
            steps.append(GateResult(f"gateway: would take out of {gateway}", True,
                                    f"{url} ({now}), then wait for 0 requests in flight"))
        for port in ports_in:
            steps.append(GateResult(f"gateway: would add back to {gateway}", True,
                                    f"{worker_url(session.name, session.vars, port)} once its gates pass"))
    return steps
