"""Privilege escalation with sudo: how a command is wrapped, and sudo's answer read before it runs.

The agent itself starts under sudo, so every operation inside it (and each venv child it
starts) has those privileges: become is a property of how a connection starts its processes,
not a flag threaded through the operations. As Ansible does, the password goes to sudo on its
stdin (``-S``), and only after sudo has printed our own prompt, so a sudo that needs none never
reads it as input; it never appears on a command line. Without a password sudo runs ``-n``: a
sudo that would prompt fails at once instead of hanging. Every sudo refusal becomes one line
naming the host and what to do.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import TYPE_CHECKING, Protocol

from fleetctl.errors import BecomeError

if TYPE_CHECKING:
    from fleetctl.transport.target import Become

# Our own prompt, unlike any sudo prints: seeing it twice means the password was wrong.
PROMPT = f"[fleetctl-become-{os.getpid()}] password: "


class PromptStream(Protocol):
    def send(self, data: bytes) -> None: ...

    def stdout_ready(self) -> bool: ...

    def read_stderr(self, timeout: float) -> bytes: ...

    def alive(self) -> bool: ...


# Printed on stdout by the wrapped shell before the command: sudo is done (a command may print
# nothing at all). ``strip_started`` takes it off again.
STARTED = b"@@FLEETCTL-BECOME-STARTED@@\n"


def wrap(command: str, become: Become) -> str:
    """``command`` (a POSIX shell line) run by /bin/sh as the become user, which first prints
    ``STARTED``: sudo is done (a command may print nothing at all)."""
    how = ["-S", "-p", PROMPT] if become.password is not None else ["-n"]
    script = f"printf '%s\\n' {shlex.quote(STARTED.decode().strip())}; {command}"
    argv = ["sudo", "-H", *how, "-u", become.user, "--", "/bin/sh", "-c", script]
    return " ".join(shlex.quote(a) for a in argv)


class StartedStripper:
    """Takes ``STARTED`` off the front of a wrapped command's stdout."""

    def __init__(self) -> None:
        self._pending: bytes | None = b""

    def strip(self, data: bytes) -> bytes:
        if self._pending is None:
            return data
        self._pending += data
        if len(self._pending) < len(STARTED) and STARTED.startswith(self._pending):
            return b""
        data, self._pending = self._pending, None
        return data.removeprefix(STARTED)


def handshake(stream: PromptStream, become: Become, host: str, login: str, timeout: float) -> bytes:
    """Wait until the wrapped command runs (its first stdout byte) or sudo refuses; answer the
    prompt once. A refusal raises ``BecomeError``; nothing waits for input that will not come.
    Returns what the command itself already wrote to stderr (read here, still the caller's)."""
    deadline = time.monotonic() + timeout
    said = b""
    sent = False
    while not stream.stdout_ready():
        said += stream.read_stderr(0.05)
        if stream.stdout_ready():
            break
        text = said.decode(errors="replace")
        refusal = refusal_reason(text, become, login)
        if refusal:
            raise BecomeError(host, refusal)
        if PROMPT in text:
            if sent or become.password is None:
                raise BecomeError(host, f"sudo refused the become password for {login}: "
                                        "check ansible_become_password or the -K answer")
            stream.send(become.password.encode() + b"\n")
            sent = True
            said = text.split(PROMPT, 1)[1].encode()
            continue
        if not stream.alive() and not stream.stdout_ready():
            tail = " ".join(text.split())[-300:]
            raise BecomeError(host, "sudo ended before the command started"
                                    + (f": {tail}" if tail else ""))
        if time.monotonic() > deadline:
            raise BecomeError(host, f"sudo did not start the command within {timeout:g}s "
                                    f"(a prompt fleetctl cannot answer?){': ' + text.strip() if text.strip() else ''}")
    return said


def refusal_reason(text: str, become: Become, login: str) -> str | None:
    """One line for what sudo said, or None while it has said nothing final."""
    low = text.lower()
    if "a password is required" in low or "a terminal is required to read the password" in low:
        return (f"sudo needs a password for {login}: set ansible_become_password (a secret) "
                "or pass -K/--ask-become-pass")
    if "not in the sudoers file" in low or "is not allowed to run sudo" in low or "may not run sudo" in low:
        return f"{login} may not use sudo (not in sudoers): ask for sudo rights or connect as another user"
    if "is not allowed to execute" in low:
        return f"{login} may not run commands as {become.user} through sudo (sudoers): check its rules"
    if "unknown user" in low:
        return f"become user '{become.user}' does not exist (ansible_become_user / --become-user)"
    if "must have a tty" in low or "requiretty" in low:
        return (f"sudo requires a terminal for {login} (Defaults requiretty): "
                f"add 'Defaults:{login} !requiretty' to sudoers")
    if "incorrect password" in low or "sorry, try again" in low:
        return f"sudo refused the become password for {login}: check ansible_become_password or the -K answer"
    if "command not found" in low and "sudo" in low:
        return "sudo is not installed: install it or connect as a user with the rights needed"
    return None
