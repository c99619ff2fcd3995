"""Two runs at once, and a lock left behind by a killed run: refused naming the holder, a stale one
detected (its holder's pid is dead on this controller) and broken only with --break-lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import assert_state_sound, fault_happened

pytestmark = pytest.mark.lab
PLAIN = Path(__file__).resolve().parents[1] / "playbooks" / "releases" / "sglang-0.5.23-lab.yml"

# Another controller's run: takes lab3's deploy lock through its own agent, says the agent's pid, waits.
HOLDER = textwrap.dedent("""\
    import sys, time
    from fleetctl.inventory import load_inventory
    from fleetctl.release.hostlock import host_lock
    from fleetctl.liveness import who
    from fleetctl.release.service import layout_for
    from fleetctl.transport.fleet import Fleet
    inv = load_inventory(sys.argv[1])
    with Fleet(inv, inv.select("lab3")) as fleet:
        ctx = fleet.contexts["lab3"]
        with host_lock(ctx, layout_for(ctx.vars), who("fleetctl deploy held.yml")):
            print(ctx.agent.info.pid, flush=True)
            time.sleep(600)
    """)


def _ppid(pid: int) -> int:
    """Lab hosts share this machine's pid namespace: their processes are visible in /proc here."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _running(pid: int) -> bool:
    return _state(pid) not in ("Z", "X", "gone")


def test_stale_lock_of_a_killed_run_is_detected_and_broken_only_on_request(
        release_free_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab = release_free_lab
    inv = str(lab.inventory_path)
    child = subprocess.Popen([sys.executable, "-c", HOLDER, inv], stdout=subprocess.PIPE, text=True)
    session = 0
    try:
        assert child.stdout is not None
        agent = int(child.stdout.readline())
        me = socket.gethostname()
        holder = f"locked by another run: {os.environ.get('USER', 'root')}"
        # 1. the holder is alive: refused naming it, and --break-lock does not break a live run's lock
        r = run_cli(capsys, "-i", inv, "-l", "lab1,lab3", "deploy", str(PLAIN), "--check", "--json")
        assert r.rc == 2
        hosts = r.json()["hosts"]
        assert hosts["lab1"]["status"] == "ok"
        expected = f"@{me} pid {child.pid} (fleetctl deploy held.yml) since 20"
        assert expected in hosts["lab3"]["reason"], hosts["lab3"]["reason"]
        r = run_cli(capsys, "-i", inv, "-l", "lab3", "deploy", str(PLAIN), "--check", "--break-lock", "--json")
        assert r.rc == 2
        reason = r.json()["hosts"]["lab3"]["reason"]
        assert expected in reason and reason.endswith(" UTC; that run is alive: not breaking its lock"), reason
        assert _running(agent)
        # 2. the run is killed while its SSH session hangs on (a half-open connection, simulated by
        # stopping the host's sshd session process): its agent lives on and keeps the flock.
        session = _ppid(agent)
        assert "sshd" in Path(f"/proc/{session}/cmdline").read_text()
        os.kill(session, signal.SIGSTOP)
        child.kill()
        child.wait()
        fault_happened(_running(agent) and _state(session) == "T" and child.returncode == -signal.SIGKILL,
                       "the holding run killed, its sshd session stopped, its agent alive")
        r = run_cli(capsys, "-i", inv, "-l", "lab3", "deploy", str(PLAIN), "--check", "--json")
        assert r.rc == 2
        reason = r.json()["hosts"]["lab3"]["reason"]
        assert reason.startswith(holder) and expected in reason and reason.endswith(
            f" UTC; stale: pid {child.pid} is no longer running on {me}, its agent (pid {agent}) still "
            "holds the lock; --break-lock ends that agent and takes the lock"), reason
        # 3. broken on request: that agent (and only it) ended, the deploy plan goes on
        r = run_cli(capsys, "-i", inv, "-l", "lab3", "deploy", str(PLAIN), "--check", "--break-lock", "--json")
        assert r.rc == 0, r.out + r.err
        broke = r.json()["hosts"]["lab3"]["value"]["broke_lock"]
        assert (broke["pid"], broke["agent_pid"], broke["command"]) == (child.pid, agent, "fleetctl deploy held.yml")
        assert not _running(agent)
        text = run_cli(capsys, "-i", inv, "-l", "lab3", "deploy", str(PLAIN), "--check")
        assert text.rc == 0 and "broke the stale lock" not in text.out  # no lock left to break
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if session:
            os.kill(session, signal.SIGKILL)  # the sshd session process this test stopped
    # every host free afterwards: a plain run takes each lock (lab2 refuses the release itself, after the lock)
    after = run_cli(capsys, "-i", inv, "deploy", str(PLAIN), "--check", "--json").json()["hosts"]
    assert [after[h]["status"] for h in ("lab1", "lab3")] == ["ok", "ok"]
    assert "locked" not in after["lab2"]["reason"]
    for host in lab.hosts:
        assert_state_sound(lab, host)
