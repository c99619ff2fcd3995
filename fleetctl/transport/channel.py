"""An SSH channel as fleetctl reads it: the stream a long command or the agent talks over (stdout bounded,
stderr drained beside it, a lost connection told apart from an exit), the remote pid read from its first
line, and closing that survives a connection already gone."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from fleetctl.transport import fdwait
from fleetctl.transport.output import tail_text

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

    def stdout_ready(self) -> bool:
        return bool(self.channel.recv_ready())

    def read_stderr(self, timeout: float) -> bytes:
        """What stderr holds now, waiting up to ``timeout`` for anything (stdout too) to arrive."""
        if not (self.channel.recv_stderr_ready() or self.channel.recv_ready()):
            fdwait.readable([self.channel], timeout)
        data = b""
        while self.channel.recv_stderr_ready():
            data += self.channel.recv_stderr(65536)
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

    def answers(self, timeout: float) -> bool:
        """Whether the SSH connection under this channel still answers: the server opens another
        channel on it within ``timeout`` (a silent host or network: it does not)."""
        transport = self.channel.get_transport()
        if transport is None or not transport.is_active():
            return False
        from paramiko import ChannelException

        try:
            transport.open_session(timeout=timeout).close()
        except ChannelException:
            return True  # refused (MaxSessions, say): the server answered
        except Exception:  # paramiko says "Timeout opening channel." as a bare SSHException
            return False
        return True

    def stderr_tail(self) -> str:
        self._drain_stderr()
        return tail_text(b"".join(self._err))

    def close(self) -> None:
        self.channel.close()


def close_quietly(chan: Any) -> None:
    """Close a channel whose connection may already be gone (sshd closes it after a sudo refusal):
    closing must not replace the error being reported with an EOFError."""
    try:
        chan.close()
    except (EOFError, OSError, paramiko_errors()):
        pass


def paramiko_errors() -> type[Exception]:
    from paramiko.ssh_exception import SSHException

    return SSHException
