"""The agent over real SSH on lab hosts: many requests on one channel, errors, death, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_support import LabHandle, wait_gone

from fleetctl.errors import AgentError, RemoteOperationError
from fleetctl.inventory import load_inventory
from fleetctl.transport.base import Status
from fleetctl.transport.fleet import Fleet, HostContext

pytestmark = pytest.mark.lab






def test_many_requests_one_agent_per_host_and_none_left_after(lab_fleet: LabHandle) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with Fleet(inv, inv.select("all")) as fleet:
        def many(ctx: HostContext) -> set[int]:
            return {ctx.call("selftest", {"action": "echo", "data": i})["pid"] for i in range(30)}

        results = fleet.map(many)
        again = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"})["pid"])
    pids = []
    for name, res in results.items():
        assert res.ok, res.reason
        assert res.value is not None and len(res.value) == 1  # one agent process served all 30
        assert again[name].value in res.value  # and it was reused by the next fan-out
        pids.extend(res.value)
    assert wait_gone(pids) == [], "an agent outlived its run"


def test_remote_exception_is_structured_and_agent_goes_on(lab_fleet: LabHandle) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with Fleet(inv, inv.select("lab1")) as fleet:
        ctx = fleet.contexts["lab1"]
        pid = ctx.call("selftest", {"action": "echo"})["pid"]
        with pytest.raises(RemoteOperationError) as err:
            ctx.call("selftest", {"action": "raise", "message": "bad on lab1"})
        assert err.value.host == "lab1"
        assert err.value.etype == "RuntimeError"
        assert 'File "<fleetctl-remote:selftest>"' in err.value.remote_traceback
        assert ctx.call("selftest", {"action": "echo"})["pid"] == pid


def test_agent_killed_mid_run_is_reported_and_restarted_once(lab_fleet: LabHandle) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with Fleet(inv, inv.select("lab1:lab2")) as fleet:
        first = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"})["pid"])
        os.kill(first["lab1"].value or 0, 9)
        second = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"})["pid"])
        assert second["lab1"].status is Status.FAILED
        assert "agent died" in second["lab1"].reason
        assert second["lab2"].ok and second["lab2"].value == first["lab2"].value  # the other host goes on
        third = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"})["pid"])
        assert third["lab1"].ok and third["lab1"].value != first["lab1"].value  # restarted once
        with pytest.raises(AgentError):
            fleet.contexts["lab1"].call("selftest", {"action": "die"})
        with pytest.raises(AgentError, match="not restarting"):
            fleet.contexts["lab1"].call("selftest", {"action": "echo"})


def test_hung_operation_times_out_and_its_agent_ends(lab_fleet: LabHandle) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with Fleet(inv, inv.select("lab3")) as fleet:
        ctx = fleet.contexts["lab3"]
        pid = ctx.call("selftest", {"action": "echo"})["pid"]
        with pytest.raises(AgentError, match="no answer within 1s"):
            ctx.call("selftest", {"action": "sleep", "seconds": 120}, timeout=1)
        assert wait_gone([pid]) == [], "the hung agent survived its closed channel"
        assert ctx.call("selftest", {"action": "echo"})["pid"] != pid


def test_venv_interpreter_child_on_a_lab_host(lab_fleet: LabHandle) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with Fleet(inv, inv.select("lab2")) as fleet:
        ctx = fleet.contexts["lab2"]
        assert ctx.run("/usr/bin/python3 -m venv --without-pip /opt/agent-venv").rc == 0
        got = ctx.call("selftest", {"action": "interpreter"}, python="/opt/agent-venv/bin/python")
        assert got["prefix"] == "/opt/agent-venv"
        ctx.run("rm -rf /opt/agent-venv")


CONTROLLER = """
import sys
from fleetctl.inventory import load_inventory
from fleetctl.transport.base import Step
from fleetctl.transport.fleet import Fleet

inv, started, go, done = sys.argv[1:5]
touch = {"action": "file", "state": "touch", "mode": None, "owner": None, "group": None, "src": None,
         "recurse": False, "check": False}
fleet = load_inventory(inv)
with Fleet(fleet, fleet.select("lab2")) as hosts:
    ctx = hosts.contexts["lab2"]
    print(ctx.call("selftest", {"action": "echo"})["pid"], flush=True)
    ctx.sequence([Step("file_ops", {**touch, "path": started}),
                  Step("wait_for", {"path": go, "state": "present", "timeout": 120, "interval": 0.1}),
                  Step("file_ops", {**touch, "path": done})])
"""


def test_a_sequence_in_flight_is_finished_by_the_host_when_the_controller_dies(
        lab_fleet: LabHandle, tmp_path: Path) -> None:
    # What deploy's switch-then-restart relies on: a controller SIGKILLed while a sequence runs
    # never leaves it cut in two; the agent finishes it, then exits (it does not linger).
    lab = lab_fleet
    started, go, done = (f"/root/seq-{what}-{os.getpid()}" for what in ("started", "go", "done"))
    lab.ssh("lab2", f"rm -f {started} {go} {done}")
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    proc = subprocess.Popen([sys.executable, str(script), str(lab.inventory_path), started, go, done],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        agent_pid = int(proc.stdout.readline() or 0)
        assert agent_pid, proc.communicate()
        deadline = time.monotonic() + 60
        while lab.ssh("lab2", f"test -e {started}", check=False).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)  # the controller dies inside step 2 (waiting for `go`)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    time.sleep(1.5)  # longer than the watchdog's poll: a plain call's agent would be gone by now
    assert wait_gone([agent_pid], seconds=0) == [agent_pid], "the agent left its sequence unfinished"
    assert lab.ssh("lab2", f"test -e {done}", check=False).returncode != 0  # step 3 waits on step 2
    lab.ssh("lab2", f"touch {go}")
    assert wait_gone([agent_pid], seconds=30) == [], "the agent outlived its finished sequence"
    assert lab.ssh("lab2", f"test -e {done}", check=False).returncode == 0, "step 3 never ran"
    lab.ssh("lab2", f"rm -f {started} {go} {done}")
