"""Drift on the lab fleet with the real sglang wheels: overlays, hand edits, locks, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from sglang_support import NEW_SGLANG, OLD_SGLANG, make_venv, wheel

pytestmark = pytest.mark.lab
VENV = "/root/drift-env"
SITE = "lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def drift_lab(lab_fleet: LabHandle) -> LabHandle:
    """lab1: a clean pip install of sglang 0.5.23; lab2: the same with 0.5.9's files copied over it
    (today's hand-made overlay); lab3: clean, then one file edited by hand."""
    new, old = wheel("sglang", NEW_SGLANG), wheel("sglang", OLD_SGLANG)
    for host in lab_fleet.hosts:
        make_venv(lab_fleet, host, VENV, [new], fresh=True)
    make_venv(lab_fleet, "lab2", "/root/drift-old", [old])
    lab_fleet.ssh("lab2", f"cp -a /root/drift-old/{SITE}/. {VENV}/{SITE}/")
    lab_fleet.ssh("lab3", f"echo '# tuned by hand' >> {VENV}/{SITE}/sglang/srt/server_args.py")
    return lab_fleet


def _drift(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str):  # type: ignore[no-untyped-def]
    return run_cli(capsys, "-i", str(lab.inventory_path), "drift", "--venv", VENV, *args)


def test_overlay_and_hand_edit_are_found(drift_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = _drift(capsys, drift_lab, "--verify-files", "--skip", "unsatisfied", "--json")
    assert r.rc == 1, r.err
    doc = r.json()
    hosts = doc["hosts"]
    assert hosts["lab1"]["findings"] == []  # a clean pip install is clean
    lab2 = {f["kind"] for f in hosts["lab2"]["findings"]}
    assert {"duplicate-dist-info", "orphan-file", "modified-file"} <= lab2
    dup = next(f for f in hosts["lab2"]["findings"] if f["kind"] == "duplicate-dist-info")
    assert dup["detail"] == f"2 dist-info folders: sglang-{NEW_SGLANG}.dist-info, sglang-{OLD_SGLANG}.dist-info"
    assert [(f["kind"], f["detail"]) for f in hosts["lab3"]["findings"]] == [
        ("modified-file", f"{SITE}/sglang/srt/server_args.py")]
    assert doc["summary"]["drifting_hosts"] == ["lab2", "lab3"]
    assert doc["matrix"]["columns"] == ["baseline", "lab1", "lab2", "lab3"]
    row = doc["matrix"]["rows"][0]
    assert row["name"] == "sglang"
    assert row["cells"][2] == {"text": f"{NEW_SGLANG} + {OLD_SGLANG}", "kind": "duplicate-dist-info"}


def test_second_verify_run_hashes_nothing_again(drift_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    _drift(capsys, drift_lab, "-l", "lab1", "--verify-files", "--json")
    files = _drift(capsys, drift_lab, "-l", "lab1", "--verify-files", "--json").json()["hosts"]["lab1"]["files"]
    assert files["checked"] > 5000 and files["cache_misses"] == 0 and files["cache_hits"] == files["checked"]


def test_lock_file_pins(drift_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = tmp_path / "fleet.lock"
    lock.write_text(f"sglang=={NEW_SGLANG}\n")
    ok = _drift(capsys, drift_lab, "-l", "lab1", "--lock", str(lock), "--skip", "unsatisfied")
    assert ok.rc == 0, ok.out
    assert "0 of 1 hosts drift" in ok.out
    lock.write_text(f"sglang=={OLD_SGLANG}\n")
    bad = _drift(capsys, drift_lab, "-l", "lab1", "--lock", str(lock), "--skip", "unsatisfied", "--json")
    assert bad.rc == 1
    assert [(f["kind"], f["expected"], f["actual"]) for f in bad.json()["hosts"]["lab1"]["findings"]] == [
        ("version", OLD_SGLANG, NEW_SGLANG)]
    lock.write_text("sglang>=0.5\n")
    err = _drift(capsys, drift_lab, "--lock", str(lock))
    assert err.rc == 3 and err.err.strip() == f"fleetctl: error: {lock}:1: 'sglang>=0.5' is not an exact pin " \
                                               "(expected name==version)"


def test_unsatisfied_requirements_of_a_no_deps_install(
    drift_lab: LabHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    r = _drift(capsys, drift_lab, "-l", "lab1", "--json")
    found = [f for f in r.json()["hosts"]["lab1"]["findings"] if f["kind"] == "unsatisfied"]
    assert any(f["detail"].startswith("sglang requires torch") for f in found)  # installed with --no-deps


def test_reports_to_files(drift_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html, md = tmp_path / "drift.html", tmp_path / "drift.md"
    args = ("--baseline", "lab1", "--skip", "unsatisfied")
    r = _drift(capsys, drift_lab, *args, "--format", "html", "--output", str(html))
    assert r.rc == 1 and f"report written to {html}" in r.err
    text = html.read_text()
    assert '<table id="matrix">' in text and 'class="duplicate-dist-info"' in text
    _drift(capsys, drift_lab, *args, "--format", "markdown", "--output", str(md))
    assert md.read_text().splitlines()[0].startswith("## Drift audit: 1 of 3 hosts drift")


def test_missing_venv_is_a_host_failure(drift_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(drift_lab.inventory_path), "-l", "lab1", "drift", "--venv", "/root/nope", "--json")
    assert r.rc == 2
    assert r.json()["hosts"]["lab1"] == {
        "status": "failed", "reason": "drift: InterpreterNotFound: no venv: no python at /root/nope/bin/python"}


def test_kept_connections_still_see_an_edit_made_between_audits(
    drift_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over kept connections the agent keeps RECORDs and the hash cache between audits: an edit
    made between two commands must still be found by the next one."""
    from fleetctl.transport import mux

    monkeypatch.setenv("FLEETCTL_MUX_DIR", str(tmp_path / "mux"))
    target = f"{VENV}/{SITE}/sglang/srt/utils/common.py"

    def audit() -> dict:  # type: ignore[type-arg]
        r = run_cli(capsys, "-i", str(drift_lab.inventory_path), "--persist", "60", "drift", "--venv", VENV,
                    "-l", "lab1", "--verify-files", "--skip", "unsatisfied", "--json")
        assert r.rc in (0, 1), r.err
        return r.json()["hosts"]["lab1"]  # type: ignore[no-any-return]

    try:
        assert audit()["findings"] == []
        again = audit()
        assert again["findings"] == [] and again["files"]["cache_misses"] == 0
        drift_lab.ssh("lab1", f"cp -a {target} /root/common.py.keep && echo '# hot fix' >> {target}")
        found = audit()
        assert [(f["kind"], f["detail"]) for f in found["findings"]] == [
            ("modified-file", f"{SITE}/sglang/srt/utils/common.py")]
    finally:
        drift_lab.ssh("lab1", f"test ! -e /root/common.py.keep || mv -f /root/common.py.keep {target}", check=False)
        mux.stop_server(mux.socket_path(tmp_path / "mux"))
