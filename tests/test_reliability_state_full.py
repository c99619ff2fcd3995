"""A host's state folder (/var/lib/fleetctl) full while a deploy writes its lock holder or state.json,
or an overlay its journal or manifest: one clear line, nothing half-written (state.json parses and
agrees with `current`, no temporary file), the previous release still current and serving, the
lock free; once there is room the same command finishes."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from reliability_support import assert_state_sound, assert_whole, fault_happened, tiny_releases

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
STATE = "/var/lib/fleetctl"

# Pages left free on the small tmpfs, and what the deploy runs out of room for: with none, the lock's
# holder record; with one (the holder takes it), the new state.json of the switch.
CASES = {
    "lock": (0, f"no space left on device in {STATE} (writing deploy.lock.holder); nothing changed"),
    "state": (1, f"no space left on device in {STATE} (writing state.json); nothing switched, {{old}} is still "
                 "current"),
}


def fill_state_dir(lab: LabHandle, host: str, pages_left: int) -> None:
    """A 1 MB tmpfs over the host's state folder (in its own mount namespace), holding a copy of what
    was there, filled up to ``pages_left`` free pages."""
    lab.ssh(host, f"cp -a {STATE} /root/state-copy && mount -t tmpfs -o size=1m fleetctl-state-full {STATE} && "
                  f"cp -a /root/state-copy/. {STATE}/ && rm -rf /root/state-copy && "
                  f"dd if=/dev/zero of={STATE}/filler bs=4k 2>/dev/null "
                  f"count=$(( $(stat -f -c %a {STATE}) - {pages_left} ))")
    fault_happened(lab.ssh(host, f"stat -f -c %a {STATE}").stdout.strip() == str(pages_left),
                   f"{STATE} on {host} left with {pages_left} free pages")


def unmount_state_dir(lab: LabHandle, host: str) -> None:
    """Back to the host's own state folder: the service started on the tmpfs keeps its log open there,
    so it is stopped first (the test's own clean-up, by its pidfile)."""
    lab.ssh(host, f"f={STATE}/service/sglang.pid; [ -f $f ] && kill -9 $(head -1 $f) 2>/dev/null; "
                  f"sleep 0.2; umount {STATE}", check=False)
    assert lab.ssh(host, f"findmnt -n -t tmpfs {STATE}; true").stdout.strip() == ""


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_full_state_folder_refuses_in_one_line_and_leaves_the_host_whole(
        scratch_lab: LabHandle, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    first, second = tiny_releases(lab, tmp_path, ["v1", "v2"])
    old, new = load_spec(first).release_id, load_spec(second).release_id
    assert run_cli(capsys, "-i", inv, "deploy", str(first)).rc == 0
    pages, line = CASES[case]
    fill_state_dir(lab, "lab1", pages)
    try:
        r = run_cli(capsys, "-i", inv, "deploy", str(second), "--json")
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


SRC, DST = "/root/ov-src", "/root/ov-dst"
SITE = "lib/python3.11/site-packages"
# A one-module distribution (no pip needed): what `venv overlay` copies from lab1 to lab2.
TINY_DIST = (f"rm -rf {SRC} && /usr/bin/python3 -m venv --without-pip {SRC} && cd {SRC}/{SITE} && "
             "mkdir tinydist tinydist-1.0.dist-info && echo 'X = 1' > tinydist/__init__.py && "
             "printf 'Metadata-Version: 2.1\\nName: tinydist\\nVersion: 1.0\\n' > tinydist-1.0.dist-info/METADATA && "
             "printf 'tinydist/__init__.py,,\\ntinydist-1.0.dist-info/METADATA,,\\ntinydist-1.0.dist-info/RECORD,,\\n'"
             " > tinydist-1.0.dist-info/RECORD")
OVERLAY_CASES = {  # free pages: the overlay journal (its first write) / the manifest after every file landed
    "journal": (0, f"(writing the overlay journal); nothing written to {DST}: run again when there is room", False),
    "manifest": (1, f"(writing the overlay manifest); every file is in {DST}, each whole; only the record "
                    "`fleetctl drift` reads (manifest, origins) is missing", True),
}


@pytest.mark.parametrize("case", sorted(OVERLAY_CASES))
def test_a_full_state_folder_during_an_overlay_is_one_line_and_a_rerun_finishes(
        scratch_lab: LabHandle, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    lab = scratch_lab
    pages, line, landed = OVERLAY_CASES[case]
    lab.ssh("lab1", TINY_DIST)

    def overlay() -> CliRun:
        return run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1",
                       "--venv", SRC, "--to-venv", DST, "--packages", "tinydist", "--json")

    lab.ssh("lab2", f"/usr/bin/python3 -m venv --without-pip {DST}")
    assert overlay().rc == 0  # a first overlay: the host's agent has its code cached, the state folder made
    lab.ssh("lab2", f"rm -rf {DST} {STATE}/overlays/* && /usr/bin/python3 -m venv --without-pip {DST}")
    fill_state_dir(lab, "lab2", pages)
    try:
        r = overlay()
        assert r.rc == 2, r.out + r.err
        reason = r.json()["hosts"]["lab2"]["reason"]
        assert reason == f"overlay failed on the target: DiskFull: no space left on device in {STATE}/overlays {line}"
        files = lab.ssh("lab2", f"ls {DST}/{SITE}").stdout.split()
        assert files == (["tinydist", "tinydist-1.0.dist-info"] if landed else []), files
        if landed:  # each file whole: the module imports with the source's content
            assert lab.ssh("lab2", f"{DST}/bin/python -c 'import tinydist; print(tinydist.X)'").stdout.strip() == "1"
        assert lab.ssh("lab2", f"find {STATE} {DST} -name '*.fleetctl-tmp*' | wc -l").stdout.strip() == "0"
        assert_state_sound(lab, "lab2")
        lab.ssh("lab2", f"rm {STATE}/filler")
        again = overlay()
        assert again.rc == 0, again.out + again.err
        value = again.json()["hosts"]["lab2"]["value"]
        # no journal left to say "cut short"; the landed files need nothing, the others are sent now
        assert value["resumes"] is False and (value["applied"] is None) is landed, value
        assert not any(n.startswith("inflight-") for n in lab.ssh("lab2", f"ls {STATE}/overlays").stdout.split())
        assert lab.ssh("lab2", f"{DST}/bin/python -c 'import tinydist; print(tinydist.X)'").stdout.strip() == "1"
    finally:
        unmount_state_dir(lab, "lab2")
