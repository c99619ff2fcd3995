"""Bulk streams through the OpenSSH client (an ``ssh`` child process): an overlay's gigabytes.

paramiko frames, encrypts and windows every packet in Python; relaying a 10 GB venv through it
costs the controller more CPU than the copy itself (bench/full_env.md). The same bytes through
``ssh`` processes cost C-speed crypto, and the controller only moves them between pipes.

The connection is the one fleetctl makes with paramiko, spelled for OpenSSH: the resolved
hostname, port, user, key files, ssh-agent choice, ProxyCommand, and each jump host as a
``ProxyCommand`` of its own ``ssh -W`` (every hop's key checked against fleetctl's known_hosts,
``StrictHostKeyChecking=yes``, never the user's files or ~/.ssh/config: ``-F /dev/null``), the
target's keepalives (ServerAliveInterval, ServerAliveCountMax);
``BatchMode`` (no prompt, ever); become through the same sudo wrapper and handshake. Where OpenSSH
cannot make that connection unattended (a login password, a key passphrase held by fleetctl)
``bulk_stream`` uses the connector's own paramiko stream. ``FLEETCTL_BULK_SSH=paramiko`` forces that.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import shlex
import shutil
import subprocess
import time
from typing import Any

from fleetctl.errors import BecomeError, ConnectError
from fleetctl.transport import become, fdwait
from fleetctl.transport.base import Stream
from fleetctl.transport.local import PipeStream
from fleetctl.transport.target import SSHTarget

# OpenSSH's own default ciphers, AES-GCM first (AES-NI makes it the cheapest per byte): the same
# set every OpenSSH server since 6.5 offers, so nothing a host accepts today is refused.
CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
           "aes128-ctr,aes192-ctr,aes256-ctr")
PIPE_SIZE = 1 << 20  # F_SETPIPE_SZ: 1 MB pipes between the controller and each ssh
F_SETPIPE_SZ = 1031


def ssh_argv(target: SSHTarget, command: str | None = None, forward: str | None = None) -> list[str] | None:
    """``ssh`` arguments that make ``target``'s connection and run ``command`` (or, as a jump host,
    ``-W forward``), or None where OpenSSH could not make it unattended (a password or passphrase
    only fleetctl holds)."""
    if target.password is not None or target.passphrase is not None:
        return None
    argv = ["ssh", "-F", "/dev/null", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={target.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no", "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={max(1, math.ceil(target.connect_timeout))}",
            "-o", "ForwardAgent=no", "-o", "ClearAllForwardings=yes", "-o", f"Ciphers={CIPHERS}",
            *keepalive_options(target.alive_interval, target.alive_count_max),
            "-p", str(target.port), "-l", target.user]
    for key in target.key_files:
        argv += ["-i", key]
    if not target.allow_agent:
        argv += ["-o", "IdentityAgent=none"]
    if not target.look_for_keys and not target.allow_agent:
        argv += ["-o", "IdentitiesOnly=yes"]
    if target.jump is not None:
        hop = ssh_argv(target.jump, forward="%h:%p")
        if hop is None:
            return None
        # OpenSSH expands %-tokens of ProxyCommand once: the hop's own arguments keep theirs literal.
        argv += ["-o", "ProxyCommand=" + " ".join(a if a == "%h:%p" else shlex.quote(a.replace("%", "%%"))
                                                  for a in hop)]
    elif target.proxy_command:
        argv += ["-o", f"ProxyCommand={target.proxy_command}"]
    if forward is not None:
        argv += ["-W", forward]
    argv += ["--", target.hostname]
    if command is not None:
        argv.append(become.wrap(command, target.become) if target.become is not None else command)
    return argv


def keepalive_options(interval: float, count_max: int) -> list[str]:
    """ServerAliveInterval (whole seconds, as ssh takes it; 0: none) and ServerAliveCountMax."""
    return ["-o", f"ServerAliveInterval={math.ceil(interval)}", "-o", f"ServerAliveCountMax={count_max}"]


class OpenSSHStream(PipeStream):
    """An ``ssh`` child whose stdin/stdout carry a remote command's stream (the ``Stream`` protocol),
    with what sudo's handshake reads (``stdout_ready``, ``read_stderr``) and ssh's exit status 255
    as the lost connection."""

    close_wait = 5.0  # the remote command ends at EOF

    def __init__(self, argv: list[str], host: str) -> None:
        super().__init__(argv)
        self.host = host
        for fd in (self._in, self._out):
            with contextlib.suppress(OSError):  # a smaller pipe only costs more wake-ups
                fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
        self._err_open = True
        self._ahead = b""  # stdout read by stdout_ready() and not yet handed out

    def send(self, data: bytes) -> None:
        try:
            super().send(data)
        except BrokenPipeError:  # ssh ended: say what it said (a refused key, a host key mismatch)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1.0)
            raise ConnectError(self.host, f"ssh ended (exit {self.proc.returncode}): "
                                          f"{self.stderr_tail().strip() or 'it said nothing'}") from None

    def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        if self._ahead:
            data, self._ahead = self._ahead[:max_bytes], self._ahead[max_bytes:]
            return data
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = fdwait.readable([self._out, *([self._errfd] if self._err_open else [])], left)
            if self._errfd in ready:  # unread stderr would fill its pipe and stall ssh: keep the tail
                chunk = os.read(self._errfd, 65536)
                self._err_open = bool(chunk)
                if chunk:
                    self._err.append(chunk)
            if self._out in ready:
                return os.read(self._out, max_bytes)
            if not ready:
                raise TimeoutError

    def stdout_ready(self) -> bool:
        if not self._ahead and fdwait.readable([self._out], 0):
            self._ahead = os.read(self._out, 65536)
            if not self._ahead:  # EOF: nothing will come; recv reports it
                return False
        return bool(self._ahead)

    def read_stderr(self, timeout: float) -> bytes:
        """What stderr holds now, waiting up to ``timeout`` for anything (stdout too) to arrive."""
        fdwait.readable([self._out, self._errfd], timeout)
        data = b""
        while fdwait.readable([self._errfd], 0):
            chunk = os.read(self._errfd, 65536)
            if not chunk:
                break
            data += chunk
        return data

    def connection_lost(self, grace: float = 1.0) -> bool:
        """Whether the connection itself went away: ssh exits 255 for that (not for the command)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        return self.proc.returncode == 255


