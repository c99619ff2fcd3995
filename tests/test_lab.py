"""End-to-end tests of the lab fleet through the real OpenSSH client (strict host keys)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import paramiko
import pytest
import yaml
from click.testing import CliRunner
from lab_support import LabHandle, listeners_on, listening_sockets, password_login, sudo_mode

from fleetctl.cli.lab import lab
from fleetctl.errors import LabError
from fleetctl.lab import LabPaths, lab_down, lab_status, lab_up
from fleetctl.lab.accounts import LAB_PASSWORD, LAB_UID, LAB_USER
from fleetctl.lab.state import host_addresses

lab_mark = pytest.mark.lab


@lab_mark
def test_each_host_answers_with_its_own_hostname(lab_fleet: LabHandle) -> None:
    for name in lab_fleet.hosts:
        assert lab_fleet.ssh(name, "hostname").stdout.strip() == name


@lab_mark
def test_opt_is_private_to_each_host(lab_fleet: LabHandle) -> None:
    marker = f"/opt/fleetctl-lab-probe-{uuid.uuid4().hex}"
    lab_fleet.ssh("lab1", f"echo hello > {marker}")
    try:
        assert lab_fleet.ssh("lab1", f"cat {marker}").stdout == "hello\n"
        assert lab_fleet.ssh("lab2", f"test -e {marker}", check=False).returncode == 1
        assert not Path(marker).exists()
    finally:
        lab_fleet.ssh("lab1", f"rm -f {marker}")


@lab_mark
def test_sftp_round_trip(lab_fleet: LabHandle, tmp_path: Path) -> None:
    local = tmp_path / "payload.txt"
    local.write_text("through sftp\n")
    back = tmp_path / "back.txt"
    batch = f"put {local} /srv/payload.txt\nget /srv/payload.txt {back}\nrm /srv/payload.txt\n"
    result = lab_fleet.sftp("lab2", batch)
    assert result.returncode == 0, result.stderr
    assert back.read_text() == "through sftp\n"


@lab_mark
def test_python3_runs_and_path_is_sane(lab_fleet: LabHandle) -> None:
    for name in lab_fleet.hosts:
        out = lab_fleet.ssh(name, "command -v python3; python3 -c 'import sys; print(sys.version_info[0])'")
        assert out.stdout.split() == ["/usr/bin/python3", "3"]
        path = lab_fleet.ssh(name, "echo $PATH").stdout.strip()
        assert {"/usr/local/bin", "/usr/bin", "/bin"} <= set(path.split(":"))


@lab_mark
def test_sshd_listens_only_on_its_own_address(lab_fleet: LabHandle) -> None:
    for status in lab_status(lab_fleet.dir):
        assert status.state == "up", status.why
        assert listening_sockets(status.pid) == [(status.address, 22)]


@lab_mark
def test_paramiko_reads_the_pinned_keys(lab_fleet: LabHandle) -> None:
    client = paramiko.SSHClient()
    client.load_host_keys(str(lab_fleet.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(lab_fleet.addresses["lab3"], username="root", key_filename=str(lab_fleet.key_path),
                   look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, stdout, _ = client.exec_command("hostname")
        assert stdout.read().decode().strip() == "lab3"
    finally:
        client.close()


@lab_mark
def test_fleetop_logs_in_with_the_client_key_and_has_passwordless_sudo(lab_fleet: LabHandle) -> None:
    for name in lab_fleet.hosts:
        out = lab_fleet.ssh(name, "id -un; id -u; echo $HOME; sudo -n id -u", user=LAB_USER)
        assert out.stdout.split() == [LAB_USER, str(LAB_UID), f"/home/{LAB_USER}", "0"], out.stderr
        assert out.stderr == ""  # no "unable to resolve host", no use_pty complaint


@lab_mark
def test_debian_use_pty_does_not_break_sudo_without_a_tty(lab_fleet: LabHandle) -> None:
    sudoers = lab_fleet.ssh("lab1", "cat /etc/sudoers").stdout
    if "use_pty" in Path("/etc/sudoers").read_text():
        assert "use_pty" in sudoers  # the host's private copy keeps the distribution's Defaults
    # ssh without -t: no tty on the host, as fleetctl's agent runs.
    out = lab_fleet.ssh("lab1", "tty; sudo -n sh -c 'echo root-now; id -u'", user=LAB_USER, check=False)
    assert out.stdout.split() == ["not", "a", "tty", "root-now", "0"], out.stderr


@lab_mark
def test_account_files_are_private_to_each_host(lab_fleet: LabHandle) -> None:
    machine = {p: Path(p).read_bytes() for p in ("/etc/passwd", "/etc/group", "/etc/shadow")}
    user = f"fl{uuid.uuid4().hex[:8]}"
    lab_fleet.ssh("lab1", f"echo '{user}:x:2499:2499::/nonexistent:/bin/false' >> /etc/passwd")
    try:
        assert lab_fleet.ssh("lab1", f"getent passwd {user}", check=False).returncode == 0
        assert lab_fleet.ssh("lab2", f"getent passwd {user}", check=False).returncode == 2
        assert {p: Path(p).read_bytes() for p in machine} == machine
        assert LAB_USER not in Path("/etc/passwd").read_text()
        assert lab_fleet.ssh("lab1", "ls /home").stdout.split() == [LAB_USER]
    finally:
        # Grouped: `a || b && c` runs c after a succeeded too, and `cat /tmp/p > /etc/passwd` with no
        # /tmp/p emptied lab1's passwd (root could no longer log in: the next tests' ssh failed at kex).
        lab_fleet.ssh("lab1", f"sed -i '/^{user}:/d' /etc/passwd 2>/dev/null || "
                              f"{{ grep -v '^{user}:' /etc/passwd > /tmp/p && cat /tmp/p > /etc/passwd; }}")


def _sudo(lab: LabHandle, host: str, password: str | None) -> tuple[int, str]:
    """sudo id -u as fleetop, without a tty: -n with no password, else the password on stdin."""
    feed = "sudo -n id -u" if password is None else f"echo {password} | sudo -S -p '' id -u"
    out = lab.ssh(host, f"timeout 10 sh -c \"{feed}\"", user=LAB_USER, check=False, timeout=30)
    return out.returncode, (out.stdout + out.stderr).strip()


@lab_mark
def test_sudo_modes_change_one_host_only(lab_fleet: LabHandle) -> None:
    machine_rules = sorted(p.name for p in Path("/etc/sudoers.d").iterdir())
    with sudo_mode(lab_fleet, "lab3", "password"):
        rc, out = _sudo(lab_fleet, "lab3", None)
        assert rc == 1 and "a password is required" in out
        assert _sudo(lab_fleet, "lab3", LAB_PASSWORD) == (0, "0")
        rc, out = _sudo(lab_fleet, "lab3", "wrong")
        assert rc == 1 and "incorrect password" in out  # nothing cached from the right one
        assert _sudo(lab_fleet, "lab1", None) == (0, "0")
    with sudo_mode(lab_fleet, "lab3", "none"):
        rc, out = _sudo(lab_fleet, "lab3", LAB_PASSWORD)
        assert rc == 1 and f"{LAB_USER} is not in the sudoers file" in out
    with sudo_mode(lab_fleet, "lab3", "requiretty"):
        rc, out = _sudo(lab_fleet, "lab3", None)
        assert rc == 1 and "you must have a tty to run sudo" in out
    assert _sudo(lab_fleet, "lab3", None) == (0, "0")
    assert sorted(p.name for p in Path("/etc/sudoers.d").iterdir()) == machine_rules


@lab_mark
def test_password_login_can_be_enabled_per_host(scratch_lab: LabHandle) -> None:
    def login(host: str) -> str:
        client = paramiko.SSHClient()
        client.load_host_keys(str(scratch_lab.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(scratch_lab.addresses[host], username=LAB_USER, password=LAB_PASSWORD,
                           look_for_keys=False, allow_agent=False, timeout=10)
            _, stdout, _ = client.exec_command("id -un")
            return stdout.read().decode().strip()
        except paramiko.AuthenticationException:
            return "refused"
        finally:
            client.close()

    assert login("lab1") == "refused"
    with password_login(scratch_lab, "lab1"):
        assert login("lab1") == LAB_USER
        assert login("lab2") == "refused"
        assert scratch_lab.ssh("lab1", "true", user=LAB_USER).returncode == 0  # keys still work
    assert login("lab1") == "refused"


@lab_mark
def test_inventory_describes_every_host(lab_fleet: LabHandle) -> None:
    doc = yaml.safe_load(lab_fleet.inventory_path.read_text())
    hosts = doc["all"]["children"]["lab"]["hosts"]
    assert list(hosts) == lab_fleet.hosts
    assert hosts["lab2"] == {
        "ansible_host": lab_fleet.addresses["lab2"], "ansible_port": 22, "ansible_user": "root",
        "ansible_ssh_private_key_file": "id_ed25519", "ansible_python_interpreter": "/usr/bin/python3",
        "service_host": lab_fleet.addresses["lab2"],  # hosts share one network: a service address each
    }


@lab_mark
def test_lab_up_twice_keeps_the_same_pids(lab_fleet: LabHandle) -> None:
    before = lab_fleet.pids()
    fleet = lab_up(len(lab_fleet.hosts), lab_fleet.dir, lab_fleet.base_address)
    assert fleet.started == []
    assert {h.name: h.pid for h in fleet.hosts} == before


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@lab_mark
def test_stale_state_with_dead_and_reused_pids_recovers(scratch_lab: LabHandle) -> None:
    lab_down(scratch_lab.dir)
    state = LabPaths(scratch_lab.dir).state
    doc = json.loads(state.read_text())
    doc["hosts"][0]["pid"] = _dead_pid()
    doc["hosts"][1]["pid"] = os.getpid()  # a live process that is not our sshd: must survive
    state.write_text(json.dumps(doc))
    assert [s.state for s in lab_status(scratch_lab.dir)] == ["down", "down"]
    fleet = lab_up(2, scratch_lab.dir, scratch_lab.base_address)
    assert fleet.started == ["lab1", "lab2"]
    assert all(h.state == "up" for h in fleet.hosts)
    assert scratch_lab.ssh("lab2", "hostname").stdout.strip() == "lab2"


@lab_mark
def test_lost_state_adopts_running_hosts(scratch_lab: LabHandle) -> None:
    before = scratch_lab.pids()
    LabPaths(scratch_lab.dir).state.unlink()
    fleet = lab_up(2, scratch_lab.dir, scratch_lab.base_address)
    assert fleet.started == []
    assert {h.name: h.pid for h in fleet.hosts} == before


@lab_mark
def test_lab_down_kills_only_our_pids(scratch_lab: LabHandle) -> None:
    decoy = subprocess.Popen(["sleep", "60"])
    try:
        state = LabPaths(scratch_lab.dir).state
        doc = json.loads(state.read_text())
        doc["hosts"][1]["pid"] = decoy.pid  # lab.json now lies about lab2
        state.write_text(json.dumps(doc))
        statuses = lab_down(scratch_lab.dir)
        assert decoy.poll() is None
        assert [s.state for s in statuses] == ["down", "down"]
        assert listeners_on(set(scratch_lab.addresses.values())) == []
        assert LabPaths(scratch_lab.dir).known_hosts.exists()  # the folder stays
    finally:
        decoy.kill()
        decoy.wait()


@lab_mark
def test_stop_and_start_keep_address_and_key(scratch_lab: LabHandle) -> None:
    scratch_lab.stop("lab1")
    assert scratch_lab.ssh("lab1", "true", check=False).returncode == 255
    assert scratch_lab.ssh("lab2", "hostname").stdout.strip() == "lab2"
    scratch_lab.start("lab1")
    assert scratch_lab.ssh("lab1", "hostname").stdout.strip() == "lab1"


@lab_mark
def test_rekeyed_host_is_refused(scratch_lab: LabHandle) -> None:
    pinned = scratch_lab.known_hosts.read_text()
    with scratch_lab.rekey("lab1"):
        result = scratch_lab.ssh("lab1", "true", check=False)
        assert result.returncode == 255
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr
        assert "Host key verification failed" in result.stderr
        assert scratch_lab.known_hosts.read_text() == pinned
    assert scratch_lab.ssh("lab1", "hostname").stdout.strip() == "lab1"


@lab_mark
def test_cli_up_status_down(scratch_lab: LabHandle) -> None:
    runner = CliRunner()
    where = ["--dir", str(scratch_lab.dir)]
    up = runner.invoke(lab, ["up", "--hosts", "2", *where, "--base-address", scratch_lab.base_address])
    assert up.exit_code == 0, up.output
    assert up.output.splitlines()[-1] == str(scratch_lab.inventory_path)
    assert "0 started, 2 already up" in up.output
    assert f"each host also has the user {LAB_USER} (passwordless sudo" in up.output
    status = runner.invoke(lab, ["status", *where])
    assert status.exit_code == 0 and "lab2" in status.output
    down = runner.invoke(lab, ["down", *where])
    assert down.exit_code == 0 and "stopped pid" in down.output
    assert runner.invoke(lab, ["status", *where]).exit_code == 1


def test_refuses_non_loopback_base_address(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="outside 127.0.0.0/8"):
        lab_up(2, tmp_path, "10.0.0.0")
    with pytest.raises(LabError, match="past 127.255.255.254"):
        lab_up(10, tmp_path, "127.255.255.250")


def test_a_thousand_hosts_number_on_past_254_skipping_0_and_255() -> None:
    """Host N is base + N up to .254 (labs of up to 254 hosts keep their addresses), then the lab
    goes on in the next /24 at .1: 1,000 hosts span four, each address once, none a .0 or .255."""
    addresses = host_addresses("127.0.90.0", 1000)
    assert addresses[:254] == [f"127.0.90.{n}" for n in range(1, 255)]
    assert addresses[254:256] == ["127.0.91.1", "127.0.91.2"]
    assert addresses[-1] == "127.0.93.238"
    assert len(set(addresses)) == 1000
    assert not any(a.endswith((".0", ".255")) for a in addresses)
    assert host_addresses("127.0.5.250", 6) == ["127.0.5.251", "127.0.5.252", "127.0.5.253", "127.0.5.254",
                                                "127.0.6.1", "127.0.6.2"]


def test_refuses_without_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="the lab needs root"):
        lab_up(2, tmp_path, "127.0.5.0")


def test_refuses_a_folder_the_hosts_would_hide() -> None:
    with pytest.raises(LabError, match="lies under /root"):
        lab_up(1, "/root/lab", "127.0.5.0")


@lab_mark
def test_hosts_keep_their_accounts_when_the_machine_replaces_its_files(lab_fleet: LabHandle) -> None:
    """adduser, apt and passwd replace /etc/passwd by a rename: that detaches a single-file bind in
    every namespace, so each host has a whole /etc of its own (the CI failure this guards against:
    hosts suddenly reading, and tests writing, the machine's own passwd)."""
    for name in ("passwd", "shadow", "group"):
        real = Path("/etc") / name
        spare = real.with_name(f".{name}.fleetctl-test")
        subprocess.run(["cp", "-a", str(real), str(spare)], check=True)
        os.replace(spare, real)  # the same bytes, a new inode: what adduser does
    for host in lab_fleet.hosts:
        assert lab_fleet.ssh(host, f"getent passwd {LAB_USER}", check=False).returncode == 0
        assert lab_fleet.ssh(host, "sudo -n id -u", user=LAB_USER).stdout.strip() == "0"
    assert LAB_USER not in Path("/etc/passwd").read_text()


@lab_mark
def test_lab_up_waits_for_a_slow_host_instead_of_restarting_it(scratch_lab: LabHandle) -> None:
    """A host whose sshd is alive but answers late (stopped for 4 s here, as a loaded machine can
    delay it) is up, not down: `lab up` keeps its pid instead of killing it under its users."""
    import signal
    import threading

    before = scratch_lab.pids()
    os.kill(before["lab1"], signal.SIGSTOP)
    resume = threading.Timer(4.0, os.kill, (before["lab1"], signal.SIGCONT))
    resume.start()
    try:
        fleet = lab_up(2, scratch_lab.dir, scratch_lab.base_address)
    finally:
        resume.join()  # the host is never left stopped
    assert fleet.started == []
    assert {h.name: h.pid for h in fleet.hosts} == before
    assert scratch_lab.ssh("lab1", "hostname").stdout.strip() == "lab1"
