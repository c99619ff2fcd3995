"""Keepalives and ignored ssh options on the lab (issue 31, item 8): a connection fleetctl opened
to a real sshd sends keepalives while it sits idle, as ServerAliveInterval says; the ssh options
fleetctl leaves out are one line each per run, and host keys are still checked.

The keepalives are seen on the wire: lab1 is reached through a ProxyCommand relay that counts the
writes from fleetctl to sshd. Once a command has finished, fleetctl has nothing to send: each
further write is a keepalive. Without keepalives none comes, and the wait below runs out."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_support import LabHandle, user_inventory

from fleetctl.inventory import load_inventory
from fleetctl.transport.fleet import Fleet

pytestmark = pytest.mark.lab
# stdin -> sshd and sshd -> stdout; each write towards sshd is logged (a line) before it is sent.
RELAY = """\
import os, select, socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
log = open(sys.argv[3], "a", buffering=1)
while True:
    ready, _, _ = select.select([0, sock], [], [])
    if 0 in ready:
        data = os.read(0, 65536)
        if not data:
            break
        log.write(f"{len(data)}\\n")
        sock.sendall(data)
    if sock in ready:
        data = sock.recv(65536)
        if not data:
            break
        os.write(1, data)
"""


def writes(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_an_idle_connection_sends_keepalives_at_the_configured_interval(
        lab_fleet: LabHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    relay, log = tmp_path / "relay.py", tmp_path / "to-sshd.log"
    relay.write_text(RELAY)
    address = lab_fleet.addresses["lab1"]
    config = tmp_path / "ssh_config"  # the interval from ssh_config; the relay from the inventory
    config.write_text(f"Host {address}\n  ServerAliveInterval 1\n")
    monkeypatch.setenv("FLEETCTL_SSH_CONFIG", str(config))
    proxy = f"{sys.executable} {relay} {address} 22 {log}"
    inv_path = user_inventory(lab_fleet, tmp_path / "hosts.yml", user="root", host_vars={
        "lab1": {"ansible_ssh_common_args": f"-o 'ProxyCommand={proxy}'"}})
    inv = load_inventory(inv_path)
    with Fleet(inv, inv.select("lab1")) as fleet:
        ctx = fleet.contexts["lab1"]
        assert ctx.run("echo hi").stdout == "hi\n"
        before = writes(log)
        assert before > 0  # the connection went through the relay
        # A closing packet of the command may still be on its way: three more writes are keepalives.
        deadline = time.monotonic() + 120
        while writes(log) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert writes(log) >= before + 3, f"no keepalives from fleetctl: {writes(log) - before} writes while idle"
        assert ctx.run("echo still").stdout == "still\n"


def test_ignored_ssh_options_are_one_line_each_per_run_and_keys_are_still_checked(
        lab_fleet: LabHandle, tmp_path: Path) -> None:
    args = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ServerAliveInterval=20 -C"
    inv_path = user_inventory(lab_fleet, tmp_path / "hosts.yml", user="root", host_vars={
        name: {"ansible_ssh_common_args": args} for name in lab_fleet.hosts})
    env = {**os.environ, "FLEETCTL_SSH_CONFIG": "none"}
    cmd = [sys.executable, "-m", "fleetctl.cli.main", "-i", str(inv_path), "-l", "lab1,lab2,lab3", "shell", "true"]
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = [line.split(" fleetctl.ssh: ", 1)[1] for line in ok.stderr.splitlines() if " fleetctl.ssh: " in line]
    known = lab_fleet.known_hosts
    assert lines == [
        f"fleetctl ignores '-o StrictHostKeyChecking=no' (ansible_ssh_common_args, host lab1) and still checks "
        f"host keys, against {known} (pin new hosts with `fleetctl hosts trust`)",
        f"fleetctl ignores '-o UserKnownHostsFile=/dev/null' (ansible_ssh_common_args, host lab1) and still checks "
        f"host keys, against {known} (pin new hosts with `fleetctl hosts trust`)",
        "ssh option '-C' (ansible_ssh_common_args, host lab1) is not honoured by fleetctl; ignored",
    ]
    # ... and checked they are: with lab2's key unknown, lab2 is refused whatever the options say.
    with lab_fleet.rekey("lab2"):
        bad = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "lab2" in bad.stdout and "host key" in (bad.stdout + bad.stderr).lower()
