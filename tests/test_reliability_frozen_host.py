"""A host that stops answering mid-command: its sshd and every process of its sessions frozen with
SIGSTOP while `shell` runs there. The command times out for that host with a line that says the
host stopped answering, at -T plus its connect timeout (the kill is tried once), measured by the
test from the moment it saw the command start on the host; the other host finishes. After SIGCONT
the host answers again and nothing of the command is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from lab_support import LabHandle, host_processes, host_running
from reliability_support import SEEN_LAG, assert_timeout_honoured, assert_whole, fault_happened, wait_until

pytestmark = pytest.mark.lab
COMMAND = "sleep 5; echo done"
TIMEOUT = 8  # -T: the other host's command ends well within it
CONNECT = 4  # lab1's ansible_timeout: how long the one kill attempt waits for the frozen host


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_a_host_frozen_mid_command_times_out_in_one_line_the_other_finishes(scratch_lab: LabHandle) -> None:
    lab = scratch_lab
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["children"]["lab"]["hosts"]["lab1"]["ansible_timeout"] = CONNECT
    inventory = lab.dir / "frozen.yml"  # beside the lab's key and known_hosts (relative paths)
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    frozen: list[int] = []
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inventory),
                             "-T", str(TIMEOUT), "--json", "-l", "all", "shell", COMMAND],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        wait_until(lambda: host_running(lab, "lab1", ["sleep", "5"]), "the command started on lab1",
                   timeout=60, interval=0.05, alive=still_running)
        seen = time.monotonic()
        frozen = host_processes(lab, "lab1")
        signal_all(frozen, signal.SIGSTOP)
        out, err = proc.communicate(timeout=TIMEOUT + CONNECT + 120)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        states = {p: open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] for p in frozen
                  if os.path.exists(f"/proc/{p}/stat")}
        signal_all(frozen, signal.SIGCONT)
    fault_happened(lab.pids()["lab1"] in frozen and states.get(lab.pids()["lab1"]) == "T",
                   f"lab1's sshd stopped (process states {states})")
    assert proc.returncode == 2, out + err
    hosts = json.loads(out)["hosts"]
    assert hosts["lab2"]["status"] == "ok" and hosts["lab2"]["value"]["stdout"].strip() == "done", hosts["lab2"]
    reason = hosts["lab1"]["reason"]
    assert hosts["lab1"]["status"] == "failed" and reason.startswith(
        f"`{COMMAND}` timed out after {TIMEOUT}s: the host stopped answering (nothing from it for "), reason
    assert reason.endswith(f"and no answer within {CONNECT}s to ending the command)"), reason
    assert "Traceback" not in err
    # by the test's own clock, from the command seen running on lab1 to the controller's exit: -T,
    # then the one kill attempt's connect timeout; not a kill waited on longer, not a second attempt
    assert_timeout_honoured(ended - seen, TIMEOUT + CONNECT, "the frozen host's command", lag=SEEN_LAG)
    # thawed: the host answers again, and its session (the command with it) was ended by sshd
    assert lab.ssh("lab1", "echo back").stdout.strip() == "back"
    wait_until(lambda: not host_running(lab, "lab1", ["sleep", "5"]), "the thawed command ended", timeout=30)
    for host in lab.hosts:
        assert_whole(lab, host, None, serving=False)
