"""The connect timeout bounds the key exchange too (issue 37): paramiko gave every key exchange a
fixed 15 s whatever ansible_timeout said, so a controller starting 1,000 handshakes at once lost
hosts whose exchange waited longer for CPU, with the reason "EOFError".

lab1 is reached through a ProxyCommand relay that passes sshd's banner at once and then holds
everything else sshd sends for a while: the key exchange takes that long."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lab_support import LabHandle, user_inventory

from fleetctl.inventory import load_inventory
from fleetctl.transport.base import Status
from fleetctl.transport.fleet import Fleet, RunSettings

pytestmark = pytest.mark.lab
# stdin -> sshd at once; sshd -> stdout: the banner line at once, the rest held for argv[2] seconds.
RELAY = """\
import os, select, socket, sys, time
sock = socket.create_connection((sys.argv[1], 22))
hold, until, held = float(sys.argv[2]), None, b""
while True:
    wait = None if until is None or not held else max(0.0, until - time.monotonic())
    ready, _, _ = select.select([0, sock], [], [], wait)
    if 0 in ready:
        data = os.read(0, 65536)
        if not data:
            break
        sock.sendall(data)
    if sock in ready:
        data = sock.recv(65536)
        if not data:
            break
        if until is None and b"\\n" in data:
            line, _, rest = data.partition(b"\\n")
            os.write(1, line + b"\\n")
            until, data = time.monotonic() + hold, rest
        if until is None:
            os.write(1, data)
        else:
            held += data
    if held and until is not None and time.monotonic() >= until:
        os.write(1, held)
        held = b""
"""


def ping_through_relay(lab: LabHandle, tmp_path: Path, hold: float, timeout: float) -> tuple[Status, str]:
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    proxy = f"{sys.executable} {relay} {lab.addresses['lab1']} {hold:g}"
    inv_path = user_inventory(lab, tmp_path / "hosts.yml", user="root", host_vars={
        "lab1": {"ansible_ssh_common_args": f"-o 'ProxyCommand={proxy}'"}})
    inv = load_inventory(inv_path)
    with Fleet(inv, inv.select("lab1"), RunSettings(connect_timeout=timeout)) as fleet:
        result = fleet.map(lambda ctx: ctx.ping().python)["lab1"]
    return result.status, result.reason


def test_a_key_exchange_longer_than_15s_within_the_connect_timeout_succeeds(
        lab_fleet: LabHandle, tmp_path: Path) -> None:
    status, reason = ping_through_relay(lab_fleet, tmp_path, hold=17, timeout=40)
    assert status is Status.OK, reason


def test_a_key_exchange_past_the_connect_timeout_says_so(lab_fleet: LabHandle, tmp_path: Path) -> None:
    status, reason = ping_through_relay(lab_fleet, tmp_path, hold=12, timeout=4)
    assert status is Status.UNREACHABLE
    assert reason == (f"cannot connect to {lab_fleet.addresses['lab1']}:22: the key exchange did not finish "
                      "within 4s (the connect timeout, ansible_timeout: the host or this controller too busy "
                      "to answer in time)")
