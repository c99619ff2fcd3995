"""What ``fleetctl report`` gathers: one read-only pass over the fleet, then the run journals.

Per host, one session (kept connections with ``--persist``): the release state (current, previous,
the history of switches), the service and its health, one ``nvidia-smi`` (its facts feed both the GPU
health rules and the drift audit's GPU stack) and the venv's distributions. A part that fails on a
reachable host (no venv, say) is kept as that part's error; the other parts still show. The journals
are read on the controller, and so are the gateways (``router_url``): each one's workers beside the
workers the hosts' servers should be there. Nothing here decides a colour: that is ``report.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.drift import audit as drift
from fleetctl.errors import ConnectError, FleetError, InputError
from fleetctl.gateway.status import GatewayStatus, gateway_status
from fleetctl.gateway.workers import expected_workers, gateways_of
from fleetctl.gpu.collect import collect_gpu
from fleetctl.gpu.health import HostHealth, Thresholds, evaluate
from fleetctl.inventory import Host
from fleetctl.lockfile import Pin
from fleetctl.release.manage import HostStatus, status_host
from fleetctl.release.service import layout_for
from fleetctl.report.runs import RunView, last_runs
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import Fleet, HostContext


@dataclass(frozen=True)
class ReportRequest:
    thresholds: dict[str, Thresholds]  # per host, read from its variables before any host is contacted
    groups: dict[str, list[str]]  # per host, its groups (for the filter)
    runs_dir: Path
    venv: str | None = None
    baseline_host: str | None = None
    lock: tuple[Mapping[str, Pin], str] | None = None
    packages: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    verify_files: bool = False
    show_all: bool = False  # every package row in the matrix, not only those that differ
    runs: int = 5  # the last N rollouts shown
    # The groups whose hosts must all run one release (None: every group): the CLI names the groups
    # without child groups, as a parent's children may run different releases on purpose.
    split_groups: tuple[str, ...] | None = None
    gateways: tuple[str, ...] = ()  # every selected host's router_url, once each


    @classmethod
    def for_hosts(cls, hosts: Sequence[Host], runs_dir: Path, **options: Any) -> ReportRequest:
        return cls({h.name: Thresholds.from_vars(h.vars, h.name) for h in hosts},
                   {h.name: sorted(g for g in h.groups if g not in ("all", "ungrouped")) for h in hosts},
                   runs_dir, **options, gateways=tuple(sorted({g for h in hosts for g in gateways_of(h.name, h.vars)})))


@dataclass
class HostGathered:
    host: str
    release: HostStatus | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # release switches, oldest first
    gpu: HostHealth | None = None
    gpu_models: list[str] = field(default_factory=list)
    inventory: drift.HostInventory | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)  # the host's servers as gateway workers
    errors: dict[str, str] = field(default_factory=dict)  # part (release, gpu, drift) -> why it failed


@dataclass
class Gathered:
    request: ReportRequest
    hosts: dict[str, HostResult[HostGathered]]
    drift: drift.DriftReport
    runs: list[RunView]
    gateways: list[GatewayStatus] = field(default_factory=list)


def gather_host(session: HostContext, request: ReportRequest) -> HostGathered:
    out = HostGathered(session.name)
    try:
        state = session.call("release_host", {"op": "state", **layout_for(session.vars).params()})
        out.history = [h for h in state.get("history") or [] if isinstance(h, dict)]
        out.release = status_host(session, state)
        if out.release.current:
            out.workers = expected_workers(session.name, session.vars, out.release.instances, out.release.current)
    except ConnectError:
        raise
    except FleetError as exc:
        out.errors["release"] = _why(exc)
    facts = None
    try:
        facts = collect_gpu(session)
        out.gpu = evaluate(facts, request.thresholds.get(session.name) or Thresholds(), session.name)
        out.gpu_models = [g.name for g in facts.gpus]
    except ConnectError:
        raise
    except FleetError as exc:
        out.errors["gpu"] = _why(exc)
    try:
        if not (request.venv or session.vars.get("venv")):  # nothing named: no audit to call in line
            raise InputError("no venv named (--venv or the host var venv): nothing audited")
        out.inventory = drift.collect(session, request.venv, request.verify_files, facts)
    except ConnectError:
        raise
    except FleetError as exc:
        out.errors["drift"] = _why(exc)
    return out


def gather(fleet: Fleet, request: ReportRequest) -> Gathered:
    """The one pass over the fleet, the drift audit over what it found, and the journals."""
    hosts = fleet.map(lambda ctx: gather_host(ctx, request))
    workers = {n: HostResult(n, r.status, value=r.value.workers if r.value else None, reason=r.reason)
               for n, r in hosts.items()}
    return Gathered(request, hosts, audit(hosts, request), last_runs(request.runs_dir, request.runs, hosts),
                    gateway_status(list(request.gateways), workers))


def audit(hosts: Mapping[str, HostResult[HostGathered]], request: ReportRequest) -> drift.DriftReport:
    """The drift audit of the hosts whose venv answered; a host without one is a failed host there."""
    inventories: dict[str, HostResult[drift.HostInventory]] = {}
    for name, res in hosts.items():
        g = res.value
        if g is not None and g.inventory is not None:
            inventories[name] = HostResult(name, Status.OK, value=g.inventory)
        else:
            why = g.errors.get("drift", "no venv answered") if g is not None else res.reason
            inventories[name] = HostResult(name, res.status if g is None else Status.FAILED, reason=why)
    baseline = request.baseline_host if request.baseline_host in {h for h, r in inventories.items() if r.ok} \
        else None
    return drift.audit(inventories, baseline_host=baseline, lock=request.lock, packages=request.packages,
                       skip=request.skip)


def _why(exc: FleetError) -> str:
    return str(getattr(exc, "reason", "") or exc)
