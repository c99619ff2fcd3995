"""Kept connections (``--persist``) on real lab hosts: reuse, liveness, trust, scope and clean-up."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from lab_support import LabHandle, wait_gone
from reliability_support import wait_until

from fleetctl.cli.context import AppContext
from fleetctl.errors import RemoteOperationError
from fleetctl.inventory import load_inventory
from fleetctl.transport import mux
from fleetctl.transport.base import Step
from fleetctl.transport.fleet import Fleet, RunSettings

pytestmark = pytest.mark.lab
PERSIST = RunSettings(persist=60)







def _agent_pids(inventory: Path, hosts: str = "all", **extra: str) -> dict[str, int]:
    inv = load_inventory(inventory, dict(extra))
    with Fleet(inv, inv.select(hosts), PERSIST) as fleet:
        res = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"})["pid"])
    assert all(r.ok for r in res.values()), {n: r.reason for n, r in res.items()}
    return {n: int(r.value) for n, r in res.items() if r.value is not None}


def test_agents_are_kept_between_commands_and_stop_ends_them(lab_fleet: LabHandle, mux_dir: Path) -> None:
    first = _agent_pids(lab_fleet.inventory_path)
    second = _agent_pids(lab_fleet.inventory_path)
    assert second == first  # the next command used the same agent on every host
    assert set(first) == set(lab_fleet.hosts)
    kept = mux.server_status(mux.socket_path(mux_dir))
    assert kept is not None and sorted(k["host"] for k in kept) == sorted(lab_fleet.hosts)
    assert mux.stop_server(mux.socket_path(mux_dir)) == len(lab_fleet.hosts)
    assert not mux.socket_path(mux_dir).exists()
    assert wait_gone(list(first.values())) == [], "an agent outlived its kept connection"


def test_cli_persist_ping_list_and_stop(lab_fleet: LabHandle, mux_dir: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(lab_fleet.inventory_path)
    assert run_cli(capsys, "-i", inv, "connections", "list").out.startswith("no persistent-connection server")
    for _ in range(2):
        r = run_cli(capsys, "-i", inv, "--persist", "30", "ping", "--json")
        assert r.rc == 0, r.err
        assert all(h["status"] == "ok" for h in r.json()["hosts"].values())
    listed = run_cli(capsys, "-i", inv, "--json", "connections", "list").json()
    assert listed["running"] and {c["host"] for c in listed["connections"]} == set(lab_fleet.hosts)
    assert all(c["pythons"] == ["/usr/bin/python3"] and not c["in_use"] for c in listed["connections"]), listed
    human = run_cli(capsys, "-i", inv, "connections", "list").out
    assert "lab1" in human and f"{len(lab_fleet.hosts)} kept connection(s)" in human
    stopped = run_cli(capsys, "-i", inv, "connections", "stop")
    assert stopped.rc == 0 and f"closed {len(lab_fleet.hosts)} connection(s)" in stopped.out
    assert run_cli(capsys, "-i", inv, "--json", "connections", "list").json()["running"] is False


def test_a_kept_agent_that_died_is_replaced_before_the_command(lab_fleet: LabHandle, mux_dir: Path) -> None:
    first = _agent_pids(lab_fleet.inventory_path, "lab1")
    os.kill(first["lab1"], signal.SIGKILL)  # lab hosts share this machine's pid namespace
    assert wait_gone([first["lab1"]]) == []
    again = _agent_pids(lab_fleet.inventory_path, "lab1")
    assert again["lab1"] != first["lab1"]  # a new connection and agent, and the command succeeded


def test_a_changed_known_hosts_opens_a_new_checked_connection(lab_fleet: LabHandle, mux_dir: Path,
                                                             tmp_path: Path) -> None:
    first = _agent_pids(lab_fleet.inventory_path, "lab1")
    # The same host with a known_hosts that does not hold its key: refused, not served by the kept one.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = load_inventory(lab_fleet.inventory_path, {"fleetctl_known_hosts": str(empty)})
    with Fleet(inv, inv.select("lab1"), PERSIST) as fleet:
        res = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"}))
    assert res["lab1"].status == "unreachable" and "known_hosts" in res["lab1"].reason
    # Re-pinning the file (same content, new mtime) also means a new connection, checked again.
    os.utime(lab_fleet.known_hosts, ns=(time.time_ns(), time.time_ns()))
    assert _agent_pids(lab_fleet.inventory_path, "lab1")["lab1"] != first["lab1"]


def test_changes_never_use_kept_connections(lab_fleet: LabHandle, mux_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    app = AppContext((str(lab_fleet.inventory_path),), None, 4, False, 0, persist=30)
    with app.fleet(read_only=False) as fleet:
        assert fleet.settings.persist == 0
    with app.fleet(read_only=True) as fleet:
        assert fleet.settings.persist == 30
    r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "--persist", "30", "-l", "all", "shell", "true")
    assert r.rc == 0, r.err
    assert mux.server_status(mux.socket_path(mux_dir)) is None  # the shell command started no server


def test_an_import_probe_sees_a_changed_package_through_a_kept_agent(
    lab_fleet: LabHandle, mux_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    venv = "/root/persist-venv"
    lab_fleet.ssh("lab1", f"test -x {venv}/bin/python || python3 -m venv --without-pip {venv}")
    site = lab_fleet.ssh("lab1", f"{venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'")
    module = f"{site.stdout.strip()}/persist_demo.py"
    inv = str(lab_fleet.inventory_path)

    def probe(expect: str) -> int:
        return run_cli(capsys, "-i", inv, "-l", "lab1", "--persist", "30", "probe", "import",
                       "persist_demo:NEW_NAME", "--venv", venv, "--expect", expect).rc

    try:
        lab_fleet.ssh("lab1", f"echo 'OLD_NAME = 1' > {module}")
        assert probe("absent") == 0
        # A deploy changed the package. Not to the same size: within the same second Python's own
        # bytecode check (source mtime in seconds and size) would take the first import's .pyc.
        lab_fleet.ssh("lab1", f"echo 'NEW_NAME = 2  # the new release' > {module}")
        assert probe("present") == 0  # not the module an earlier command imported
        listed = mux.server_status(mux.socket_path(mux_dir)) or []
        assert any(f"{venv}/bin/python" in c["pythons"] for c in listed)  # the venv got an agent of its own
    finally:
        lab_fleet.ssh("lab1", f"rm -rf {venv}", check=False)


def test_a_socket_folder_others_can_enter_is_refused(lab_fleet: LabHandle, mux_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    mux_dir.mkdir(mode=0o755)
    mux_dir.chmod(0o755)
    r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "--persist", "30", "ping")
    assert r.rc == 3
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and str(mux_dir) in lines[0] and "0700" in lines[0]


def test_the_server_closes_everything_after_its_idle_time(lab_fleet: LabHandle, mux_dir: Path) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with Fleet(inv, inv.select("lab1"), RunSettings(persist=1)) as fleet:
        pid = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"})["pid"])["lab1"].value
    assert pid is not None
    deadline = time.monotonic() + 15
    while mux.socket_path(mux_dir).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mux.socket_path(mux_dir).exists(), "the server outlived its idle time"
    assert wait_gone([int(pid)]) == [], "the host's agent outlived the server"


def test_a_fleet_ping_gives_every_host_its_own_result_and_reopens_a_dead_one(
    lab_fleet: LabHandle, mux_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    inv = str(lab_fleet.inventory_path)
    first = _agent_pids(lab_fleet.inventory_path)
    os.kill(first["lab1"], signal.SIGKILL)  # lab1's kept agent dies between commands
    assert wait_gone([first["lab1"]]) == []
    with lab_fleet.stop("lab2"):  # lab2 goes down with its kept connection
        r = run_cli(capsys, "-i", inv, "--persist", "30", "ping", "--json")
    assert r.rc == 2, r.err
    hosts = r.json()["hosts"]
    assert list(hosts) == sorted(lab_fleet.hosts)  # in host order, one entry each
    assert hosts["lab1"]["status"] == "ok" and hosts["lab1"]["value"]["hostname"] == "lab1"
    assert hosts["lab2"]["status"] == "unreachable" and "127." in hosts["lab2"]["reason"], hosts["lab2"]
    assert all(hosts[h]["status"] == "ok" for h in lab_fleet.hosts if h not in ("lab1", "lab2"))
    again = _agent_pids(lab_fleet.inventory_path, "lab1,lab3")
    assert again["lab1"] != first["lab1"]  # re-opened before its ping, not reported dead
    assert again["lab3"] == first["lab3"]  # the others stayed kept


def test_a_sequence_through_a_kept_connection_runs_in_order_to_the_first_failure(
        lab_fleet: LabHandle, mux_dir: Path) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    steps = [Step("selftest", {"action": "echo"}), Step("selftest", {"action": "raise", "message": "bad on lab1"}),
             Step("selftest", {"action": "echo"})]
    with Fleet(inv, inv.select("lab1"), PERSIST) as fleet:
        ctx = fleet.contexts["lab1"]
        pid = ctx.call("selftest", {"action": "echo"})["pid"]
        first, failed = ctx.sequence(steps)  # the third step never ran
    assert first["pid"] == pid  # the kept agent ran it
    assert isinstance(failed, RemoteOperationError) and failed.host == "lab1"
    assert failed.etype == "RuntimeError" and "bad on lab1" in failed.reason


def test_a_fleet_ping_waits_for_a_kept_agent_another_command_is_using(
    lab_fleet: LabHandle, mux_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    first = _agent_pids(lab_fleet.inventory_path)
    inv = load_inventory(lab_fleet.inventory_path)
    started = f"/tmp/fleetctl-busy-agent-{os.getpid()}-{time.monotonic_ns()}"  # made by the request on lab1
    ended: list[float] = []
    released: list[float] = []

    def hold(ctx: Any) -> Any:  # held until the test removes `started` (at most 120 s)
        answer = ctx.call("selftest", {"action": "sleep", "seconds": 120, "started": started, "until_removed": True})
        ended.append(time.monotonic())
        return answer

    def release_later() -> None:  # once the ping below is under way (it must wait for the hold)
        time.sleep(3)
        released.append(time.monotonic())  # before the hold can end: nothing after it is ordered by threads
        lab_fleet.ssh("lab1", f"rm -f {started}")

    with Fleet(inv, inv.select("lab1"), PERSIST) as fleet, ThreadPoolExecutor(1) as pool:
        # Another command's request runs on lab1's kept agent while the fleet is pinged.
        busy = pool.submit(fleet.map, hold)
        wait_until(lambda: lab_fleet.ssh("lab1", f"test -e {started}", check=False).returncode == 0,
                   "the other command's request running on lab1's kept agent", timeout=30,
                   alive=lambda: not busy.done() or busy.result())
        assert not busy.done()  # still running as the ping starts: it ends only when `started` is removed
        releaser = threading.Thread(target=release_later)
        releaser.start()
        r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "--persist", "30", "ping", "--json")
        releaser.join()
        pinged = time.monotonic()
        assert busy.result()["lab1"].ok
    lab_fleet.ssh("lab1", f"rm -f {started}")
    assert r.rc == 0, r.err
    hosts = r.json()["hosts"]
    assert all(hosts[h]["status"] == "ok" and hosts[h]["value"]["hostname"] == h for h in lab_fleet.hosts), hosts
    # lab1 answered the ping only once the other request was done, so after it was released (a
    # ping that did not wait would be back within the 3 s before that); `ended` is recorded by
    # another thread and may come a moment after the ping's answer.
    assert ended and released and released[0] <= pinged
    assert _agent_pids(lab_fleet.inventory_path) == first  # every host answered on its kept agent


def test_frozen_kept_agents_are_replaced_and_every_other_host_answers(
    lab_fleet: LabHandle, mux_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    quick = {"ansible_timeout": "2"}  # how long a kept agent's check waits before it is replaced
    first = _agent_pids(lab_fleet.inventory_path, **quick)
    frozen = [first["lab1"], first["lab3"]]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # alive, connection up, never answering
    try:
        r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "-e", "ansible_timeout=2", "--persist", "30",
                    "ping", "--json")
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
    assert r.rc == 0, r.err
    hosts = r.json()["hosts"]
    assert all(hosts[h]["status"] == "ok" and hosts[h]["value"]["hostname"] == h for h in lab_fleet.hosts), hosts
    again = _agent_pids(lab_fleet.inventory_path, **quick)
    assert again["lab1"] != first["lab1"] and again["lab3"] != first["lab3"]  # new connections and agents
    assert again["lab2"] == first["lab2"]  # the one that answered stayed kept
