"""Helpers for tests on a lab host booted by a real systemd (fleetctl/lab/systemd_host.py)."""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle, host_processes, listening_sockets, worker_lab_dir

from fleetctl.lab import lab_down, lab_up
from fleetctl.lab.fleet import set_init

HOST = "lab1"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def systemd_lab_dir(name: str) -> Path:
    """A lab folder outside /var/tmp (a systemd host covers /tmp, /var/tmp and /run with its own)."""
    folder = worker_lab_dir(name)
    if Path("/var/tmp") in folder.parents:  # a checkout under /root puts labs there
        folder = Path("/var/lib/fleetctl-lab-tests") / folder.relative_to("/var/tmp")
    return folder


@contextmanager
def systemd_lab(name: str, base: str) -> Iterator[LabHandle]:
    """A one-host lab whose lab1 boots under systemd; powered off and purged afterwards (also what a
    killed earlier run left)."""
    directory = systemd_lab_dir(name)
    lab_down(directory, purge=True)
    shutil.rmtree(directory, ignore_errors=True)
    set_init(directory, HOST)
    try:
        yield LabHandle.from_fleet(lab_up(1, directory, base))
    finally:
        lab_down(directory, purge=True)
        shutil.rmtree(directory, ignore_errors=True)


def sh(lab: LabHandle, command: str) -> str:
    return lab.ssh(HOST, command).stdout.strip()


def unit(lab: LabHandle, prop: str) -> str:
    return sh(lab, f"systemctl show -p {prop} --value sglang.service")


def spec(folder: Path, version: str, args: str = "") -> Path:
    path = folder / f"v{version}.yml"
    path.write_text(f'name: bare\nversion: "{version}"\nbase: {{adopt: /root/ml-env}}\n'
                    f"service: {{standin: true{args}}}\nhealth: {{timeout: 60, interval: 0.2}}\n")
    return path


def cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str):  # type: ignore[no-untyped-def]
    return run_cli(capsys, "-i", str(lab.inventory_path), "-l", "all", *args)


def deploy(capsys: pytest.CaptureFixture[str], lab: LabHandle, path: Path) -> str:
    r = cli(capsys, lab, "deploy", str(path), "--json")
    assert r.rc == 0, r.out + r.err
    return str(r.json()["hosts"][HOST]["value"]["release_id"])


def host_listeners(lab: LabHandle) -> set[tuple[str, int]]:
    """What every process of lab1 listens on (sessions that end while we look are left out)."""
    found: set[tuple[str, int]] = set()
    for pid in host_processes(lab, HOST):
        try:
            found.update(listening_sockets(pid))
        except OSError:
            continue
    return found


def health(lab: LabHandle, seconds: float = 60) -> int:
    """/health of lab1's server, asked until it answers at all (the server binds after systemd starts it)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with NO_PROXY.open(f"http://{lab.addresses[HOST]}:30000/health", timeout=5) as answer:
                return int(answer.status)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Follow:
    """``fleetctl logs --follow`` as its own process (a user's terminal); its lines read as they come."""

    def __init__(self, lab: LabHandle) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path),
                                      "-l", "all", "logs", "--follow"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(x.rstrip()) for x in self.proc.stdout or ()],
                         daemon=True).start()

    def wait_for(self, count: int, text: str, seconds: float = 60) -> None:
        """Until ``count`` lines seen contain ``text``; fails after ``seconds`` with what came."""
        deadline = time.monotonic() + seconds
        while sum(text in line for line in self.seen) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} x {text!r} never came; saw:\n" + "\n".join(self.seen[-30:]))
            try:
                self.seen.append(self.lines.get(timeout=0.5))
            except queue.Empty:
                continue

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=60)


def journal_followers(lab: LabHandle, seconds: float = 20) -> str:
    """``journalctl -f`` still running on the host (its own PID namespace), asked until none is or time is up."""
    deadline = time.monotonic() + seconds
    while True:
        left = lab.ssh(HOST, "pgrep -a -f '[j]ournalctl -u' || true").stdout.strip()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
