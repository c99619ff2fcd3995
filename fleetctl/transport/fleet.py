"""Fan-out over hosts: a bounded pool, one connection and one agent per host for the run.

``Fleet.map(fn)`` calls ``fn(session)`` for every selected host in parallel and returns a
per-host map of ``HostResult`` (ok | failed | unreachable); it never raises because one
host went bad. A host found unreachable is skipped for the rest of the run, as Ansible does.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl.errors import ConnectError, FleetError, InputError
from fleetctl.transport import fdwait, hostkeys
from fleetctl.transport.agent import AgentClient, AgentInfo
from fleetctl.transport.base import CommandResult, Connector, HostResult, Progress, Status, Step
from fleetctl.transport.target import Become, ConnectOptions, SSHTarget, resolve_become, resolve_target

if TYPE_CHECKING:
    from fleetctl.connection import ConnectionSpec
    from fleetctl.inventory import Host, Inventory
    from fleetctl.transport.mux import MuxAgentClient

T = TypeVar("T")
log = logging.getLogger("fleetctl.transport")


@dataclass(frozen=True)
class RunSettings:
    forks: int = 32
    command_timeout: float | None = 600.0
    connect_timeout: float | None = None  # None: each host's ansible_timeout
    persist: float = 0.0  # > 0: agent requests go through the kept connections (transport/mux.py)
    connect: ConnectOptions = ConnectOptions()  # -u, --private-key, -b, --become-user, -K
    become: bool | None = None  # a play's or task's `become` keyword (beats -b, loses to the inventory)
    become_user: str | None = None
    # Worker processes for a fan-out over many hosts (transport/spread.py): 1 none, 0 one per core.
    # Only for commands whose fan-out is one pass of read-only work (their CLI says so).
    workers: int = 1
    # A read-only command that works in a venv (drift, probe grep): each host's agent starts under
    # that venv's python when the host has it, so its calls need no child interpreter.
    # ``venv``: the --venv given (None: each host's ``venv`` var). Fresh connections only: the
    # persistent-connection server already keeps an agent per interpreter.
    agent_in_venv: bool = False
    venv: str | None = None


def interpreters(spec: ConnectionSpec) -> list[str]:
    """Interpreter discovery order: ansible_python_interpreter > venv's python > python3."""
    found = [spec.python] if spec.python else []
    if spec.venv:
        found.append(f"{spec.venv.rstrip('/')}/bin/python")
    return found + ["python3", "/usr/bin/python3"]


def host_become(spec: ConnectionSpec, settings: RunSettings) -> Become | None:
    return resolve_become(spec, settings.connect, settings.become, settings.become_user)


def ssh_target(inventory: Inventory, spec: ConnectionSpec, settings: RunSettings) -> SSHTarget:
    """The host's resolved SSH target (``transport/target.py`` says how settings combine)."""
    return resolve_target(inventory, spec, settings.connect, settings.connect_timeout,
                          host_become(spec, settings))


def _never() -> bool:
    return False


class HostContext:
    """One host's session for the run: its connector and agent, both opened lazily."""

    def __init__(self, host: Host, connector: Connector, settings: RunSettings) -> None:
        self.host = host
        self.name = host.name
        self.vars: dict[str, Any] = dict(host.vars)
        self.connector = connector
        self.settings = settings
        self.agent: AgentClient | MuxAgentClient = _agent(host, connector, settings)
        self.unreachable: str | None = None
        self.aborting: Callable[[], bool] = _never  # a run's second Ctrl-C (playbook runner binds it)
        # The run's other hosts, for a live canary's baseline (release/live_canary.py; batched runs bind it).
        self.peers: Callable[[], list[HostContext]] = list
        self.node_sync: object | None = None  # a batch's multi-node groups in step (release/group_sync.py)

    def call(
        self, op: str, params: dict[str, Any] | None = None, *, python: str | None = None,
        timeout: float | None = None, progress: Progress | None = None,
    ) -> Any:
        timeout = timeout or self.settings.command_timeout
        if progress is not None and isinstance(self.agent, AgentClient):  # kept connections carry no progress
            return self.agent.call(op, params, python=python, timeout=timeout, progress=progress)
        return self.agent.call(op, params, python=python, timeout=timeout)

    def sequence(self, steps: list[Step], *, timeout: float | None = None) -> list[Any]:
        each = self.settings.command_timeout  # a plain call's budget, per step
        return self.agent.sequence(steps, timeout=timeout or (each * len(steps) if each else None))

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        return self.connector.run(command, timeout=timeout or self.settings.command_timeout)

    def ping(self) -> AgentInfo:
        return self.agent.ping()

    @property
    def is_open(self) -> bool:
        """Whether closing it has anything to end (a connector or agent that says nothing: yes)."""
        return bool(getattr(self.agent, "is_open", True) or getattr(self.connector, "is_open", True))

    def close(self) -> None:
        try:
            self.agent.close()
        finally:
            self.connector.close()


