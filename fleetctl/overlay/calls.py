"""``fleetctl venv overlay``: how the controller asks each host for its listings. Over fresh
connections every host's stream process (the OpenSSH process that later carries its files, or its
plan and the files) is started as the command starts, and the listings are calls on it
(``remote/overlay_calls.py``): no agent start, no child interpreter per call, and the source keeps
what it described for the file lists asked next. So a fresh target's first byte waits on one
connect and one listing per side, not an agent start, two listings and a stream start.
Over kept connections the kept agents answer (they are warm; a stream is a new connect)."""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol

from fleetctl.errors import ConnectError, RemoteOperationError
from fleetctl.overlay import stream as overlay_stream
from fleetctl.overlay.stream import Reader, frame, stream_command
from fleetctl.transport.base import HostSession, Stream
from fleetctl.transport.fleet import HostContext

CALL_MAGIC = b"\x00FLEETCTL-OVERLAY-CALL\n"
NO_PYTHON = "fleetctl: InterpreterNotFound"  # what stream_command says when the venv's python is absent


class HostCalls(Protocol):
    name: str

    @property
    def ctx(self) -> HostSession: ...

    def call(self, params: dict[str, Any]) -> Any: ...

    def take(self) -> Stream | None:
        """The stream process, for its work after the calls (None: open one)."""
        ...

    def close(self) -> None: ...


class AgentCalls:
    """The host's agent answers, in a child under the venv's python: over kept connections, and for
    a caller that holds a session (the playbook's ``venv`` module)."""

    def __init__(self, ctx: HostSession, module: str, python: str) -> None:
        self.ctx, self.module, self.python, self.name = ctx, module, python, ctx.name

    def call(self, params: dict[str, Any]) -> Any:
        return self.ctx.call(self.module, params, python=self.python)

    def take(self) -> Stream | None:
        return None

    def close(self) -> None:
        pass


class StreamCalls:
    """Calls on the host's stream process, started now (its ssh connects while others work)."""

    def __init__(self, ctx: HostContext, module: str, python: str) -> None:
        self.ctx, self.module, self.python, self.name = ctx, module, python, ctx.name
        self.stream: Stream | None = overlay_stream.bulk_stream(ctx.connector, stream_command(module, python))
        self.reader = Reader(self.stream, ctx.settings.command_timeout)

    def call(self, params: dict[str, Any]) -> Any:
        if self.stream is None:
            raise RuntimeError(f"{self.name}: the overlay's stream was taken: no more calls on it")
        try:
            self.stream.send(frame({"call": params}))
            self.reader.until(CALL_MAGIC, limit=1 << 20)
            size = struct.unpack(">I", self.reader.exact(4))[0]
            answer = json.loads(self.reader.exact(size))
        except (ConnectError, EOFError, OSError, TimeoutError, ValueError) as exc:  # ssh ended: say why
            raise self.failure(exc) from None
        if not answer.get("ok"):
            err = answer.get("error") or {}
            raise RemoteOperationError(self.name, self.module, err.get("type", "Error"), err.get("message", ""),
                                       err.get("traceback", ""))
        return answer.get("result")

    def failure(self, exc: BaseException) -> Exception:
        """Why the process answered nothing: no such python, the connection, or its own last words."""
        assert self.stream is not None
        tail = self.stream.stderr_tail().strip()
        if NO_PYTHON in tail:
            return RemoteOperationError(self.name, self.module, "InterpreterNotFound", f"no python at {self.python}")
        lost = getattr(self.stream, "connection_lost", None)
        if lost is not None and lost():
            return ConnectError(self.name, tail.splitlines()[-1] if tail else f"ssh ended: {exc}")
        why = f"{type(exc).__name__}: {exc}" + (f" ({tail.splitlines()[-1]})" if tail else "")
        return RemoteOperationError(self.name, self.module, "StreamEnded", why)

    def take(self) -> Stream | None:
        stream, self.stream = self.stream, None
        assert not self.reader.buf, "bytes past a call's answer"
        return stream

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()  # the remote side reads the end of its input: it exits, nothing written
            self.stream = None


def as_calls(host: HostCalls | HostSession, module: str, python: str) -> HostCalls:
    """``host`` as listing calls: calls already, or a session whose agent answers them."""
    return host if hasattr(host, "take") else AgentCalls(host, module, python)  # type: ignore[return-value]


def open_calls(ctx: HostContext, module: str, python: str) -> HostCalls:
    """The host's listing calls: on its stream process, or its kept agent over kept connections."""
    if ctx.settings.persist > 0:
        return AgentCalls(ctx, module, python)
    return StreamCalls(ctx, module, python)
