"""The person running a rollout: questions asked on the controller's terminal (the ``pause``
module's prompt, ``fleetctl run --step``), and none at all without one (CI), where a question is
refused before anything runs rather than left waiting for an answer that cannot come.

The CLI builds the ``Terminal`` (stdin must be a tty; the question goes where the run's human
output goes, with the progress line held off while it waits). Reading polls, so Ctrl-C (the run's
stop) or a closed terminal ends a question at once; a question is never a hang.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

NO_TERMINAL = "stdin is not a terminal"


class Terminal:
    """Questions on a tty: one at a time, each answered by one line."""

    def __init__(self, fd: int, write: Callable[[str], None],
                 hold: Callable[[], AbstractContextManager[object]] = nullcontext) -> None:
        self._fd = fd
        self._write = write  # shows the question (the CLI's console)
        self._hold = hold  # keeps the progress line off the terminal while a question waits
        self._lock = threading.Lock()

    def ask(self, question: str, stopping: Callable[[], bool], seconds: float | None = None) -> str | None:
        """The line typed (stripped); None when the run stops (Ctrl-C), the terminal closes, or
        ``seconds`` pass first."""
        import time

        until = None if seconds is None else time.monotonic() + seconds
        with self._lock, self._hold():
            self._write(question)
            typed = b""
            while not stopping():
                wait = 0.2 if until is None else min(0.2, until - time.monotonic())
                if wait <= 0:
                    return None
                ready, _, _ = select.select([self._fd], [], [], wait)
                if not ready:
                    continue
                chunk = os.read(self._fd, 4096)
                if not chunk:  # the terminal closed
                    return None
                typed += chunk
                if b"\n" in typed or b"\r" in typed:
                    return typed.splitlines()[0].decode("utf-8", "replace").strip()
            return None


@dataclass
class Operator:
    """What a run may ask of the person who started it: ``terminal`` (None: nobody to ask),
    ``step`` (``--step``: confirm each batch), and the run's stop (Ctrl-C), bound by the runner."""

    terminal: Terminal | None = None
    step: bool = False
    stopping: Callable[[], bool] = field(default=lambda: False)
    asked_all: bool = False  # --step answered 'c': the rest of the run goes on without asking

    def bound(self, stop: threading.Event) -> Operator:
        self.stopping = stop.is_set
        return self

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` (a timed pause); False when Ctrl-C ended it early."""
        import time

        until = time.monotonic() + seconds
        while not self.stopping():
            left = until - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(0.2, left))
        return False
