"""A second Ctrl-C while the first is being handled (issue 32 P8: GNU `timeout -s INT` signals twice)
ends the run in a recorded, consistent state: the host whose health gate was in flight goes back to
the release it ran (never left switched and not gated), the journal says interrupted and has its
run_end, exit 130, and `run --resume` finishes the rollout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
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


def test_a_second_ctrl_c_rolls_the_gated_host_back_and_records_the_end(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    # The new release answers /health only after 20 s: both Ctrl-Cs land inside batch 2's gate.
    first, second, book = slow_rollout(lab, tmp_path, start_delay=20, timeout=90)
    old, new = load_spec(first).release_id, load_spec(second).release_id
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(first)).rc == 0
    runs = lab.dir / ".fleetctl" / "runs"
    earlier = set(runs.glob("*.jsonl"))
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", inv, "run", str(book)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    said: list[str] = []  # what it prints (human output and errors), line by line as it comes
    reader = threading.Thread(target=lambda: said.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        def still_running() -> None:
            assert proc.poll() is None, "".join(said)

        wait_until(lambda: release_state(lab, "lab2")["current"] == new, "lab2 switched to the new release",
                   timeout=180, interval=0.2, alive=still_running)
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: any("Ctrl-C: finishing" in line for line in said), "the first Ctrl-C was taken",
                   timeout=30, alive=still_running)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    err = "".join(said)
    assert proc.returncode == 130, err
    assert "Ctrl-C again: aborting" in err and "Traceback" not in err, err
    (journal,) = set(runs.glob("*.jsonl")) - earlier
    events = journal_events(journal)
    stop = next(e for e in events if e["event"] == "interrupted")
    assert stop["aborted"] is True and stop["batch"] == 2, stop
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "interrupted", events[-1]
    lab2_done = [e for e in events if e["event"] == "task_result" and e.get("host") == "lab2"]
    fault_happened(lab2_done, "lab2's deploy answered (its gate was in flight at the second Ctrl-C)")
    # lab1 finished batch 1, gated; lab2's gate was ended: back on the release it ran, whole and serving
    assert_whole(lab, "lab1", new)
    state = assert_whole(lab, "lab2", old)["state"]
    assert [(h["from"], h["to"], h["kind"]) for h in state["history"][-2:]] == \
        [(old, new, "deploy"), (new, old, "revert")], state["history"]
    listed = run_cli(capsys, "-i", inv, "runs", "list", "--json").json()
    assert next(r for r in listed if r["run_id"] == journal.stem)["status"] == "interrupted"
    again = run_cli(capsys, "-i", inv, "run", str(book), "--resume", journal.stem)
    assert again.rc == 0, again.out + again.err
    for host in lab.hosts:
        assert_whole(lab, host, new)
