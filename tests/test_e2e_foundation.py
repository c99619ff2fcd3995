"""End to end on the lab fleet (real sshd): ping, shell, facts, failures per host, host keys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from cli_support import run_cli, wall_clock
from lab_support import LabHandle

pytestmark = pytest.mark.lab


def test_ping_reaches_every_host_through_one_agent(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "ping", "--json")
    assert r.rc == 0, r.err
    doc = r.json()
    assert sorted(doc["hosts"]) == lab_fleet.hosts
    for name, entry in doc["hosts"].items():
        assert entry["status"] == "ok"
        assert entry["value"]["hostname"] == name  # its own UTS namespace
        assert entry["value"]["python"] == "/usr/bin/python3"
    assert doc["summary"] == {"ok": 3, "failed": 0, "unreachable": 0}


def test_shell_gathers_identical_output(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(lab_fleet.inventory_path)
    same = run_cli(capsys, "-i", inv, "-l", "all", "shell", "echo same; uname -s")
    assert same.rc == 0, same.err
    assert "lab1,lab2,lab3 (3)" in same.out
    assert same.out.count("same") == 1
    differ = run_cli(capsys, "-i", inv, "-l", "all", "shell", "hostname")
    for name in lab_fleet.hosts:
        assert f"{name} (1)" in differ.out


def test_shell_json_and_failing_command(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(lab_fleet.inventory_path)
    r = run_cli(capsys, "-i", inv, "-l", "lab1,lab2", "shell", "--json",
                'if [ "$(hostname)" = lab2 ]; then echo bad >&2; exit 3; fi; echo fine')
    assert r.rc == 2
    doc = r.json()["hosts"]
    assert doc["lab1"] == {"status": "ok", "value": {"rc": 0, "stdout": "fine\n", "stderr": "",
                                                     "duration_s": doc["lab1"]["value"]["duration_s"]}}
    assert doc["lab2"]["status"] == "failed"
    assert doc["lab2"]["value"]["rc"] == 3
    assert doc["lab2"]["reason"] == "exited 3: bad"


def test_limit_with_shell_metacharacters_runs_nothing(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    """A pattern full of shell metacharacters that still selects every host (a name and a regex whose
    alternatives are payloads): the hosts are reached and nothing of the pattern runs anywhere."""
    marker = f"/tmp/fleetctl-pwned-{os.getpid()}"
    pattern = f"lab1,~^lab[23]$|$(touch {marker})|`touch {marker}`;touch {marker} &"
    r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "-l", pattern, "shell", "--json", "hostname")
    assert r.rc == 0, r.err
    hosts = r.json()["hosts"]
    assert {name: h["value"]["stdout"] for name, h in hosts.items()} == {h: f"{h}\n" for h in lab_fleet.hosts}
    assert not Path(marker).exists()
    for host in lab_fleet.hosts:  # their own /root; /tmp is this machine's
        assert lab_fleet.ssh(host, f"ls /root/{Path(marker).name} 2>/dev/null; true").stdout == "", host
    # the same pattern with no host matched is refused on the controller, naming the pattern
    r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "-l", f"lab9; touch {marker}", "ping")
    assert r.rc == 3 and "no hosts match" in r.err
    assert not Path(marker).exists()


def test_facts_on_lab_hosts(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "facts", "--json")
    assert r.rc == 0, r.err
    for name, entry in r.json()["hosts"].items():
        facts = entry["value"]
        assert facts["hostname"] == name
        assert facts["cpus"] >= 1
        assert facts["memory_total"] > 0
        assert facts["gpus"]["gpus"] == []  # no nvidia-smi here: "no GPU"
    table = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "facts")
    assert "no GPU" in table.out


def test_command_timeout_fails_that_host_only(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    with wall_clock() as took:
        r = run_cli(capsys, "-i", str(lab_fleet.inventory_path), "-T", "1", "-l", "all", "shell", "--json",
                    'if [ "$(hostname)" = lab1 ]; then sleep 30; fi; echo done')
    assert took.seconds < 1 + 20, took  # -T 1 ended lab1's 30 s sleep (20 s for connecting on a busy machine)
    assert r.rc == 2
    doc = r.json()["hosts"]
    assert doc["lab1"]["status"] == "failed"
    assert "timed out" in doc["lab1"]["reason"]
    assert doc["lab2"]["status"] == doc["lab3"]["status"] == "ok"


def test_unreachable_host_reported_while_others_succeed(
    scratch_lab: LabHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch_lab.stop("lab2")
    r = run_cli(capsys, "-i", str(scratch_lab.inventory_path), "ping", "--json")
    assert r.rc == 2
    doc = r.json()["hosts"]
    assert doc["lab1"]["status"] == "ok"
    assert doc["lab2"]["status"] == "unreachable"
    assert f"cannot connect to {scratch_lab.addresses['lab2']}:22" in doc["lab2"]["reason"]
    human = run_cli(capsys, "-i", str(scratch_lab.inventory_path), "ping")
    assert "lab2: unreachable: cannot connect" in " ".join(human.err.split())


def test_changed_host_key_is_refused(scratch_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    scratch_lab.rekey("lab1")
    inv = str(scratch_lab.inventory_path)
    r = run_cli(capsys, "-i", inv, "ping", "--json")
    assert r.rc == 2
    doc = r.json()["hosts"]
    assert doc["lab1"]["status"] == "unreachable"
    assert f"HOST KEY CHANGED for {scratch_lab.addresses['lab1']}" in doc["lab1"]["reason"]
    assert str(scratch_lab.known_hosts) in doc["lab1"]["reason"]
    assert doc["lab2"]["status"] == "ok"
    # trust does not silently replace a changed key...
    t = run_cli(capsys, "-i", inv, "hosts", "trust", "-l", "lab1")
    assert t.rc == 2
    assert "key changed" in t.err
    # ...only when told to, after which the host is reachable again.
    t = run_cli(capsys, "-i", inv, "hosts", "trust", "-l", "lab1", "--replace", "--json")
    assert t.rc == 0
    assert t.json()["hosts"]["lab1"]["value"]["state"] == "replaced"
    assert run_cli(capsys, "-i", inv, "ping", "-l", "lab1").rc == 0


def test_unknown_host_key_refused_then_trusted(scratch_lab: LabHandle, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    inv_doc = yaml.safe_load(scratch_lab.inventory_path.read_text())
    inv_doc["all"]["vars"] = {**inv_doc["all"].get("vars", {}), "fleetctl_known_hosts": str(tmp_path / "kh")}
    for host in inv_doc["all"]["children"]["lab"]["hosts"].values():
        host["ansible_ssh_private_key_file"] = str(scratch_lab.key_path)
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(inv_doc))
    r = run_cli(capsys, "-i", str(inv), "ping", "--json")
    assert r.rc == 2
    assert "unknown host key ssh-ed25519 SHA256:" in r.json()["hosts"]["lab1"]["reason"]
    t = run_cli(capsys, "-i", str(inv), "hosts", "trust")
    assert t.rc == 0
    assert "SHA256:" in t.out
    assert (tmp_path / "kh").read_text().count("ssh-ed25519") == 2
    assert run_cli(capsys, "-i", str(inv), "ping").rc == 0


def test_wrong_client_key_is_refused(scratch_lab: LabHandle, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    r = run_cli(capsys, "-i", str(scratch_lab.inventory_path), "-l", "lab1",
                "-e", f"ansible_ssh_private_key_file={other}", "ping", "--json")
    assert r.rc == 2
    entry = r.json()["hosts"]["lab1"]
    assert entry["status"] == "unreachable"
    assert f"authentication failed for root@{scratch_lab.addresses['lab1']}:22" in entry["reason"]


def test_bastion_jump_host(scratch_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("-i", str(scratch_lab.inventory_path), "-l", "lab2", "-e", "jump_host=lab1", "shell", "--json",
            "hostname")
    r = run_cli(capsys, *args)
    assert r.rc == 0, r.err
    assert r.json()["hosts"]["lab2"]["value"]["stdout"] == "lab2\n"
    # With the bastion down, lab2 (still up) cannot be reached: the path really goes through lab1.
    scratch_lab.stop("lab1")
    r = run_cli(capsys, *args)
    assert r.rc == 2
    assert r.json()["hosts"]["lab2"]["status"] == "unreachable"
    assert f"{scratch_lab.addresses['lab1']}:22" in r.json()["hosts"]["lab2"]["reason"]