def bulk_stream(connector: Any, command: str) -> Stream:
    """A stream of ``command`` on the connector's host for bulk bytes: through ``ssh`` when it can
    make the same connection, else the connector's own."""
    target: SSHTarget | None = getattr(connector, "target", None)
    argv = ssh_argv(target, command) if target is not None and openssh_wanted() else None
    if argv is None:
        return connector.open_stream(command)
    stream = OpenSSHStream(argv, connector.host)
    if target is not None and target.become is not None:
        try:
            become.handshake(stream, target.become, connector.host, target.user, target.connect_timeout)
            expect_started(stream, connector.host, target.connect_timeout)
        except BaseException:
            stream.close()
            raise
    return stream


def openssh_wanted() -> bool:
    return os.environ.get("FLEETCTL_BULK_SSH", "openssh") != "paramiko" and shutil.which("ssh") is not None


def expect_started(stream: OpenSSHStream, host: str, timeout: float) -> None:
    """sudo's wrapper prints STARTED before the command's own output: consume it."""
    got = b""
    deadline = time.monotonic() + timeout
    while len(got) < len(become.STARTED):
        got += stream.recv(len(become.STARTED) - len(got), max(0.0, deadline - time.monotonic()))
        if not got or not become.STARTED.startswith(got):
            raise BecomeError(host, f"unexpected output from sudo before the command: {got[:80]!r}")
