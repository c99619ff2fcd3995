"""Faults on the lab's shaped links (fleetctl/lab/netfaults.py, set as a user would with `fleetctl lab
links`): a host partitioned mid-rollout (its packets dropped, nothing refused), a host 300 ms away.
Each ends with every host whole (nothing half-switched, no temporary file, the lock free), the exit
code and the one line a user reads. Nothing here asserts timing: bounds are wide, for a loaded machine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import assert_whole, fault_happened, release_state, tiny_releases, wait_until

from fleetctl.lab import netfaults
from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
FLEETCTL = [sys.executable, "-m", "fleetctl.cli.main"]
# The new release's server answers /health only after 6 s: the partition lands inside the gate.
SLOW = 'service:\n  standin: true\n  args: [--standin-start-delay, "6"]\nhealth: {timeout: 60, interval: 0.2}\n'
TIMEOUT = 30  # -T: how long a silent host is waited for


def links(lab: LabHandle, *args: str) -> str:
    """`fleetctl lab links` on this lab, as a user types it; its one line (or lines)."""
    done = subprocess.run([*FLEETCTL, "lab", "links", "--dir", str(lab.dir), *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


@pytest.fixture
def faulty_lab(scratch_lab: LabHandle) -> Iterator[LabHandle]:
    """The scratch lab; its faults removed afterwards whatever the test did."""
    try:
        yield scratch_lab
    finally:
        netfaults.clear(scratch_lab.dir)


def releases(lab: LabHandle, folder: Path) -> tuple[Path, Path]:
    """v1 (deployed on every host here) and v2, whose server is 6 s slow to answer /health."""
    (first,) = tiny_releases(lab, folder, ["v1"])
    second = folder / "v2.yml"
    second.write_text(first.read_text().replace("name: v1", "name: v2").split("service:")[0] + SLOW)
    return first, second


def test_a_host_partitioned_mid_rollout_fails_after_the_timeout_the_other_finishes_and_a_rerun_completes(
        faulty_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = faulty_lab, str(faulty_lab.inventory_path)
    first, second = releases(lab, tmp_path)
    old, new = load_spec(first).release_id, load_spec(second).release_id
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(first)).rc == 0
    proc = subprocess.Popen([*FLEETCTL, "-i", inv, "-T", str(TIMEOUT), "-l", "all", "deploy", str(second), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        wait_until(lambda: release_state(lab, "lab1")["current"] == new, "lab1 switched to v2 (its gate waits)",
                   timeout=120, interval=0.2, alive=still_running)
        assert links(lab, "--partition", "--host", "lab1") == "link of lab1: partitioned (every packet dropped)"
        out, err = proc.communicate(timeout=TIMEOUT + 240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    fault_happened(netfaults.dropped(lab.dir).get(lab.addresses["lab1"]), "packets to or from lab1 dropped")
    assert proc.returncode == 2, out + err
    hosts = json.loads(out)["hosts"]
    assert hosts["lab2"]["status"] == "ok" and hosts["lab2"]["value"]["outcome"] == "deployed", hosts["lab2"]
    # the agent call waiting on the gate runs out (-T and the gate's timeout), then one more check
    assert hosts["lab1"]["status"] == "unreachable", hosts["lab1"]
    assert hosts["lab1"]["reason"].startswith("the host stopped answering: no answer within "), hosts["lab1"]
    assert "Traceback" not in err
    assert links(lab, "--heal", "--host", "lab1") == "link of lab1: no faults"
    # lab1 switched before the partition: whole on v2 (its gate never passed) or rolled back to v1
    state = release_state(lab, "lab1")
    assert state["current"] in (old, new), state
    assert_whole(lab, "lab2", new)
    rerun(capsys, inv, second)
    for host in lab.hosts:
        assert_whole(lab, host, new)


def rerun(capsys: pytest.CaptureFixture[str], inv: str, spec: Path) -> None:
    """The deploy again, after the fault: it completes. A host that was cut off mid-run may still
    hold its deploy lock (its agent's session half-open on the host: the controller's close never
    reached it), then the re-run refuses it in one line naming --break-lock, which completes it."""
    again = run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(spec), "--json")
    if again.rc == 2:
        refused = [h for h, v in again.json()["hosts"].items() if v["status"] != "ok"]
        for host in refused:
            reason = again.json()["hosts"][host]["reason"]
            assert reason.startswith("locked by another run: ") and reason.endswith(
                "still holds the lock; --break-lock ends that agent and takes the lock"), reason
        again = run_cli(capsys, "-i", inv, "-l", ",".join(refused), "deploy", str(spec), "--break-lock", "--json")
    assert again.rc == 0, again.out + again.err
