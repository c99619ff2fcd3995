"""Faults during ``venv overlay`` on the lab fleet: one target's sshd killed mid-stream (the other
target finishes, that one is unreachable, its files are each old-or-new, a re-run completes it);
a target whose venv's disk fills (a clean failure naming host and path, no temporary file left)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_support import CliRun, run_cli
from lab_support import REPO, LabHandle, process_gone
from reliability_support import assert_state_sound, fault_happened, wait_until
from sglang_support import NEW_SGLANG, make_venv, wheel

pytestmark = pytest.mark.lab
SRC = "/root/rel-src"
SITE = "lib/python3.11/site-packages"
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")

# On the host: sha256 of every file under a folder, by relative path.
_HASHES = textwrap.dedent("""\
    import hashlib, json, os, sys
    top, out = sys.argv[1], {}
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, top)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    print(json.dumps(out))
    """)


def hashes(lab: LabHandle, host: str, folder: str) -> dict[str, str]:
    return json.loads(lab.ssh(host, f"/usr/bin/python3 - {folder} <<'PY'\n{_HASHES}PY").stdout)


@pytest.fixture(scope="module")
def src_lab(lab_fleet: LabHandle) -> LabHandle:
    """lab1: /root/rel-src holds sglang 0.5.23 (pip-installed); reused while the lab lives."""
    make_venv(lab_fleet, "lab1", SRC, [wheel("sglang", NEW_SGLANG)])
    return lab_fleet


def _fresh(lab: LabHandle, host: str, venv: str) -> None:
    lab.ssh(host, f"rm -rf {venv} /var/lib/fleetctl/overlays && /usr/bin/python3 -m venv --without-pip {venv}")


def _overlay(capsys: pytest.CaptureFixture[str], lab: LabHandle, limit: str, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(lab.inventory_path), "-l", limit, "venv", "overlay", "--from", "lab1",
                   "--venv", SRC, "--packages", "sglang", *args, "--json")


def test_sshd_killed_mid_overlay_other_target_finishes_rerun_completes(
        src_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab = src_lab
    for host in ("lab2", "lab3"):
        _fresh(lab, host, SRC)
    env = dict(os.environ, FLEETCTL_OVERLAY_THROTTLE_S="0.002")  # each target takes a few seconds
    proc = subprocess.Popen([FLEETCTL, "-i", str(lab.inventory_path), "-l", "lab2,lab3", "venv", "overlay",
                             "--from", "lab1", "--venv", SRC, "--packages", "sglang", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    sshd = lab.pids()["lab2"]
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        def writing() -> bool:  # lab2 has begun to write sglang's files
            count = lab.ssh("lab2", f"ls {SRC}/{SITE}/sglang/srt 2>/dev/null | wc -l", check=False).stdout.strip()
            return count not in ("", "0")

        wait_until(writing, "lab2 began to write sglang's files", timeout=120, alive=still_running)
        lab.stop("lab2")
        fault_happened(process_gone(sshd), f"lab2's sshd (pid {sshd}) killed mid-overlay")
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, out + err
    hosts = json.loads(out)["hosts"]
    assert hosts["lab3"]["status"] == "ok" and hosts["lab3"]["value"]["applied"]["written"] > 1000
    assert hosts["lab2"]["status"] == "unreachable", hosts["lab2"]
    assert hosts["lab2"]["reason"].startswith("connection lost during the transfer"), hosts["lab2"]["reason"]
    lab.start("lab2")
    # every file on lab2 is whole: the source's own bytes (a fresh venv has no old version to keep)
    source = hashes(lab, "lab1", f"{SRC}/{SITE}")
    seen = hashes(lab, "lab2", f"{SRC}/{SITE}")
    landed = [p for p in seen if not p.endswith(".fleetctl-tmp")]
    assert landed and len([p for p in landed if p.startswith("sglang/")]) < len(
        [p for p in source if p.startswith("sglang/")])  # cut midway
    assert [p for p in landed if seen[p] != source.get(p)] == []
    assert not any(p.startswith("sglang-") and p.endswith("RECORD") for p in landed)  # dist-info comes last
    r = _overlay(capsys, lab, "lab2,lab3")
    assert r.rc == 0, r.out[-2000:] + r.err
    assert r.json()["hosts"]["lab2"]["value"]["resumes"] is True
    assert r.json()["hosts"]["lab3"]["value"]["applied"] is None  # nothing to change
    for host in ("lab2", "lab3"):
        assert lab.ssh(host, f"find {SRC} -name '*.fleetctl-tmp*' | wc -l").stdout.strip() == "0"
    def sglang_files(table: dict[str, str]) -> dict[str, str]:
        return {p: h for p, h in table.items() if p.startswith(("sglang/", f"sglang-{NEW_SGLANG}.dist-info/"))
                and not p.endswith(("INSTALLER", "REQUESTED", "direct_url.json", "RECORD"))}  # RECORD: rewritten

    want = sglang_files(source)
    for host in ("lab2", "lab3"):
        assert sglang_files(hashes(lab, host, f"{SRC}/{SITE}")) == want, host
        assert_state_sound(lab, host)  # no temporary file in the state folder, no lock left held


def test_disk_full_during_overlay_fails_cleanly(src_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    """lab3's target venv lives on a 2 MB tmpfs (in lab3's own mount namespace): sglang does not fit."""
    lab, target = src_lab, "/root/ov-full"
    lab.ssh("lab3", f"rm -rf {target} /var/lib/fleetctl/overlays; mkdir -p {target} && mount -t tmpfs "
                    f"-o size=2m fleetctl-full {target} && /usr/bin/python3 -m venv --without-pip {target}")
    fault_happened(lab.ssh("lab3", f"findmnt -n -t tmpfs -o SIZE {target}").stdout.strip() == "2M",
                   f"lab3's {target} a 2 MB tmpfs")
    try:
        r = _overlay(capsys, lab, "lab3", "--to-venv", target)
        assert r.rc == 2
        reason = r.json()["hosts"]["lab3"]["reason"]
        assert reason.startswith(f"overlay failed on the target: DiskFull: no space left on device in {target} "
                                 "(writing sglang/"), reason
        assert "temporary files removed" in reason and reason.endswith("run again when there is room")
        human = run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab3", "venv", "overlay", "--from", "lab1",
                        "--venv", SRC, "--packages", "sglang", "--to-venv", target)
        assert human.rc == 2
        assert f"lab3: failed: overlay failed on the target: DiskFull: no space left on device in {target}" in \
            " ".join(human.err.split()) + " ".join(human.out.split())
        assert lab.ssh("lab3", f"find {target} -name '*.fleetctl-tmp*' | wc -l").stdout.strip() == "0"
        assert lab.ssh("lab3", f"ls {target}/{SITE} | grep -c dist-info; true").stdout.strip() == "0"
        assert lab.ssh("lab3", f"{target}/bin/python -c 'print(1)'").stdout.strip() == "1"  # the venv still works
        # room again: a re-run finishes the job
        lab.ssh("lab3", f"mount -o remount,size=400m {target}")
        done = _overlay(capsys, lab, "lab3", "--to-venv", target)
        assert done.rc == 0, done.out[-2000:] + done.err
        assert lab.ssh("lab3", f"{target}/bin/python -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'"
                       ).stdout.strip() == NEW_SGLANG
        assert lab.ssh("lab3", f"find {target} -name '*.fleetctl-tmp*' | wc -l").stdout.strip() == "0"
        assert_state_sound(lab, "lab3")
    finally:
        lab.ssh("lab3", f"umount {target}; rm -rf {target} /var/lib/fleetctl/overlays", check=False)
