"""Fan-out over worker processes (issue 23) on real lab hosts: every host its own result, in host
order, from processes other than the controller; strict host keys there too; Ctrl-C ends the
workers, their connections and every agent they started, and the command exits 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_support import REPO, LabHandle, wait_gone

from fleetctl.inventory import load_inventory
from fleetctl.transport.base import Status
from fleetctl.transport.fleet import Fleet, HostContext, RunSettings

pytestmark = pytest.mark.lab
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")


def _where(ctx: HostContext) -> tuple[int, str, int]:
    info = ctx.ping()
    return os.getpid(), info.hostname, ctx.call("selftest", {"action": "echo"})["pid"]


def test_workers_answer_every_host_in_order_and_a_down_host_is_its_own_result(lab_fleet: LabHandle) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with lab_fleet.stop("lab2"), Fleet(inv, inv.select("all"), RunSettings(workers=2)) as fleet:
        results = fleet.map(_where)
        again = fleet.map(lambda ctx: ctx.ping().hostname)  # a second pass: in this process, lab2 skipped
    assert list(results) == sorted(lab_fleet.hosts)
    assert results["lab2"].status is Status.UNREACHABLE, results["lab2"]
    workers = {r.value[0] for r in results.values() if r.value}
    assert os.getpid() not in workers and len(workers) == 2  # lab1 and lab3 answered from two workers
    for name in ("lab1", "lab3"):
        assert results[name].ok and results[name].value is not None and results[name].value[1] == name
    assert [again[n].ok for n in ("lab1", "lab3")] == [True, True]
    assert again["lab2"].status is Status.UNREACHABLE
    agents = [r.value[2] for r in results.values() if r.value]
    assert wait_gone(agents) == [], "an agent outlived its worker"


def test_workers_check_host_keys_as_strictly(lab_fleet: LabHandle) -> None:
    inv = load_inventory(lab_fleet.inventory_path)
    with lab_fleet.rekey("lab3"), Fleet(inv, inv.select("all"), RunSettings(workers=2)) as fleet:
        results = fleet.map(lambda ctx: ctx.ping().hostname)
    assert results["lab1"].ok and results["lab2"].ok
    assert results["lab3"].status is Status.UNREACHABLE
    assert "HOST KEY CHANGED" in results["lab3"].reason


def _agents_under(lab: LabHandle) -> list[int]:
    """The fleetctl agents running on the lab's hosts (descendants of each host's sshd)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(lab.pids().values())
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            try:
                if b"fleetctl_agent" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(child)
            except OSError:
                continue
    return found


def test_ctrl_c_ends_the_workers_and_every_agent(lab_fleet: LabHandle, tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(300)\n")
    env = {**os.environ, "FLEETCTL_WORKERS": "2"}
    proc = subprocess.Popen([FLEETCTL, "-i", str(lab_fleet.inventory_path), "probe", "script", str(script),
                             "--timeout", "600", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)
    agents: list[int] = []
    deadline = time.monotonic() + 60
    while len(agents) < len(lab_fleet.hosts) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
        agents = _agents_under(lab_fleet)
    assert len(agents) == len(lab_fleet.hosts), "the agents did not start"
    proc.send_signal(signal.SIGINT)  # the controller alone: it passes the interrupt on to its workers
    out, err = proc.communicate(timeout=60)  # not the script's 300 s: the interrupt ends the work in flight
    assert proc.returncode == 130, out + err
    assert "aborted" in err and "Traceback" not in err
    assert wait_gone(agents) == [], "an agent outlived the interrupted command"


def test_ping_json_over_workers_lists_hosts_in_order(lab_fleet: LabHandle) -> None:
    env = {**os.environ, "FLEETCTL_WORKERS": "2"}
    proc = subprocess.run([FLEETCTL, "-i", str(lab_fleet.inventory_path), "ping", "--json"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc["hosts"]) == sorted(lab_fleet.hosts)
    assert {h: v["value"]["hostname"] for h, v in doc["hosts"].items()} == {h: h for h in lab_fleet.hosts}
