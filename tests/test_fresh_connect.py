"""What a fresh connection reads once per run instead of once per host (issue 23): a known_hosts
file's pins (plain and hashed names, @revoked, a later line winning), and how a fan-out is cut
into worker shares; how often an open connection's thread wakes while idle (issue 37)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest
from lab_support import LabHandle

from fleetctl.transport import hostkeys
from fleetctl.transport.spread import shares, worker_count


def _line(name: str, b64: str) -> str:
    return f"{name} ssh-ed25519 {b64}\n"


def _b64(seed: int) -> str:
    # a valid ed25519 public key blob: type string + 32 bytes
    blob = b"\x00\x00\x00\x0bssh-ed25519" + b"\x00\x00\x00\x20" + bytes([seed]) * 32
    return base64.b64encode(blob).decode()


def test_pins_for_one_name_plain_hashed_and_revoked(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("[10.0.0.2]:2222")
    known.write_text("# comment\n" + _line("10.0.0.1", _b64(1)) + _line(hashed, _b64(2))
                     + _line("10.0.0.3,10.0.0.1", _b64(3))  # a later line for 10.0.0.1 wins
                     + f"@revoked 10.0.0.9 ssh-ed25519 {_b64(9)}\n" + "garbage line\n")
    one, revoked = hostkeys.pinned_for(known, "10.0.0.1")
    assert one["ssh-ed25519"].get_base64() == _b64(3)
    two, _ = hostkeys.pinned_for(known, "[10.0.0.2]:2222")
    assert two["ssh-ed25519"].get_base64() == _b64(2)
    assert hostkeys.pinned_for(known, "10.0.0.7")[0] == {}
    assert revoked == frozenset({_b64(9)})


def test_pins_are_read_again_when_the_file_changes(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(_line("h1", _b64(1)))
    assert hostkeys.pinned_for(known, "h1")[0]["ssh-ed25519"].get_base64() == _b64(1)
    known.write_text(_line("h1", _b64(4)) + _line("h2", _b64(5)))  # e.g. `fleetctl hosts trust` re-pinned
    assert hostkeys.pinned_for(known, "h1")[0]["ssh-ed25519"].get_base64() == _b64(4)
    assert hostkeys.pinned_for(known, "h2")[0]["ssh-ed25519"].get_base64() == _b64(5)
    known.unlink()
    assert hostkeys.pinned_for(known, "h1") == ({}, frozenset())


def test_shares_are_contiguous_and_cover_every_host() -> None:
    assert shares(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    assert shares(2, 4) == [range(0, 1), range(1, 2)]
    assert sum(len(r) for r in shares(200, 16)) == 200


def test_worker_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETCTL_WORKERS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    assert worker_count(10, 0) == 1  # too few hosts to pay for a worker
    assert worker_count(200, 0) == 8  # one per core
    assert worker_count(60, 0) == 2  # one per 24 hosts
    monkeypatch.setenv("FLEETCTL_WORKERS", "1")
    assert worker_count(200, 0) == 1
    monkeypatch.setenv("FLEETCTL_WORKERS", "3")
    assert worker_count(2, 0) == 2


def test_connections_offer_aes_gcm_first_and_keep_paramikos_set() -> None:
    """AES-GCM leads the cipher offer (one pass, no separate MAC: cheaper for the overlay's bulk
    streams); nothing is added or dropped, so a server without it negotiates as before."""
    import socket

    import paramiko

    from fleetctl.transport.paramiko_transport import make_transport

    left, right = socket.socketpair()
    try:
        offered = make_transport(left).get_security_options().ciphers
        assert offered[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
        assert sorted(offered) == sorted(paramiko.Transport(right).get_security_options().ciphers)
    finally:
        left.close()
        right.close()


@pytest.mark.lab
def test_an_open_connection_wakes_its_thread_at_most_once_a_second(lab_fleet: LabHandle,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's connections stay open until its end, and paramiko's thread of each woke 10 times a
    second to find nothing: at 1,000 hosts those wake-ups were half the controller's CPU per host.
    Each wake-up that finds nothing is one ``_check_keepalive``: counted over 3 idle seconds."""
    from paramiko.packet import Packetizer

    from fleetctl.inventory import load_inventory
    from fleetctl.transport.fleet import Fleet

    wakeups: list[float] = []
    ours: set[int] = set()  # this test's connections: others the worker process holds wake on their own
    check, init = Packetizer._check_keepalive, Packetizer.__init__

    def tagged(self: Packetizer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        ours.add(id(self))

    def counted(self: Packetizer) -> None:
        if id(self) in ours:
            wakeups.append(time.monotonic())
        check(self)

    monkeypatch.setattr(Packetizer, "__init__", tagged)
    monkeypatch.setattr(Packetizer, "_check_keepalive", counted)
    inv = load_inventory(lab_fleet.inventory_path)
    with Fleet(inv, inv.select("lab1")) as fleet:
        assert fleet.map(lambda ctx: ctx.ping().python)["lab1"].ok
        wakeups.clear()
        time.sleep(3)
        idle = len(wakeups)
    assert idle <= 4, f"{idle} wake-ups in 3 idle seconds (paramiko's default timeout wakes 30 times)"
