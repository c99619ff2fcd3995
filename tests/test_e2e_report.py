"""``fleetctl report`` end to end on the lab fleet (real sshd hosts, real sglang venvs): a real fleet
state, then the page and its JSON.

The state: lab1 and lab3 deployed the plain release through a 2-batch rollout (canary lab1); a second
rollout put the sick release (its /health answers 503) on lab3, whose gate failed, so lab3 was rolled
back; lab2 is stale (sglang 0.5.9 where the others have 0.5.23) and has no release; every host has a
fake nvidia-smi (host var ``nvidia_smi``) printing the real H200 capture, lab3's with a pending row
remapping (red), lab2's with a hostile GPU name; lab2's release state file carries a hostile history
entry. Host output is hostile input: the page must show it escaped.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from gpu_fixtures import FAKE_SMI, H200_XML, derive, install_fake_smi, remove_fake_smi
from lab_support import REPO, LabHandle, unhealthy_release_spec

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
PLAIN = REPO / "playbooks" / "releases" / "sglang-0.5.23-lab.yml"
EVIL = '<script>alert("pwned")</script><img src=http://evil.example/x.png>'
VARS = ("-e", f"nvidia_smi={FAKE_SMI}", "-e", "gpus_expected=1", "-e", "gpu_model=H200")
CHROMIUM = ("chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run")


def cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(lab.inventory_path), *args)


def rollout(capsys: pytest.CaptureFixture[str], lab: LabHandle, folder: Path, hosts: str, spec: Path,
            serial: int) -> dict[str, Any]:
    path = folder / f"rollout-{spec.stem}.yml"
    path.write_text(yaml.safe_dump([{"name": "rollout", "hosts": hosts, "serial": serial,
                                     "tasks": [{"name": "deploy", "release": str(spec)}]}], sort_keys=False))
    r = cli(capsys, lab, "run", str(path), "--json")
    doc: dict[str, Any] = r.json()
    return doc


@pytest.fixture(scope="module")
def fleet_state(release_free_lab: LabHandle, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[tuple[LabHandle, dict[str, Any], dict[str, Any]]]:
    lab = release_free_lab
    scratch = tmp_path_factory.mktemp("report")
    evil_name = H200_XML.replace("<product_name>NVIDIA H200</product_name>",
                                 "<product_name>NVIDIA H200 &lt;script&gt;alert(1)&lt;/script&gt;</product_name>", 1)
    for host, xml in (("lab1", H200_XML), ("lab2", evil_name), ("lab3", derive("remap-pending"))):
        install_fake_smi(lab, host, xml, scratch)
    history = {"history": [{"time": 1.75e9, "from": None, "to": "gone-1", "reason": EVIL, "who": EVIL}]}
    lab.ssh("lab2", f"mkdir -p /var/lib/fleetctl && echo {json.dumps(json.dumps(history))} "
                    "> /var/lib/fleetctl/state.json")
    # The report reads every run journal beside the inventory: this test's runs only, not those that
    # earlier tests on the same session lab left (a run that touched lab2 would be its last run).
    runs, kept = lab.dir / ".fleetctl" / "runs", scratch / "earlier-runs"
    if runs.exists():
        shutil.move(str(runs), str(kept))  # scratch may be on another filesystem
    yield lab, {"scratch": scratch}, {}
    for host in lab.hosts:
        remove_fake_smi(lab, host)
    if kept.exists():
        shutil.rmtree(runs, ignore_errors=True)
        shutil.move(str(kept), str(runs))


def test_report_of_a_real_fleet(fleet_state: tuple[LabHandle, dict[str, Any], dict[str, Any]],
                                capsys: pytest.CaptureFixture[str]) -> None:
    lab, where, _ = fleet_state
    scratch: Path = where["scratch"]
    first = rollout(capsys, lab, scratch, "lab:!lab2", PLAIN, 1)
    assert first["status"] == "ok", first
    sick = rollout(capsys, lab, scratch, "lab3", unhealthy_release_spec(scratch), 1)
    assert sick["status"] == "halted", sick  # its one batch failed: over the failure budget
    plain = load_spec(PLAIN).release_id

    page = scratch / "fleet.html"
    r = cli(capsys, lab, *VARS, "report", "--venv", "/root/ml-env", "--skip", "unsatisfied", "--output", str(page),
            "--json")
    assert r.rc == 1, r.out + r.err  # red hosts, none unreachable
    doc = r.json()
    rows = {row["host"]: row for row in doc["hosts"]}
    assert [row["host"] for row in doc["hosts"]] == ["lab2", "lab3", "lab1"]  # worst first
    lab1, lab2, lab3 = rows["lab1"], rows["lab2"], rows["lab3"]
    assert (lab1["level"], lab1["problems"]) == ("green", [])
    assert (lab1["release"]["current"], lab1["release"]["level"]) == (plain, "green")
    assert [(i["service"], i["health"], i["level"]) for i in lab1["instances"]] == [("running", "200", "green")]
    assert lab1["gpu"]["text"] == "1 GPU, every check green" and lab1["drift"]["text"] == "in line"
    assert (lab1["last_run"]["run_id"], lab1["last_run"]["result"]) == (first["run_id"], "changed")
    # the stale host: drift red with its counts per class, no release
    assert lab2["level"] == "red" and lab2["drift"]["level"] == "red"
    assert lab2["drift"]["counts"].get("version") == 1, lab2["drift"]
    assert (lab2["release"]["level"], lab2["release"]["text"]) == ("amber", "no release")
    assert lab2["last_run"]["level"] == "none"
    # the red GPU host, rolled back by the second rollout, serving the plain release again
    assert (lab3["level"], lab3["gpu"]["level"], lab3["gpu"]["rule"]) == ("red", "red", "row_remapping")
    assert lab3["gpu"]["value"].startswith("pending: yes")
    assert (lab3["last_run"]["run_id"], lab3["last_run"]["result"]) == (sick["run_id"], "rolled back")
    assert lab3["release"]["current"] == plain and lab3["instances"][0]["health"] == "200"
    assert doc["summary"] == {"hosts": 3, "red": 2, "amber": 0, "green": 1, "line": "3 hosts: 2 red, 0 amber, 1 green"}
    mine = [run for run in doc["rollouts"] if run["run_id"] in (first["run_id"], sick["run_id"])]
    assert [run["run_id"] for run in mine] == [sick["run_id"], first["run_id"]]  # newest first
    assert [b["hosts"] for b in mine[1]["batches"]] == [["lab1"], ["lab3"]]
    assert all(b["seconds"] and b["seconds"] > 0 for b in mine[1]["batches"])
    assert mine[1]["canary"] and {c["host"] for c in mine[1]["canary"]} == {"lab1"}
    assert [(rb["host"], rb["status"], rb["to"]) for rb in mine[0]["rollbacks"]] == [("lab3", "rolled-back", plain)]
    assert [f["host"] for f in mine[0]["failures"]] == ["lab3"]
    timeline = {t["host"]: t for t in doc["timelines"]}
    sick_id = load_spec(scratch / "sick.yml").release_id
    assert [(s["from"], s["to"], s["rollback"]) for s in timeline["lab3"]["switches"]] == [
        (None, plain, False), (plain, sick_id, False), (sick_id, plain, True)]
    assert [s["release"] for s in timeline["lab3"]["segments"]] == [plain, sick_id, plain]
    assert timeline["lab2"]["switches"][0]["reason"] == EVIL  # the data keeps it; the page escapes it

    html = page.read_text()
    assert f"report written to {page}" in r.err
    assert EVIL not in html and "&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;" in html
    assert "NVIDIA H200 &lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script>") == 1 and "<link" not in html and "src=" not in html.replace("src=http", "")
    assert not [h for h in _attrs(html, "href") if not h.startswith("#")]
    for host, level in (("lab1", "green"), ("lab2", "red"), ("lab3", "red")):
        assert f'<tr id="host-{host}" data-host="{host}" data-level="{level}"' in html
    assert "row_remapping: pending: yes" in html and "no release" in html and "rolled-back to " + plain in html
    _look_in_chromium(page, scratch)


def _attrs(html: str, name: str) -> list[str]:
    import re

    return re.findall(rf'\s{name}="([^"]*)"', html)


def _look_in_chromium(page: Path, scratch: Path) -> None:
    """Headless Chromium runs the page's script (the DOM after it says so), and the screenshots at
    1280 px and at phone width are not blank."""
    assert shutil.which("chromium"), "chromium not installed (make chromium)"
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        dom = subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120).stdout
        assert "3 of 3 hosts shown" in dom  # the script ran: filter controls shown, hosts counted
        assert 'data-host="lab2" data-level="red"' in dom and 'data-host="lab3" data-level="red"' in dom
        assert "rolled-back to" in dom
        for width in (1280, 390):
            shot = scratch / f"fleet-{width}.png"
            subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", f"--window-size={width},1600",
                            f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
            assert not _blank(shot.read_bytes()), f"{shot} is blank"
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _blank(png: bytes) -> bool:
    """True when every pixel byte of the PNG is one value (a blank page)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        (length,), kind = struct.unpack(">I", png[pos:pos + 4]), png[pos + 4:pos + 8]
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(data)
    return len(set(raw[1:4096 * 64])) <= 2  # filter bytes and one colour
