"""The lab's links (fleetctl/lab/links.py): with a rate set, a transfer between two lab hosts cannot go
faster than it, in both directions of a host; the shaping is gone with ``links --off`` (and lab down)."""

from __future__ import annotations

import subprocess
import time

import pytest
from lab_support import LabHandle

pytestmark = pytest.mark.lab
RATE = 4_000_000  # bytes/s
SIZE = 8_000_000


def push(lab: LabHandle, sender: str, receiver: str) -> float:
    """Seconds for ``sender`` to ssh SIZE bytes to ``receiver`` (its own ssh, as models sync's links)."""
    command = (f"head -c {SIZE} /dev/zero | ssh -o BatchMode=yes -o StrictHostKeyChecking=no "
               f"-o UserKnownHostsFile=/dev/null -i /root/.ssh/lab_key root@{lab.addresses[receiver]} 'cat >/dev/null'")
    start = time.monotonic()
    lab.ssh(sender, command)
    return time.monotonic() - start


def test_a_rate_caps_host_to_host_transfers_and_off_removes_it(scratch_lab: LabHandle) -> None:
    lab = scratch_lab
    for host in lab.hosts:  # the lab's client key on each host, to reach the other
        path = lab.dir / "hosts" / host / "root" / ".ssh"
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        (path / "lab_key").write_bytes(lab.key_path.read_bytes())
        (path / "lab_key").chmod(0o600)
    with lab.links(RATE):
        shown = subprocess.run(["tc", "class", "show", "dev", "lo"], capture_output=True, text=True).stdout
        assert shown.count("rate 32Mbit") >= 2, shown
        # a lower bound only: shaping can make a transfer slower, never faster
        assert push(lab, "lab1", "lab2") >= 0.8 * SIZE / RATE
        assert push(lab, "lab2", "lab1") >= 0.8 * SIZE / RATE
    shown = subprocess.run(["tc", "class", "show", "dev", "lo"], capture_output=True, text=True).stdout
    assert "rate 32Mbit" not in shown
    config = (lab.dir / "hosts" / "lab1" / "etc" / "ssh" / "ssh_config").read_text()
    assert "BindAddress" not in config
