"""``fleetctl logs --follow`` on the lab fleet, run as a user would (a process, then Ctrl-C): new
lines arrive prefixed by host and instance, a restarted server's lines keep coming (``tail -F``), a
host that drops gets one line and the others go on, and Ctrl-C exits 130 with no ``tail`` left."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from service_cleanup import clean_releases

pytestmark = pytest.mark.lab
VENV = "/root/follow-env"
# The release's servers and supervisors stopped, releases and boot entries gone.
CLEAN = clean_releases()
# Followers (tail, or our own follower process) whose mount namespace is this host's: the lab's hosts
# share one pid namespace, so the host is told apart by its mounts.
FOLLOWERS_HERE = ("me=$(readlink /proc/self/ns/mnt); for p in $(pgrep -f '[t]ail -F|[f]leetctl_log_follow'); do "
                  "[ \"$(readlink /proc/$p/ns/mnt 2>/dev/null)\" = \"$me\" ] && [ $p != $$ ] && "
                  "tr '\\0' ' ' < /proc/$p/cmdline | cut -c1-120 && echo; done; true")


@pytest.fixture
def served(lab_fleet: LabHandle, tmp_path: Path) -> Iterator[LabHandle]:
    """lab1 and lab2 serving a two-instance stand-in release."""
    for host in ("lab1", "lab2"):
        lab_fleet.ssh(host, f"{CLEAN}; /usr/bin/python3 -m venv --without-pip {VENV}")
    spec = tmp_path / "pair.yml"
    spec.write_text(f'name: pair\nversion: "1"\nbase: {{adopt: {VENV}}}\nservice:\n  standin: true\n'
                    '  instances:\n    - {name: a, port: 30011}\n    - {name: b, port: 30012}\n'
                    "health: {timeout: 30, interval: 0.2}\n")
    r = cli(lab_fleet, "-l", "lab1,lab2", "deploy", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    yield lab_fleet
    lab_fleet.restore()
    for host in ("lab1", "lab2"):
        lab_fleet.ssh(host, f"{CLEAN}; rm -rf {VENV}")


def cli(lab: LabHandle, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), *args],
                          capture_output=True, text=True, timeout=300)


class Follow:
    """``fleetctl logs --follow`` running as its own process; its stdout and stderr lines read as they come."""

    def __init__(self, lab: LabHandle, *args: str, after: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), *args, "logs", "--follow",
             *after],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        for pipe, tag in ((self.proc.stdout, "out"), (self.proc.stderr, "err")):
            threading.Thread(target=self._read, args=(pipe, tag), daemon=True).start()

    def _read(self, pipe: object, tag: str) -> None:
        for line in pipe:  # type: ignore[attr-defined]
            self.lines.put(f"{tag} {line.rstrip()}")

    def wait_for(self, found: Callable[[str], bool], seconds: float = 60) -> str:
        """The first line so far (``out TEXT`` or ``err TEXT``) ``found`` accepts; fails after ``seconds``."""
        for line in self.seen:
            if found(line):
                return line
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append(line)
            if found(line):
                return line
        raise AssertionError("never came; saw:\n" + "\n".join(self.seen[-40:]))

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=60)
        time.sleep(0.2)  # the reader threads drain what was left in the pipes
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return rc


def followers_left(lab: LabHandle, host: str, seconds: float = 20) -> str:
    """The followers still running on ``host`` (empty once none is), asked until ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        left = lab.ssh(host, FOLLOWERS_HERE).stdout.strip()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_follow_prefixes_new_lines_survives_restart_and_a_lost_host_and_stops_on_ctrl_c(
        served: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab = served
    follow = Follow(lab, "-l", "lab1,lab2")
    # The last lines first, each named by host and instance.
    follow.wait_for(lambda line: line.startswith("out lab2 b: --- ") and " start: " in line)
    assert followers_left(lab, "lab1", 0), "the follower should be running on lab1 now"

    # A restarted server writes to its log again (a second start line): it arrives, prefixed.
    def starts_of_a(_line: str) -> bool:
        return sum(x.startswith("out lab1 a: --- ") and " start: " in x for x in follow.seen) >= 2

    follow.wait_for(lambda line: line.startswith("out lab1 a: --- "))  # the one start line so far
    assert run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab1", "service", "restart", "a").rc == 0
    follow.wait_for(starts_of_a)
    # The log replaced under it (rotated): the new file's lines come (tail -F).
    log = "/var/lib/fleetctl/service/sglang@a.log"
    lab.ssh("lab1", f"mv '{log}' '{log}.1' && echo 'after the rotation' >> '{log}'")
    follow.wait_for(lambda line: line == "out lab1 a: after the rotation")

    # lab2 drops: one line names it; lab1's new lines still come.
    with lab.stop("lab2"):
        follow.wait_for(lambda line: line == "err fleetctl: lab2: connection lost (following the others)")
        lab.ssh("lab1", "echo 'a line from the operator' >> '/var/lib/fleetctl/service/sglang@b.log'")
        follow.wait_for(lambda line: line == "out lab1 b: a line from the operator")

    rc = follow.interrupt()
    assert rc == 130, follow.seen[-20:]
    assert not any("Traceback" in line for line in follow.seen), follow.seen
    assert followers_left(lab, "lab1") == ""


def test_follow_with_json_is_one_document_per_line(served: LabHandle) -> None:
    follow = Follow(served, "-l", "lab1", after=("-n", "1", "--json"))
    first = follow.wait_for(lambda line: line.startswith("out {"))
    assert json.loads(first[4:]).keys() == {"host", "instance", "line"}
    assert json.loads(first[4:])["host"] == "lab1" and json.loads(first[4:])["instance"] in ("a", "b")
    assert follow.interrupt() == 130


def test_follow_of_a_host_without_a_release_is_one_line(lab_fleet: LabHandle) -> None:
    lab_fleet.ssh("lab3", CLEAN)
    r = cli(lab_fleet, "-l", "lab3", "logs", "--follow")
    assert r.returncode == 2
    assert r.stderr.strip() == ("fleetctl: lab3: no server log at /var/lib/fleetctl/service/sglang.log "
                                "(no release started here)")
