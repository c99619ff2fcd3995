"""The controller SIGKILLed mid-rollout, as batch 2's host switches or waits in its health gate: that
host is switched (whole, serving the new release when its server runs) or not, never half;
`fleetctl run --resume RUN_ID` skips the host that finished and takes the rest through, every host
whole and serving the new release at the end."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import (
    assert_whole,
    fault_happened,
    journal_events,
    release_state,
    slow_rollout,
    wait_until,
)

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab


def test_controller_killed_in_a_health_gate_then_resume_finishes(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    # The new release's server answers /health only after 6 s: the kill lands inside the gate.
    first, second, book = slow_rollout(lab, tmp_path, start_delay=6, timeout=60)
    old, new = load_spec(first).release_id, load_spec(second).release_id
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(first)).rc == 0
    runs = lab.dir / ".fleetctl" / "runs"
    earlier = set(runs.glob("*.jsonl"))  # the plain deploy's journal
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", inv, "run", str(book)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        # batch 2 (lab2) has switched and waits for /health: kill the controller there
        wait_until(lambda: release_state(lab, "lab2")["current"] == new, "lab2 switched to the new release",
                   timeout=120, interval=0.2, alive=still_running)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    fault_happened(proc.returncode == -signal.SIGKILL, "the controller died of SIGKILL")
    (journal,) = set(runs.glob("*.jsonl")) - earlier
    events = journal_events(journal)
    fault_happened(not any(e["event"] == "run_end" for e in events), "the run ended before the kill")
    assert any(e["event"] == "host_done" and e.get("host") == "lab1" for e in events)
    # The host finishes a switch and its restart even when the controller dies inside them (one
    # sequence); its agent then exits and the deploy lock is free.
    wait_until(lambda: not release_state(lab, "lab2")["lock_held"], "lab2's agent let go of the deploy lock",
               timeout=60, interval=0.2)
    # no host half-switched: lab1 finished on v2; lab2 switched to v2 (whole, its gate never passed)
    # and, when its server runs, it serves v2
    assert_whole(lab, "lab1", new)
    assert_whole(lab, "lab2", new, serving=None)
    again = run_cli(capsys, "-i", inv, "run", str(book), "--resume", journal.stem, "--json")
    assert again.rc == 0, again.out + again.err
    resumed = journal_events(journal)
    after = resumed[next(i for i, e in enumerate(resumed) if e["event"] == "resume"):]
    assert [e["hosts"] for e in after if e["event"] == "batch_start"] == [["lab2"]]  # lab1 skipped
    assert next(e for e in reversed(resumed) if e["event"] == "run_end")["status"] == "ok"
    for host in lab.hosts:
        assert_whole(lab, host, new)
    assert old != new
