"""A read-only command that works in a venv starts each host's agent under that venv's python
(no child interpreter per call); a host without the venv falls back to its usual interpreter."""

from __future__ import annotations

import pytest
from lab_support import LabHandle

from fleetctl.inventory import load_inventory
from fleetctl.transport.fleet import Fleet, RunSettings

pytestmark = pytest.mark.lab
VENV = "/root/agent-venv"


def test_the_agent_runs_in_the_commands_venv_where_the_host_has_it(lab_fleet: LabHandle) -> None:
    lab_fleet.ssh("lab1", f"test -x {VENV}/bin/python || python3 -m venv --without-pip {VENV}")
    try:
        inv = load_inventory(lab_fleet.inventory_path)
        settings = RunSettings(agent_in_venv=True, venv=VENV + "/")
        with Fleet(inv, inv.select("lab1,lab2"), settings) as fleet:
            pythons = fleet.map(lambda ctx: ctx.ping().python)
            call = fleet.map(lambda ctx: (ctx.call("selftest", {"action": "echo"}, python=f"{VENV}/bin/python")["pid"],
                                          ctx.ping().pid), names=["lab1"])["lab1"]
        assert pythons["lab1"].value == f"{VENV}/bin/python"
        assert pythons["lab2"].value == "/usr/bin/python3"  # no such venv there: its usual interpreter
        assert call.ok and call.value is not None and call.value[0] == call.value[1]  # run in the agent itself
    finally:
        lab_fleet.ssh("lab1", f"rm -rf {VENV}", check=False)
