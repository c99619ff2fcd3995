"""A full /opt after the switch (issue 32 B7): the new release was staged before the disk filled, so
the switch and restart succeed, then the warm-up's measurement cannot be kept (ENOSPC on
releases/<id>/canary.json). The host must go back to the release that served, as after any gate
failure: serving the previous release, the new one recorded as rejected in its history, the run's
journal saying failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import STATE, assert_whole, fault_happened, served_release, tiny_releases
from service_cleanup import clean_releases, unmount

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab

OPT = "/opt/fleetctl"
MEASURED = ("service: {standin: true}\n"
            "health: {timeout: 30, interval: 0.2, warmup: {requests: 1, max_tokens: 16}, "
            "canary: {max_regression_percent: 50}}\n")


def test_a_full_opt_after_the_switch_rolls_the_host_back(scratch_lab: LabHandle, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    first, second = tiny_releases(lab, tmp_path, ["full1", "full2"], MEASURED)
    old, new = load_spec(first).release_id, load_spec(second).release_id
    lab.ssh("lab1", f"mkdir -p {OPT} && mount -t tmpfs -o size=2m fleetctl-opt-full {OPT}")
    try:
        assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(first)).rc == 0
        assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(second), "--stage").rc == 0
        lab.ssh("lab1", f"dd if=/dev/zero of={OPT}/filler bs=4k 2>/dev/null count=$(stat -f -c %a {OPT})")
        fault_happened(lab.ssh("lab1", f"stat -f -c %a {OPT}").stdout.strip() == "0", f"{OPT} on lab1 full")
        r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(second), "--json")
        assert r.rc == 2, r.out + r.err
        lab1 = r.json()["hosts"]["lab1"]
        assert lab1["status"] == "failed" and "Traceback" not in r.err, lab1
        value = lab1["value"]
        assert value["outcome"] == "rolled-back" and value["previous"] == old, value
        failed = [g for g in value["gates"] if not g["ok"]]
        # the fault really happened where it matters: after the switch, at the measurement's save
        assert [g["name"] for g in failed] == ["warm-up saved"], value["gates"]
        assert "No space left on device" in failed[0]["detail"], failed
        assert lab1["reason"].endswith(f"rolled back to {old}"), lab1["reason"]
        # the whole host: serving the previous release, the new one rejected in its history
        state = assert_whole(lab, "lab1", old, base="/root/tiny-env")["state"]
        assert served_release(lab, "lab1") == old
        assert new in state["rejected"] and old not in state["rejected"], state
        assert [(h["from"], h["to"], h["kind"]) for h in state["history"][-2:]] == \
            [(old, new, "deploy"), (new, old, "revert")], state["history"]
        # the run's journal: this deploy failed on lab1
        runs = run_cli(capsys, "-i", inv, "runs", "list", "--json")
        last = sorted(runs.json(), key=lambda run: run["started"])[-1]
        assert last["status"] == "failed" and last["hosts"] == ["lab1"], last
        # room again: the same deploy goes through, gated
        lab.ssh("lab1", f"rm {OPT}/filler")
        again = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(second))
        assert again.rc == 0, again.out + again.err
        assert_whole(lab, "lab1", new, base="/root/tiny-env")
        kept = lab.ssh("lab1", f"cat {OPT}/releases/{new}/canary.json").stdout
        assert json.loads(kept)["requests"] == 1
    finally:
        lab.ssh("lab1", f"{clean_releases(OPT + '/*', state=STATE)}; {unmount(OPT)}", check=False)
    assert lab.ssh("lab1", f"findmnt -n {OPT}; true").stdout.strip() == ""
