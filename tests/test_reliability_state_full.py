"""A host's state folder (/var/lib/fleetctl) full while a deploy writes its lock holder or state.json:
one clear line, nothing half-written (state.json parses and agrees with `current`, no temporary
file), the previous release still current and serving, the lock free; once there is room the same
deploy finishes."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import STATE, assert_whole, fill_state_dir, tiny_releases, unmount_state_dir

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab

# Pages left free on the small tmpfs, and what the deploy runs out of room for: with none, the lock's
# holder record; with one (the holder takes it), the new state.json of the switch.
CASES = {
    "lock": (0, f"no space left on device in {STATE} (writing deploy.lock.holder); nothing changed"),
    "state": (1, f"no space left on device in {STATE} (writing state.json); nothing switched, {{old}} is still "
                 "current"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_full_state_folder_refuses_in_one_line_and_leaves_the_host_whole(
        scratch_lab: LabHandle, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    first, second = tiny_releases(lab, tmp_path, ["v1", "v2"])
    old, new = load_spec(first).release_id, load_spec(second).release_id
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(first)).rc == 0
    pages, line = CASES[case]
    fill_state_dir(lab, "lab1", pages)
    try:
        r = run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(second), "--json")
        assert r.rc == 2, r.out + r.err
        hosts = r.json()["hosts"]
        assert hosts["lab1"]["status"] == "failed"
        assert hosts["lab1"]["reason"] == "release_host: DiskFull: " + line.format(old=old), hosts["lab1"]
        assert hosts["lab2"]["status"] == "ok" and hosts["lab2"]["value"]["outcome"] == "deployed"
        human = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(second))
        assert human.rc == 2 and "Traceback" not in human.out + human.err
        assert f"lab1: failed: release_host: DiskFull: {line.format(old=old)}" in " ".join(human.err.split())
        assert_whole(lab, "lab1", old)  # state.json parses and names v1, the lock free, v1 serving
        assert_whole(lab, "lab2", new)
        # room again (the filler removed): the same deploy finishes the job
        lab.ssh("lab1", f"rm {STATE}/filler")
        done = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(second))
        assert done.rc == 0, done.out + done.err
        assert_whole(lab, "lab1", new)
    finally:
        unmount_state_dir(lab, "lab1")
