"""A tarpit among 16 healthy hosts: a TCP listener on the host's address that accepts and never says a
word (an sshd wedged before its banner, a half-dead load balancer). fleetctl gives up on it at its
connect timeout, as the tarpit sees it (from the first connection accepted to the last one closed by
fleetctl); it is `unreachable` with one line naming it, and all 16 others answer, left as they were."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from cli_support import run_cli, wall_clock
from lab_support import _NET, LabHandle, lab_usable, private_lab, worker_lab_dir
from reliability_support import ARRIVAL_LAG, assert_timeout_honoured, assert_whole, fault_happened, wait_until

pytestmark = pytest.mark.lab
HOSTS = 16
TARPIT = f"127.{_NET}.81.1"
CONNECT = 4  # the tarpit's ansible_timeout


class Tarpit:
    """Accepts on TARPIT:22 and holds every connection open, silent, until the client closes it or
    the tarpit stops; records when each was accepted and when its client closed it (time.monotonic())."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_server((address, 22), backlog=64)
        self.accepted: list[socket.socket] = []
        self.times: list[tuple[float, float | None]] = []  # (accepted, closed by the client), in order
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed: stop
            self.accepted.append(conn)
            self.times.append((time.monotonic(), None))
            threading.Thread(target=self._hold, args=(conn, len(self.times) - 1), daemon=True).start()

    def _hold(self, conn: socket.socket, index: int) -> None:
        try:
            while conn.recv(4096):  # the client's banner and key exchange go unanswered
                pass
        except OSError:
            pass
        self.times[index] = (self.times[index][0], time.monotonic())

    def held_since(self, first: int) -> float:
        """From the first connection accepted since index ``first`` to the last one closed by its client
        (each of them closed, waited for): how long fleetctl waited on the tarpit."""
        fault_happened(len(self.times) > first, "the tarpit accepted a connection (fleetctl reached it)")
        wait_until(lambda: all(closed is not None for _, closed in self.times[first:]),
                   "fleetctl closed every connection to the tarpit", timeout=30)
        spans = self.times[first:]
        return max(closed or 0.0 for _, closed in spans) - min(at for at, _ in spans)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (a bare close does not)
        self.sock.close()
        self.thread.join(5)
        for conn in self.accepted:
            conn.close()


@pytest.fixture(scope="module")
def fleet16(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabHandle, Path, Tarpit]]:
    """16 lab hosts (started once for the module), a tarpit, and an inventory holding all 17."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    with private_lab(worker_lab_dir("test-lab-tarpit"), HOSTS, f"127.{_NET}.80.0") as lab:
        doc = yaml.safe_load(lab.inventory_path.read_text())
        hosts = doc["all"]["children"]["lab"]["hosts"]
        hosts["tarpit"] = dict(hosts["lab1"], ansible_host=TARPIT, service_host=TARPIT, ansible_timeout=CONNECT)
        inventory = lab.dir / "with-tarpit.yml"  # beside the lab's key and known_hosts (relative paths)
        inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
        tarpit = Tarpit(TARPIT)
        try:
            yield lab, inventory, tarpit
        finally:
            tarpit.close()


def assert_tarpit_unreachable(result: dict[str, dict[str, object]], tarpit: Tarpit) -> None:
    fault_happened(tarpit.accepted, "the tarpit accepted a connection (fleetctl reached it)")
    entry = result["tarpit"]
    assert entry["status"] == "unreachable", entry
    assert entry["reason"] == (f"cannot connect to {TARPIT}:22: no SSH banner within {CONNECT}s (the port accepts "
                               "connections, but nothing answers)"), entry


def test_ping_with_a_tarpit_among_16_finishes_in_the_connect_timeout(
        fleet16: tuple[LabHandle, Path, Tarpit], capsys: pytest.CaptureFixture[str]) -> None:
    lab, inventory, tarpit = fleet16
    first = len(tarpit.times)
    with wall_clock() as took:
        r = run_cli(capsys, "-i", str(inventory), "ping", "--json")
    assert r.rc == 2, r.out + r.err
    hosts = r.json()["hosts"]
    assert_tarpit_unreachable(hosts, tarpit)
    assert_timeout_honoured(tarpit.held_since(first), CONNECT, "ping: the tarpit held", lag=ARRIVAL_LAG)
    assert sorted(h for h, v in hosts.items() if v["status"] == "ok") == sorted(lab.hosts)
    assert took.seconds < CONNECT + 60, took  # the whole command: never a hang
    human = run_cli(capsys, "-i", str(inventory), "ping")
    assert f"tarpit: unreachable: cannot connect to {TARPIT}:22" in " ".join(human.err.split()) + human.out
    with ThreadPoolExecutor(8) as pool:  # every healthy host left as it was: no lock held, nothing written
        list(pool.map(lambda h: assert_whole(lab, h, None, serving=False), lab.hosts))


def test_run_with_a_tarpit_among_16_finishes_in_the_connect_timeout(
        fleet16: tuple[LabHandle, Path, Tarpit], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inventory, tarpit = fleet16
    book = tmp_path / "hello.yml"
    book.write_text(yaml.safe_dump([{"name": "hello", "hosts": "all", "tasks": [
        {"name": "say", "shell": "hostname", "register": "out"}]}]))
    first = len(tarpit.times)
    with wall_clock() as took:
        r = run_cli(capsys, "-i", str(inventory), "run", str(book), "--json")
    assert r.rc == 2, r.out + r.err
    doc = r.json()
    assert doc["recap"]["tarpit"]["unreachable"] == 1, doc["recap"]
    assert all(doc["recap"][h]["ok"] == 1 and doc["recap"][h]["failed"] == 0 for h in lab.hosts), doc["recap"]
    assert_timeout_honoured(tarpit.held_since(first), CONNECT, "run: the tarpit held", lag=ARRIVAL_LAG)
    assert took.seconds < CONNECT + 60, took  # the whole command: never a hang
    with ThreadPoolExecutor(8) as pool:  # every healthy host left as it was: no lock held, nothing half-written
        list(pool.map(lambda h: assert_whole(lab, h, None, serving=False), lab.hosts))
