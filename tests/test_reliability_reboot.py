"""A host rebooted between staging and switching: `deploy --stage` builds and verifies the release,
the host restarts (its namespace and every process in it, the running service too, end; its disks
stay; the supervisor's boot entry brings the old release's server back), then `deploy` switches to
the staged build, or rebuilds it, and never leaves the host half-switched."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle, process_gone
from reliability_support import assert_whole, fault_happened, release_state, tiny_releases, wait_until

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab


def test_a_host_rebooted_between_staging_and_switching_switches_whole(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    first, second = tiny_releases(lab, tmp_path, ["v1", "v2"])
    old, new = load_spec(first).release_id, load_spec(second).release_id
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(first)).rc == 0
    staged = run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(second), "--stage", "--json")
    assert staged.rc == 0, staged.out + staged.err
    assert {h: v["value"]["outcome"] for h, v in staged.json()["hosts"].items()} == dict.fromkeys(lab.hosts, "staged")
    for host in lab.hosts:
        assert_whole(lab, host, old)  # staging switches nothing
    # lab1 reboots: its sshd, its sessions and the service it ran end; its files stay
    sshd, service = lab.pids()["lab1"], release_state(lab, "lab1")["service_pid"]
    lab.stop("lab1")
    fault_happened(process_gone(sshd) and process_gone(service), f"lab1's sshd {sshd} and service {service} ended")
    lab.start("lab1")
    # the supervisor's boot entry brings the old release's server back (a new process): still old
    back_pid = wait_until(lambda: (release_state(lab, "lab1")["service_pid"] or 0) not in (0, service) and
                          release_state(lab, "lab1")["service_pid"], "lab1's server back after the restart")
    fault_happened(back_pid != service, f"lab1's server is a new process after the restart ({service} -> {back_pid})")
    assert_whole(lab, "lab1", old)
    r = run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(second), "--json")
    assert r.rc == 0, r.out + r.err
    for host in lab.hosts:
        value = r.json()["hosts"][host]["value"]
        # the staged build survived the reboot: only switched, restarted, gated
        assert (value["outcome"], value["staged"], value["release_id"]) == ("deployed", True, new), value
        assert_whole(lab, host, new)
    # and back: the rebooted host rolls back to what it ran before, whole
    back = run_cli(capsys, "-i", inv, "-l", "lab1", "rollback")
    assert back.rc == 0, back.out + back.err
    assert_whole(lab, "lab1", old)
