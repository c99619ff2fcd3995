"""The release story on a lab host booted by a real systemd (fleetctl/lab/systemd_host.py): with no
``service_manager`` set, fleetctl finds systemd there and deploys a unit, restarts it, reads its logs
from journald, rolls back, and the enabled server comes back by itself after the host reboots."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cli_support import run_cli
from lab_support import (
    _NET,
    LabHandle,
    host_processes,
    lab_usable,
    listeners_on,
    process_gone,
    unhealthy_release_spec,
    user_inventory,
    wait_gone,
)
from systemd_support import (
    HOST,
    Follow,
    cli,
    deploy,
    health,
    host_listeners,
    journal_followers,
    sh,
    spec,
    systemd_lab,
    systemd_lab_dir,
    unit,
)

from fleetctl.lab import LabPaths, lab_down, lab_up
from fleetctl.lab.reboot import serve_restarts
from fleetctl.lab.systemd_host import host_cgroup, running_init

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def sd_lab() -> Iterator[LabHandle]:
    why = lab_usable()
    if why:
        pytest.skip(why)
    with systemd_lab("test-lab-systemd", f"127.{_NET}.90.0") as lab:
        lab.ssh(HOST, "/usr/bin/python3 -m venv --without-pip /root/ml-env")
        yield lab


def test_the_host_boots_systemd_with_only_its_own_units(sd_lab: LabHandle) -> None:
    lab = sd_lab
    assert sh(lab, "systemctl is-system-running --wait") == "running"
    assert sh(lab, "cat /proc/1/comm") == "systemd"
    running = sh(lab, "systemctl list-units --type=service --state=running --no-legend --plain").splitlines()
    names = {line.split()[0] for line in running}
    base = {"fleetctl-lab-sshd.service", "systemd-journald.service"}
    assert base <= names <= base | {"dbus.service", "sglang.service"}  # the bus starts when first asked
    # Nothing of the host listens beyond its own address (its sshd, the server): no 0.0.0.0.
    sockets = host_listeners(lab)
    assert sockets and {address for address, _port in sockets} == {lab.addresses[HOST]}


def test_a_boot_leaves_the_machines_tmp_alone(sd_lab: LabHandle, tmp_path: Path) -> None:
    """systemd-tmpfiles would empty a month-old /tmp file; the host's /tmp is its own tmpfs."""
    old = Path("/tmp") / f"fleetctl-systemd-host-sentinel-{os.getpid()}"
    old.write_text("kept\n")
    month_ago = time.time() - 30 * 86400
    os.utime(old, (month_ago, month_ago))
    try:
        with sd_lab.stop(HOST):  # a power-off, then a boot
            pass
        assert sh(sd_lab, "systemctl is-system-running --wait") == "running"
        assert old.read_text() == "kept\n"
        assert sd_lab.ssh(HOST, f"test -e {old}", check=False).returncode == 1
        sh(sd_lab, "touch /tmp/made-on-the-host")
        assert not Path("/tmp/made-on-the-host").exists()
    finally:
        old.unlink(missing_ok=True)


