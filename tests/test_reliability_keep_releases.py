"""`keep_releases` holds when the oldest release is the rollback target (issue 32 P7): prune used to
look only at the oldest len-keep releases and removed nothing when one of them was protected, so a
host kept more releases than the spec allows. Now the oldest unprotected ones go until `keep` are left."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import STANDIN_BODY, assert_whole, tiny_releases

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab


def test_keep_releases_holds_when_the_oldest_release_is_the_rollback_target(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    specs = tiny_releases(lab, tmp_path, ["keep1", "keep2", "keep3"], STANDIN_BODY + "keep_releases: 2\n")
    one, two, three = (load_spec(s).release_id for s in specs)
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(specs[0])).rc == 0
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(specs[1])).rc == 0
    # back to keep1: keep2 is rejected as a rollback target, keep1 (the oldest) stays the one to go back to
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "rollback").rc == 0
    r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(specs[2]), "--json")
    assert r.rc == 0, r.out + r.err
    value = r.json()["hosts"]["lab1"]["value"]
    assert (value["previous"], value["pruned"]) == (one, [two]), value
    listed = run_cli(capsys, "-i", inv, "-l", "lab1", "releases", "list", "--json").json()["hosts"]["lab1"]["value"]
    assert sorted(listed["releases"]) == sorted([one, three]), listed  # two releases: keep_releases
    assert listed["previous"] == one
    assert_whole(lab, "lab1", three)
    back = run_cli(capsys, "-i", inv, "-l", "lab1", "rollback")  # the rollback target survived the prune
    assert back.rc == 0, back.out + back.err
    assert_whole(lab, "lab1", one)
