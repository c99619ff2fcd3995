"""A host that stops answering mid-command: its sshd and every process of its sessions frozen with
SIGSTOP while `shell` runs there. The command times out for that host with a line that says the
host stopped answering, within -T plus the connect timeout (the kill is tried once) plus a wide
margin by the test's clock; the other host finishes. After SIGCONT the host answers again and
nothing of the command is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from cli_support import wall_clock
from lab_support import LabHandle, host_processes, host_running
from reliability_support import assert_whole, fault_happened, wait_until

pytestmark = pytest.mark.lab
COMMAND = "sleep 6; echo done"
TIMEOUT = 10  # -T
CONNECT = 10  # the lab inventory's connect timeout (fleetctl's default)


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_a_host_frozen_mid_command_times_out_in_one_line_the_other_finishes(scratch_lab: LabHandle) -> None:
    lab = scratch_lab
    frozen: list[int] = []
    with wall_clock() as took:
        proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path),
                                 "-T", str(TIMEOUT), "--json", "-l", "all", "shell", COMMAND],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def still_running() -> None:
                assert proc.poll() is None, proc.communicate()

            wait_until(lambda: host_running(lab, "lab1", ["sleep", "6"]), "the command started on lab1",
                       timeout=60, alive=still_running)
            frozen = host_processes(lab, "lab1")
            signal_all(frozen, signal.SIGSTOP)
            out, err = proc.communicate(timeout=TIMEOUT + CONNECT + 120)
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
    # by the test's own clock: -T, one kill attempt (connect timeout + 5 s), start-up, a wide margin
    assert took.seconds < TIMEOUT + CONNECT + 5 + 60, took
    # thawed: the host answers again, and its session (the command with it) was ended by sshd
    assert lab.ssh("lab1", "echo back").stdout.strip() == "back"
    wait_until(lambda: not host_running(lab, "lab1", ["sleep", "6"]), "the thawed command ended", timeout=30)
    for host in lab.hosts:
        assert_whole(lab, host, None, serving=False)
