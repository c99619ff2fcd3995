"""Ad-hoc operations: ping every host, run a shell command, gather identical outputs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleetctl.transport.base import CommandResult, HostResult, Status
from fleetctl.transport.fleet import Fleet, HostContext
from fleetctl.transport.output import tail_text


@dataclass(frozen=True)
class PingInfo:
    hostname: str
    python: str
    python_version: str
    connect_ms: float  # first contact: connection + agent start
    rtt_ms: float  # one request on the open agent channel
    user: str = ""  # who the agent runs as (the become user under sudo)

    def to_dict(self) -> dict[str, object]:
        return self.__dict__.copy()


def _ping_one(ctx: HostContext) -> PingInfo:
    start = time.perf_counter()
    ctx.ping()
    connected = time.perf_counter()
    info = ctx.ping()
    done = time.perf_counter()
    return PingInfo(info.hostname, info.python, info.version,
                    round((connected - start) * 1000, 1), round((done - connected) * 1000, 2), info.user)


def ping(fleet: Fleet) -> dict[str, HostResult[PingInfo]]:
    if fleet.settings.persist > 0:  # kept connections: the whole fleet in one request to their server
        from fleetctl.transport.mux_batch import ping_kept

        return ping_kept(fleet, _ping_one, lambda info, connect_ms, rtt_ms: PingInfo(
            info.hostname, info.python, info.version, connect_ms, rtt_ms, info.user))
    return fleet.map(_ping_one)


def shell(fleet: Fleet, command: str, timeout: float | None = None) -> dict[str, HostResult[CommandResult]]:
    """Run ``command`` everywhere; a non-zero exit marks that host failed (its output is kept)."""
    results = fleet.map(lambda ctx: ctx.run(command, timeout=timeout))
    for res in results.values():
        if res.ok and res.value is not None and res.value.rc != 0:
            res.status = Status.FAILED
            detail = tail_text(res.value.stderr, 1)
            res.reason = f"exited {res.value.rc}" + (f": {detail}" if detail else "")
    return results


@dataclass(frozen=True)
class OutputBlock:
    """Hosts whose command output was identical, gathered as ``clush -b`` does."""

    hosts: tuple[str, ...]
    rc: int | None
    stdout: str
    stderr: str
    status: str = "ok"


def gather(results: dict[str, HostResult[CommandResult]]) -> list[OutputBlock]:
    """Group hosts by (status, rc, stdout, stderr); failures keep their reason as stderr."""
    groups: dict[tuple[str, int | None, str, str], list[str]] = {}
    key: tuple[str, int | None, str, str]
    for name, res in sorted(results.items()):
        if res.value is not None:
            key = (res.status.value, res.value.rc, res.value.stdout, res.value.stderr)
        else:
            key = (res.status.value, None, "", res.reason)
        groups.setdefault(key, []).append(name)
    blocks = [OutputBlock(tuple(hosts), rc, out, err, status) for (status, rc, out, err), hosts in groups.items()]
    return sorted(blocks, key=lambda b: (b.status != "ok", -len(b.hosts), b.hosts))
