"""An agent's start is given the connect timeout when that is longer than its own 30 s (issue 37):
at 1,000 lab hosts on two cores, a host whose interpreter took over 30 s to start was lost as
"agent did not start in time" though the run allowed 60 s (`-e ansible_timeout=60`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lab_support import LabHandle

from fleetctl.lab import LabPaths

pytestmark = pytest.mark.lab
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
SLOW_S = 33  # the interpreter's start on the host: over the agent's own 30 s


def test_a_slow_interpreter_start_is_given_the_connect_timeout(lab_fleet: LabHandle) -> None:
    slow = LabPaths(lab_fleet.dir).host_dir("lab1") / "root" / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep {SLOW_S}\nexec /usr/bin/python3 \"$@\"\n")
    slow.chmod(0o755)
    inventory = lab_fleet.dir / "inventory-slow-python.yml"  # beside the lab's known_hosts
    inventory.write_text(lab_fleet.inventory_path.read_text().replace(
        "ansible_python_interpreter: /usr/bin/python3", "ansible_python_interpreter: /root/slow-python"))
    try:
        done = subprocess.run([FLEETCTL, "-i", str(inventory), "-l", "lab1", "-e", "ansible_timeout=90",
                               "ping", "--json"], capture_output=True, text=True, timeout=300)
    finally:
        slow.unlink()
        inventory.unlink()
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert json.loads(done.stdout)["summary"]["ok"] == 1
