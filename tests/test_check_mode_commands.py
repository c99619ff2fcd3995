"""`--check` on every command that changes hosts (issue 32, P6): `service start|stop|restart`, `releases
remove` and `venv create` say per host what they would do, and change nothing there: every file under
the release root and the state folder the same (size and mtime), the servers the same processes, no
venv made, no journal written on the controller."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import STATE, tiny_releases
from service_cleanup import clean_releases

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab

NEW_VENV = "/root/check-env"
# Every file (not folder) under the release root and the state folder, with its size and mtime, and
# the server's pid: what a change would move. (The agent's own cache is not the host's state.)
SNAPSHOT = (f"find /opt/fleetctl {STATE} -path {STATE}/cache -prune -o ! -type d -printf '%p %s %T@\\n' | sort; "
            f"cat {STATE}/service/sglang.pid; ls -d {NEW_VENV} 2>&1")


def test_check_mode_says_what_would_happen_and_changes_nothing(scratch_lab: LabHandle, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    specs = tiny_releases(lab, tmp_path, ["chk1", "chk2", "chk3"])
    ids = [load_spec(s).release_id for s in specs]
    for spec in specs:  # chk1 ends neither current nor previous: removable
        assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(spec)).rc == 0
    runs = run_cli(capsys, "-i", inv, "runs", "list", "--json").json()
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("tinydist==1.0\n")
    before = lab.ssh("lab1", SNAPSHOT, check=False).stdout
    assert f"releases/{ids[0]}/manifest.json" in before and "No such file" in before, before
    try:
        stop = run_cli(capsys, "-i", inv, "-l", "lab1", "service", "stop", "--check", "--json")
        assert stop.rc == 0, stop.out + stop.err
        assert stop.json()["hosts"]["lab1"]["value"]["would"] == ["would stop"]
        restart = run_cli(capsys, "-i", inv, "-l", "lab1", "service", "restart", "--check")
        cells = re.sub(r"[\s│]+", " ", restart.out)  # the table wraps a cell where the pid column is wide
        assert restart.rc == 0 and "would restart, then wait for /health" in cells, restart.out
        assert "check: nothing changed" in restart.out
        start = run_cli(capsys, "-i", inv, "-l", "lab1", "service", "start", "--check", "--json")
        assert start.json()["hosts"]["lab1"]["value"]["would"] == ["nothing: running"]
        remove = run_cli(capsys, "-i", inv, "-l", "lab1", "releases", "remove", ids[0], "--check")
        assert remove.rc == 0 and f"lab1: would remove /opt/fleetctl/releases/{ids[0]}" in remove.out, remove.out
        refused = run_cli(capsys, "-i", inv, "-l", "lab1", "releases", "remove", ids[2], "--check")
        assert refused.rc == 2 and f"release {ids[2]} is the current one" in refused.err, refused.err
        create = run_cli(capsys, "-i", inv, "-l", "lab1", "venv", "create", "--venv", NEW_VENV, "--requirements",
                         str(reqs), "--check", "--json")
        assert create.rc == 0, create.out + create.err
        value = create.json()["hosts"]["lab1"]["value"]
        assert value["summary"] == "would create the venv, install 1 (tinydist==1.0)" and value["check"], value
        # nothing changed on the host, and nothing journaled
        assert lab.ssh("lab1", SNAPSHOT, check=False).stdout == before
        assert run_cli(capsys, "-i", inv, "runs", "list", "--json").json() == runs
    finally:
        lab.ssh("lab1", f"{clean_releases()}; rm -rf {NEW_VENV}", check=False)
