"""Persistent connections: a background process keeps SSH connections and agents between commands.

What OpenSSH's ControlPersist (and Ansible, which turns it on) does for ``ssh``, for fleetctl's
agents: with ``--persist SECONDS`` (or ``FLEETCTL_PERSIST``), the read-only commands (ping, facts,
probe, drift, status, releases) send their agent requests over a Unix socket to one server
process per user, which holds one SSH connection per host and one agent per interpreter on it.
The next command skips the key exchange, the login and the interpreter start. The server exits
after SECONDS without a command (and closes every connection); ``fleetctl connections stop``
ends it at once.

Safety decisions:
- only read-only commands use it; deploy, rollback, venv and playbook runs always open their own
  connections, so a host lock or a half-finished change never outlives its command;
- host keys are checked when the server connects, exactly as a direct connection does; the
  connection is keyed by everything that decides it (address, user, key file, known_hosts, and
  the known_hosts and key files' size and mtime), so a re-pinned or revoked key is used at once;
- the socket lives in a folder only this user can enter, and the server answers only peers with
  this user's uid (SO_PEERCRED): holding the socket is holding root on every connected host;
- each command runs every remote module's top level afresh (no module state outlives a command),
  and import probes always run in a child interpreter;
- a kept connection is checked with one agent round trip when a command attaches; a dead one is
  replaced by a fresh connection before the command's first request, never retried after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fleetctl.errors import (
    AgentError,
    ConnectError,
    FleetError,
    HostError,
    HostKeyError,
    InputError,
    RemoteOperationError,
)
from fleetctl.transport.agent import AgentInfo, module_source, step_outcome
from fleetctl.transport.base import Step
from fleetctl.transport.mux_gone import server_failed

if TYPE_CHECKING:
    from fleetctl.transport.ssh import SSHTarget

PROTOCOL = 1
MAX_FRAME = 256 * 1024 * 1024
SPAWN_WAIT_S = 15.0
_HERE = Path(__file__).resolve().parent
# The server runs this code: a changed checkout (an upgrade) gets a new server, never an old one.
# The whole transport package (a listed subset missed what the listed modules import: fdwait,
# agent_boot, target...) and the agent it starts on hosts.
_SERVER_CODE = (*sorted(_HERE.glob("*.py")), _HERE.parent / "remote" / "agent.py")


# -- where ---------------------------------------------------------------------------------------
def mux_dir() -> Path:
    configured = os.environ.get("FLEETCTL_MUX_DIR")
    return Path(configured) if configured else Path("~/.cache/fleetctl/mux").expanduser()


def socket_path(directory: Path | None = None) -> Path:
    return (directory or mux_dir()) / f"fleetctl-{_server_code_digest()}.sock"


@cache
def _server_code_digest() -> str:
    digest = hashlib.sha256(str(PROTOCOL).encode())
    for path in _SERVER_CODE:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def private_dir(path: Path) -> Path:
    """``path`` created 0700, and refused unless it is a real folder of ours that no one else can enter."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise InputError(f"{path}: the persistent-connection folder must be a folder owned by this user "
                         f"with mode 0700 (it is {stat.filemode(st.st_mode)}, uid {st.st_uid}); fix or remove it")
    return path


# -- framing -------------------------------------------------------------------------------------
def send_frame(sock: socket.socket, obj: Any) -> None:
    send_bytes(sock, json.dumps(obj, default=str).encode())


