"""A host's state folder (/var/lib/fleetctl) full while `venv overlay` writes its journal (before any
file) or its manifest (after every file landed): one clear line saying which and what holds, no
temporary file, no journal left to mistake a finished overlay for a cut one; the re-run finishes."""

from __future__ import annotations

import pytest
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from reliability_support import STATE, assert_state_sound, fill_state_dir, unmount_state_dir

pytestmark = pytest.mark.lab

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
