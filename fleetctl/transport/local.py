"""``ansible_connection: local``: run on the controller itself, without SSH or paramiko."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections import deque

from fleetctl.errors import CommandError
from fleetctl.transport import fdwait
from fleetctl.transport.base import CommandResult
from fleetctl.transport.output import BoundedCapture, tail_text


class PipeStream:
    """A child process (``argv``) whose stdin/stdout carry a stream; stderr kept as a short tail."""

    close_wait = 3.0  # seconds for the child to exit at EOF before it is killed

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self._errfd = self.proc.stderr.fileno()
        self._err: deque[bytes] = deque(maxlen=64)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._in, view):]

    def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        ready = fdwait.readable([self._out], timeout)
        if not ready:
            raise TimeoutError
        return os.read(self._out, max_bytes)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self) -> str:
        while fdwait.readable([self._errfd], 0):
            chunk = os.read(self._errfd, 65536)
            if not chunk:
                break
            self._err.append(chunk)
        return tail_text(b"".join(self._err))

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):  # stdin's unflushed bytes to a child already dead
                    pipe.close()
        try:
            self.proc.wait(timeout=self.close_wait)  # the child exits at EOF (an agent: or its watchdog ends it)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LocalStream(PipeStream):
    """A shell command on the controller whose stdin/stdout carry the agent protocol."""

    def __init__(self, command: str) -> None:
        super().__init__(["/bin/sh", "-c", command])


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
                ready = fdwait.readable(open_fds, left)
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
