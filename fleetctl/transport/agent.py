"""Controller side of the remote agent: start it once per host, then one message per operation.

The agent (``fleetctl/remote/agent.py``) is shipped inline in the start command as
zlib+base64 source, so nothing is installed on the host (``agent_boot.py`` keeps its compiled
code there). Module sources are sent once per agent and cached there by hash.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import shlex
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fleetctl.errors import AgentError, ConnectError, RemoteOperationError
from fleetctl.transport.agent_boot import start_code
from fleetctl.transport.base import Connector, Progress, Step, Stream

REMOTE_DIR = Path(__file__).resolve().parent.parent / "remote"  # host-side code, shipped as source
MAGIC = b"\x00FLEETCTL-AGENT-1\n"
MAX_NOISE = 64 * 1024  # login-file chatter tolerated before the hello
MAX_MESSAGE = 256 * 1024 * 1024
SILENT_CHECK_S = 10.0  # after a timed-out call: how long the connection may take to open a channel
# Modules that import user code: run in a child interpreter even when the agent runs the same
# python, so nothing they import stays loaded in the agent (stale after a deploy).
OWN_PROCESS_MODULES = frozenset({"importprobe"})
def step_outcome(host: str, module: str, answer: dict[str, Any]) -> Any:
    """One answer of a sequence: the step's result, or its failure as the RemoteOperationError
    a plain call raises (returned, not raised: the caller knows which steps ran)."""
    if answer.get("ok"):
        return answer.get("result")
    err = answer.get("error") or {}
    return RemoteOperationError(host, module, err.get("type", "Error"), err.get("message", ""),
                                err.get("traceback", ""))
_MODULE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


_INCLUDE = re.compile(r"^# fleetctl-include: ([a-z_][a-z0-9_]*)\s*$", re.M)


@cache
def module_source(module: str) -> tuple[str, str]:
    """Source and short hash of ``fleetctl/remote/<module>.py``.

    Host-side modules are shipped as one text each; a line ``# fleetctl-include: other`` puts
    ``other.py``'s source (and its own includes) before the module's, so helpers are shared
    between remote modules without an import system on the host.
    """
    text = _with_includes(module, ())
    return text, hashlib.sha256(text.encode()).hexdigest()[:16]


def _with_includes(module: str, seen: tuple[str, ...]) -> str:
    if not _MODULE_NAME.match(module):
        raise ValueError(f"bad remote module name {module!r}")
    if module in seen:
        raise ValueError(f"remote module include loop: {' -> '.join((*seen, module))}")
    text = (REMOTE_DIR / f"{module}.py").read_text(encoding="utf-8")
    parts = [_with_includes(name, (*seen, module)) for name in _INCLUDE.findall(text)]
    return "\n\n".join([*parts, text]) if parts else text


def bootstrap_command(interpreters: list[str]) -> str:
    """A POSIX shell line that runs the agent under the first interpreter that exists."""
    return _bootstrap_command(tuple(interpreters))


@cache
def _bootstrap_command(interpreters: tuple[str, ...]) -> str:  # built once per run, not per host
    return _under_first_python(start_code(*module_source("agent"), "fleetctl_agent"), interpreters)


def stream_command(module: str, interpreters: list[str], params: Any) -> str:
    """A shell line that runs ``stream_main(params)`` of remote ``module`` (inline, as the agent is)
    under the first of ``interpreters`` that exists: a process of its own on its own channel, for
    what streams for as long as it runs (``logs --follow``). ``__name__`` is ``fleetctl_<module>``,
    so the process is recognisable on the host."""
    call = f"stream_main(json.loads({json.dumps(params)!r}))"
    return _under_first_python(f"import json;{_inline_code(module, 'fleetctl_' + module)};{call}",
                               tuple(interpreters))


def _inline_code(module: str, name: str) -> str:
    source, _ = module_source(module)
    blob = base64.b64encode(zlib.compress(source.encode(), 9)).decode()
    return f"import zlib,binascii;__name__='{name}';exec(zlib.decompress(binascii.a2b_base64('{blob}')))"


def _under_first_python(code: str, interpreters: tuple[str, ...]) -> str:
    tries = " ".join(shlex.quote(p) for p in interpreters)
    return (
        f"for p in {tries}; do if command -v \"$p\" >/dev/null 2>&1; then "
        f"exec \"$p\" -c {shlex.quote(code)}; fi; done; "
        "echo 'fleetctl: no python interpreter found (tried: '" + shlex.quote(tries) + "')' >&2; exit 127"
    )


@dataclass(frozen=True)
class AgentInfo:
    python: str
    version: str
    pid: int
    hostname: str
    user: str = ""  # who the agent runs as: the become user under sudo


@dataclass(frozen=True)
class PingInFlight:
    """A ping sent by ``AgentClient.send_ping``, its answer not yet read."""

    msg: dict[str, Any]
    deadline: float | None
    timeout: float


class AgentClient:
    """One agent on one host. Thread-safe: requests on one host are serialized."""

    def __init__(self, host: str, connector: Connector, interpreters: list[str], start_timeout: float = 30.0):
        self.host = host
        self.connector = connector
        self.interpreters = interpreters
        self.start_timeout = start_timeout
        self.info: AgentInfo | None = None
        self._stream: Stream | None = None
        self._sent: set[str] = set()
        self._lock = threading.Lock()
        self._next_id = 0
        self._restarts = 0
        self._died = False
        self._just_started = False  # info came with the hello and no request went since
        self._pending = b""  # bytes read past the hello, not yet consumed

    # -- lifecycle -------------------------------------------------------------------------
    def _start(self) -> None:
        self._stream = self.connector.open_stream(bootstrap_command(self.interpreters))
        self._sent = set()
        self._pending = b""
        deadline = time.monotonic() + self.start_timeout
        self._read_hello(deadline)
        # The agent says what a ping would right after its hello: no round trip to ask it.
        self.info = AgentInfo(**self._answer(0, {"op": "ping"}, deadline, self.start_timeout))
        self._just_started = True

    def _ensure_started(self) -> None:
        if self._stream is not None:
            return
        if self._died:
            # An agent that died is restarted once per run; a second death is final.
            if self._restarts >= 1:
                raise AgentError(self.host, "agent died again after a restart; not restarting")
            self._restarts += 1
        self._start()

    def close(self) -> None:
        with self._lock:
            if self._stream is None:
                return
            try:
                self._request({"op": "exit"}, 5.0)
            except AgentError:
                pass
            finally:
                self._drop()

    @property
    def is_open(self) -> bool:
        """Whether closing it has anything to end (its agent's channel)."""
        return self._stream is not None

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = None

    def _fail(self, why: str) -> AgentError:
        tail = self._stream.stderr_tail().strip() if self._stream else ""
        self._drop()
        self._died = True
        return AgentError(self.host, f"agent {why}" + (f": {tail}" if tail else ""))

    def _timed_out(self, timeout: float | None) -> Exception:
        """No answer in time: the host stopped answering (its connection opens no channel either: a
        partition, a frozen host), or the agent's operation hung on a host that still answers."""
        answers = getattr(self._stream, "answers", None)
        if answers is not None and not answers(SILENT_CHECK_S):
            self._drop()
            self._died = True
            return ConnectError(self.host, f"the host stopped answering: no answer within {timeout:g}s, and "
                                            f"none on its SSH connection within {SILENT_CHECK_S:g}s more")
        return self._fail(f"gave no answer within {timeout:g}s (stopped)")

    # -- framing ---------------------------------------------------------------------------
    def _recv_exact(self, n: int, deadline: float | None) -> bytes:
        assert self._stream is not None
        buf = bytearray(self._pending[:n])
        self._pending = self._pending[n:]
        while len(buf) < n:
            # Past the deadline what has already arrived is still taken (a fleet's pings are read
            # in turn, some after their deadline): only waiting for more is a timeout.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            chunk = self._stream.recv(n - len(buf), left)
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def _read_hello(self, deadline: float) -> None:
        seen = b""
        try:
            while MAGIC not in seen:
                # Whatever came after the hello (the first frames) is kept for the reads that follow.
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                assert self._stream is not None
                chunk = self._stream.recv(4096, left)
                if not chunk:
                    raise EOFError
                seen += chunk
                if len(seen) > MAX_NOISE + len(MAGIC) and MAGIC not in seen:
                    raise self._fail("sent no hello (login files print too much?)")
            self._pending = seen[seen.index(MAGIC) + len(MAGIC):]
        except TimeoutError:
            raise self._fail("did not start in time") from None
        except EOFError:
            raise self._fail("exited before saying hello") from None

    def _request(self, msg: dict[str, Any], timeout: float | None, progress: Progress | None = None) -> Any:
        msg, deadline = self._send(msg, timeout)
        return self._answer(msg["id"], msg, deadline, timeout, progress)

    def _send(self, msg: dict[str, Any], timeout: float | None) -> tuple[dict[str, Any], float | None]:
        """``msg`` sent with its id; the deadline of its answer."""
        assert self._stream is not None
        self._next_id += 1
        self._just_started = False
        msg = {**msg, "id": self._next_id}
        data = json.dumps(msg).encode()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._stream.send(struct.pack(">I", len(data)) + data)
        except (EOFError, OSError) as exc:
            raise self._lost(exc) from None
        return msg, deadline

    def _lost(self, exc: BaseException) -> Exception:
        lost = getattr(self._stream, "connection_lost", None)
        if lost is not None and lost():
            self._drop()
            self._died = True
            bastion = getattr(self.connector, "lost_bastion", lambda: "")()
            return ConnectError(self.host, f"connection lost during the run ({type(exc).__name__}): " + (
                f"its bastion {bastion} went away" if bastion else "the host's SSH server or network went away"))
        return self._fail(f"died ({type(exc).__name__})")

    def _answer(self, want_id: int, msg: dict[str, Any], deadline: float | None, timeout: float | None,
                progress: Progress | None = None) -> Any:
        """The answer to ``want_id`` (its progress frames, if asked, handed to ``progress`` on the way);
        its result, or the remote error raised."""
        answer = self._message(deadline, timeout)
        while progress is not None and "progress" in answer and "ok" not in answer and answer.get("id") == want_id:
            with contextlib.suppress(Exception):  # a display's fault must not cost the answer (nor the framing)
                progress(answer["progress"])
            answer = self._message(deadline, timeout)
        if answer.get("id") != want_id:
            raise self._fail("answered out of order")
        if not answer.get("ok"):
            err = answer.get("error") or {}
            raise RemoteOperationError(
                self.host, str(msg.get("module", msg["op"])), err.get("type", "Error"),
                err.get("message", ""), err.get("traceback", ""),
            )
        return answer.get("result")

    def _message(self, deadline: float | None, timeout: float | None) -> Any:
        try:
            size = struct.unpack(">I", self._recv_exact(4, deadline))[0]
            if size > MAX_MESSAGE:
                raise self._fail(f"sent a {size}-byte message (limit {MAX_MESSAGE})")
            return json.loads(self._recv_exact(size, deadline))
        except TimeoutError:
            raise self._timed_out(timeout) from None
        except (EOFError, OSError) as exc:
            raise self._lost(exc) from None

    # -- operations ------------------------------------------------------------------------
    def ping(self, timeout: float = 30.0) -> AgentInfo:
        with self._lock:
            self._ensure_started()
            if self._just_started and self.info is not None:  # its hello answered this very ping
                self._just_started = False
                return self.info
            self.info = AgentInfo(**self._request({"op": "ping"}, timeout))
            return self.info

    def send_ping(self, timeout: float) -> PingInFlight | None:
        """A ping sent on a running agent without waiting for its answer: the kept-connection server
        has a whole fleet's pings in flight from one thread, then reads each with ``ping_answer``.
        The agent stays locked until then. None (nothing sent): not running, or busy with another
        command's request (``ping`` waits for it instead)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._stream is None:
                self._lock.release()
                return None
            msg, deadline = self._send({"op": "ping"}, timeout)
        except BaseException:
            self._lock.release()
            raise
        return PingInFlight(msg, deadline, timeout)

    def ping_arrived(self, sent: PingInFlight, within: float) -> bool:
        """Whether the answer to ``sent`` has begun to arrive, waiting up to ``within`` seconds (never
        past its deadline); what arrived is kept for ``ping_answer``, which reports any failure."""
        if self._pending or self._stream is None:
            return True
        left = within if sent.deadline is None else min(within, sent.deadline - time.monotonic())
        if left <= 0:
            return True
        try:
            self._pending = self._stream.recv(65536, left)
        except TimeoutError:
            return False
        except (EOFError, OSError):
            return True
        return True

    def ping_answer(self, sent: PingInFlight) -> AgentInfo:
        """The answer to ``send_ping``'s ping (the agent's errors raised as ``ping`` raises them)."""
        try:
            self.info = AgentInfo(**self._answer(sent.msg["id"], sent.msg, sent.deadline, sent.timeout))
            return self.info
        finally:
            self._lock.release()

    def call(
        self, module: str, params: dict[str, Any] | None = None, *, python: str | None = None,
        timeout: float | None = None, source: tuple[str, str] | None = None, fresh: bool = False,
        progress: Progress | None = None,
    ) -> Any:
        """``main(params)`` of remote ``module``: in the agent, or in a child under ``python``.

        ``source`` (text, hash) overrides this checkout's module source (the persistent-connection
        server runs what its client sent); ``fresh`` re-runs the module's top level first; ``progress``
        gets each progress document the module sends before its answer (none from a child)."""
        text, digest = source or module_source(module)
        with self._lock:
            self._ensure_started()
            if module in OWN_PROCESS_MODULES:
                # Imports must not stay in a long-lived agent: always a child, fresh each call.
                python = python or (self.info.python if self.info else None)
            elif python is not None and self.info is not None and python == self.info.python:
                python = None  # the agent already runs that interpreter: no child needed
            msg: dict[str, Any] = {
                "op": "call", "module": module, "hash": digest, "params": params or {},
                "python": python, "timeout": timeout,
            }
            if fresh:
                msg["fresh"] = True
            if progress is not None:
                msg["progress"] = True
            if digest not in self._sent:
                msg["source"] = text
            self._sent.add(digest)  # a fresh agent (after a restart) resets this set
            # The agent enforces a child interpreter's timeout itself: allow it slack to report.
            slack = 5.0 if python else 0.0
            return self._request(msg, None if timeout is None else timeout + slack, progress)

    def sequence(self, steps: list[Step], *, timeout: float | None = None) -> list[Any]:
        """``steps`` run in the agent one after another, to the end or the
        first that fails, and the host finishes them even if this controller dies meanwhile. One
        entry per step that ran: its result, or (the last) the RemoteOperationError it met, unraised."""
        with self._lock:
            self._ensure_started()
            msgs = []
            for step in steps:
                text, digest = step.source or module_source(step.module)
                if step.module in OWN_PROCESS_MODULES:
                    raise ValueError(f"{step.module} runs in its own process: not in a sequence")
                msg: dict[str, Any] = {"module": step.module, "hash": digest, "params": step.params}
                if step.fresh:
                    msg["fresh"] = True
                if digest not in self._sent:
                    msg["source"] = text
                self._sent.add(digest)
                msgs.append(msg)
            answers = self._request({"op": "sequence", "steps": msgs}, timeout)
        return [step_outcome(self.host, msg["module"], answer) for msg, answer in zip(msgs, answers, strict=False)]
