"""SSH connector on Fabric: one lazily opened connection per host, reused for the whole run.

Host keys are checked against the inventory's known_hosts (Fabric's default AutoAddPolicy
is replaced). A bastion (``jump_host`` or ``-o ProxyJump=``) goes through Fabric's gateway.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.errors import CommandError, ConnectError, HostKeyError
from fleetctl.transport import hostkeys
from fleetctl.transport.base import CommandResult
from fleetctl.transport.output import BoundedCapture, tail_text

PID_TAG = "@@FLEETCTL-PID "


class _PidReader:
    """Takes the shell's pid line off the front of a command's stderr."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self._pending: bytes | None = b""

    def strip(self, data: bytes) -> bytes:
        if self._pending is None:
            return data
        self._pending += data
        line, sep, rest = self._pending.partition(b"\n")
        if not sep:
            if len(self._pending) > 256:  # not our line after all
                data, self._pending = self._pending, None
                return data
            return b""
        self._pending = None
        if line.startswith(PID_TAG.encode()) and line[len(PID_TAG):].isdigit():
            self.pid = int(line[len(PID_TAG):])
            return rest
        return line + sep + rest


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to connect; ``jump`` is the bastion's own target, if any."""

    hostname: str
    port: int
    user: str
    key_file: str | None
    known_hosts: Path
    connect_timeout: float
    jump: SSHTarget | None = None


class ChannelStream:
    """One exec channel on the host's connection, carrying the agent protocol."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._err: deque[bytes] = deque(maxlen=64)

    def send(self, data: bytes) -> None:
        self.channel.sendall(data)

    def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        self._drain_stderr()
        self.channel.settimeout(timeout)
        try:
            data: bytes = self.channel.recv(max_bytes)
        except TimeoutError:
            raise TimeoutError from None
        return data

    def _drain_stderr(self) -> None:
        # Unread stderr would fill the channel window and stall stdout; keep only the tail.
        while self.channel.recv_stderr_ready():
            self._err.append(self.channel.recv_stderr(65536))

    def alive(self) -> bool:
        return not (self.channel.closed or self.channel.exit_status_ready())

    def connection_lost(self, grace: float = 1.0) -> bool:
        """Whether the SSH connection itself is gone (not just this channel): the host went away."""
        transport = self.channel.get_transport()
        deadline = time.monotonic() + grace
        while transport is not None and transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.05)  # the transport notices a dropped socket just after its channels do
        return transport is None or not transport.is_active()

    def stderr_tail(self) -> str:
        self._drain_stderr()
        return tail_text(b"".join(self._err))

    def close(self) -> None:
        self.channel.close()


def _connection(host: str, target: SSHTarget) -> Any:
    from fabric import Connection

    gateway = _connection(host, target.jump) if target.jump else None
    kwargs: dict[str, Any] = {"banner_timeout": target.connect_timeout, "auth_timeout": target.connect_timeout}
    if target.key_file:
        kwargs.update(key_filename=target.key_file, look_for_keys=False, allow_agent=False)
    conn = Connection(
        host=target.hostname, user=target.user, port=target.port, gateway=gateway,
        connect_timeout=max(1, round(target.connect_timeout)), connect_kwargs=kwargs,
    )
    if target.known_hosts.exists():
        conn.client.load_host_keys(str(target.known_hosts))
    conn.client.set_missing_host_key_policy(hostkeys.strict_policy(host, target.known_hosts))
    return conn


class SSHConnector:
    """Fabric connection to one host, opened on first use."""

    def __init__(self, host: str, target: SSHTarget) -> None:
        self.host = host
        self.target = target
        self._conn: Any = None
        self._lock = threading.Lock()

    def _open(self) -> Any:
        with self._lock:
            if self._conn is None or not self._conn.is_connected:
                conn = _connection(self.host, self.target)
                if conn.gateway is not None and self.target.jump is not None:
                    self._connect(conn.gateway, self.target.jump, "bastion ")
                self._connect(conn, self.target)
                self._conn = conn
            return self._conn

    def _connect(self, conn: Any, target: SSHTarget, role: str = "") -> None:
        import paramiko

        where = f"{role}{target.hostname}:{target.port}"
        try:
            conn.open()
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise hostkeys.changed_key_error(self.host, exc, target.known_hosts) from None
        except paramiko.AuthenticationException as exc:
            raise ConnectError(
                self.host, f"authentication failed for {target.user}@{where} "
                f"(key {target.key_file or 'default'}): {exc}",
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ConnectError(self.host, f"cannot connect to {where}: {why}") from None

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """``command`` through the login shell on its own channel. Output is kept in bounded memory
        (``BoundedCapture``); at the timeout the command's whole process group is killed on the host
        (sshd made the shell a session leader; it says its pid first, on stderr)."""
        import select

        conn = self._open()
        start = time.monotonic()
        chan = conn.client.get_transport().open_session(timeout=self.target.connect_timeout)
        chan.exec_command(f"printf '{PID_TAG}%s\\n' $$ >&2; {command}")
        chan.shutdown_write()  # stdin is empty
        out, err = BoundedCapture(), BoundedCapture()
        deadline = None if timeout is None else start + timeout
        pid = _PidReader()
        try:
            while True:
                busy = False
                while chan.recv_ready():
                    out.add(chan.recv(65536))
                    busy = True
                while chan.recv_stderr_ready():
                    err.add(pid.strip(chan.recv_stderr(65536)))
                    busy = True
                if not busy and chan.exit_status_ready():
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    self._kill_group(pid.pid)
                    raise CommandError(self.host, command, None, tail_text(err.text()))
                if not busy:
                    left = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
                    select.select([chan], [], [], left)
            rc = chan.recv_exit_status()
        finally:
            chan.close()
        return CommandResult(command, rc, out.text(), err.text(), time.monotonic() - start)

    def _kill_group(self, pid: int | None) -> None:
        """End a timed-out command and everything it started (its process group) on the host."""
        if pid is None:
            return
        try:
            chan = self._open().client.get_transport().open_session(timeout=self.target.connect_timeout)
            chan.exec_command(f"kill -TERM -- -{pid} 2>/dev/null; sleep 1; kill -KILL -- -{pid} 2>/dev/null; true")
            chan.recv_exit_status()
            chan.close()
        except Exception:  # best effort: the session's end closes the command's pipes anyway
            pass

    def put(self, local_path: str, remote_path: str) -> None:
        self._open().put(local_path, remote_path)

    def get(self, remote_path: str, local_path: str) -> None:
        self._open().get(remote_path, local_path)

    def open_stream(self, command: str) -> ChannelStream:
        conn = self._open()
        chan = conn.client.get_transport().open_session(timeout=self.target.connect_timeout)
        chan.exec_command(command)
        return ChannelStream(chan)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                gateway = self._conn.gateway
                self._conn.close()
                if gateway is not None and not isinstance(gateway, str):
                    gateway.close()  # Fabric leaves the bastion's connection open
                self._conn = None
