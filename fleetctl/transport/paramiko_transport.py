"""The paramiko Transport every SSH connection of fleetctl uses (``transport/ssh.py`` opens them).

Three changes to paramiko's own, each for a fan-out over many hosts from one process:

- AES-GCM is offered first (as OpenSSH orders them after chacha20): one pass, no separate HMAC;
  paramiko lists it last. Measured on the lab (400 MB through one channel): 2.5 s of controller
  CPU with aes128-ctr + hmac-sha2-256, 2.0 s with aes128-gcm. Servers without it negotiate as before.
- No polling. paramiko's thread wakes every 0.1 s while nothing arrives, and a caller waiting for
  the key exchange or the login polls its event every 0.1 s as well. Each wake-up takes the GIL
  from the threads at work, and they add up as hosts x how long each waits: a run's connections
  stay open until its end, and at 1,000 fresh hosts the exchanges queue for CPU. From 200 to
  1,000 hosts the controller's CPU per host rose from 8.6 to 15.2 ms (bench/scale.md); an idle
  connection cost 0.27 ms of CPU a second at 0.1 s, 0.04 ms at 1 s. What arrives is read at
  once all the same: the thread's timeout only bounds how late it notices a connection closed
  under it, the handshake and banner timeouts' grain and a keepalive's delay.
- The key exchange is bounded by the connect timeout, not paramiko's fixed 15 s: a controller
  starting 1,000 handshakes at once can make one wait longer than that for CPU, and the host
  was lost (as "EOFError") though the user allowed more.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import paramiko

GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
IDLE_WAKEUP_S = 1.0  # how often the thread of a connection wakes while nothing arrives
HANDSHAKES_PER_CORE = 8  # connection opens (TCP, key exchange, login) at once per process, per core
_slots: tuple[int, threading.BoundedSemaphore | None] = (0, None)  # (pid, semaphore): a fork gets its own
_slots_lock = threading.Lock()


def handshake_limit() -> int:
    """How many connections one process opens at once: FLEETCTL_HANDSHAKES (0: no bound), else
    HANDSHAKES_PER_CORE per core this process may run on."""
    env = os.environ.get("FLEETCTL_HANDSHAKES", "").strip()
    if env.isdigit():
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return HANDSHAKES_PER_CORE * cores


@contextlib.contextmanager
def handshake_slot() -> Iterator[None]:
    """Held while a connection opens. A thousand handshakes started at once in one process each
    wait for the GIL behind all the others (and on the lab, for the CPU behind a thousand sshd):
    every one then takes as long as all of them, and the controller's CPU per host grows with the
    fleet. A host that does not answer holds its slot for at most the connect timeout."""
    global _slots
    with _slots_lock:
        if _slots[0] != os.getpid():
            limit = handshake_limit()
            _slots = (os.getpid(), threading.BoundedSemaphore(limit) if limit > 0 else None)
        slots = _slots[1]
    if slots is None:
        yield
        return
    with slots:
        yield


class QuietTransport(paramiko.Transport):
    """paramiko's Transport whose callers wait for the key exchange and the login on their event
    (paramiko sets every such event when its thread ends, so a dead connection still wakes them)."""

    def start_client(self, event: threading.Event | None = None, timeout: float | None = None) -> None:
        if event is not None:
            return super().start_client(event, timeout)
        done = threading.Event()
        super().start_client(event=done, timeout=timeout)  # starts the thread and returns
        done.wait(timeout)
        if not self.is_active():  # as paramiko's own wait ends
            error = self.get_exception()
            raise error if error is not None else paramiko.SSHException("Negotiation failed.")
        return None

    def auth_publickey(self, username: str, key: Any, event: threading.Event | None = None) -> list[str]:
        if event is not None:
            return super().auth_publickey(username, key, event)
        done = threading.Event()
        super().auth_publickey(username, key, done)  # sends the request and returns
        if not done.wait(self.auth_timeout) and self.is_active():
            raise paramiko.AuthenticationException("Authentication timeout.")
        handler = self.auth_handler
        assert handler is not None  # super() made it
        result: list[str] = handler.wait_for_response(done)  # set: paramiko's verdict at once
        return result


def make_transport(sock: Any, handshake_timeout: float | None = None, **kwargs: Any) -> QuietTransport:
    """A ``QuietTransport`` on ``sock`` (an SSHClient's ``transport_factory``), AES-GCM first, its
    thread waking every IDLE_WAKEUP_S, the key exchange given ``handshake_timeout`` seconds."""
    transport = QuietTransport(sock, **kwargs)
    transport.sock.settimeout(IDLE_WAKEUP_S)  # before its thread starts: the handshake's waits too
    if handshake_timeout is not None:
        transport.handshake_timeout = handshake_timeout
    options = transport.get_security_options()
    options.ciphers = (*[c for c in GCM_FIRST if c in options.ciphers],
                       *[c for c in options.ciphers if c not in GCM_FIRST])
    return transport
