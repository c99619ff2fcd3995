"""What an audit read, said out loud: `drift` names the venv (or interpreter) it audited per host and
refuses to audit when no venv is named anywhere; a note every host gives (launch args not validated)
is one line with the host list, not one line per host."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import TINY_BASE, tiny_releases

pytestmark = pytest.mark.lab


def test_drift_without_a_venv_anywhere_is_refused_before_any_connection(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.yml"  # nothing listens on port 9: a connection attempt would say unreachable
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-01": {"ansible_host": "127.0.0.1", "ansible_port": 9}}}}))
    r = run_cli(capsys, "-i", str(inv), "-l", "gpu-01", "drift", "--baseline", "gpu-01")
    assert r.rc == 3, r.out + r.err
    assert r.err.strip().endswith("drift: no venv named for any selected host: pass --venv PATH or set the host "
                                  "var `venv` (the audit reads a venv's installed packages)"), r.err
    assert "unreachable" not in r.out + r.err


def test_drift_names_what_it_audited_and_deploy_notes_are_gathered(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    (spec,) = tiny_releases(lab, tmp_path, ["noted"])
    r = run_cli(capsys, "-i", inv, "-l", "lab1,lab2", "drift", "--venv", TINY_BASE, "--baseline", "lab1")
    assert r.rc == 0, r.out + r.err
    assert f"audited: lab1,lab2 venv {TINY_BASE}" in r.out
    # the tiny base has no SGLang: each host says its launch args were not validated, once for both
    d = run_cli(capsys, "-i", inv, "-l", "lab1,lab2", "deploy", str(spec))
    assert d.rc == 0, d.out + d.err
    notes = [line for line in d.out.splitlines() if "launch args not validated" in line]
    assert len(notes) == 1 and notes[0].startswith("lab1,lab2: launch args not validated"), d.out
