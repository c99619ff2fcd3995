"""SSH connector on Fabric: one lazily opened connection per host, reused for the whole run.

The target comes resolved (``transport/target.py``: inventory, CLI and ssh_config combined).
Host keys are checked against the inventory's known_hosts on every hop (Fabric's default
AutoAddPolicy is replaced). A bastion chain goes through Fabric gateways, one per hop, each
opened here so its failure names that hop; a ProxyCommand is Fabric's string gateway. With
become, commands and the agent start under sudo (``transport/become.py``).
"""

from __future__ import annotations

import functools
import os
import shlex
import threading
import time
import uuid
from typing import Any

from fleetctl.errors import BecomeError, CommandError, ConnectError, HostKeyError
from fleetctl.transport import become, client_keys, fdwait, hostkeys
from fleetctl.transport.base import CommandResult
from fleetctl.transport.channel import PID_TAG, ChannelStream, _PidReader, close_quietly
from fleetctl.transport.output import BoundedCapture, tail_text
from fleetctl.transport.target import SSHTarget

__all__ = ["SSHConnector", "SSHTarget", "ChannelStream"]

EXIT_GRACE_S = 2.0  # after a command's exit status, how long its output may still take to arrive


def _tried(target: SSHTarget) -> str:
    ways = [f"key {k}" for k in target.key_files]
    ways += ["ssh-agent"] if target.allow_agent and os.environ.get("SSH_AUTH_SOCK") else []
    ways += ["default keys"] if target.look_for_keys else []
    ways += ["password"] if target.password is not None else []
    return ", ".join(ways) or "no key"


# Bulk streams (the overlay's tar): the server may send packets up to 256 KB into a 16 MB window
# (paramiko's defaults, 32 KB and 2 MB, cost a Python round per 32 KB): 1.4 s instead of 2.0 s.
STREAM_WINDOW, STREAM_PACKET = 16 << 20, (256 << 10) - 1024


def _connection(host: str, target: SSHTarget) -> Any:
    from fabric import Config, Connection

    from fleetctl.transport.paramiko_transport import make_transport

    gateway: Any = _connection(host, target.jump) if target.jump else target.proxy_command
    kwargs: dict[str, Any] = {
        "banner_timeout": target.connect_timeout, "auth_timeout": target.connect_timeout,
        "look_for_keys": target.look_for_keys, "allow_agent": target.allow_agent,
        "transport_factory": functools.partial(make_transport, handshake_timeout=target.connect_timeout),
        **client_keys.auth_kwargs(target.key_files, target.passphrase if target.passphrase is not None
                                  else target.password),
    }
    if target.password is not None:
        kwargs["password"] = target.password
    if target.passphrase is not None:
        kwargs["passphrase"] = target.passphrase
    # The target is already resolved: Fabric must not apply ssh_config over it a second time.
    # (A Config per host: Fabric's lazily merged Config is not safe to share between threads.)
    config = Config(overrides={"load_ssh_configs": False}, lazy=True)
    conn = Connection(
        host=target.hostname, user=target.user, port=target.port, gateway=gateway, config=config,
        connect_timeout=max(1, round(target.connect_timeout)), connect_kwargs=kwargs,
    )
    # Only this host's own pins: paramiko looks the server up under this one name.
    pinned, revoked = hostkeys.pinned_for(target.known_hosts, target.key_name)
    for key_type, key in pinned.items():
        conn.client.get_host_keys().add(target.key_name, key_type, key)
    conn.fleetctl_revoked = revoked
    conn.client.set_missing_host_key_policy(hostkeys.strict_policy(host, target.known_hosts))
    return conn


def _hops(conn: Any, target: SSHTarget) -> list[tuple[Any, SSHTarget]]:
    """(connection, target) of every hop, the first bastion first and the host itself last."""
    hops = [(conn, target)]
    while hops[-1][1].jump is not None:
        hops.append((hops[-1][0].gateway, hops[-1][1].jump))
    return hops[::-1]


