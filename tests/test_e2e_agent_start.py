"""An agent's start is given the connect timeout when that is longer than its own 30 s (issue 37):
at 1,000 lab hosts on two cores, a host whose interpreter took over 30 s to start was lost as
"agent did not start in time" though the run allowed 60 s (`-e ansible_timeout=60`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lab_support import LabHandle

from fleetctl.lab import LabPaths

pytestmark = pytest.mark.lab
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
SLOW_S = 33  # the interpreter's start on the host: over the agent's own 30 s


@pytest.mark.parametrize("kept", [False, True], ids=["fresh", "kept"])
def test_a_slow_interpreter_start_is_given_the_connect_timeout(lab_fleet: LabHandle, kept: bool,
                                                              tmp_path: Path) -> None:
    """Fresh, and through the kept-connection server (its own agents are started there)."""
    env = {**os.environ, **({"FLEETCTL_PERSIST": "60", "FLEETCTL_MUX_DIR": str(tmp_path / "mux")} if kept else {})}
    slow = LabPaths(lab_fleet.dir).host_dir("lab1") / "root" / f"slow-python-{kept}"
    slow.write_text(f"#!/bin/sh\nsleep {SLOW_S}\nexec /usr/bin/python3 \"$@\"\n")
    slow.chmod(0o755)
    inventory = lab_fleet.dir / f"inventory-slow-python-{kept}.yml"  # beside the lab's known_hosts
    inventory.write_text(lab_fleet.inventory_path.read_text().replace(
        "ansible_python_interpreter: /usr/bin/python3", f"ansible_python_interpreter: /root/{slow.name}"))
    try:
        done = subprocess.run([FLEETCTL, "-i", str(inventory), "-l", "lab1", "-e", "ansible_timeout=90",
                               "ping", "--json"], capture_output=True, text=True, timeout=300, env=env)
    finally:
        if kept:
            subprocess.run([FLEETCTL, "connections", "stop"], env=env, capture_output=True, timeout=60)
        slow.unlink()
        inventory.unlink()
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert json.loads(done.stdout)["summary"]["ok"] == 1
