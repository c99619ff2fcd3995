"""The tiny transport interface every connector implements, and per-host results.

A connector moves bytes and runs commands on one host: ``run``, ``put``, ``get``,
``open_stream`` (a long-lived process whose stdin/stdout carry the agent protocol)
and ``close``. Everything above it (agent, fan-out, core modules) is connector-agnostic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
# What a call's progress frames are handed to, each as it arrives: the module's progress document
# (``AGENT_PROGRESS(doc)`` on the host; see ``fleetctl/remote/agent.py``).
Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did."""

    command: str
    rc: int
    stdout: str
    stderr: str
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0


class Stream(Protocol):
    """A running remote process whose stdin/stdout carry a byte protocol (the agent's)."""

    def send(self, data: bytes) -> None: ...

    def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        """Up to ``max_bytes``; ``b""`` at end of stream; raises ``TimeoutError`` past ``timeout``."""
        ...

    def alive(self) -> bool: ...

    def stderr_tail(self) -> str: ...

    def close(self) -> None: ...


class Connector(Protocol):
    """One host's connection. Implementations connect lazily and are reused for a whole run."""

    host: str

    def run(self, command: str, timeout: float | None = None) -> CommandResult: ...

    def put(self, local_path: str, remote_path: str) -> None: ...

    def get(self, remote_path: str, local_path: str) -> None: ...

    def open_stream(self, command: str) -> Stream: ...

    def close(self) -> None: ...


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    UNREACHABLE = "unreachable"


@dataclass
class HostResult(Generic[T]):
    """The outcome of one operation on one host: ok (with a value), failed, or unreachable (with why)."""

    host: str
    status: Status
    value: T | None = None
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


@dataclass(frozen=True)
class Step:
    """One call of ``HostSession.sequence``; ``source`` and ``fresh`` as for ``AgentClient.call``."""

    module: str
    params: dict[str, Any]
    source: tuple[str, str] | None = None
    fresh: bool = False


class HostSession(Protocol):
    """What core modules (facts, probes, drift, ...) get for one host during a fan-out.

    ``call(op, params)`` runs ``main(params)`` of ``fleetctl/remote/<op>.py`` on the host inside
    the host's long-lived agent and returns its JSON-able answer; with ``python=`` it runs in a
    child process of that interpreter (a venv's python, to see the venv's packages). A remote
    exception raises ``RemoteOperationError``; a dead channel raises ``AgentError``.
    ``progress=`` is handed each progress document the module sends while it runs (the host's
    ``AGENT_PROGRESS``); a session that cannot carry them sends none.
    ``sequence(steps)`` runs several calls in the agent as one request that the host finishes even
    if the controller dies meanwhile (``AgentClient.sequence``).
    """

    name: str
    vars: dict[str, Any]

    def call(
        self, op: str, params: dict[str, Any] | None = None, *, python: str | None = None,
        timeout: float | None = None, progress: Progress | None = None,
    ) -> Any: ...

    def sequence(self, steps: list[Step], *, timeout: float | None = None) -> list[Any]: ...

    def run(self, command: str, timeout: float | None = None) -> CommandResult: ...
