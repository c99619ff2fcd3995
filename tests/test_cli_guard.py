"""Commands that change hosts need an explicit target and, on a terminal, ask (issue 31, item 4).

The refusal is proved to come before any connection: the inventory's host is a TCP socket this test
listens on, and after the command its backlog is empty (a connection attempt, even one fleetctl
dropped at once, would be waiting there). The question is asked on a real pseudo-terminal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_playbook_step_tty import Tty

REPO = Path(__file__).resolve().parents[1]
PLAIN = REPO / "playbooks" / "releases" / "sglang-0.5.23-lab.yml"

CHANGES = [
    ("deploy", str(PLAIN)),
    ("deploy", str(PLAIN), "--stage", "--serial", "1"),
    ("rollback",),
    ("service", "restart"),
    ("service", "stop"),
    ("service", "start"),
    ("releases", "remove", "some-release"),
    ("shell", "touch /tmp/should-not-exist"),
]


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    """An inventory whose two hosts are a socket this test listens on (and never accepts from)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    port = server.getsockname()[1]
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n" + "".join(
        f"    {name}:\n      ansible_host: 127.0.0.1\n      ansible_port: {port}\n" for name in ("gpu1", "gpu2")))
    yield server, inv
    server.close()


def fleetctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def connections(server: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


@pytest.mark.parametrize("args", CHANGES, ids=lambda a: " ".join(a[:2]).replace(str(PLAIN), "SPEC"))
def test_no_target_refused_in_one_line_before_any_connection(listening: tuple[socket.socket, Path], tmp_path: Path,
                                                             args: tuple[str, ...]) -> None:
    server, inv = listening
    r = fleetctl("-i", str(inv), *args, cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    command = " ".join(args[:2]) if args[0] in ("service", "releases") else args[0]
    assert r.stderr.splitlines() == [
        f"fleetctl: error: {command} changes hosts: name them with -l PATTERN (-l all: every host in the "
        "inventory); nothing was contacted"]
    assert r.stdout == ""
    assert connections(server) == 0
    # a stale environment variable is no target either
    r = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inv), *args], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "FLEETCTL_LIMIT": "all"})
    assert r.returncode == 3 and connections(server) == 0


def test_with_a_target_and_no_terminal_it_goes_ahead(listening: tuple[socket.socket, Path], tmp_path: Path) -> None:
    server, inv = listening
    r = fleetctl("-i", str(inv), "-l", "gpu1", "shell", "true", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr  # it tried: the socket is no SSH server
    assert connections(server) >= 1


def test_read_only_and_check_need_no_target(listening: tuple[socket.socket, Path], tmp_path: Path) -> None:
    server, inv = listening
    for args in (("deploy", str(PLAIN), "--check"), ("service", "status"), ("status",)):
        r = fleetctl("-i", str(inv), "-T", "5", "-e", "ansible_timeout=3", *args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout + r.stderr)  # went to the hosts, which are no SSH servers
    assert connections(server) >= 3


LOCAL = """\
all:
  hosts:
    one: {ansible_connection: local, ansible_python_interpreter: /usr/bin/python3}
    two: {ansible_connection: local, ansible_python_interpreter: /usr/bin/python3}
"""


@pytest.fixture
def local(tmp_path: Path) -> Path:
    inv = tmp_path / "local.yml"
    inv.write_text(LOCAL)
    return inv


@pytest.fixture
def ttys() -> Iterator[list[Tty]]:
    started: list[Tty] = []
    yield started
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def test_on_a_terminal_it_shows_the_plan_and_asks(local: Path, tmp_path: Path, ttys: list[Tty]) -> None:
    marker = tmp_path / "ran"
    t = Tty(["-i", str(local), "-l", "all", "shell", f"echo x >> {marker}"], tmp_path)
    ttys.append(t)
    t.expect(f"plan: shell: echo x >> {marker}")
    t.expect("hosts (2): one, two")
    t.expect("shell on 2 hosts? [y/N]: ")
    t.type("n\n")
    assert t.finish() == 1
    assert "not confirmed: nothing was changed" in t.seen
    assert not marker.exists()

    t = Tty(["-i", str(local), "-l", "one", "shell", f"echo x >> {marker}"], tmp_path)
    ttys.append(t)
    t.expect("shell on 1 host? [y/N]: ")
    t.type("y\n")
    assert t.finish() == 0, t.seen
    assert marker.read_text() == "x\n"


def test_the_plan_names_the_release_and_its_batches(local: Path, tmp_path: Path, ttys: list[Tty]) -> None:
    from fleetctl.release.spec import load_spec

    t = Tty(["-i", str(local), "deploy", str(PLAIN), "-l", "all", "--serial", "1"], tmp_path)
    ttys.append(t)
    t.expect(f"plan: deploy {load_spec(PLAIN).release_id} (build, switch, restart, health gates, roll back on "
             "failure)")
    t.expect("batches: 2")
    t.expect("batch 1: one")
    t.expect("batch 2: two")
    t.expect("deploy on 2 hosts? [y/N]: ")
    t.type("\n")  # the default is no
    assert t.finish() == 1
    assert not (tmp_path / ".fleetctl").exists()  # no journal: nothing started


@pytest.mark.parametrize("where", ["after", "before"])
def test_yes_does_not_ask(local: Path, tmp_path: Path, ttys: list[Tty], where: str) -> None:
    """--yes after the command, or before it as pyinfra's -y goes (a global option too)."""
    marker = tmp_path / "ran"
    argv = ["shell", "--yes"] if where == "after" else ["--yes", "shell"]
    t = Tty(["-i", str(local), *argv, "-l", "one", f"echo y >> {marker}"], tmp_path)
    ttys.append(t)
    assert t.finish() == 0, t.seen
    assert "[y/N]" not in t.seen
    assert marker.read_text() == "y\n"
