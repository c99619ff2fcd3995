"""``fleetctl gpu health``: the request, the one core call, and the report's rows and JSON.

Collection is one agent round trip per host (``gpu.collect.collect_gpu``: one ``nvidia-smi -q -x``,
``nvidia-smi nvlink`` where links exist, the kernel log's Xid lines); the verdicts are the pure
rules of ``gpu_health.py``, with each host's thresholds read from its variables before any host
is contacted, so a bad threshold is an input error naming the host and the variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleetctl.errors import ExitCode
from fleetctl.gpu.collect import collect_gpu
from fleetctl.gpu.health import HostHealth, Level, Thresholds, evaluate
from fleetctl.inventory import Host
from fleetctl.transport.base import HostResult
from fleetctl.transport.fleet import Fleet, HostContext


@dataclass(frozen=True)
class HealthRequest:
    thresholds: dict[str, Thresholds]  # per host, read from its variables
    problems_only: bool = False  # rows of amber and red checks only

    @classmethod
    def for_hosts(cls, hosts: Sequence[Host], problems_only: bool = False) -> HealthRequest:
        return cls({h.name: Thresholds.from_vars(h.vars, h.name) for h in hosts}, problems_only)


def check_host(session: HostContext, thresholds: Thresholds) -> HostHealth:
    """One host: its GPU facts, then every rule."""
    return evaluate(collect_gpu(session), thresholds, session.name)


def run(fleet: Fleet, request: HealthRequest) -> dict[str, HostResult[HostHealth]]:
    return fleet.map(lambda ctx: check_host(ctx, request.thresholds.get(ctx.name) or Thresholds()))


def exit_code(results: dict[str, HostResult[HostHealth]]) -> int:
    """2 when a host failed or was unreachable, else 1 when any host is red, else 0."""
    if not all(r.ok for r in results.values()):
        return int(ExitCode.HOST_FAILED)
    red = any(r.value is not None and r.value.level is Level.RED for r in results.values())
    return int(ExitCode.BAD_ANSWER if red else ExitCode.OK)


def red_hosts(results: dict[str, HostResult[HostHealth]]) -> list[str]:
    return sorted(h for h, r in results.items() if r.value is not None and r.value.level is Level.RED)


def rows(results: dict[str, HostResult[HostHealth]], problems_only: bool = False) -> list[tuple[str, str, str,
                                                                                                Level, str]]:
    """(host, GPU, check, level, value) for every check, hosts in name order."""
    out = []
    for host, res in sorted(results.items()):
        if res.value is None:
            continue
        for gpu in res.value.gpus:
            label = "host" if gpu.index is None else f"{gpu.index} {gpu.name}"
            for check in gpu.checks:
                if not problems_only or check.level is not Level.GREEN:
                    out.append((host, label, check.rule, check.level, check.value))
    return out
