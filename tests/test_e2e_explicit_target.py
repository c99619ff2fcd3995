"""On the lab: a deploy with no -l is refused and changes nothing; with ``-l lab1`` it deploys there
only; plain (not --serial) deploy and service runs are journaled, and ``runs list``/``runs show``
read them back (issue 31, item 4)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
PLAIN = Path(__file__).resolve().parents[1] / "playbooks" / "releases" / "sglang-0.5.23-lab.yml"


def current(lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    doc = run_cli(capsys, "-i", str(lab.inventory_path), "status", "--json").json()
    return {h: (v.get("value") or {}).get("current") for h, v in doc["hosts"].items()}


def test_deploy_needs_a_target_then_deploys_there_journaled(release_free_lab: LabHandle,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = release_free_lab, str(release_free_lab.inventory_path)
    runs = lab.dir / ".fleetctl" / "runs"
    earlier = set(runs.glob("*.jsonl"))
    refused = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", inv, "deploy", str(PLAIN)],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "-l PATTERN" in refused.stderr
    assert set(current(lab, capsys).values()) == {None}
    assert set(runs.glob("*.jsonl")) == earlier

    r = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", inv, "-l", "lab1", "deploy", str(PLAIN)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    release = load_spec(PLAIN).release_id
    assert current(lab, capsys) == {"lab1": release, "lab2": None, "lab3": None}
    restarted = run_cli(capsys, "-i", inv, "service", "restart", "-l", "lab1", "--json")
    assert restarted.rc == 0, restarted.out + restarted.err
    assert restarted.json()["journal"]

    listed = run_cli(capsys, "-i", inv, "runs", "list", "--json").json()
    ours = [s for s in listed if s["run_id"] not in {p.stem for p in earlier}]
    assert [(s["playbook"], s["status"], s["hosts"]) for s in ours] == [
        (f"fleetctl deploy {PLAIN}", "ok", ["lab1"]), ("fleetctl service restart", "ok", ["lab1"])]
    shown = run_cli(capsys, "-i", inv, "runs", "show", ours[0]["run_id"])
    assert shown.rc == 0, shown.err
    assert f"run {ours[0]['run_id']}: fleetctl deploy {PLAIN}" in " ".join((shown.out + shown.err).split())
    assert "ok: lab1" in shown.out + shown.err
