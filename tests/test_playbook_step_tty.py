"""`fleetctl run --step` and the `pause` prompt on a real terminal: the real CLI in a subprocess whose
stdin, stdout and stderr are a pseudo-terminal (python's pty), answered the way a person types;
local-connection hosts (no SSH). Every answer is journaled."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_playbook_approval import INVENTORY

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class Tty:
    """The CLI on a pseudo-terminal: what it wrote so far (escape codes stripped), keys typed."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        env = {**os.environ, "TERM": "xterm", "COLUMNS": "200"}
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", *args], stdin=slave,
                                     stdout=slave, stderr=slave, cwd=cwd, env=env, start_new_session=True)
        os.close(slave)
        self.seen = ""
        self.read_to = 0

    def expect(self, text: str, timeout: float = 60) -> str:
        """Wait for ``text`` after what the last expect matched; what came before it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = self.seen.find(text, self.read_to)
            if at >= 0:
                before, self.read_to = self.seen[self.read_to:at], at + len(text)
                return before
            if not self._read(0.2):
                break
        raise AssertionError(f"{text!r} not shown; the terminal shows:\n{self.seen[self.read_to:]}")

    def _read(self, wait: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return self.proc.poll() is None
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # the other side closed: the process ended
            return False
        self.seen += ANSI.sub("", chunk.decode("utf-8", "replace"))
        return bool(chunk)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        while self._read(0.05):  # what it wrote last
            pass
        rc = self.proc.wait(timeout=5)
        os.close(self.master)
        return rc


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return path


@pytest.fixture
def tty_runs() -> Iterator[list[Tty]]:
    started: list[Tty] = []
    yield started
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def rollout(tmp_path: Path, tasks: list[dict[str, Any]]) -> Path:
    path = tmp_path / "book.yml"
    path.write_text(yaml.safe_dump([{"name": "stepped", "hosts": "web", "serial": 1, "tasks": tasks}],
                                   sort_keys=False))
    return path


def events(inv: Path) -> list[dict[str, Any]]:
    (path,) = (inv.parent / ".fleetctl" / "runs").glob("*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def work(tmp_path: Path) -> dict[str, Any]:
    return {"name": "work", "shell": f"echo {{{{ inventory_hostname }}}} >> {tmp_path / 'ran'}"}


def test_step_asks_before_each_batch_until_continue(inv: Path, tmp_path: Path, tty_runs: list[Tty]) -> None:
    t = Tty(["-i", str(inv), "run", str(rollout(tmp_path, [work(tmp_path)])), "--step"], tmp_path)
    tty_runs.append(t)
    t.expect("STEP stepped: batch 1/3 (one): run it? yes / no, stop the rollout here / continue, no more "
             "questions: ")
    t.type("y\n")
    t.expect("BATCH 1/3 one")
    t.expect("STEP stepped: batch 2/3")
    t.type("maybe\n")  # not an answer: asked again
    t.expect("STEP stepped: batch 2/3")
    t.type("c\n")
    assert t.finish() == 0, t.seen
    assert t.seen.count("STEP stepped:") == 3  # batch 2 twice, batch 3 not asked
    assert (tmp_path / "ran").read_text().split() == ["one", "three", "two"]
    assert [(e["batch"], e["answer"]) for e in events(inv) if e["event"] == "step"] == [(1, "yes"), (2, "continue")]


def test_step_no_halts_before_the_batch(inv: Path, tmp_path: Path, tty_runs: list[Tty]) -> None:
    t = Tty(["-i", str(inv), "run", str(rollout(tmp_path, [work(tmp_path)])), "--step"], tmp_path)
    tty_runs.append(t)
    t.expect("STEP stepped: batch 1/3")
    t.type("yes\n")
    t.expect("STEP stepped: batch 2/3")
    t.type("n\n")
    t.expect("HALTED after batch 1: --step: batch 2 declined at the terminal")
    assert t.finish() == 2, t.seen
    assert (tmp_path / "ran").read_text().split() == ["one"]
    assert [e["hosts"] for e in events(inv) if e["event"] == "batch_start"] == [["one"]]


def test_pause_prompt_takes_a_line_and_ctrl_c_ends_it(inv: Path, tmp_path: Path, tty_runs: list[Tty]) -> None:
    ask = {"name": "ask", "pause": {"prompt": "deploy {{ inventory_hostname }}?"}, "register": "said"}
    echo = {"name": "echo", "shell": f"echo {{{{ said.user_input }}}} >> {tmp_path / 'said'}"}
    t = Tty(["-i", str(inv), "run", str(rollout(tmp_path, [ask, echo]))], tmp_path)
    tty_runs.append(t)
    t.expect("PAUSE deploy one?: ")
    t.type("ship it\n")
    t.expect("PAUSE deploy three?: ")
    t.proc.send_signal(signal.SIGINT)  # Ctrl-C while the question waits
    t.expect("INTERRUPTED")
    assert t.finish() == 130, t.seen
    assert (tmp_path / "said").read_text().split("\n")[0] == "ship it"
    results = [e for e in events(inv) if e["event"] == "task_result" and e["name"] == "ask"]
    assert results[0]["data"]["user_input"] == "ship it" and results[0]["host"] == "one"
    assert results[1]["msg"].startswith("ended early by Ctrl-C")
    assert next(e for e in events(inv) if e["event"] == "interrupted")["batch"] == 2