def _agent(host: Host, connector: Connector, settings: RunSettings) -> AgentClient | MuxAgentClient:
    target = getattr(connector, "target", None)
    if settings.persist > 0 and target is not None:  # an SSH host: its agent is kept between commands
        from fleetctl.transport.mux import MuxAgentClient

        return MuxAgentClient(host.name, target, interpreters(host.connection), settings.persist)
    if target is None:  # a local connection: the agent's own start timeout
        return AgentClient(host.name, connector, agent_interpreters(host, settings))
    return AgentClient(host.name, connector, agent_interpreters(host, settings), start_timeout=target.agent_start_s)


def agent_interpreters(host: Host, settings: RunSettings) -> list[str]:
    """``interpreters``, with the command's venv python first where the command works in a venv."""
    found = interpreters(host.connection)
    venv = (settings.venv or host.vars.get("venv")) if settings.agent_in_venv else None
    if not venv:
        return found
    python = f"{str(venv).rstrip('/')}/bin/python"  # as probes.probe_python names it
    return [python, *(p for p in found if p != python)]


def make_connector(inventory: Inventory, host: Host, settings: RunSettings) -> Connector:
    spec = host.connection
    if spec.kind == "local":
        from fleetctl.transport.local import LocalConnector

        if host_become(spec, settings) is not None:
            raise InputError(f"{host.name}: become on a local connection is not supported: "
                             "run fleetctl itself as the user you need (sudo fleetctl ...)")
        return LocalConnector(host.name)
    from fleetctl.transport.ssh import SSHConnector

    return SSHConnector(host.name, ssh_target(inventory, spec, settings))


