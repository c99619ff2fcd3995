"""The lab's links (fleetctl/lab/links.py, netfaults.py): with a rate set, a transfer between two lab
hosts cannot go faster than it, in both directions of a host; a partition drops, a delay relays; the
shaping and the faults are gone with ``links --off`` (and lab down), and only the lab's own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from lab_support import LabHandle, process_gone, wait_gone

from fleetctl.lab import lab_down, netfaults

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


def nft_tables() -> list[str]:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout.splitlines()


def lab_links(lab: LabHandle, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "lab", "links", "--dir", str(lab.dir), *args],
                          capture_output=True, text=True, timeout=120)


def connect(address: str) -> str:
    """What a TCP connect to the host's ssh port gets within 3 s: its banner, "refused" or "silence"."""
    try:
        with socket.create_connection((address, 22), timeout=3) as sock:
            return sock.recv(7).decode()
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "silence"


def test_partition_delay_and_off_touch_only_the_labs_own_table(scratch_lab: LabHandle) -> None:
    """A partition drops (silence, never a refusal) and heals; a delay runs a relay in front of the
    host's sshd; --off and lab down remove the lab's table and relays and leave other tables alone."""
    lab, table = scratch_lab, f"ip {netfaults.table_name(scratch_lab.dir)}"
    decoy = f"fleetctl_test_decoy_{os.getpid()}"
    subprocess.run(["nft", "add", "table", "ip", decoy], check=True)
    try:
        assert lab_links(lab, "--partition", "--host", "lab1").stdout == (
            "link of lab1: partitioned (every packet dropped)\n")
        assert (connect(lab.addresses["lab1"]), connect(lab.addresses["lab2"])) == ("silence", "SSH-2.0")
        assert lab_links(lab, "--heal", "--host", "lab1").stdout == "link of lab1: no faults\n"
        assert connect(lab.addresses["lab1"]) == "SSH-2.0"
        assert lab_links(lab, "--delay", "100", "--host", "lab2").stdout == "link of lab2: 100 ms delay each way\n"
        relay = netfaults.load(lab.dir)["lab2"].relay_pid
        assert not process_gone(relay) and lab.ssh("lab2", "hostname").stdout == "lab2\n"
        assert f"table {table}" in nft_tables()
        off = lab_links(lab, "--off")
        assert off.stdout == "links of 2 lab hosts: unshaped, no faults\n", off.stdout + off.stderr
        assert f"table {table}" not in nft_tables() and wait_gone([relay]) == []
        assert f"table ip {decoy}" in nft_tables()
        # one line each for what cannot be done
        bad = lab_links(lab, "--loss", "5", "--host", "lab9")
        assert (bad.returncode, bad.stderr.strip().splitlines()[-1]) == (
            3, f"Error: no lab host lab9 in {lab.dir} (hosts: lab1, lab2)"), bad.stderr
        bad = lab_links(lab, "--rate", "1M", "--host", "lab1")
        assert bad.returncode == 3 and "--rate applies to every lab host" in bad.stderr, bad.stderr
        # lab down takes them with it
        assert lab_links(lab, "--loss", "5", "--delay", "50").returncode == 0
        relays = [link.relay_pid for link in netfaults.load(lab.dir).values()]
        lab_down(lab.dir)
        assert f"table {table}" not in nft_tables() and wait_gone(relays) == []
    finally:
        subprocess.run(["nft", "delete", "table", "ip", decoy], check=False)
