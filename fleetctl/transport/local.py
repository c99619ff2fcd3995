"""``ansible_connection: local``: run on the controller itself, without SSH or paramiko."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
from collections import deque

from fleetctl.errors import CommandError
from fleetctl.transport.base import CommandResult
from fleetctl.transport.output import BoundedCapture, tail_text


class LocalStream:
    """A child process whose stdin/stdout carry the agent protocol."""

    def __init__(self, command: str) -> None:
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )
        self._err: deque[bytes] = deque(maxlen=64)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError
        return os.read(fd, max_bytes)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self) -> str:
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self._err.append(chunk)
        return tail_text(b"".join(self._err))

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):  # stdin's unflushed bytes to an agent already dead
                    pipe.close()
        try:
            self.proc.wait(timeout=3)  # the agent exits at EOF, or its watchdog ends it
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: everything it started goes too
    except OSError:
        proc.kill()
    proc.wait()


class LocalConnector:
    """Runs commands and copies files on the controller."""

    def __init__(self, host: str) -> None:
        self.host = host

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """As over SSH: output kept in bounded memory, the whole process group killed at the timeout."""
        start = time.monotonic()
        proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = BoundedCapture(), BoundedCapture()
        captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        open_fds = set(captures)
        deadline = None if timeout is None else start + timeout
        try:
            while open_fds:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    _kill_group(proc)
                    raise CommandError(self.host, command, None, tail_text(err.text()))
                ready, _, _ = select.select(list(open_fds), [], [], left)
                for fd in ready:
                    data = os.read(fd, 65536)
                    if data:
                        captures[fd].add(data)
                    else:
                        open_fds.discard(fd)
            proc.wait()
        finally:
            proc.stdout.close()
            proc.stderr.close()
        return CommandResult(command, proc.returncode, out.text(), err.text(), time.monotonic() - start)

    def put(self, local_path: str, remote_path: str) -> None:
        shutil.copyfile(local_path, remote_path)

    def get(self, remote_path: str, local_path: str) -> None:
        shutil.copyfile(remote_path, local_path)

    def open_stream(self, command: str) -> LocalStream:
        return LocalStream(command)

    is_open = False  # nothing to end: each command is its own process

    def close(self) -> None:
        pass