class Fleet:
    """The selected hosts of one run. Use as a context manager so every agent is stopped."""

    def __init__(self, inventory: Inventory, hosts: list[Host], settings: RunSettings | None = None) -> None:
        self.inventory = inventory
        self.settings = settings or RunSettings()
        fdwait.raise_open_files_limit()
        if self.settings.persist > 0 and any(h.connection.kind != "local" for h in hosts):
            from fleetctl.transport.mux import mux_dir, private_dir

            private_dir(mux_dir())  # a folder others could enter is refused before any host is asked
        self.contexts = {
            h.name: HostContext(h, make_connector(inventory, h, self.settings), self.settings) for h in hosts
        }
        self._mapped = False  # a pass ran in this process: its connections are here
        self.kept_frames = 0  # frames sent to the kept-connection server (one per round of requests)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(self, fn: Callable[[HostContext], T], names: Iterable[str] | None = None) -> dict[str, HostResult[T]]:
        """``fn`` on every host (or on ``names``, in that order), in parallel."""
        order = sorted(self.contexts) if names is None else list(names)
        if self.settings.persist > 0:  # kept connections: each round of requests is one frame to their server
            from fleetctl.transport.mux_calls import map_kept

            self._mapped = True
            return map_kept(self, fn, order)
        processes = self._processes(len(order))
        if processes > 1:
            from fleetctl.transport.spread import spread_map

            self._prepare([self.contexts[n] for n in order])
            stream = spread_map([self.contexts[n] for n in order], fn, self.settings.forks, processes,
                                self.run_one, _close_quietly)
            spread = dict(zip(order, stream, strict=True))
            self._mapped = True  # a later pass runs here (and keeps its connections for the one after)
            return spread
        return self.map_threads(fn, order)

    def map_threads(self, fn: Callable[[HostContext], T], order: list[str]) -> dict[str, HostResult[T]]:
        """``fn`` on the hosts of ``order`` in this process's threads, each host on its own."""
        self._mapped = True
        workers = max(1, min(self.settings.forks, len(order)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetctl-host") as pool:
            results = list(pool.map(lambda n: self.run_one(self.contexts[n], fn), order))
        return dict(zip(order, results, strict=True))

    def _processes(self, hosts: int) -> int:
        """Worker processes for this pass: only the first pass of a fleet that allows them (a later
        pass must find the connections an earlier one opened in this process), and not over kept
        connections (the server holds those)."""
        if self.settings.workers == 1 or self.settings.persist > 0 or self._mapped:
            return 1
        from fleetctl.transport.spread import worker_count

        return worker_count(hosts, self.settings.workers)

    @staticmethod
    def _prepare(contexts: list[HostContext]) -> None:
        """Work every host shares, done once before the workers fork (each would repeat it):
        imports, the agent's bootstrap line, known_hosts and key files read."""
        from fleetctl.transport.agent import bootstrap_command

        for ctx in contexts:
            prepare = getattr(ctx.connector, "prepare", None)
            if prepare is not None:
                prepare()
            if isinstance(ctx.agent, AgentClient):
                bootstrap_command(ctx.agent.interpreters)

    def run_one(self, ctx: HostContext, fn: Callable[[HostContext], T]) -> HostResult[T]:
        """``fn`` on one host, its outcome as a ``HostResult`` (an unreachable host stays skipped)."""
        if ctx.unreachable:
            return HostResult(ctx.name, Status.UNREACHABLE, reason=ctx.unreachable)
        try:
            return HostResult(ctx.name, Status.OK, value=fn(ctx))
        except ConnectError as exc:
            ctx.unreachable = exc.reason
            return HostResult(ctx.name, Status.UNREACHABLE, reason=exc.reason)
        except FleetError as exc:
            reason = getattr(exc, "reason", str(exc))
            return HostResult(ctx.name, Status.FAILED, reason=reason, details=_details(exc))
        except Exception as exc:  # a bug on one host must not lose the others' results
            log.exception("unexpected error on %s", ctx.name)
            return HostResult(
                ctx.name, Status.FAILED, reason=f"internal error: {type(exc).__name__}: {exc}",
                details={"traceback": traceback.format_exc()},
            )

    def close(self) -> None:
        """Stop every agent and connection, all at once: each close waits a round trip for the
        agent's exit, and those waits need not add up host after host. A host with nothing open
        (its work went through the kept-connection server or a worker process) is skipped: a pool
        of threads for nothing was a tenth of a kept-connection ping's CPU at 200 hosts."""
        contexts = [c for c in self.contexts.values() if c.is_open]
        if len(contexts) > 1:
            with ThreadPoolExecutor(max_workers=min(self.settings.forks, len(contexts)),
                                    thread_name_prefix="fleetctl-close") as pool:
                list(pool.map(_close_quietly, contexts))
        elif contexts:
            _close_quietly(contexts[0])


def _close_quietly(ctx: HostContext) -> None:
    try:
        ctx.close()
    except Exception:  # closing is best effort: the agent exits at EOF anyway
        log.debug("closing %s failed", ctx.name, exc_info=True)


def _details(exc: FleetError) -> dict[str, Any]:
    out: dict[str, Any] = {"error": type(exc).__name__}
    for attr in ("rc", "command", "stderr_tail", "etype", "remote_traceback"):
        if getattr(exc, attr, None) not in (None, ""):
            out[attr] = getattr(exc, attr)
    return out


def known_hosts_for(inventory: Inventory, host: Host) -> Path:
    return hostkeys.known_hosts_file(inventory.folder, host.connection.known_hosts)