def test_deploy_restart_logs_and_rollback_under_systemd(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = sd_lab
    first = deploy(capsys, lab, spec(tmp_path, "1"))
    assert (sh(lab, "systemctl is-active sglang.service"), sh(lab, "systemctl is-enabled sglang.service")) == (
        "active", "enabled")
    assert unit(lab, "FragmentPath") == "/etc/systemd/system/sglang.service"
    assert unit(lab, "Description").endswith(f"(fleetctl release {first})")
    pid = unit(lab, "MainPID")
    assert "sglang_standin.py" in sh(lab, f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert lab.ssh(HOST, "ls /var/lib/fleetctl/service/*supervisor*", check=False).returncode != 0
    server = cli(capsys, lab, "service", "status", "--json").json()["hosts"][HOST]["value"]["servers"][0]
    assert (server["manager"], server["running"], server["health"]) == ("systemd", True, "200")

    r = cli(capsys, lab, "service", "restart", "--json")
    assert r.rc == 0, r.out + r.err
    assert unit(lab, "MainPID") not in ("0", pid) and unit(lab, "ActiveState") == "active"

    second = deploy(capsys, lab, spec(tmp_path, "2"))
    assert unit(lab, "Description").endswith(f"(fleetctl release {second})")
    r = cli(capsys, lab, "rollback", "--json")
    assert r.rc == 0, r.out + r.err
    assert (r.json()["hosts"][HOST]["value"]["outcome"], r.json()["hosts"][HOST]["value"]["to"]) == (
        "rolled-back", first)
    assert unit(lab, "Description").endswith(f"(fleetctl release {first})")
    assert unit(lab, "ActiveState") == "active"

    logs = cli(capsys, lab, "logs", "-n", "30", "--json").json()["hosts"][HOST]["value"]
    assert any(f"systemd[1]: Started sglang.service - SGLang inference server (fleetctl release {first})" in line
               for line in logs["lines"]), logs


def test_a_server_that_fails_to_start_is_logged_by_journald(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = sd_lab
    good = deploy(capsys, lab, spec(tmp_path, "1"))
    r = cli(capsys, lab, "deploy", str(spec(tmp_path, "3", ", args: [--speculative-algorithm, BOGUS]")), "--json")
    assert r.rc == 2
    host = r.json()["hosts"][HOST]
    assert host["value"]["outcome"] == "rolled-back"
    assert "invalid choice: 'BOGUS'" in host["reason"] and "sglang.service: Main process exited" in host["reason"]
    assert unit(lab, "Description").endswith(f"(fleetctl release {good})") and unit(lab, "ActiveState") == "active"
    lines = cli(capsys, lab, "logs", "-n", "30", "--json").json()["hosts"][HOST]["value"]["lines"]
    assert any("error: argument --speculative-algorithm: invalid choice: 'BOGUS'" in line for line in lines), lines


def test_a_release_whose_health_gate_fails_is_rolled_back_under_systemd(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = sd_lab
    good = deploy(capsys, lab, spec(tmp_path, "1"))
    r = cli(capsys, lab, "deploy", str(unhealthy_release_spec(tmp_path)), "--json")
    assert r.rc == 2, r.out + r.err
    host = r.json()["hosts"][HOST]
    assert host["value"]["outcome"] == "rolled-back" and host["reason"].startswith("health gate failed: GET /health")
    assert unit(lab, "Description").endswith(f"(fleetctl release {good})") and unit(lab, "ActiveState") == "active"
    assert health(lab) == 200


def test_a_killed_server_is_restarted_by_systemd(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The unit's Restart=on-failure: systemd, not fleetctl, brings a server killed with SIGKILL back."""
    lab = sd_lab
    deploy(capsys, lab, spec(tmp_path, "1"))
    pid, restarts = unit(lab, "MainPID"), int(unit(lab, "NRestarts"))
    sh(lab, f"kill -9 {pid}")
    deadline = time.monotonic() + 120
    while int(unit(lab, "NRestarts")) == restarts or unit(lab, "ActiveState") != "active":
        assert time.monotonic() < deadline, sh(lab, "systemctl status sglang.service --no-pager; true")
        time.sleep(0.5)
    assert unit(lab, "MainPID") not in ("0", pid) and int(unit(lab, "NRestarts")) == restarts + 1
    assert health(lab) == 200
    server = cli(capsys, lab, "service", "status", "--json").json()["hosts"][HOST]["value"]["servers"][0]
    assert (server["manager"], server["running"]) == ("systemd", True)


def test_fleetop_needs_become_for_systemctl_and_gets_it_with_b(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = sd_lab
    deploy(capsys, lab, spec(tmp_path, "1"))
    inv = str(user_inventory(lab, tmp_path / "fleetop.yml"))
    r = run_cli(capsys, "-i", inv, "-l", "all", "service", "status", "--json")
    server = r.json()["hosts"][HOST]["value"]["servers"][0]
    assert (r.rc, server["manager"], server["running"]) == (0, "systemd", True), r.out + r.err
    pid = unit(lab, "MainPID")
    r = run_cli(capsys, "-i", inv, "-l", "all", "service", "restart", "--json")
    assert r.rc == 2
    assert "as fleetop: run with --become (-b)" in r.json()["hosts"][HOST]["reason"], r.out
    assert unit(lab, "MainPID") == pid
    r = run_cli(capsys, "-i", inv, "-l", "all", "-b", "service", "restart", "--json")
    assert r.rc == 0, r.out + r.err
    assert unit(lab, "MainPID") not in ("0", pid)
    r = run_cli(capsys, "-i", inv, "-l", "all", "-b", "deploy", str(spec(tmp_path, "2")), "--json")
    assert r.rc == 0, r.out + r.err
    assert unit(lab, "Description").endswith(f"(fleetctl release {r.json()['hosts'][HOST]['value']['release_id']})")


def test_a_status_systemd_cannot_answer_says_why(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the system bus, systemctl as a non-root user gets no answer at all: the host fails in one
    line saying why, never "not running" for a server that runs."""
    lab = sd_lab
    deploy(capsys, lab, spec(tmp_path, "1"))
    inv = str(user_inventory(lab, tmp_path / "fleetop.yml"))
    sh(lab, "systemctl stop dbus.socket dbus.service")
    try:
        r = run_cli(capsys, "-i", inv, "-l", "all", "service", "status", "--json")
        assert r.rc == 2, r.out
        assert ("systemd gave no answer: `systemctl is-active sglang.service` exited 1: Failed to connect to bus"
                in r.json()["hosts"][HOST]["reason"]), r.out
    finally:
        sh(lab, "systemctl start dbus.socket")
    assert unit(lab, "ActiveState") == "active"


def test_an_enabled_server_comes_back_by_itself_after_a_reboot(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = sd_lab
    release = deploy(capsys, lab, spec(tmp_path, "1"))
    boot_id, init = sh(lab, "cat /proc/sys/kernel/random/boot_id"), running_init(LabPaths(lab.dir), HOST)
    with lab.stop(HOST):
        assert process_gone(init)  # the host's systemd powered off, and its server with it
        assert listeners_on({lab.addresses[HOST]}) == []
    assert sh(lab, "systemctl is-system-running --wait") == "running"
    assert sh(lab, "cat /proc/sys/kernel/random/boot_id") != boot_id
    assert unit(lab, "ActiveState") == "active" and unit(lab, "Description").endswith(f"(fleetctl release {release})")
    assert health(lab) == 200
    status = cli(capsys, lab, "service", "status", "--json").json()["hosts"][HOST]["value"]
    assert (status["current"], status["servers"][0]["running"]) == (release, True)


HELLO_UNIT = ("[Unit]\nDescription=hello\n[Service]\nExecStart=/bin/sleep infinity\n"
              "[Install]\nWantedBy=multi-user.target\n")


def test_a_playbook_enables_a_unit_and_reboots_the_host_through_systemd(
        sd_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The playbook modules ``systemd`` (daemon-reload, enable, start) and ``reboot`` with its default
    command (``shutdown -r now``): systemd stops every unit, its reboot service asks the lab for a
    restart, the host boots again and both the unit and the release's server are back by themselves."""
    lab = sd_lab
    release = deploy(capsys, lab, spec(tmp_path, "1"))
    boot_id = sh(lab, "cat /proc/sys/kernel/random/boot_id")
    book = tmp_path / "reboot.yml"
    book.write_text(yaml.safe_dump([{"name": "reboot", "hosts": "lab", "tasks": [
        {"name": "unit", "copy": {"dest": "/etc/systemd/system/lab-hello.service", "content": HELLO_UNIT}},
        {"name": "enable and start", "register": "u", "systemd": {
            "name": "lab-hello.service", "state": "started", "enabled": True, "daemon_reload": True}},
        {"name": "reboot", "reboot": {"reboot_timeout": 120}, "register": "r"},
        {"name": "saw it", "assert": {"that": ["r.rebooted", "u is changed"]}},
    ]}], sort_keys=False))
    with serve_restarts(lab.dir) as restarted:
        r = run_cli(capsys, "-i", str(lab.inventory_path), "run", str(book), "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert restarted == [HOST]  # asked by systemd's own reboot service: nothing else asks
    assert sh(lab, "cat /proc/sys/kernel/random/boot_id") != boot_id
    assert sh(lab, "systemctl is-system-running --wait") == "running"
    assert sh(lab, "systemctl is-active lab-hello.service; systemctl is-enabled lab-hello.service").split() == [
        "active", "enabled"]
    assert unit(lab, "ActiveState") == "active" and unit(lab, "Description").endswith(f"(fleetctl release {release})")
    assert health(lab) == 200


def test_instances_are_units_of_their_own_and_logs_follow_the_journal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    why = lab_usable()
    if why:
        pytest.skip(why)
    pair = tmp_path / "pair.yml"
    pair.write_text('name: pair\nversion: "1"\nbase: {adopt: /root/ml-env}\nservice:\n  standin: true\n'
                    "  instances:\n    - {name: a, port: 30011}\n    - {name: b, port: 30012}\n"
                    "health: {timeout: 60, interval: 0.2}\n")
    with systemd_lab("test-lab-systemd-pair", f"127.{_NET}.92.0") as lab:
        lab.ssh(HOST, "/usr/bin/python3 -m venv --without-pip /root/ml-env")
        deploy(capsys, lab, pair)
        for name in ("a", "b"):
            assert sh(lab, f"systemctl is-active sglang@{name}.service; systemctl is-enabled sglang@{name}.service"
                      ).split() == ["active", "enabled"]
        lines = cli(capsys, lab, "logs", "a", "--since", "-1h", "--json").json()["hosts"][HOST]["value"]["lines"]
        assert any("systemd[1]: Started sglang@a.service" in line for line in lines), lines
        assert not any("sglang@b" in line for line in lines), lines

        follow = Follow(lab)
        try:
            follow.wait_for(1, "systemd[1]: Started sglang@b.service")
            assert cli(capsys, lab, "service", "restart", "b").rc == 0
            follow.wait_for(2, "systemd[1]: Started sglang@b.service")  # a new journal line, as it came
            assert any(line.startswith("lab1 b: ") for line in follow.seen), follow.seen[-10:]
        finally:
            rc = follow.interrupt()
        assert rc == 130, follow.seen[-10:]
        assert journal_followers(lab) == ""


def test_lab_up_and_down_of_a_systemd_host_leave_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """``lab up --systemd-host`` switches a running host to systemd (once); ``lab down`` (also what
    clears a killed test's leftovers) powers it off: every process of the host, its cgroup and its
    address are gone."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    directory, base = systemd_lab_dir("test-lab-systemd-cli"), f"127.{_NET}.91.0"
    lab_down(directory, purge=True)
    shutil.rmtree(directory, ignore_errors=True)
    try:
        r = run_cli(capsys, "lab", "up", "-n", "1", "--dir", str(directory), "--base-address", base,
                    "--systemd-host", "lab2")
        assert (r.rc, r.err.strip()) == (2, "fleetctl: error: no lab host named 'lab2': the hosts are lab1..lab1")
        lab, paths = LabHandle.from_fleet(lab_up(1, directory, base)), LabPaths(directory)
        assert sh(lab, "cat /proc/1/comm") != "systemd"  # the lab's usual host: this machine's PID 1
        for _ in range(2):  # switched to systemd (restarted), then left alone
            r = run_cli(capsys, "lab", "up", "-n", "1", "--dir", str(directory), "--base-address", base,
                        "--systemd-host", HOST)
            assert r.rc == 0, r.out + r.err
        assert "0 started, 1 already up" in r.out
        pids, cgroup, init = host_processes(lab, HOST), host_cgroup(paths, HOST), running_init(paths, HOST)
        assert init in pids and sh(lab, "cat /proc/1/comm") == "systemd" and cgroup.is_dir()
        r = run_cli(capsys, "lab", "down", "--dir", str(directory))
        assert r.rc == 0 and f"stopped pid {init}" in r.out, r.out + r.err
        assert wait_gone(pids) == []
        assert not cgroup.exists() and listeners_on({lab.addresses[HOST]}) == []
        assert json.loads(paths.state.read_text())["hosts"][0]["pid"] == 0
    finally:
        lab_down(directory, purge=True)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_systemd_host_in_a_lab_folder_under_tmp_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The host covers /tmp with its own tmpfs, so it could not reach a lab folder there: refused
    before anything is made or started."""
    folder = tmp_path / "lab"
    r = run_cli(capsys, "lab", "up", "-n", "1", "--dir", str(folder), "--systemd-host", HOST)
    assert (r.rc, r.err.strip()) == (2, f"fleetctl: error: lab1: the lab folder {folder} lies under /tmp, which a "
                                        "systemd lab host replaces with its own tmpfs; pass --dir elsewhere")
    assert not folder.exists()
