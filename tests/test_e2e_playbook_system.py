"""``reboot`` and ``systemd`` on real lab hosts.

reboot: the lab's own restart (fleetctl/lab/reboot.py: ``/etc/fleetctl-lab/restart-this-lab-host``
asks the lab to stop the host, everything in it, and start it again with a new boot id) stands in
for the machine's reboot; the module runs it as Ansible runs ``shutdown -r``: detached, waits for
the connection to drop, reconnects until the boot id differs, runs ``test_command``; the play goes
on over the new connection. systemd: the lab's hosts run no systemd (sshd is their first process),
so the module fails there with one line saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_support import run_cli
from lab_support import LabHandle

from fleetctl.lab.reboot import RESTART_COMMAND, serve_restarts

pytestmark = pytest.mark.lab
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def test_reboot_waits_for_the_host_to_come_back(scratch_lab: LabHandle, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    lab = scratch_lab
    before = {h: lab.ssh(h, BOOT_ID).stdout.strip() for h in lab.hosts}
    assert len(set(before.values())) == 2  # each lab host has a boot id of its own
    pids = lab.pids()
    book = tmp_path / "reboot.yml"
    book.write_text(yaml.safe_dump([{"name": "reboot", "hosts": "lab", "tasks": [
        {"name": "a process from before", "shell": "nohup sleep 600 >/dev/null 2>&1 & echo $!", "register": "p"},
        {"name": "reboot", "reboot": {"reboot_command": RESTART_COMMAND, "reboot_timeout": 120}, "register": "r"},
        # a zombie is gone too: the lab host's processes end with it, reparented to this machine's
        # init, which may reap them later (a real reboot leaves nothing)
        {"name": "after", "shell": "s=$(ps -o stat= -p {{ p.stdout }} 2>/dev/null); "
                                   "case \"$s\" in ''|Z*) echo gone;; *) echo running;; esac",
         "register": "after"},
        {"name": "saw it", "assert": {"that": ["r.rebooted", "r is changed", "after.stdout == 'gone'"]}},
        {"name": "agent after", "copy": {"content": "back\n", "dest": "/root/after-reboot"}},
    ]}], sort_keys=False))
    with serve_restarts(lab.dir) as restarted:
        r = run_cli(capsys, "-i", str(lab.inventory_path), "run", str(book), "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert sorted(restarted) == lab.hosts
    after = {h: lab.ssh(h, BOOT_ID).stdout.strip() for h in lab.hosts}
    for host in lab.hosts:
        assert after[host] != before[host]
        assert lab.pids()[host] != pids[host]  # a new sshd: the host really went down and came back
        assert lab.ssh(host, "cat /root/after-reboot").stdout == "back\n"  # modules work over the new session
    assert {h: c["changed"] for h, c in r.json()["recap"].items()} == {"lab1": 4, "lab2": 4}


def test_reboot_that_never_comes_back_fails_in_time(scratch_lab: LabHandle, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    book = tmp_path / "noreboot.yml"
    book.write_text(yaml.safe_dump([{"name": "p", "hosts": "lab1", "tasks": [
        {"name": "reboot", "reboot": {"reboot_command": "true", "reboot_timeout": 5}}]}], sort_keys=False))
    r = run_cli(capsys, "-i", str(scratch_lab.inventory_path), "run", str(book), "--json")
    assert r.rc == 2
    msg = r.json()["results"]["lab1"][0]["msg"]
    assert msg.startswith("reboot: not back with a new boot within 5s"), msg


def test_systemd_without_systemd_is_one_line(scratch_lab: LabHandle, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    book = tmp_path / "systemd.yml"
    book.write_text(yaml.safe_dump([{"name": "p", "hosts": "lab1", "tasks": [
        {"name": "unit", "systemd": {"name": "cron", "state": "started", "enabled": True}}]}], sort_keys=False))
    r = run_cli(capsys, "-i", str(scratch_lab.inventory_path), "run", str(book), "--json")
    assert r.rc == 2
    msg = r.json()["results"]["lab1"][0]["msg"]
    assert msg.startswith("systemd: ") and "systemd is not running on this host" in msg or \
        "no systemctl on this host" in msg, msg
    assert "\n" not in msg
