"""How many connections one process opens at once (issue 37): at 1,000 fresh hosts every handshake
started together waited behind all the others. The bound is honoured on real lab hosts, every host
still answers (the forks still cover them all), and the answers are those of an unbounded run."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from lab_support import LabHandle

from fleetctl.inventory import load_inventory
from fleetctl.transport import paramiko_transport
from fleetctl.transport.fleet import Fleet, RunSettings

START_CLIENT = paramiko_transport.QuietTransport.start_client


def test_limit_is_per_core_and_the_environment_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETCTL_HANDSHAKES", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(4)))
    assert paramiko_transport.handshake_limit() == 4 * paramiko_transport.HANDSHAKES_PER_CORE
    monkeypatch.setenv("FLEETCTL_HANDSHAKES", "0")  # no bound: every fork opens at once
    assert paramiko_transport.handshake_limit() == 0
    monkeypatch.setenv("FLEETCTL_HANDSHAKES", "3")
    assert paramiko_transport.handshake_limit() == 3


class _InFlight:
    """Counts key exchanges under way; each waits until ``companions`` are under way together (or
    every host's has begun), so an unbounded run shows them all at once, a bounded one its bound.
    The wait's limit only keeps a broken run from hanging."""

    def __init__(self, companions: int, hosts: int) -> None:
        self.now = self.most = self.begun = 0
        self.companions, self.hosts = companions, hosts
        self.cond = threading.Condition()

    def wrap(self, original: Any) -> Any:
        def start_client(transport: Any, event: Any = None, timeout: Any = None) -> None:
            with self.cond:
                self.now += 1
                self.begun += 1
                self.most = max(self.most, self.now)
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.now >= self.companions or self.begun == self.hosts, timeout=120)
            try:
                return original(transport, event, timeout)
            finally:
                with self.cond:
                    self.now -= 1

        return start_client


def _hostnames(lab: LabHandle, monkeypatch: pytest.MonkeyPatch, bound: int) -> tuple[dict[str, Any], int]:
    monkeypatch.setenv("FLEETCTL_HANDSHAKES", str(bound))
    monkeypatch.setattr(paramiko_transport, "_slots", (0, None))  # read the bound again in this process
    seen = _InFlight(companions=bound or len(lab.hosts), hosts=len(lab.hosts))
    monkeypatch.setattr(paramiko_transport.QuietTransport, "start_client",
                        seen.wrap(START_CLIENT))
    inv = load_inventory(lab.inventory_path)
    with Fleet(inv, inv.select("all"), RunSettings(forks=len(lab.hosts), workers=1)) as fleet:
        results = fleet.map(lambda ctx: ctx.ping().hostname)
    return {name: (r.status, r.value) for name, r in results.items()}, seen.most


@pytest.mark.lab
def test_opens_at_most_the_bound_at_once_with_the_same_answers(lab_fleet: LabHandle,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    unbounded, most_unbounded = _hostnames(lab_fleet, monkeypatch, 0)
    bounded, most_bounded = _hostnames(lab_fleet, monkeypatch, 2)
    assert most_unbounded == len(lab_fleet.hosts)  # the forks did start every handshake together
    assert most_bounded == 2
    assert bounded == unbounded
    assert {value for _status, value in bounded.values()} == set(lab_fleet.hosts)