def _kex_unfinished(transport: Any) -> bool:
    """Whether the key exchange ran out of time: paramiko's handshake timer fired (its thread then
    says EOFError), or the connect's own deadline passed with the exchange still going on (paramiko
    then says "No existing session")."""
    timed_out = transport.packetizer.handshake_timed_out()
    return bool(timed_out or (transport.is_active() and not transport.initial_kex_done))


class SSHConnector:
    """Fabric connection to one host, opened on first use."""

    def __init__(self, host: str, target: SSHTarget) -> None:
        self.host = host
        self.target = target
        self._conn: Any = None
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Read what every connection of the run shares (paramiko, known_hosts, key files) ahead of
        time: the fan-out's worker processes then inherit it instead of each reading it again."""
        import fabric  # noqa: F401
        import paramiko  # noqa: F401

        hop: SSHTarget | None = self.target
        while hop is not None:
            hostkeys.pinned_for(hop.known_hosts, hop.key_name)
            client_keys.auth_kwargs(hop.key_files, hop.passphrase if hop.passphrase is not None else hop.password)
            hop = hop.jump

    def _open(self) -> Any:
        with self._lock:
            if self._conn is None or not self._conn.is_connected:
                conn = _connection(self.host, self.target)
                hops = _hops(conn, self.target)
                for hop_conn, hop in hops[:-1]:
                    self._connect(hop_conn, hop, "bastion ")
                self._connect(conn, self.target)
                self._conn = conn
            return self._conn

    def _connect(self, conn: Any, target: SSHTarget, role: str = "") -> None:
        import paramiko

        from fleetctl.transport.paramiko_transport import handshake_slot

        where = f"{role}{target.hostname}:{target.port}"
        try:
            with handshake_slot():
                conn.open()
            # ServerAliveInterval: a quiet channel (a build, a gate, an hour-long copy) still sends
            # every interval, so NAT and bastion idle timeouts never cut it. paramiko's keepalive asks
            # no answer: ServerAliveCountMax applies to the ssh processes only (transport/openssh.py).
            conn.client.get_transport().set_keepalive(target.alive_interval)
            key = conn.client.get_transport().get_remote_server_key()
            if key.get_base64() in conn.fleetctl_revoked:
                conn.close()
                raise HostKeyError(self.host, f"host key {hostkeys.fingerprint(key)} of {where} is marked "
                                              f"@revoked in {target.known_hosts}; refused")
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise hostkeys.changed_key_error(self.host, exc, target.known_hosts) from None
        except paramiko.PasswordRequiredException:
            raise ConnectError(
                self.host, f"key {target.key_file or 'file'} for {target.user}@{where} is encrypted: "
                "add it to ssh-agent or set ansible_ssh_private_key_passphrase (a secret)",
            ) from None
        except paramiko.AuthenticationException as exc:
            raise ConnectError(self.host, f"authentication failed for {target.user}@{where} "
                                          f"({_tried(target)}): {exc}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            transport = conn.client.get_transport()
            if isinstance(exc, paramiko.SSHException) and transport is not None and not transport.remote_version:
                # paramiko gives up the negotiation at its timeout quietly, then says "No existing
                # session": the port took the connection, but no SSH server ever spoke (a tarpit).
                why = (f"no SSH banner within {target.connect_timeout:g}s (the port accepts connections, "
                       "but nothing answers)")
            elif transport is not None and _kex_unfinished(transport):
                why = (f"the key exchange did not finish within {target.connect_timeout:g}s (the connect "
                       "timeout, ansible_timeout: the host or this controller too busy to answer in time)")
            conn.close()
            raise ConnectError(self.host, f"cannot connect to {where}: {why}") from None

    def _exec(self, chan: Any, command: str) -> bytes:
        """Start ``command`` on ``chan``; with become, through sudo, answered before returning.
        Returns the command's stderr that the sudo handshake read on the way."""
        if self.target.become is None:
            chan.exec_command(command)
            return b""
        chan.exec_command(become.wrap(command, self.target.become))
        return become.handshake(ChannelStream(chan), self.target.become, self.host, self.target.user,
                                self.target.connect_timeout)

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """``command`` through the login shell on its own channel. Output is kept in bounded memory
        (``BoundedCapture``); at the timeout the command's whole process group is killed on the host
        (sshd made the shell a session leader; it says its pid first, on stderr)."""
        conn = self._open()
        start = time.monotonic()
        chan = self._session(conn)
        # The shell says its pid first: with become it is the shell under sudo, which _kill_group
        # then signals through sudo too.
        try:
            early = self._exec(chan, f"printf '{PID_TAG}%s\\n' $$ >&2; {command}")
        except Exception:
            close_quietly(chan)
            raise
        chan.shutdown_write()  # stdin is empty
        out, err = BoundedCapture(), BoundedCapture()
        deadline = None if timeout is None else start + timeout
        pid = _PidReader()
        err.add(pid.strip(early))
        started = become.StartedStripper() if self.target.become else None
        heard = time.monotonic()  # when the host last sent anything on this channel
        exited_at = 0.0
        try:
            while True:
                busy = False
                while chan.recv_ready():
                    data = chan.recv(65536)
                    out.add(started.strip(data) if started else data)
                    busy = True
                while chan.recv_stderr_ready():
                    err.add(pid.strip(chan.recv_stderr(65536)))
                    busy = True
                if busy:
                    heard = time.monotonic()
                # sshd may send the exit status before the last output it still has buffered: the
                # end is EOF after the exit status (a background process holding the output open
                # gets EXIT_GRACE_S, as before it got nothing).
                if not busy and chan.exit_status_ready():
                    exited_at = exited_at or time.monotonic()
                    if chan.eof_received or chan.closed or time.monotonic() - exited_at > EXIT_GRACE_S:
                        break
                if deadline is not None and time.monotonic() >= deadline:
                    silent = time.monotonic() - heard
                    killed = self._kill_group(pid.pid)
                    why = (f"after {timeout:g}s" if killed else
                           f"after {timeout:g}s: the host stopped answering (nothing from it for {silent:.0f}s, "
                           f"and no answer within {self.target.connect_timeout:g}s to ending the command)")
                    raise CommandError(self.host, command, None, tail_text(err.text()), why)
                if not busy:
                    left = 0.5 if not exited_at else 0.05
                    left = left if deadline is None else max(0.0, min(left, deadline - time.monotonic()))
                    fdwait.readable([chan], left)
            rc = chan.recv_exit_status()
        finally:
            close_quietly(chan)
        return CommandResult(command, rc, out.text(), err.text(), time.monotonic() - start)

    def _session(self, conn: Any, **sizes: int) -> Any:
        """A new channel on the open connection; a connection that no longer answers (its host or
        the network between gone silent: nothing refused, nothing closed) is unreachable, in one line."""
        import paramiko

        try:
            return conn.client.get_transport().open_session(timeout=self.target.connect_timeout, **sizes)
        except paramiko.ChannelException:
            raise  # the server answered: it refused the channel
        except paramiko.SSHException as exc:
            self.close()
            raise ConnectError(self.host, f"the host stopped answering: its connection opened no channel within "
                                          f"{self.target.connect_timeout:g}s ({exc})") from None

    def _kill_group(self, pid: int | None) -> bool:
        """End a timed-out command and everything it started (its process group) on the host; False
        when the host did not answer (a frozen or vanished host: nothing more can be done from here)."""
        if pid is None:
            return False
        try:
            chan = self._open().client.get_transport().open_session(timeout=self.target.connect_timeout)
            if self.target.become is None:  # the pid leads the session sshd made
                chan.exec_command(f"kill -TERM -- -{pid} 2>/dev/null; sleep 1; kill -KILL -- -{pid} 2>/dev/null; true")
            else:  # the pid is the shell under sudo, in the group sudo leads: end that group, as root
                group = f"$(ps -o pgid= -p {pid} | tr -d ' ')"
                self._exec(chan, f"g={group}; [ -n \"$g\" ] || exit 0; kill -TERM -$g; sleep 1; "
                                 "kill -KILL -$g 2>/dev/null; echo done")
            if not chan.status_event.wait(self.target.connect_timeout + 5):  # a host gone quiet mid-kill
                chan.close()
                return False
            chan.close()
        except Exception:  # best effort: the session's end closes the command's pipes anyway
            return False
        return True

    def forward(self, hostname: str, port: int) -> Any:
        """A channel from this host to ``hostname:port`` (what a ProxyJump through it carries)."""
        import paramiko

        try:
            return self._open().client.get_transport().open_channel(
                "direct-tcpip", (hostname, port), ("", 0), timeout=self.target.connect_timeout)
        except (paramiko.SSHException, OSError) as exc:
            raise ConnectError(self.host, f"bastion {self.target.hostname}:{self.target.port} cannot reach "
                                          f"{hostname}:{port}: {exc}") from None

    def put(self, local_path: str, remote_path: str) -> None:
        """SFTP runs as the login user: with become the file lands in its home first, then the
        become user copies it into place (so it is theirs, as Ansible's become does)."""
        conn = self._open()
        if self.target.become is None:
            conn.put(local_path, remote_path)
            return
        staged = f"{conn.sftp().normalize('.')}/.fleetctl-put-{uuid.uuid4().hex}"
        conn.put(local_path, staged)
        q = shlex.quote
        result = self.run(f"cp -- {q(staged)} {q(remote_path)}; rc=$?; rm -f -- {q(staged)}; exit $rc",
                          timeout=self.target.connect_timeout + 300)
        if result.rc != 0:
            raise CommandError(self.host, f"copy into {remote_path}", result.rc, result.stderr)

    def get(self, remote_path: str, local_path: str) -> None:
        conn = self._open()
        if self.target.become is None:
            conn.get(remote_path, local_path)
            return
        staged = f"{conn.sftp().normalize('.')}/.fleetctl-get-{uuid.uuid4().hex}"
        q = shlex.quote
        result = self.run(f"cp -- {q(remote_path)} {q(staged)} && chown {q(self.target.user)} {q(staged)}")
        if result.rc != 0:
            raise CommandError(self.host, f"copy of {remote_path}", result.rc, result.stderr)
        try:
            conn.get(staged, local_path)
        finally:
            conn.sftp().remove(staged)

    def open_stream(self, command: str) -> ChannelStream:
        chan = self._session(self._open(), window_size=STREAM_WINDOW, max_packet_size=STREAM_PACKET)
        stream = ChannelStream(chan)
        try:
            self._exec(chan, command)
            if self.target.become is not None:  # the command's own output starts after our line
                self._expect_started(stream)
        except Exception:
            close_quietly(chan)  # the error that got us here is what the user must see
            raise
        return stream

    def _expect_started(self, stream: ChannelStream) -> None:
        got = b""
        deadline = time.monotonic() + self.target.connect_timeout
        while len(got) < len(become.STARTED):
            got += stream.recv(len(become.STARTED) - len(got), max(0.0, deadline - time.monotonic()))
            if not become.STARTED.startswith(got) or not got:
                raise BecomeError(self.host, f"unexpected output from sudo before the command: {got[:80]!r}")

    def lost_bastion(self) -> str:
        """The bastion (``host:port``, the first hop first) whose own connection is gone: what cut a
        lost connection that went through it; "" when none is, or none is used."""
        conn = self._conn
        if conn is None or self.target.jump is None:
            return ""
        for hop, target in _hops(conn, self.target)[:-1]:
            transport = hop.client.get_transport() if hop is not None and not isinstance(hop, str) else None
            if transport is not None and not transport.is_active():
                return f"{target.hostname}:{target.port}"
        return ""

    @property
    def is_open(self) -> bool:
        """Whether closing it has anything to end (its connection)."""
        return self._conn is not None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                gateway = self._conn.gateway
                self._conn.close()
                if gateway is not None and not isinstance(gateway, str):
                    gateway.close()  # Fabric leaves the bastion's connection open
                self._conn = None