def send_bytes(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv_frame(sock: socket.socket) -> Any:
    """The next message, or ``None`` at a clean end of stream."""
    body = recv_bytes(sock)
    return None if body is None else json.loads(body)


def recv_bytes(sock: socket.socket) -> bytes | None:
    """The next message's bytes, undecoded, or ``None`` at a clean end of stream."""
    header = _recv_exact(sock, 4)
    if header is None:
        return None
    size = struct.unpack(">I", header)[0]
    if size > MAX_FRAME:
        raise OSError(f"{size}-byte message (limit {MAX_FRAME})")
    body = _recv_exact(sock, size)
    if body is None:
        raise EOFError("stream ended inside a message")
    return body


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if buf:
                raise EOFError("stream ended inside a message")
            return None
        buf += chunk
    return bytes(buf)


# -- errors across the socket --------------------------------------------------------------------
def error_payload(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {"class": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, HostError):
        out.update(host=exc.host, reason=exc.reason)
    if isinstance(exc, RemoteOperationError):
        out.update(op=exc.op, etype=exc.etype, remote_message=exc.remote_message,
                   remote_traceback=exc.remote_traceback)
    return out


def raise_payload(host: str, err: dict[str, Any]) -> None:
    """Raise the error the server met, as the same class a direct connection raises."""
    cls, reason = err.get("class"), err.get("reason") or err.get("message", "")
    if cls == "RemoteOperationError":
        raise RemoteOperationError(host, err.get("op", "?"), err.get("etype", "Error"),
                                   err.get("remote_message", ""), err.get("remote_traceback", ""))
    if cls == "HostKeyError":
        raise HostKeyError(host, reason)
    if cls == "ConnectError":
        raise ConnectError(host, reason)
    if cls == "AgentError":
        raise AgentError(host, reason)
    raise AgentError(host, f"persistent-connection server: {cls}: {err.get('message', '')}")


# -- client --------------------------------------------------------------------------------------
_spawn_lock = threading.Lock()


def connect(path: Path, persist: float) -> socket.socket:
    """A socket to the server at ``path``, starting the server first when none answers."""
    with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
        return _dial(path)
    private_dir(path.parent)
    lock_fd = os.open(path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    with _spawn_lock, os.fdopen(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one spawner among this command's threads and other commands
        with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
            return _dial(path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a server that died without cleaning up
        log_path = path.with_suffix(".log")
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleetctl.transport.mux_main", str(path), str(persist)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fd, close_fds=True,
                start_new_session=True, cwd="/",
            )
        finally:
            os.close(fd)
        deadline = time.monotonic() + SPAWN_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
                return _dial(path)
            if proc.poll() is not None:
                break
            time.sleep(0.01)
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:] if log_path.exists() else []
        raise FleetError(f"the persistent-connection server did not start (log: {log_path}): {' | '.join(tail)}; "
                         "run without --persist / FLEETCTL_PERSIST meanwhile")


SUN_PATH_MAX = 107  # bytes of a unix socket's path on Linux (sun_path is 108, NUL included)


def _dial(path: Path) -> socket.socket:
    if len(os.fsencode(path)) > SUN_PATH_MAX:  # else connect() says only "AF_UNIX path too long"
        raise InputError(f"{path}: too long for the persistent-connection socket ({len(os.fsencode(path))} bytes, "
                         f"at most {SUN_PATH_MAX}); set FLEETCTL_MUX_DIR to a shorter folder")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def request(sock: socket.socket, msg: dict[str, Any]) -> dict[str, Any]:
    send_frame(sock, msg)
    answer = recv_frame(sock)
    if answer is None:
        raise EOFError("the persistent-connection server closed the connection")
    return dict(answer)


class RequestBatch(Protocol):
    """A fleet pass that sends its hosts' requests together (``mux_calls.KeptRounds``)."""

    def ask(self, agent: MuxAgentClient, msg: dict[str, Any]) -> dict[str, Any]: ...


class MuxAgentClient:
    """The ``AgentClient`` interface, served by the persistent-connection server."""

    def __init__(self, host: str, target: SSHTarget, interpreters: list[str], persist: float,
                 path: Path | None = None) -> None:
        self.host = host
        self.target = target
        self.interpreters = interpreters
        self.persist = persist
        self._path = path  # found when first needed: a fleet's ping asks the server once for all hosts
        self.info: AgentInfo | None = None
        self.batch: RequestBatch | None = None  # set while a fleet pass batches its hosts' requests (mux_calls)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = socket_path()
        return self._path

    def _session(self) -> socket.socket:
        if self._sock is None:
            sock = connect(self.path, self.persist)
            try:
                answer = request(sock, {"op": "attach", "host": self.host, "target": target_doc(self.target),
                                        "interpreters": self.interpreters, "persist": self.persist})
            except (OSError, EOFError, ValueError) as exc:
                sock.close()
                raise AgentError(self.host, server_failed(self.path, exc)) from None
            if not answer.get("ok"):
                sock.close()
                raise_payload(self.host, answer.get("error") or {})
            self.info = AgentInfo(**answer["result"])
            self._sock = sock
        return self._sock

    def _ask(self, msg: dict[str, Any]) -> Any:
        if self.batch is not None:
            with self._lock:
                answer = self.batch.ask(self, msg)
            if answer.get("info"):  # the server attached this host for the request: its agent's info
                self.info = AgentInfo(**answer["info"])
            if not answer.get("ok"):
                raise_payload(self.host, answer.get("error") or {})
            return answer.get("result")
        with self._lock:
            sock = self._session()
            try:
                answer = request(sock, msg)
            except (OSError, EOFError, ValueError) as exc:
                self._drop()
                raise AgentError(self.host, server_failed(self.path, exc)) from None
            if not answer.get("ok"):
                raise_payload(self.host, answer.get("error") or {})
            return answer.get("result")

    def ping(self, timeout: float = 30.0) -> AgentInfo:
        with self._lock:
            # attaching pings the host's agent (or starts it): that is this ping
            if self._sock is None and self.batch is None:
                self._session()
                assert self.info is not None
                return self.info
        self.info = AgentInfo(**self._ask({"op": "ping", "timeout": timeout}))
        return self.info

    def call(self, module: str, params: dict[str, Any] | None = None, *, python: str | None = None,
             timeout: float | None = None) -> Any:
        text, digest = module_source(module)
        return self._ask({"op": "call", "module": module, "source": text, "hash": digest,
                          "params": params or {}, "python": python, "timeout": timeout})

    def sequence(self, steps: list[Step], *, timeout: float | None = None) -> list[Any]:
        """As ``AgentClient.sequence``: the server runs the steps as one request to the host's agent."""
        sent = [{"module": s.module, "params": s.params, "source": module_source(s.module)} for s in steps]
        answers = self._ask({"op": "sequence", "steps": sent, "timeout": timeout})
        return [step_outcome(self.host, s.module, a) for s, a in zip(steps, answers, strict=False)]

    @property
    def is_open(self) -> bool:
        """Whether closing it has anything to end (its socket to the server)."""
        return self._sock is not None

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:  # answered once the server no longer counts this command as a user
                with contextlib.suppress(OSError, EOFError, ValueError):
                    request(self._sock, {"op": "detach"})
            self._drop()  # the connection and the agents stay with the server


def target_doc(target: SSHTarget) -> dict[str, Any]:
    """``target`` as the server rebuilds it; paths absolute (the server runs in /). Field by field,
    not ``asdict``: its deep copies were most of a kept-connection command's CPU per host."""
    doc: dict[str, Any] = {name: getattr(target, name) for name in _target_fields()}
    doc["known_hosts"] = os.path.abspath(target.known_hosts)
    doc["key_files"] = [os.path.abspath(k) for k in target.key_files]
    doc["jump"] = target_doc(target.jump) if target.jump is not None else None
    doc["become"] = asdict(target.become) if target.become is not None else None
    return doc


@cache
def _target_fields() -> tuple[str, ...]:
    from fleetctl.transport.target import SSHTarget

    return tuple(f.name for f in fields(SSHTarget))


def target_from_doc(doc: dict[str, Any]) -> SSHTarget:
    from fleetctl import redact
    from fleetctl.transport.target import Become, SSHTarget

    # the server's log masks the secrets its targets carry (redact.py)
    redact.register([doc.get("password"), doc.get("passphrase"), (doc.get("become") or {}).get("password")])
    return SSHTarget(**{
        **doc, "known_hosts": Path(doc["known_hosts"]), "key_files": tuple(doc["key_files"]),
        "jump": target_from_doc(doc["jump"]) if doc.get("jump") else None,
        "become": Become(**doc["become"]) if doc.get("become") else None,
    })


def server_status(path: Path | None = None) -> list[dict[str, Any]] | None:
    """The server's kept connections, or ``None`` when no server runs."""
    try:
        sock = _dial(path or socket_path())
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    with sock:
        try:
            return list(request(sock, {"op": "list"}).get("result") or [])
        except (ConnectionResetError, BrokenPipeError, EOFError):  # it was dying: accepted, then gone
            return None


def stop_server(path: Path | None = None, wait_s: float = 10.0) -> int | None:
    """Stop the server (closing every kept connection); how many it held, or ``None`` if none ran."""
    path = path or socket_path()
    try:
        sock = _dial(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    with sock:
        try:
            held = int(request(sock, {"op": "stop"}).get("result") or 0)
        except (ConnectionResetError, BrokenPipeError, EOFError):  # it was dying (killed): nothing left to stop
            return None
    deadline = time.monotonic() + wait_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return held
